//! The in-shard block map: block hash -> [`Holders`], by linear probing
//! over one array of 16-byte slots.
//!
//! Why not hashbrown: a hashbrown lookup reads a control-byte group and
//! then the bucket, two lines in two arrays, and a cold probe pays both
//! misses one after the other. Here the key and its holders share a slot,
//! and the next slots share its line, so a cold lookup is one miss (plus
//! the slab bitmap for a block on more than four pods).
//!
//! Rules:
//! - the slot array's length is a power of two, and it grows (doubling)
//!   before its load passes 4/5, so every probe sequence meets an empty
//!   slot;
//! - key 0 marks an empty slot; the block hash 0 itself lives in a side
//!   slot of its own;
//! - a slot's home is `mix64(key) & mask` (`router_core::mix64`, unrelated
//!   to the Fibonacci product that picks the shard);
//! - removal shifts the following slots back (no tombstones), so a lookup
//!   can stop at the first empty slot.

use crate::holders::Holders;

/// An empty slot's key.
const EMPTY_KEY: u64 = 0;
/// The position of the side slot holding key 0.
const ZERO_AT: usize = usize::MAX;
/// The smallest array allocated.
const MIN_SLOTS: usize = 16;

/// Block hash -> holders, for one shard.
#[derive(Debug, Default)]
pub(crate) struct BlockMap {
    slots: Vec<(u64, Holders)>,
    /// The entry of block hash 0, if any.
    zero: Option<Holders>,
    /// Entries in `slots` (not counting `zero`).
    len: usize,
}

impl BlockMap {
    #[inline]
    fn home(&self, key: u64) -> usize {
        router_core::mix64(key) as usize & (self.slots.len() - 1)
    }

    /// The position of `key`'s entry.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        if key == EMPTY_KEY {
            return self.zero.map(|_| ZERO_AT);
        }
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY_KEY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The holders of `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&Holders> {
        match self.find(key)? {
            ZERO_AT => self.zero.as_ref(),
            i => Some(&self.slots[i].1),
        }
    }

    /// The first empty slot from `key`'s home: where a key known to be
    /// absent goes.
    #[inline]
    fn vacancy(&self, key: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        while self.slots[i].0 != EMPTY_KEY {
            i = (i + 1) & mask;
        }
        i
    }

    /// The holders at a position [`BlockMap::find`] returned.
    #[inline]
    pub(crate) fn at_mut(&mut self, at: usize) -> &mut Holders {
        match at {
            ZERO_AT => self.zero.get_or_insert(Holders::EMPTY),
            i => &mut self.slots[i].1,
        }
    }

    /// The holders of `key`, mutable.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut Holders> {
        let at = self.find(key)?;
        Some(self.at_mut(at))
    }

    /// The holders of `key`, inserted as [`Holders::EMPTY`] if absent.
    pub(crate) fn get_or_insert(&mut self, key: u64) -> &mut Holders {
        if key == EMPTY_KEY {
            return self.zero.get_or_insert(Holders::EMPTY);
        }
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                break;
            }
            if k == EMPTY_KEY {
                self.slots[i] = (key, Holders::EMPTY);
                self.len += 1;
                break;
            }
            i = (i + 1) & mask;
        }
        &mut self.slots[i].1
    }

    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::take(&mut self.slots);
        self.place_all(n, old);
    }

    /// Places the entries of `old` in a new array of `n` slots.
    fn place_all(&mut self, n: usize, old: Vec<(u64, Holders)>) {
        self.slots = vec![(EMPTY_KEY, Holders::EMPTY); n];
        for (k, v) in old {
            if k != EMPTY_KEY {
                let i = self.vacancy(k);
                self.slots[i] = (k, v);
            }
        }
    }

    /// Removes the entry at a position [`BlockMap::find`] returned.
    pub(crate) fn remove_at(&mut self, at: usize) {
        if at == ZERO_AT {
            self.zero = None;
            return;
        }
        let mask = self.slots.len() - 1;
        let mut hole = at;
        let mut j = at;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY_KEY {
                break;
            }
            // Slot j may fill the hole unless its home lies cyclically in
            // (hole, j]: then a lookup from its home would never pass it.
            let home = self.home(k);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY_KEY, Holders::EMPTY);
        self.len -= 1;
    }

    /// Removes `key`'s entry, if any.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, key: u64) {
        if let Some(at) = self.find(key) {
            self.remove_at(at);
        }
    }

    /// Keeps the entries for which `keep` returns true (it may change them).
    /// A few departures are removed one by one (each shifting its run
    /// back); after many (a sweep may empty most of a shard) the survivors
    /// are placed again in the cleared array, which costs passes over the
    /// array rather than a shift per departure. The array keeps its size,
    /// as hashbrown's does.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &mut Holders) -> bool) {
        if let Some(h) = self.zero.as_mut()
            && !keep(EMPTY_KEY, h)
        {
            self.zero = None;
        }
        let mut gone: Vec<usize> = Vec::new();
        for (i, (k, h)) in self.slots.iter_mut().enumerate() {
            if *k != EMPTY_KEY && !keep(*k, h) {
                gone.push(i);
            }
        }
        if gone.len() * 8 < self.len {
            let keys: Vec<u64> = gone.iter().map(|&i| self.slots[i].0).collect();
            for k in keys {
                if let Some(at) = self.find(k) {
                    self.remove_at(at);
                }
            }
            return;
        }
        for &i in &gone {
            self.slots[i].0 = EMPTY_KEY;
        }
        // The survivors leave their slots (only an empty slot's key is
        // ever read), then go back in from their homes.
        let mut survivors: Vec<(u64, Holders)> = Vec::with_capacity(self.len - gone.len());
        for slot in self.slots.iter_mut().filter(|s| s.0 != EMPTY_KEY) {
            survivors.push(*slot);
            slot.0 = EMPTY_KEY;
        }
        self.len = survivors.len();
        for (k, v) in survivors {
            let i = self.vacancy(k);
            self.slots[i] = (k, v);
        }
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<(u64, Holders)>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::holders::Slab;

    /// Holders naming one slot, to tell values apart.
    fn value(slot: u16) -> Holders {
        let mut h = Holders::EMPTY;
        h.insert(&mut Slab::<1>::default(), slot % 64);
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
        // the side slot's key.
        let key = prop_oneof![0u64..64, Just(0u64), any::<u64>()];
        prop_oneof![
            4 => (key.clone(), any::<u16>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => key.clone().prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
            1 => key.prop_map(Op::RetainNot),
        ]
    }

    proptest! {
        /// Against std's HashMap, after every operation.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec(op(), 1..400)) {
            let mut m = BlockMap::default();
            let mut oracle: HashMap<u64, Holders> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        *m.get_or_insert(k) = value(v);
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
                for k in (0..64).chain(oracle.keys().copied()) {
                    prop_assert_eq!(m.get(k), oracle.get(&k));
                }
                prop_assert!(m.len() * 5 <= m.slots.len().max(1) * 4 + 5);
            }
        }
    }

    #[test]
    fn every_key_is_found_after_growth_and_removal_shifts() {
        let mut m = BlockMap::default();
        for k in 1..=10_000u64 {
            *m.get_or_insert(k) = value(k as u16);
        }
        assert_eq!(m.len(), 10_000);
        assert!(m.slots.len().is_power_of_two());
        for k in (1..=10_000u64).step_by(3) {
            m.remove(k);
        }
        for k in 1..=10_000u64 {
            let want = (k % 3 != 1).then(|| value(k as u16));
            assert_eq!(m.get(k).copied(), want, "key {k}");
        }
        assert_eq!(m.bytes(), m.slots.len() * 16);
    }
}
