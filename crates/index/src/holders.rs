//! The compact per-block record of which pods hold a block.
//!
//! Most blocks live on one or two pods (a prompt's blocks land where the
//! request was routed), so a full 256-bit bitmap per block would spend 32
//! bytes to say "pod 7". A [`Holders`] is one `u64`: up to four slot
//! numbers inline, or, for blocks held more widely, the index of a full
//! bitmap in the shard's slab, plus a 16-bit **run hint**. A map entry is
//! then 16 bytes (key + value) whatever the width, and a block on many pods
//! pays one bitmap, shared by all its pods.
//!
//! Encoding: the low 48 bits are four 12-bit lanes; `0xFFF` marks an empty
//! lane. When the top lane is `0xFFE` the low 32 bits index the slab. Slot
//! numbers are below 1024, so neither marker can be a slot. The high 16
//! bits are the run hint (see [`Holders::hint`]); changing the holders
//! keeps it.

use crate::bitmap::HostBitmap;

const EMPTY_LANE: u16 = 0xFFF;
const SLAB_TAG: u16 = 0xFFE;
const LANE_BITS: u32 = 12;
const LANES_MASK: u64 = (1 << 48) - 1;
/// Four empty lanes.
const NO_LANES: u64 = LANES_MASK;
/// A slab bitmap shrinking to this many pods goes back inline. Lower than
/// the inline capacity, so a block hovering at the boundary does not flip
/// between forms on every event.
const DEMOTE_AT: u32 = 2;

/// Up to four slots inline, or a slab index; and a run hint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Holders(u64);

/// The shard's store of full bitmaps for widely held blocks.
#[derive(Debug, Default)]
pub(crate) struct Slab<const W: usize> {
    bitmaps: Vec<HostBitmap<W>>,
    free: Vec<u32>,
}

impl<const W: usize> Slab<W> {
    fn alloc(&mut self, b: HostBitmap<W>) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.bitmaps[i as usize] = b;
                i
            }
            None => {
                self.bitmaps.push(b);
                // A shard holds far fewer than 2^32 widely shared blocks;
                // the slab length is bounded by the shard's entry count.
                (self.bitmaps.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, i: u32) {
        self.bitmaps[i as usize] = HostBitmap::EMPTY;
        self.free.push(i);
    }

    /// Bitmaps in use.
    pub(crate) fn live(&self) -> usize {
        self.bitmaps.len() - self.free.len()
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.bitmaps.capacity() * std::mem::size_of::<HostBitmap<W>>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}

impl Holders {
    /// No pod, no hint.
    pub(crate) const EMPTY: Holders = Holders(NO_LANES);

    #[inline]
    fn lanes(self) -> [u16; 4] {
        let m = (1u64 << LANE_BITS) - 1;
        [
            (self.0 & m) as u16,
            (self.0 >> LANE_BITS & m) as u16,
            (self.0 >> (2 * LANE_BITS) & m) as u16,
            (self.0 >> (3 * LANE_BITS) & m) as u16,
        ]
    }

    /// These lanes, keeping `self`'s hint.
    #[inline]
    fn with_lanes(self, l: [u16; 4]) -> Self {
        let lanes = l[0] as u64
            | (l[1] as u64) << LANE_BITS
            | (l[2] as u64) << (2 * LANE_BITS)
            | (l[3] as u64) << (3 * LANE_BITS);
        Holders(self.0 & !LANES_MASK | lanes)
    }

    #[inline]
    fn slab_index(self) -> Option<u32> {
        ((self.0 >> (3 * LANE_BITS) & 0xFFF) as u16 == SLAB_TAG).then_some(self.0 as u32)
    }

    /// Slab record `i`, keeping `self`'s hint.
    fn with_slab(self, i: u32) -> Self {
        Holders(self.0 & !LANES_MASK | (SLAB_TAG as u64) << (3 * LANE_BITS) | i as u64)
    }

    /// Whether no pod holds the block.
    #[inline]
    pub(crate) fn is_empty(self) -> bool {
        self.0 & LANES_MASK == NO_LANES
    }

    /// The run hint: `r > 0` says that, when the block was last written,
    /// the next `r - 1` blocks of the writing event's chain had the same
    /// holders and the `r`-th did not (or the event ended there). 0: none.
    /// Only a guess for the search's next split: any value is safe.
    #[inline]
    pub(crate) fn hint(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// Sets the run hint.
    #[inline]
    pub(crate) fn set_hint(&mut self, r: u16) {
        self.0 = self.0 & LANES_MASK | (r as u64) << 48;
    }

    /// Whether the record uses a slab bitmap.
    #[cfg(test)]
    pub(crate) fn is_slab(self) -> bool {
        self.slab_index().is_some()
    }

    /// The holders as a bitmap.
    #[inline]
    pub(crate) fn to_bitmap<const W: usize>(self, slab: &Slab<W>) -> HostBitmap<W> {
        match self.slab_index() {
            Some(i) => slab.bitmaps[i as usize],
            None => {
                let mut b = HostBitmap::EMPTY;
                for l in self.lanes() {
                    if l != EMPTY_LANE {
                        b.insert(l as usize);
                    }
                }
                b
            }
        }
    }

    /// The holders among `candidates`.
    #[inline]
    pub(crate) fn and<const W: usize>(
        self,
        slab: &Slab<W>,
        candidates: &HostBitmap<W>,
    ) -> HostBitmap<W> {
        match self.slab_index() {
            Some(i) => slab.bitmaps[i as usize].and(candidates),
            None => {
                let mut b = HostBitmap::EMPTY;
                for l in self.lanes() {
                    if l != EMPTY_LANE && candidates.contains(l as usize) {
                        b.insert(l as usize);
                    }
                }
                b
            }
        }
    }

    /// Whether `slot` holds the block.
    pub(crate) fn contains<const W: usize>(self, slab: &Slab<W>, slot: u16) -> bool {
        match self.slab_index() {
            Some(i) => slab.bitmaps[i as usize].contains(slot as usize),
            None => self.lanes().contains(&slot),
        }
    }

    /// The number of pods holding the block.
    #[cfg(test)]
    pub(crate) fn count<const W: usize>(self, slab: &Slab<W>) -> u32 {
        match self.slab_index() {
            Some(i) => slab.bitmaps[i as usize].count(),
            None => self.lanes().iter().filter(|&&l| l != EMPTY_LANE).count() as u32,
        }
    }

    /// Adds `slot`; returns whether it was absent.
    pub(crate) fn insert<const W: usize>(&mut self, slab: &mut Slab<W>, slot: u16) -> bool {
        if let Some(i) = self.slab_index() {
            return slab.bitmaps[i as usize].insert(slot as usize);
        }
        let mut lanes = self.lanes();
        if lanes.contains(&slot) {
            return false;
        }
        if let Some(free) = lanes.iter_mut().find(|l| **l == EMPTY_LANE) {
            *free = slot;
            *self = self.with_lanes(lanes);
            return true;
        }
        let mut b = self.to_bitmap(slab);
        b.insert(slot as usize);
        *self = self.with_slab(slab.alloc(b));
        true
    }

    /// Removes `slot`; returns whether it was present.
    pub(crate) fn remove<const W: usize>(&mut self, slab: &mut Slab<W>, slot: u16) -> bool {
        let mut mask = HostBitmap::EMPTY;
        mask.insert(slot as usize);
        self.remove_mask(slab, &mask) == 1
    }

    /// Removes every slot of `mask`; returns how many were present. An
    /// emptied slab record releases its bitmap.
    pub(crate) fn remove_mask<const W: usize>(
        &mut self,
        slab: &mut Slab<W>,
        mask: &HostBitmap<W>,
    ) -> u32 {
        match self.slab_index() {
            Some(i) => {
                let before = slab.bitmaps[i as usize];
                let after = before.and_not(mask);
                let removed = before.count() - after.count();
                if after.count() <= DEMOTE_AT {
                    slab.release(i);
                    let mut lanes = [EMPTY_LANE; 4];
                    for (lane, s) in lanes.iter_mut().zip(after.iter()) {
                        *lane = s as u16;
                    }
                    *self = self.with_lanes(lanes);
                } else {
                    slab.bitmaps[i as usize] = after;
                }
                removed
            }
            None => {
                let mut lanes = self.lanes();
                let mut removed = 0;
                for l in &mut lanes {
                    if *l != EMPTY_LANE && mask.contains(*l as usize) {
                        *l = EMPTY_LANE;
                        removed += 1;
                    }
                }
                *self = self.with_lanes(lanes);
                removed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_the_slab_and_shrinks_back() {
        let mut slab = Slab::<4>::default();
        let mut h = Holders::EMPTY;
        assert!(h.is_empty());
        for s in [3u16, 200, 7, 255] {
            assert!(h.insert(&mut slab, s));
            assert!(!h.insert(&mut slab, s), "second insert of {s} is a no-op");
        }
        assert!(!h.is_slab());
        assert_eq!(h.count(&slab), 4);
        assert!(h.insert(&mut slab, 64));
        assert!(h.is_slab());
        assert_eq!(slab.live(), 1);
        let want: HostBitmap<4> = [3, 7, 64, 200, 255].into_iter().collect();
        assert_eq!(h.to_bitmap(&slab), want);
        let cand: HostBitmap<4> = [7, 8, 255].into_iter().collect();
        assert_eq!(h.and(&slab, &cand), [7, 255].into_iter().collect());
        assert!(h.remove(&mut slab, 3));
        assert!(!h.remove(&mut slab, 3));
        assert!(h.is_slab(), "4 pods stay in the slab (hysteresis)");
        let mask: HostBitmap<4> = [7, 200].into_iter().collect();
        assert_eq!(h.remove_mask(&mut slab, &mask), 2);
        assert!(!h.is_slab(), "2 pods go back inline");
        assert_eq!(slab.live(), 0);
        assert!(h.contains(&slab, 64) && h.contains(&slab, 255) && !h.contains(&slab, 7));
        assert!(h.remove(&mut slab, 64) && h.remove(&mut slab, 255));
        assert!(h.is_empty());
    }

    #[test]
    fn the_hint_survives_every_change_of_holders() {
        let mut slab = Slab::<16>::default();
        let mut h = Holders::EMPTY;
        assert_eq!(h.hint(), 0);
        h.set_hint(0xBEEF);
        assert!(h.is_empty(), "a hint alone holds no pod");
        for s in [1023u16, 0, 512, 7, 9, 300] {
            assert!(h.insert(&mut slab, s));
            assert_eq!(h.hint(), 0xBEEF);
        }
        assert!(h.is_slab());
        let want: HostBitmap<16> = [0, 7, 9, 300, 512, 1023].into_iter().collect();
        assert_eq!(h.to_bitmap(&slab), want);
        h.set_hint(3);
        assert_eq!(
            h.to_bitmap(&slab),
            want,
            "setting the hint keeps the holders"
        );
        let mask: HostBitmap<16> = [0, 9, 300, 512].into_iter().collect();
        assert_eq!(h.remove_mask(&mut slab, &mask), 4);
        assert!(!h.is_slab());
        assert_eq!(h.hint(), 3);
        assert_eq!(h.to_bitmap(&slab), [7, 1023].into_iter().collect());
        assert!(h.remove(&mut slab, 7) && h.remove(&mut slab, 1023));
        assert!(h.is_empty());
        assert_eq!(h.hint(), 3);
    }

    #[test]
    fn inline_and_matches_bitmap_and() {
        let slab = Slab::<16>::default();
        let mut s2 = Slab::<16>::default();
        let mut h = Holders::EMPTY;
        for s in [0u16, 1023, 512] {
            h.insert(&mut s2, s);
        }
        let cand: HostBitmap<16> = [1023, 5].into_iter().collect();
        assert_eq!(h.and(&slab, &cand), HostBitmap::single(1023));
    }
}
