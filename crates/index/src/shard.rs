//! The sharded block map.
//!
//! Sharding rules (the index depends on them):
//! - the shard count is a power of two (`1 << shard_bits`, 256 by default);
//! - each shard is `CachePadded`, so two shards' locks never share a line;
//! - the shard is picked from the **top** bits of `h * 0x9E3779B97F4A7C15`
//!   (Fibonacci hashing), which spreads even small sequential keys such as
//!   trace block ids;
//! - the in-shard map ([`BlockMap`], `table.rs`) places keys by
//!   `router_core::mix64`, a full-avalanche mix unrelated to the Fibonacci
//!   product: reusing the shard bits would crowd a shard's keys together.
//!
//! Reading without a lock (a seqlock per shard):
//! - the writer takes the shard lock, makes the sequence number odd, writes
//!   (every word an atomic, stored with `Release`), and makes it even again
//!   when its [`ShardWrite`] drops;
//! - a reader loads the sequence number (`Acquire`), refuses an odd one,
//!   reads with `Acquire` loads, and accepts what it read only if the
//!   number is unchanged afterwards; otherwise it reads again under the
//!   lock. A reader writes no shared line, so readers on many cores do not
//!   pass lock words between them, and a writer never waits for readers;
//! - a read that saw a torn state is discarded, and the structures it
//!   walks stay memory-safe whatever it sees (`array.rs`, `table.rs`).

use crossbeam_utils::CachePadded;

use crate::bitmap::HostBitmap;
use crate::holders::{Holders, Slab, SlabMut, SlabRead, SlabState};
use crate::seqlock::{SeqGuard, SeqLock};
use crate::sync::Guard;
use crate::table::{BlockMap, MapMut, MapState};

const FIBONACCI: u64 = router_core::GOLDEN_GAMMA;

/// The shard of a block hash among `1 << bits` shards.
#[inline]
pub(crate) fn shard_of(hash: u64, bits: u32) -> usize {
    debug_assert!(bits < 64, "at most 2^63 shards");
    // Two shifts, so that 0 bits (one shard) needs no branch.
    (hash.wrapping_mul(FIBONACCI) >> 1 >> (63 - bits)) as usize
}

/// The writer's state of one shard, behind its lock.
#[derive(Debug, Default)]
pub(crate) struct ShardState {
    map: MapState,
    slab: SlabState,
    /// Sum over entries of the pods holding them.
    pub(crate) residencies: u64,
}

/// A read begun by [`ShardCore::stage`], inside the guard `'g`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged<'g> {
    /// The sequence number read first (`None`: a writer was in).
    seq: Option<u64>,
    /// The entry, as read.
    holders: Option<Holders>,
    /// The slab array as the read saw it, for an entry that names a slab
    /// bitmap (else empty): [`ShardCore::finish`] reads the bitmap there
    /// rather than loading the slab's tag a second time. Loaded after the
    /// sequence number, so the read's validation covers it.
    slab: SlabRead<'g>,
}

impl Staged<'_> {
    /// No read: [`ShardCore::finish`] reports it raced.
    pub(crate) const NONE: Staged<'static> = Staged {
        seq: None,
        holders: None,
        slab: SlabRead::EMPTY,
    };
}

/// One shard: what readers see, and the lock its writers take.
#[derive(Debug, Default)]
pub(crate) struct ShardCore<const W: usize> {
    /// The writers' lock and the readers' version (`seqlock.rs`), which
    /// readers outside this module validate their reads against.
    pub(crate) lock: SeqLock<ShardState>,
    map: BlockMap,
    slab: Slab<W>,
}

pub(crate) type Shard<const W: usize> = CachePadded<ShardCore<W>>;

/// A shard open for writing: holds its lock, so its sequence number stays
/// odd until this drops.
#[derive(Debug)]
pub(crate) struct ShardWrite<'a, const W: usize> {
    core: &'a ShardCore<W>,
    guard: SeqGuard<'a, ShardState>,
}

impl<const W: usize> ShardCore<W> {
    /// Starts a write.
    #[inline]
    pub(crate) fn write(&self) -> ShardWrite<'_, W> {
        ShardWrite {
            core: self,
            guard: self.lock.lock(),
        }
    }

    /// Prefetches the shard's lock and array words, for a lookup of its map
    /// that will follow.
    #[inline]
    pub(crate) fn prefetch_header(&self) {
        let p = std::ptr::from_ref(self).cast::<u8>();
        crate::array::prefetch(p);
        crate::array::prefetch(p.wrapping_add(64));
    }

    /// Prefetches the cell line where the entry of the block whose hash
    /// mixes to `mixed` (`router_core::mix64`) lives (or would go). Reads
    /// the map's array word, so the header should be in cache.
    #[inline]
    pub(crate) fn prefetch_entry(&self, mixed: u64) {
        self.map.prefetch(mixed);
    }

    /// The pods among `cand` holding `hash`, and the block's run hint, read
    /// as they are now: exact in a validated read, else any value (never
    /// out of bounds).
    #[inline]
    pub(crate) fn look_unchecked(
        &self,
        guard: &Guard,
        hash: u64,
        cand: &HostBitmap<W>,
    ) -> (HostBitmap<W>, u16) {
        self.read_unchecked(guard, hash, |h, slab| h.and(slab, cand))
    }

    /// Every holder of `hash`, and its hint, read as
    /// [`ShardCore::look_unchecked`] reads.
    #[inline]
    pub(crate) fn entry_unchecked(&self, guard: &Guard, hash: u64) -> (HostBitmap<W>, u16) {
        self.read_unchecked(guard, hash, |h, slab| h.to_bitmap(slab))
    }

    /// `pods` of `hash`'s holders, and its hint; nothing for an absent block.
    #[inline]
    fn read_unchecked(
        &self,
        guard: &Guard,
        hash: u64,
        pods: impl FnOnce(Holders, &SlabRead<'_>) -> HostBitmap<W>,
    ) -> (HostBitmap<W>, u16) {
        match self.map.lookup(guard, hash) {
            Some(h) => (pods(h, &self.slab.read(guard)), h.hint()),
            None => (HostBitmap::EMPTY, 0),
        }
    }

    /// The first half of a read split in two, so that many blocks' reads
    /// can overlap their misses: the shard's sequence number and the
    /// block's entry, with its slab bitmap (if any) prefetched.
    /// [`ShardCore::finish`] completes it. `mixed` is the hash's
    /// `router_core::mix64`, computed once where a prefetch of its cell
    /// needed it too.
    #[inline]
    pub(crate) fn stage<'g>(&self, guard: &'g Guard, hash: u64, mixed: u64) -> Staged<'g> {
        let seq = self.lock.begin_read();
        let holders = self.map.lookup_mixed(guard, hash, mixed);
        let mut slab = SlabRead::EMPTY;
        if let Some(i) = holders.and_then(Holders::slab_index) {
            slab = self.slab.read(guard);
            slab.prefetch::<W>(i);
        }
        Staged { seq, holders, slab }
    }

    /// The pods among `cand` holding the staged block, and its hint, if
    /// the read held: `None` when a write raced it (the caller reads it
    /// again). Always inlined: out of line, its result came back through
    /// memory and its prologue saved six registers, a third of its cost
    /// (callgrind, W2 N=32 K=8).
    #[inline(always)]
    pub(crate) fn finish(
        &self,
        staged: Staged<'_>,
        cand: &HostBitmap<W>,
    ) -> Option<(HostBitmap<W>, u16)> {
        let seq = staged.seq?;
        let read = match staged.holders {
            Some(h) => (h.and(&staged.slab, cand), h.hint()),
            None => (HostBitmap::EMPTY, 0),
        };
        self.lock.still(seq).then_some(read)
    }

    /// Whether pod `slot` holds `hash`, and its hint, validated as
    /// [`ShardCore::look`] is: one pod's read, a bit test instead of a
    /// bitmap.
    #[inline(always)]
    pub(crate) fn holds(&self, guard: &Guard, hash: u64, slot: u16) -> (bool, u16) {
        let mut round = 0;
        loop {
            if let Some(s) = self.lock.begin_read() {
                let r = match self.map.lookup(guard, hash) {
                    Some(h) => (h.contains::<W>(&self.slab.read(guard), slot), h.hint()),
                    None => (false, 0),
                };
                if self.lock.still(s) {
                    return r;
                }
            }
            self.lock.wait_for_writer(&mut round);
        }
    }

    /// [`ShardCore::look_unchecked`], validated: tried again while writes
    /// race it.
    #[inline]
    pub(crate) fn look(
        &self,
        guard: &Guard,
        hash: u64,
        cand: &HostBitmap<W>,
    ) -> (HostBitmap<W>, u16) {
        let mut round = 0;
        loop {
            if let Some(s) = self.lock.begin_read() {
                let r = self.look_unchecked(guard, hash, cand);
                if self.lock.still(s) {
                    return r;
                }
            }
            self.lock.wait_for_writer(&mut round);
        }
    }
}

impl<const W: usize> ShardWrite<'_, W> {
    /// The map, the slab and the residency count, for changing.
    #[inline]
    pub(crate) fn parts(&mut self) -> (MapMut<'_>, SlabMut<'_, W>, &mut u64) {
        let ShardState {
            map,
            slab,
            residencies,
        } = self.guard.state();
        (
            self.core.map.write(map),
            self.core.slab.write(slab),
            residencies,
        )
    }

    /// Makes the map's table large enough for `entries` entries without
    /// growing.
    pub(crate) fn reserve(&mut self, entries: usize) {
        let (mut map, _, _) = self.parts();
        map.reserve(entries);
    }

    /// Entries.
    pub(crate) fn entries(&mut self) -> usize {
        let core = self.core;
        core.map.len(&self.guard.state().map)
    }

    /// Slab bitmaps in use.
    pub(crate) fn bitmaps_live(&mut self) -> usize {
        let core = self.core;
        core.slab.live(&self.guard.state().slab)
    }

    /// Bytes allocated by the shard's map and slab.
    pub(crate) fn bytes(&mut self) -> usize {
        let core = self.core;
        let st = self.guard.state();
        core.map.bytes(&st.map) + core.slab.bytes(&st.slab)
    }

    /// The sum over entries of the pods holding them.
    pub(crate) fn residencies(&mut self) -> u64 {
        self.guard.state().residencies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_keys_spread_over_shards() {
        let mut counts = [0usize; 256];
        for k in 0..256 * 64u64 {
            counts[shard_of(k, 8)] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min >= 32 && *max <= 96, "min {min} max {max}");
        assert_eq!(shard_of(12345, 0), 0);
    }
}
