//! The compact per-block record of which pods hold a block.
//!
//! Most blocks live on one or two pods (a prompt's blocks land where the
//! request was routed), so a full 256-bit bitmap per block would spend 32
//! bytes to say "pod 7". A [`Holders`] is one `u64`: up to four slot
//! numbers inline; for blocks held more widely, a 46-bit bitmap inline when
//! every holder's slot is below 46 (a fleet of up to 46 pods never leaves
//! the cell), else the index of a full bitmap in the shard's slab; plus a
//! 16-bit **run hint**. A map entry is then 16 bytes (key + value) whatever
//! the width, a block on many pods of a small fleet costs no more, and one
//! on many pods of a large fleet pays one bitmap, shared by all its pods.
//!
//! Encoding: the low 48 bits are four 12-bit lanes; `0xFFF` marks an empty
//! lane. When the top lane is `0xFFE` the low 32 bits index the slab. When
//! bits 47 and 46 are `10` (a top lane in `0x800..0xC00`) the low 46 bits
//! are the small bitmap. Slot numbers are below 1024 (`0x400`), so no
//! marker can be a slot. The high 16 bits are the run hint (see
//! [`Holders::hint`]); changing the holders keeps it.

use crate::array::{Bin, Line, Lines, WORDS, word};
use crate::bitmap::HostBitmap;
use crate::sync::{Guard, Ordering};

const EMPTY_LANE: u16 = 0xFFF;
const SLAB_TAG: u16 = 0xFFE;
const LANE_BITS: u32 = 12;
const LANES_MASK: u64 = (1 << 48) - 1;
/// Four empty lanes.
const NO_LANES: u64 = LANES_MASK;
/// A slab or small bitmap shrinking to this many pods goes back to lanes.
/// Lower than the lanes' capacity, so a block hovering at the boundary does
/// not flip between forms on every event.
const DEMOTE_AT: u32 = 2;
/// Slots below this fit the small inline bitmap.
pub(crate) const SMALL_SLOTS: usize = 46;
/// The small bitmap's bits, and its marker in bits 47 and 46.
const SMALL_BITS: u64 = (1 << SMALL_SLOTS) - 1;
const SMALL_MARK: u64 = 0b11 << SMALL_SLOTS;
const SMALL_TAG: u64 = 0b10 << SMALL_SLOTS;

/// The small bitmap of these slots, if every one is below [`SMALL_SLOTS`].
fn small_of(slots: impl IntoIterator<Item = u16>) -> Option<u64> {
    slots.into_iter().try_fold(0u64, |bits, s| {
        ((s as usize) < SMALL_SLOTS).then(|| bits | 1 << s)
    })
}

/// Up to four slots inline, a small bitmap inline, or a slab index; and a
/// run hint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Holders(u64);

/// The shard's store of full bitmaps for widely held blocks: the words
/// readers see. Bitmap `i` is words `i * W .. (i + 1) * W` of the array.
#[derive(Debug, Default)]
pub(crate) struct Slab<const W: usize> {
    lines: Lines,
}

/// The writer's side of a [`Slab`], behind the shard lock.
#[derive(Debug, Default)]
pub(crate) struct SlabState {
    /// Bitmaps handed out (live or free).
    len: u32,
    free: Vec<u32>,
    bin: Bin,
}

/// Where [`Holders`] read the bitmaps of slab records.
pub(crate) trait Bitmaps<const W: usize> {
    /// Bitmap `i` (empty past the array's end, which only a torn read of a
    /// racing write can name; the reader's sequence check rejects it).
    fn bitmap(&self, i: u32) -> HostBitmap<W>;
}

#[inline(always)]
fn read_bitmap<const W: usize>(lines: &[Line], i: u32, ordering: Ordering) -> HostBitmap<W> {
    let base = i as usize * W;
    if base + W > lines.len() * WORDS {
        return HostBitmap::EMPTY;
    }
    HostBitmap::from_words(std::array::from_fn(|k| {
        word(lines, base + k).map_or(0, |w| w.load(ordering))
    }))
}

/// A reader's view of a slab, inside its pinned epoch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlabRead<'g> {
    lines: &'g [Line],
}

impl SlabRead<'_> {
    /// No array: every bitmap read from it is empty.
    pub(crate) const EMPTY: SlabRead<'static> = SlabRead { lines: &[] };
}

impl<const W: usize> Slab<W> {
    /// The reader's view.
    #[inline]
    pub(crate) fn read<'g>(&self, guard: &'g Guard) -> SlabRead<'g> {
        SlabRead {
            lines: self.lines.load(guard),
        }
    }

    /// The writer's view, for the holder of the shard lock and its state.
    pub(crate) fn write<'a>(&'a self, st: &'a mut SlabState) -> SlabMut<'a, W> {
        SlabMut { slab: self, st }
    }

    /// Bitmaps in use.
    pub(crate) fn live(&self, st: &SlabState) -> usize {
        (st.len as usize) - st.free.len()
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self, st: &SlabState) -> usize {
        std::mem::size_of_val(self.lines.locked(&st.bin))
            + st.free.capacity() * std::mem::size_of::<u32>()
    }
}

impl SlabRead<'_> {
    /// Prefetches the line of bitmap `i` (of `W` words), for a read that
    /// will follow.
    #[inline]
    pub(crate) fn prefetch<const W: usize>(&self, i: u32) {
        if let Some(w) = word(self.lines, i as usize * W) {
            crate::array::prefetch(std::ptr::from_ref(w));
        }
    }
}

impl<const W: usize> Bitmaps<W> for SlabRead<'_> {
    #[inline(always)]
    fn bitmap(&self, i: u32) -> HostBitmap<W> {
        read_bitmap(self.lines, i, Ordering::Acquire)
    }
}

/// A [`Slab`] open for writing: only under the shard lock.
#[derive(Debug)]
pub(crate) struct SlabMut<'a, const W: usize> {
    slab: &'a Slab<W>,
    st: &'a mut SlabState,
}

impl<const W: usize> Bitmaps<W> for SlabMut<'_, W> {
    #[inline]
    fn bitmap(&self, i: u32) -> HostBitmap<W> {
        read_bitmap(self.slab.lines.locked(&self.st.bin), i, Ordering::Relaxed)
    }
}

impl<const W: usize> SlabMut<'_, W> {
    fn set(&mut self, i: u32, b: HostBitmap<W>) {
        let lines = self.slab.lines.locked(&self.st.bin);
        for (k, &w) in b.words().iter().enumerate() {
            if let Some(a) = word(lines, i as usize * W + k) {
                a.store(w, Ordering::Release);
            }
        }
    }

    #[inline(never)]
    fn alloc(&mut self, b: HostBitmap<W>) -> u32 {
        let i = match self.st.free.pop() {
            Some(i) => i,
            None => {
                let i = self.st.len;
                let need = (i as usize + 1) * W;
                let have = self.slab.lines.locked(&self.st.bin).len();
                if need > have * WORDS {
                    let lines = (have * 2).max(need.div_ceil(WORDS).next_power_of_two());
                    self.slab
                        .lines
                        .replace(&mut self.st.bin, lines, |old, new| {
                            for (o, n) in old.iter().zip(new) {
                                for (a, b) in o.0.iter().zip(&n.0) {
                                    b.store(a.load(Ordering::Relaxed), Ordering::Relaxed);
                                }
                            }
                        });
                }
                // A shard holds far fewer than 2^32 widely shared blocks;
                // the slab length is bounded by the shard's entry count.
                self.st.len += 1;
                i
            }
        };
        self.set(i, b);
        i
    }

    fn release(&mut self, i: u32) {
        self.set(i, HostBitmap::EMPTY);
        self.st.free.push(i);
    }

    /// Bitmaps in use.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.slab.live(self.st)
    }
}

impl Holders {
    /// No pod, no hint.
    pub(crate) const EMPTY: Holders = Holders(NO_LANES);

    /// The encoded word, as the map stores it.
    #[inline]
    pub(crate) fn raw(self) -> u64 {
        self.0
    }

    /// Holders from a word [`Holders::raw`] gave (or a torn read of one:
    /// any word decodes to some holders).
    #[inline]
    pub(crate) fn from_raw(w: u64) -> Self {
        Holders(w)
    }

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
    pub(crate) fn slab_index(self) -> Option<u32> {
        ((self.0 >> (3 * LANE_BITS) & 0xFFF) as u16 == SLAB_TAG).then_some(self.0 as u32)
    }

    /// Slab record `i`, keeping `self`'s hint.
    fn with_slab(self, i: u32) -> Self {
        Holders(self.0 & !LANES_MASK | (SLAB_TAG as u64) << (3 * LANE_BITS) | i as u64)
    }

    /// The small bitmap, if the record is one.
    #[inline(always)]
    fn small(self) -> Option<u64> {
        (self.0 & SMALL_MARK == SMALL_TAG).then_some(self.0 & SMALL_BITS)
    }

    /// The small bitmap `bits` (not empty), keeping `self`'s hint.
    fn with_small(self, bits: u64) -> Self {
        Holders(self.0 & !LANES_MASK | SMALL_TAG | bits & SMALL_BITS)
    }

    /// Lanes naming the slots of `bits` (at most four), keeping the hint.
    fn lanes_of(self, bits: impl IntoIterator<Item = usize>) -> Self {
        let mut lanes = [EMPTY_LANE; 4];
        for (lane, s) in lanes.iter_mut().zip(bits) {
            *lane = s as u16;
        }
        self.with_lanes(lanes)
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
    #[inline(always)]
    pub(crate) fn to_bitmap<const W: usize>(self, slab: &impl Bitmaps<W>) -> HostBitmap<W> {
        if let Some(bits) = self.small() {
            return HostBitmap::from_words(std::array::from_fn(|k| if k == 0 { bits } else { 0 }));
        }
        match self.slab_index() {
            Some(i) => slab.bitmap(i),
            None => {
                // Each word is made from the four lanes in registers, with
                // no store to a word picked at run time: the write path
                // compares the bitmap whole (`Run::before`), and narrow
                // stores read back wide wait for each other (a failed
                // store forward, a tenth of a store's time in a profile).
                // An empty lane's word number, 63, is past every width.
                let lanes = self.lanes();
                HostBitmap::from_words(std::array::from_fn(|k| {
                    lanes.iter().fold(0, |w, &l| {
                        w | u64::from(usize::from(l >> 6) == k) << (l & 63)
                    })
                }))
            }
        }
    }

    /// The holders among `candidates`.
    ///
    /// Always inlined, since every search probe calls it: called out of
    /// line, the bitmap came back through memory, and the caller's wide
    /// load of it waited for the narrow stores to drain (a failed store
    /// forward, the hottest instruction in a profile of a hot search).
    #[inline(always)]
    pub(crate) fn and<const W: usize>(
        self,
        slab: &impl Bitmaps<W>,
        candidates: &HostBitmap<W>,
    ) -> HostBitmap<W> {
        if let Some(bits) = self.small() {
            let c = candidates.words()[0];
            return HostBitmap::from_words(std::array::from_fn(
                |k| if k == 0 { bits & c } else { 0 },
            ));
        }
        match self.slab_index() {
            Some(i) => slab.bitmap(i).and(candidates),
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
    pub(crate) fn contains<const W: usize>(self, slab: &impl Bitmaps<W>, slot: u16) -> bool {
        if let Some(bits) = self.small() {
            return (slot as usize) < SMALL_SLOTS && bits >> slot & 1 != 0;
        }
        match self.slab_index() {
            Some(i) => slab.bitmap(i).contains(slot as usize),
            None => {
                // Whether some lane equals `slot`, i.e. some lane of `v` is
                // zero: subtracting one from every lane borrows into a
                // lane's top bit where that lane was zero (or a lane below
                // it was, so the test as a whole stays exact), and a lane
                // whose own top bit was set is masked out by `!v`.
                const ONES: u64 = 1 | 1 << LANE_BITS | 1 << (2 * LANE_BITS) | 1 << (3 * LANE_BITS);
                const TOPS: u64 = ONES << (LANE_BITS - 1);
                let v = (self.0 ^ (slot as u64).wrapping_mul(ONES)) & LANES_MASK;
                v.wrapping_sub(ONES) & !v & TOPS != 0
            }
        }
    }

    /// The number of pods holding the block.
    #[cfg(test)]
    pub(crate) fn count<const W: usize>(self, slab: &impl Bitmaps<W>) -> u32 {
        if let Some(bits) = self.small() {
            return bits.count_ones();
        }
        match self.slab_index() {
            Some(i) => slab.bitmap(i).count(),
            None => self.lanes().iter().filter(|&&l| l != EMPTY_LANE).count() as u32,
        }
    }

    /// Adds `slot`; returns whether it was absent.
    #[inline(always)]
    pub(crate) fn insert<const W: usize>(&mut self, slab: &mut SlabMut<'_, W>, slot: u16) -> bool {
        if let Some(bits) = self.small() {
            if (slot as usize) < SMALL_SLOTS {
                let bit = 1u64 << slot;
                *self = self.with_small(bits | bit);
                return bits & bit == 0;
            }
            // A slot past the small bitmap: the whole set to the slab.
            let mut b = self.to_bitmap(slab);
            b.insert(slot as usize);
            *self = self.with_slab(slab.alloc(b));
            return true;
        }
        if let Some(i) = self.slab_index() {
            let mut b = slab.bitmap(i);
            let new = b.insert(slot as usize);
            if new {
                slab.set(i, b);
            }
            return new;
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
        if let Some(bits) = small_of(lanes.into_iter().chain([slot])) {
            *self = self.with_small(bits);
            return true;
        }
        let mut b = self.to_bitmap(slab);
        b.insert(slot as usize);
        *self = self.with_slab(slab.alloc(b));
        true
    }

    /// Removes `slot`; returns whether it was present.
    pub(crate) fn remove<const W: usize>(&mut self, slab: &mut SlabMut<'_, W>, slot: u16) -> bool {
        let mut mask = HostBitmap::EMPTY;
        mask.insert(slot as usize);
        self.remove_mask(slab, &mask) == 1
    }

    /// Removes every slot of `mask`; returns how many were present. An
    /// emptied slab record releases its bitmap.
    pub(crate) fn remove_mask<const W: usize>(
        &mut self,
        slab: &mut SlabMut<'_, W>,
        mask: &HostBitmap<W>,
    ) -> u32 {
        if let Some(bits) = self.small() {
            let after = bits & !mask.words()[0];
            *self = if after.count_ones() <= DEMOTE_AT {
                self.lanes_of(HostBitmap::<1>::from_words([after]).iter())
            } else {
                self.with_small(after)
            };
            return (bits ^ after).count_ones();
        }
        match self.slab_index() {
            Some(i) => {
                let before = slab.bitmap(i);
                let after = before.and_not(mask);
                let removed = before.count() - after.count();
                let w = after.words();
                let small =
                    (w[0] & !SMALL_BITS == 0 && w[1..].iter().all(|&x| x == 0)).then_some(w[0]);
                if after.count() <= DEMOTE_AT {
                    slab.release(i);
                    *self = self.lanes_of(after.iter());
                } else if let Some(bits) = small {
                    // Every holder left fits the cell: the bitmap goes.
                    slab.release(i);
                    *self = self.with_small(bits);
                } else if removed > 0 {
                    slab.set(i, after);
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
        let (slab, mut st) = (Slab::<4>::default(), SlabState::default());
        let mut slab = slab.write(&mut st);
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
        let (slab, mut st) = (Slab::<16>::default(), SlabState::default());
        let mut slab = slab.write(&mut st);
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
        let (s1, mut st1) = (Slab::<16>::default(), SlabState::default());
        let slab = s1.write(&mut st1);
        let (s2, mut st2) = (Slab::<16>::default(), SlabState::default());
        let mut s2 = s2.write(&mut st2);
        let mut h = Holders::EMPTY;
        for s in [0u16, 1023, 512] {
            h.insert(&mut s2, s);
        }
        let cand: HostBitmap<16> = [1023, 5].into_iter().collect();
        assert_eq!(h.and(&slab, &cand), HostBitmap::single(1023));
    }

    /// The branch-free inline `and` against the obvious one: the holders
    /// as a bitmap, then the candidates.
    fn inline_and_is_bitmap_and<const W: usize>(slots: &[u16], cand: &[u16]) {
        let (s, mut st) = (Slab::<W>::default(), SlabState::default());
        let mut slab = s.write(&mut st);
        let mut h = Holders::EMPTY;
        for &s in slots {
            h.insert(&mut slab, s);
        }
        assert!(!h.is_slab());
        let cand: HostBitmap<W> = cand.iter().map(|&c| c as usize).collect();
        assert_eq!(h.and(&slab, &cand), h.to_bitmap(&slab).and(&cand));
    }

    #[test]
    fn a_small_fleet_stays_in_the_cell() {
        let (slab, mut st) = (Slab::<4>::default(), SlabState::default());
        let mut slab = slab.write(&mut st);
        let mut h = Holders::EMPTY;
        h.set_hint(77);
        for s in 0..SMALL_SLOTS as u16 {
            assert!(h.insert(&mut slab, s));
            assert!(!h.insert(&mut slab, s));
        }
        assert!(!h.is_slab(), "46 pods below slot 46 need no slab bitmap");
        assert_eq!(slab.live(), 0);
        assert_eq!(h.count(&slab), 46);
        assert_eq!(h.hint(), 77);
        assert!(h.insert(&mut slab, 46), "slot 46 is past the small bitmap");
        assert!(h.is_slab());
        assert_eq!(h.count(&slab), 47);
        let high: HostBitmap<4> = [46].into_iter().collect();
        assert_eq!(h.remove_mask(&mut slab, &high), 1);
        assert!(!h.is_slab(), "back in the cell once every holder fits");
        assert_eq!(slab.live(), 0, "its bitmap released");
        let most: HostBitmap<4> = (2..SMALL_SLOTS).collect();
        assert_eq!(h.remove_mask(&mut slab, &most), 44);
        assert_eq!(h.to_bitmap(&slab), [0, 1].into_iter().collect());
        assert_eq!(h.hint(), 77);
    }

    /// The lanes' membership test (a zero-lane test on the record XOR the
    /// slot) against a plain comparison, for every slot against records of
    /// up to four lanes, each a slot or empty, with any hint.
    #[test]
    fn a_lane_test_finds_exactly_the_slots_in_lanes() {
        let s = Slab::<16>::default();
        let guard = crate::sync::pin();
        let slab = s.read(&guard);
        let picks = [
            0u16, 1, 2, 7, 45, 63, 64, 511, 512, 1000, 1022, 1023, EMPTY_LANE,
        ];
        for a in picks {
            for b in picks {
                for c in [0u16, 3, 1023, EMPTY_LANE] {
                    for d in [EMPTY_LANE, 1, 1022] {
                        let mut h = Holders::EMPTY.with_lanes([a, b, c, d]);
                        h.set_hint(0xFFFF);
                        for x in 0..1024u16 {
                            let want = [a, b, c, d].contains(&x);
                            assert_eq!(h.contains::<16>(&slab, x), want, "{x} in {a} {b} {c} {d}");
                        }
                    }
                }
            }
        }
    }

    /// One operation on a holders record: insert a slot, or remove a set.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16),
        Remove(Vec<u16>),
    }

    /// Every form (lanes, small bitmap, slab) against a set: the same
    /// members after any sequence of inserts and removes, `and` equal to
    /// the bitmap's AND, and no slab bitmap left behind once the record no
    /// longer uses one.
    fn follows_a_set<const W: usize>(ops: &[Op], cand: &[u16]) {
        let (s, mut st) = (Slab::<W>::default(), SlabState::default());
        let mut slab = s.write(&mut st);
        let mut h = Holders::EMPTY;
        h.set_hint(0x1234);
        let mut model = std::collections::BTreeSet::new();
        let cap = (W * 64) as u16;
        for op in ops {
            match op {
                Op::Insert(x) => {
                    let x = x % cap;
                    assert_eq!(h.insert(&mut slab, x), model.insert(x));
                }
                Op::Remove(xs) => {
                    let mask: HostBitmap<W> = xs.iter().map(|&x| (x % cap) as usize).collect();
                    let gone = model.iter().filter(|&&x| mask.contains(x as usize)).count();
                    model.retain(|&x| !mask.contains(x as usize));
                    assert_eq!(h.remove_mask(&mut slab, &mask) as usize, gone);
                }
            }
            let want: HostBitmap<W> = model.iter().map(|&x| x as usize).collect();
            assert_eq!(h.to_bitmap(&slab), want);
            assert_eq!(h.count(&slab) as usize, model.len());
            assert_eq!(h.is_empty(), model.is_empty());
            assert_eq!(h.hint(), 0x1234);
            assert_eq!(slab.live(), usize::from(h.is_slab()));
            let c: HostBitmap<W> = cand.iter().map(|&x| (x % cap) as usize).collect();
            assert_eq!(h.and(&slab, &c), want.and(&c));
            let members = model.iter().copied();
            let others = cand.iter().map(|&x| x % cap);
            for x in [0u16, 45, 46, 47, 63, cap - 1]
                .into_iter()
                .chain(members)
                .chain(others)
            {
                assert_eq!(h.contains(&slab, x), model.contains(&x), "slot {x}");
            }
        }
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Mostly slots of a small fleet, some past it, so every form and
        // every change between forms is met.
        let slot = prop_oneof![4 => 0u16..50, 1 => 0u16..1024];
        prop_oneof![
            3 => slot.clone().prop_map(Op::Insert),
            1 => proptest::collection::vec(slot, 0..12).prop_map(Op::Remove),
        ]
    }

    proptest::proptest! {
        #[test]
        fn every_form_follows_a_set_model(
            ops in proptest::collection::vec(op(), 0..80),
            cand in proptest::collection::vec(0u16..1024, 0..64),
        ) {
            follows_a_set::<1>(&ops, &cand);
            follows_a_set::<4>(&ops, &cand);
            follows_a_set::<16>(&ops, &cand);
        }

        #[test]
        fn inline_and_agrees_with_the_bitmap_at_every_width(
            slots in proptest::collection::vec(0u16..1024, 0..=4),
            cand in proptest::collection::vec(0u16..1024, 0..64),
        ) {
            let narrow = |m: u16| -> Vec<u16> { slots.iter().map(|s| s % m).collect() };
            inline_and_is_bitmap_and::<1>(&narrow(64), &cand);
            inline_and_is_bitmap_and::<4>(&narrow(256), &cand);
            inline_and_is_bitmap_and::<16>(&slots, &cand);
        }
    }
}
