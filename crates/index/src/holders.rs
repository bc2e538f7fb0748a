//! The compact per-block record of which pods hold a block.
//!
//! Most blocks live on one or two pods (a prompt's blocks land where the
//! request was routed), so a full 256-bit bitmap per block would spend 32
//! bytes to say "pod 7". A [`Holders`] is one `u64`: up to four 16-bit slot
//! numbers inline, or, for blocks held more widely, the index of a full
//! bitmap in the shard's slab. A map entry is then 16 bytes (key + value)
//! whatever the width, and a block on many pods pays one bitmap, shared by
//! all its pods.
//!
//! Encoding: four 16-bit lanes; `0xFFFF` marks an empty lane. When the top
//! lane is `0xFFFE` the low 32 bits index the slab. Slot numbers are below
//! 1024, so neither marker can be a slot.

use crate::bitmap::HostBitmap;
use crate::pool::Pool;
use crate::sync::{AtomicU64, Ordering};

const EMPTY_LANE: u16 = 0xFFFF;
const SLAB_TAG: u16 = 0xFFFE;
/// A slab bitmap shrinking to this many pods goes back inline. Lower than
/// the inline capacity, so a block hovering at the boundary does not flip
/// between forms on every event.
const DEMOTE_AT: u32 = 2;

/// Up to four slots inline, or a slab index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Holders(u64);

/// The shard's full bitmaps for widely held blocks, readable without a lock.
pub(crate) struct SlabStore<const W: usize> {
    pool: Pool<[AtomicU64; W]>,
}

impl<const W: usize> Default for SlabStore<W> {
    fn default() -> Self {
        #[cfg(not(router_loom))]
        let pool = Pool::new(4);
        // loom: allocated up front, see `Pool::with_chunks`.
        #[cfg(router_loom)]
        let pool = Pool::with_chunks(0, 3, || std::array::from_fn(|_| AtomicU64::new(0)));
        SlabStore { pool }
    }
}

impl<const W: usize> std::fmt::Debug for SlabStore<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabStore").finish_non_exhaustive()
    }
}

impl<const W: usize> SlabStore<W> {
    /// Bitmap `i` (empty if it was never allocated: only a torn read asks).
    #[inline]
    pub(crate) fn load(&self, i: u32) -> HostBitmap<W> {
        match self.pool.get(i) {
            Some(words) => {
                HostBitmap::from_words(std::array::from_fn(|w| words[w].load(Ordering::Relaxed)))
            }
            None => HostBitmap::EMPTY,
        }
    }

    fn store(&self, i: u32, b: &HostBitmap<W>) {
        if let Some(words) = self.pool.get(i) {
            for (a, w) in words.iter().zip(b.words()) {
                a.store(*w, Ordering::Relaxed);
            }
        }
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.pool.bytes()
    }
}

/// The writer's bookkeeping of the slab: free bitmaps and the next new one.
#[derive(Debug, Default)]
pub(crate) struct SlabAlloc {
    free: Vec<u32>,
    next: u32,
}

/// A writer's view of the slab.
#[derive(Debug)]
pub(crate) struct Slab<'a, const W: usize> {
    store: &'a SlabStore<W>,
    alloc: &'a mut SlabAlloc,
}

impl<'a, const W: usize> Slab<'a, W> {
    pub(crate) fn new(store: &'a SlabStore<W>, alloc: &'a mut SlabAlloc) -> Self {
        Slab { store, alloc }
    }

    fn alloc(&mut self, b: HostBitmap<W>) -> u32 {
        let i = match self.alloc.free.pop() {
            Some(i) => i,
            None => {
                let i = self.alloc.next;
                self.alloc.next += 1;
                self.store
                    .pool
                    .ensure(i, || std::array::from_fn(|_| AtomicU64::new(0)));
                i
            }
        };
        self.store.store(i, &b);
        i
    }

    fn release(&mut self, i: u32) {
        self.store.store(i, &HostBitmap::EMPTY);
        self.alloc.free.push(i);
    }

    /// Bitmaps in use.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.alloc.live()
    }
}

impl SlabAlloc {
    /// Bitmaps in use.
    pub(crate) fn live(&self) -> usize {
        self.next as usize - self.free.len()
    }
}

impl Holders {
    /// No pod.
    pub(crate) const EMPTY: Holders = Holders(u64::MAX);

    #[inline]
    fn lanes(self) -> [u16; 4] {
        [
            self.0 as u16,
            (self.0 >> 16) as u16,
            (self.0 >> 32) as u16,
            (self.0 >> 48) as u16,
        ]
    }

    #[inline]
    fn from_lanes(l: [u16; 4]) -> Self {
        Holders(l[0] as u64 | (l[1] as u64) << 16 | (l[2] as u64) << 32 | (l[3] as u64) << 48)
    }

    #[inline]
    fn slab_index(self) -> Option<u32> {
        ((self.0 >> 48) as u16 == SLAB_TAG).then_some(self.0 as u32)
    }

    fn slab(i: u32) -> Self {
        Holders((SLAB_TAG as u64) << 48 | i as u64)
    }

    /// The holders a table slot stores.
    #[inline]
    pub(crate) const fn from_raw(raw: u64) -> Self {
        Holders(raw)
    }

    /// The value a table slot stores (never 0 for live holders).
    #[inline]
    pub(crate) const fn raw(self) -> u64 {
        self.0
    }

    /// Whether no pod holds the block.
    pub(crate) fn is_empty(self) -> bool {
        self == Self::EMPTY
    }

    /// Whether the record uses a slab bitmap.
    #[cfg(test)]
    pub(crate) fn is_slab(self) -> bool {
        self.slab_index().is_some()
    }

    /// The holders as a bitmap.
    #[inline]
    pub(crate) fn to_bitmap<const W: usize>(self, slab: &SlabStore<W>) -> HostBitmap<W> {
        match self.slab_index() {
            Some(i) => slab.load(i),
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
        slab: &SlabStore<W>,
        candidates: &HostBitmap<W>,
    ) -> HostBitmap<W> {
        match self.slab_index() {
            Some(i) => slab.load(i).and(candidates),
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
    pub(crate) fn contains<const W: usize>(self, slab: &SlabStore<W>, slot: u16) -> bool {
        match self.slab_index() {
            Some(i) => slab.load(i).contains(slot as usize),
            None => self.lanes().contains(&slot),
        }
    }

    /// The number of pods holding the block.
    #[cfg(test)]
    pub(crate) fn count<const W: usize>(self, slab: &SlabStore<W>) -> u32 {
        match self.slab_index() {
            Some(i) => slab.load(i).count(),
            None => self.lanes().iter().filter(|&&l| l != EMPTY_LANE).count() as u32,
        }
    }

    /// Adds `slot`; returns whether it was absent.
    pub(crate) fn insert<const W: usize>(&mut self, slab: &mut Slab<W>, slot: u16) -> bool {
        if let Some(i) = self.slab_index() {
            let mut b = slab.store.load(i);
            let newly = b.insert(slot as usize);
            slab.store.store(i, &b);
            return newly;
        }
        let mut lanes = self.lanes();
        if lanes.contains(&slot) {
            return false;
        }
        if let Some(free) = lanes.iter_mut().find(|l| **l == EMPTY_LANE) {
            *free = slot;
            *self = Self::from_lanes(lanes);
            return true;
        }
        let mut b = self.to_bitmap(slab.store);
        b.insert(slot as usize);
        *self = Self::slab(slab.alloc(b));
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
                let before = slab.store.load(i);
                let after = before.and_not(mask);
                let removed = before.count() - after.count();
                if after.count() <= DEMOTE_AT {
                    slab.release(i);
                    let mut lanes = [EMPTY_LANE; 4];
                    for (lane, s) in lanes.iter_mut().zip(after.iter()) {
                        *lane = s as u16;
                    }
                    *self = Self::from_lanes(lanes);
                } else {
                    slab.store.store(i, &after);
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
                *self = Self::from_lanes(lanes);
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
        let store = SlabStore::<4>::default();
        let mut alloc = SlabAlloc::default();
        let mut slab = Slab::new(&store, &mut alloc);
        let mut h = Holders::EMPTY;
        assert!(h.is_empty());
        for s in [3u16, 200, 7, 255] {
            assert!(h.insert(&mut slab, s));
            assert!(!h.insert(&mut slab, s), "second insert of {s} is a no-op");
        }
        assert!(!h.is_slab());
        assert_eq!(h.count(slab.store), 4);
        assert!(h.insert(&mut slab, 64));
        assert!(h.is_slab());
        assert_eq!(slab.live(), 1);
        let want: HostBitmap<4> = [3, 7, 64, 200, 255].into_iter().collect();
        assert_eq!(h.to_bitmap(slab.store), want);
        let cand: HostBitmap<4> = [7, 8, 255].into_iter().collect();
        assert_eq!(h.and(slab.store, &cand), [7, 255].into_iter().collect());
        assert!(h.remove(&mut slab, 3));
        assert!(!h.remove(&mut slab, 3));
        assert!(h.is_slab(), "4 pods stay in the slab (hysteresis)");
        let mask: HostBitmap<4> = [7, 200].into_iter().collect();
        assert_eq!(h.remove_mask(&mut slab, &mask), 2);
        assert!(!h.is_slab(), "2 pods go back inline");
        assert_eq!(slab.live(), 0);
        assert!(h.contains(slab.store, 64) && h.contains(slab.store, 255));
        assert!(!h.contains(slab.store, 7));
        assert!(h.remove(&mut slab, 64) && h.remove(&mut slab, 255));
        assert!(h.is_empty());
        assert_ne!(h.raw(), 0, "0 is the table's vacant marker");
    }

    #[test]
    fn inline_and_matches_bitmap_and() {
        let store = SlabStore::<16>::default();
        let mut alloc = SlabAlloc::default();
        let mut slab = Slab::new(&store, &mut alloc);
        let mut h = Holders::EMPTY;
        for s in [0u16, 1023, 512] {
            h.insert(&mut slab, s);
        }
        assert_ne!(h.raw(), 0);
        let cand: HostBitmap<16> = [1023, 5].into_iter().collect();
        assert_eq!(h.and(&store, &cand), HostBitmap::single(1023));
    }
}
