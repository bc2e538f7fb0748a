//! The in-shard block map: block hash -> [`Holders`], by linear probing
//! over one array of 16-byte cells, which readers search without a lock.
//!
//! Why not hashbrown: a hashbrown lookup reads a control-byte group and
//! then the bucket, two lines in two arrays, and a cold probe pays both
//! misses one after the other. Here the key and its holders share a cell,
//! and the next cells share its line, so a cold lookup is one miss (plus
//! the slab bitmap for a block on more than four pods).
//!
//! Rules:
//! - the cell array's length is a power of two, and it grows (doubling)
//!   before its load passes 4/5, so every probe sequence meets an empty
//!   cell;
//! - key 0 marks an empty cell; the block hash 0 itself lives in a side
//!   word of its own;
//! - a cell's home is `mix64(key) & mask` (`router_core::mix64`, unrelated
//!   to the Fibonacci product that picks the shard);
//! - removal shifts the following cells back (no tombstones), so a lookup
//!   can stop at the first empty cell;
//! - every word is an atomic ([`crate::array`]): the shard's writer changes
//!   them under the shard lock, and a reader's lookup ([`BlockMap::lookup`])
//!   may see a half-made change, which the shard's sequence number then
//!   rejects (`shard.rs`). A lookup therefore stops after one pass over the
//!   array whatever it reads, and never indexes past it.

use crate::array::{Bin, Line, Lines, WORDS};
use crate::holders::Holders;
use crate::sync::{AtomicU64, Guard, Ordering};

/// An empty cell's key.
const EMPTY_KEY: u64 = 0;
/// The position of the side word holding key 0.
const ZERO_AT: usize = usize::MAX;
/// The side word's value while key 0 is absent. No holders encode to 0:
/// four lanes naming the same slot never occur.
const ABSENT: u64 = 0;
/// Cells per line.
const CELLS: usize = WORDS / 2;
/// The smallest array allocated, in lines (16 cells).
const MIN_LINES: usize = 4;

/// Block hash -> holders, for one shard: the words readers see.
#[derive(Debug, Default)]
pub(crate) struct BlockMap {
    lines: Lines,
    zero: AtomicU64,
}

/// The writer's side of a [`BlockMap`], behind the shard lock.
#[derive(Debug, Default)]
pub(crate) struct MapState {
    /// Entries in the array (not counting key 0).
    len: usize,
    bin: Bin,
}

/// The key and holders words of cell `i`.
#[inline]
fn cell(lines: &[Line], i: usize) -> (&AtomicU64, &AtomicU64) {
    let w = &lines[i / CELLS].0;
    let j = (i % CELLS) * 2;
    (&w[j], &w[j + 1])
}

/// Whether `entries` entries keep a table of `cells` cells within the load
/// bound (4/5), which both growth and [`MapMut::reserve`] size by.
#[inline]
fn within_load(entries: usize, cells: usize) -> bool {
    entries.saturating_mul(5) <= cells.saturating_mul(4)
}

#[inline]
fn home(key: u64, cells: usize) -> usize {
    home_mixed(router_core::mix64(key), cells)
}

/// [`home`], given `mixed`, the key's `mix64`.
#[inline]
fn home_mixed(mixed: u64, cells: usize) -> usize {
    mixed as usize & (cells - 1)
}

/// The cell holding `key` (not 0), searching at most one pass.
#[inline]
fn find_in(lines: &[Line], key: u64) -> Option<usize> {
    find_mixed(lines, key, router_core::mix64(key))
}

/// [`find_in`], given `mixed`, the key's `mix64`.
#[inline]
fn find_mixed(lines: &[Line], key: u64, mixed: u64) -> Option<usize> {
    let cells = lines.len() * CELLS;
    if cells == 0 {
        return None;
    }
    let mut i = home_mixed(mixed, cells);
    for _ in 0..cells {
        let k = cell(lines, i).0.load(Ordering::Acquire);
        if k == key {
            return Some(i);
        }
        if k == EMPTY_KEY {
            return None;
        }
        i = (i + 1) & (cells - 1);
    }
    None
}

/// The first empty cell from `key`'s home: where a key known to be absent
/// goes (the writer's view: the load bound guarantees one).
fn vacancy(lines: &[Line], key: u64) -> usize {
    let cells = lines.len() * CELLS;
    let mut i = home(key, cells);
    while cell(lines, i).0.load(Ordering::Relaxed) != EMPTY_KEY {
        i = (i + 1) & (cells - 1);
    }
    i
}

#[inline]
fn put(lines: &[Line], i: usize, key: u64, h: Holders) {
    let (k, v) = cell(lines, i);
    // Holders before key: a reader that sees the key sees its holders, or
    // a sequence number that rejects what it read.
    v.store(h.raw(), Ordering::Release);
    k.store(key, Ordering::Release);
}

impl BlockMap {
    /// The holders of `key`, as a reader sees them: exact unless a write
    /// raced, which the caller's sequence check detects.
    #[inline]
    pub(crate) fn lookup(&self, guard: &Guard, key: u64) -> Option<Holders> {
        self.lookup_mixed(guard, key, router_core::mix64(key))
    }

    /// [`BlockMap::lookup`], given `mixed`, the key's `mix64` (which a
    /// prefetch of its cell computed already).
    #[inline]
    pub(crate) fn lookup_mixed(&self, guard: &Guard, key: u64, mixed: u64) -> Option<Holders> {
        if key == EMPTY_KEY {
            let z = self.zero.load(Ordering::Acquire);
            return (z != ABSENT).then_some(Holders::from_raw(z));
        }
        let lines = self.lines.load(guard);
        let i = find_mixed(lines, key, mixed)?;
        Some(Holders::from_raw(cell(lines, i).1.load(Ordering::Acquire)))
    }

    /// Prefetches the line of the home cell of the key whose `mix64` is
    /// `mixed`, for a lookup or an insert that will follow.
    #[inline]
    pub(crate) fn prefetch(&self, mixed: u64) {
        self.lines
            .prefetch_line(|lines| home_mixed(mixed, lines * CELLS) / CELLS);
    }

    /// The writer's view, for the holder of the shard lock and its state.
    pub(crate) fn write<'a>(&'a self, st: &'a mut MapState) -> MapMut<'a> {
        MapMut { map: self, st }
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self, st: &MapState) -> usize {
        std::mem::size_of_val(self.lines.locked(&st.bin))
    }

    /// Entries.
    pub(crate) fn len(&self, st: &MapState) -> usize {
        st.len + usize::from(self.zero.load(Ordering::Relaxed) != ABSENT)
    }
}

/// A [`BlockMap`] open for writing: only under the shard lock.
#[derive(Debug)]
pub(crate) struct MapMut<'a> {
    map: &'a BlockMap,
    st: &'a mut MapState,
}

impl MapMut<'_> {
    #[inline]
    fn lines(&self) -> &[Line] {
        self.map.lines.locked(&self.st.bin)
    }

    /// The position of `key`'s entry.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        if key == EMPTY_KEY {
            return (self.map.zero.load(Ordering::Relaxed) != ABSENT).then_some(ZERO_AT);
        }
        find_in(self.lines(), key)
    }

    /// The holders at a position [`MapMut::find`] or [`MapMut::insert`]
    /// returned.
    #[inline]
    pub(crate) fn get(&self, at: usize) -> Holders {
        let w = match at {
            ZERO_AT => &self.map.zero,
            i => cell(self.lines(), i).1,
        };
        Holders::from_raw(w.load(Ordering::Relaxed))
    }

    /// The holders of `key`.
    #[cfg(test)]
    pub(crate) fn get_key(&self, key: u64) -> Option<Holders> {
        self.find(key).map(|at| self.get(at))
    }

    /// Sets the holders at a position of an entry.
    #[inline]
    pub(crate) fn set(&mut self, at: usize, h: Holders) {
        let w = match at {
            ZERO_AT => &self.map.zero,
            i => cell(self.lines(), i).1,
        };
        w.store(h.raw(), Ordering::Release);
    }

    /// The position of `key`'s entry, inserted as [`Holders::EMPTY`] if
    /// absent.
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: u64) -> usize {
        if key == EMPTY_KEY {
            if self.map.zero.load(Ordering::Relaxed) == ABSENT {
                self.map.zero.store(Holders::EMPTY.raw(), Ordering::Release);
            }
            return ZERO_AT;
        }
        if !within_load(self.st.len + 1, self.lines().len() * CELLS) {
            self.grow();
        }
        let lines = self.lines();
        let cells = lines.len() * CELLS;
        let mut i = home(key, cells);
        loop {
            let k = cell(lines, i).0.load(Ordering::Relaxed);
            if k == key {
                return i;
            }
            if k == EMPTY_KEY {
                put(lines, i, key, Holders::EMPTY);
                self.st.len += 1;
                return i;
            }
            i = (i + 1) & (cells - 1);
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        self.resize((self.lines().len() * 2).max(MIN_LINES));
    }

    /// Makes the table large enough for `entries` entries (the zero key's
    /// side word aside) without passing the load bound: a table of the
    /// size growth would have reached.
    pub(crate) fn reserve(&mut self, entries: usize) {
        let mut lines = MIN_LINES;
        while !within_load(entries, lines * CELLS) {
            lines *= 2;
        }
        if lines > self.lines().len() {
            self.resize(lines);
        }
    }

    /// Moves every entry into a new table of `n` lines (a power of two,
    /// with room for them all under the load bound).
    fn resize(&mut self, n: usize) {
        self.map.lines.replace(&mut self.st.bin, n, |old, new| {
            for i in 0..old.len() * CELLS {
                let (k, v) = cell(old, i);
                let k = k.load(Ordering::Relaxed);
                if k != EMPTY_KEY {
                    let h = Holders::from_raw(v.load(Ordering::Relaxed));
                    put(new, vacancy(new, k), k, h);
                }
            }
        });
    }

    /// Removes the entry at a position [`MapMut::find`] returned.
    pub(crate) fn remove_at(&mut self, at: usize) {
        if at == ZERO_AT {
            self.map.zero.store(ABSENT, Ordering::Release);
            return;
        }
        let lines = self.lines();
        let cells = lines.len() * CELLS;
        let mask = cells - 1;
        let mut hole = at;
        let mut j = at;
        loop {
            j = (j + 1) & mask;
            let k = cell(lines, j).0.load(Ordering::Relaxed);
            if k == EMPTY_KEY {
                break;
            }
            // Cell j may fill the hole unless its home lies cyclically in
            // (hole, j]: then a lookup from its home would never pass it.
            let h = home(k, cells);
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                let v = Holders::from_raw(cell(lines, j).1.load(Ordering::Relaxed));
                put(lines, hole, k, v);
                hole = j;
            }
        }
        cell(lines, hole).0.store(EMPTY_KEY, Ordering::Release);
        self.st.len -= 1;
    }

    /// Removes `key`'s entry, if any.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, key: u64) {
        if let Some(at) = self.find(key) {
            self.remove_at(at);
        }
    }

    /// Keeps the entries for which `keep` returns true (it may change
    /// them). A few departures are removed one by one (each shifting its
    /// run back); after many (a sweep may empty most of a shard) the
    /// survivors are placed again in the cleared array, which costs passes
    /// over the array rather than a shift per departure. The array keeps
    /// its size, as hashbrown's does.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &mut Holders) -> bool) {
        let z = self.map.zero.load(Ordering::Relaxed);
        if z != ABSENT {
            let mut h = Holders::from_raw(z);
            let kept = keep(EMPTY_KEY, &mut h);
            let z = if kept { h.raw() } else { ABSENT };
            self.map.zero.store(z, Ordering::Release);
        }
        let lines = self.lines();
        let cells = lines.len() * CELLS;
        let mut gone: Vec<usize> = Vec::new();
        for i in 0..cells {
            let (k, v) = cell(lines, i);
            let key = k.load(Ordering::Relaxed);
            if key == EMPTY_KEY {
                continue;
            }
            let mut h = Holders::from_raw(v.load(Ordering::Relaxed));
            if keep(key, &mut h) {
                v.store(h.raw(), Ordering::Release);
            } else {
                gone.push(i);
            }
        }
        if gone.len() * 8 < self.st.len {
            let keys: Vec<u64> = gone
                .iter()
                .map(|&i| cell(lines, i).0.load(Ordering::Relaxed))
                .collect();
            for k in keys {
                if let Some(at) = self.find(k) {
                    self.remove_at(at);
                }
            }
            return;
        }
        for &i in &gone {
            cell(lines, i).0.store(EMPTY_KEY, Ordering::Release);
        }
        // The survivors leave their cells, then go back in from their
        // homes.
        let mut survivors: Vec<(u64, Holders)> = Vec::with_capacity(self.st.len - gone.len());
        for i in 0..cells {
            let (k, v) = cell(lines, i);
            let key = k.load(Ordering::Relaxed);
            if key != EMPTY_KEY {
                survivors.push((key, Holders::from_raw(v.load(Ordering::Relaxed))));
                k.store(EMPTY_KEY, Ordering::Release);
            }
        }
        let kept = survivors.len();
        for (k, v) in survivors {
            put(lines, vacancy(lines, k), k, v);
        }
        self.st.len = kept;
    }

    /// Entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len(self.st)
    }

    /// Cells in the array.
    #[cfg(test)]
    fn cells(&self) -> usize {
        self.lines().len() * CELLS
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::holders::{Slab, SlabState};

    /// Holders naming one slot, to tell values apart.
    fn value(slot: u16) -> Holders {
        let (slab, mut st) = (Slab::<1>::default(), SlabState::default());
        let mut h = Holders::EMPTY;
        h.insert(&mut slab.write(&mut st), slot % 64);
        h
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u16),
        Remove(u64),
        RetainOdd,
        /// Drops one key through `retain` (its few-departures path).
        RetainNot(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so removals hit and probe runs collide; 0 is
        // the side word's key.
        let key = prop_oneof![0u64..64, Just(0u64), any::<u64>()];
        prop_oneof![
            4 => (key.clone(), any::<u16>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => key.clone().prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
            1 => key.prop_map(Op::RetainNot),
        ]
    }

    proptest! {
        /// Against std's HashMap, after every operation, through both the
        /// writer's view and a reader's lookup.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec(op(), 1..400)) {
            let (map, mut st) = (BlockMap::default(), MapState::default());
            let mut oracle: HashMap<u64, Holders> = HashMap::new();
            for op in ops {
                let mut m = map.write(&mut st);
                match op {
                    Op::Insert(k, v) => {
                        let at = m.insert(k);
                        m.set(at, value(v));
                        oracle.insert(k, value(v));
                    }
                    Op::Remove(k) => {
                        m.remove(k);
                        oracle.remove(&k);
                    }
                    Op::RetainOdd => {
                        m.retain(|k, _| k % 2 == 1);
                        oracle.retain(|k, _| k % 2 == 1);
                    }
                    Op::RetainNot(x) => {
                        m.retain(|k, _| k != x);
                        oracle.retain(|k, _| *k != x);
                    }
                }
                prop_assert_eq!(m.len(), oracle.len());
                prop_assert!(m.len() * 5 <= m.cells().max(1) * 4 + 5);
                let guard = crate::sync::pin();
                for k in (0..64).chain(oracle.keys().copied()) {
                    prop_assert_eq!(m.get_key(k), oracle.get(&k).copied());
                    prop_assert_eq!(map.lookup(&guard, k), oracle.get(&k).copied());
                }
            }
        }
    }

    #[test]
    fn every_key_is_found_after_growth_and_removal_shifts() {
        let (map, mut st) = (BlockMap::default(), MapState::default());
        let mut m = map.write(&mut st);
        for k in 1..=10_000u64 {
            let at = m.insert(k);
            m.set(at, value(k as u16));
        }
        assert_eq!(m.len(), 10_000);
        assert!(m.cells().is_power_of_two());
        for k in (1..=10_000u64).step_by(3) {
            m.remove(k);
        }
        let cells = m.cells();
        let guard = crate::sync::pin();
        for k in 1..=10_000u64 {
            let want = (k % 3 != 1).then(|| value(k as u16));
            assert_eq!(map.lookup(&guard, k), want, "key {k}");
        }
        assert_eq!(map.bytes(&st), cells * 16);
    }
}
