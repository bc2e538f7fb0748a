//! One shard: a hash table from block hash to [`Holders`] that readers
//! search without a lock and without writing shared memory.
//!
//! # Why not a `RwLock<HashMap>`
//!
//! A prefix query makes `O(K log N)` probes, each in some shard. With a
//! reader-writer lock every probe pays two atomic read-modify-writes on the
//! lock word (about 70% of a probe's time when measured), and readers of a
//! hot shard bounce its lock line between cores while writers run. Here a
//! probe is a **seqlock read**: load the shard's sequence number, search,
//! load it again; retry if a writer ran in between. Readers write nothing.
//!
//! # Layout
//!
//! - Buckets of 7 `(key, value)` slots plus an overflow link, 128 bytes,
//!   cache-line aligned. Value 0 marks a vacant slot (a live [`Holders`] is
//!   never 0).
//! - Linear hashing (Litwin): the table grows one bucket at a time by
//!   splitting bucket `split` into itself and `split + 2^level`, so growth
//!   never rehashes the whole shard and never moves a bucket.
//! - Buckets, overflow buckets and slab bitmaps live in [`Pool`]s whose
//!   chunks never move, so a reader racing a writer may read stale or torn
//!   values (then the sequence check sends it round again) but never freed
//!   memory. Everything a reader loads is an atomic: there is no data race.
//! - Writers serialise on the shard's mutex and make the sequence number odd
//!   while they change anything; long passes (sweeps) let readers in every
//!   few buckets.

use std::fmt;

use crate::bitmap::HostBitmap;
use crate::holders::{Holders, Slab, SlabAlloc, SlabStore};
use crate::pool::Pool;
use crate::shard::mix;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, fence, spin};

const SLOTS: usize = 7;
/// Split when entries exceed 3/4 of the slots.
const LOAD_NUM: u64 = 3;
const LOAD_DEN: u64 = 4;
/// A consistent overflow chain is never this long; a longer walk can only
/// be a torn read, which the sequence check discards.
const MAX_CHAIN: usize = 1 << 16;
/// Buckets a long pass (sweep, clear) handles before letting readers in.
const PASS_STRIDE: usize = 64;

/// A key and its holders side by side: a probe reads one line for both.
struct Entry {
    key: AtomicU64,
    val: AtomicU64,
}

#[repr(align(64))]
struct Bucket {
    slots: [Entry; SLOTS],
    /// Overflow bucket id + 1, or 0.
    next: AtomicU64,
}

fn bucket() -> Bucket {
    Bucket {
        slots: std::array::from_fn(|_| Entry {
            key: AtomicU64::new(0),
            val: AtomicU64::new(0),
        }),
        next: AtomicU64::new(0),
    }
}

impl Bucket {
    fn clear(&self) {
        for e in &self.slots {
            e.val.store(0, Ordering::Relaxed);
        }
        self.next.store(0, Ordering::Relaxed);
    }
}

/// Where an entry sits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loc {
    overflow: bool,
    id: u32,
    slot: usize,
}

/// Writer-side bookkeeping, behind the shard's mutex.
#[derive(Debug, Default)]
pub(crate) struct WriterState {
    /// Blocks in the shard.
    pub(crate) entries: u64,
    /// (block, pod) pairs in the shard.
    pub(crate) residencies: u64,
    overflow_free: Vec<u32>,
    overflow_next: u32,
    slab: SlabAlloc,
}

impl WriterState {
    /// Slab bitmaps in use.
    pub(crate) fn bitmaps(&self) -> usize {
        self.slab.live()
    }
}

/// One shard of the block map.
pub(crate) struct Shard<const W: usize> {
    seq: AtomicU64,
    /// `level << 32 | split`: the table has `2^level + split` buckets.
    level: AtomicU64,
    main: Pool<Bucket>,
    overflow: Pool<Bucket>,
    slab: SlabStore<W>,
    writer: Mutex<WriterState>,
}

impl<const W: usize> fmt::Debug for Shard<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<const W: usize> Default for Shard<W> {
    fn default() -> Self {
        #[cfg(not(router_loom))]
        let (main, overflow) = (Pool::new(0), Pool::new(0));
        #[cfg(router_loom)]
        let (main, overflow) = (
            Pool::with_chunks(0, 3, bucket),
            Pool::with_chunks(0, 3, bucket),
        );
        main.ensure(0, bucket);
        Shard {
            seq: AtomicU64::new(0),
            level: AtomicU64::new(0),
            main,
            overflow,
            slab: SlabStore::default(),
            writer: Mutex::new(WriterState::default()),
        }
    }
}

#[inline]
fn bucket_of(level: u64, hash: u64) -> u32 {
    let (l, split) = (level >> 32, level as u32 as u64);
    let b = hash & ((1u64 << l) - 1);
    let b = if b < split {
        hash & ((1u64 << (l + 1)) - 1)
    } else {
        b
    };
    b as u32
}

impl<const W: usize> Shard<W> {
    /// Runs `f` as a seqlock read: again and again until no writer ran
    /// during it. `f` must tolerate torn state (it only loads atomics).
    #[inline]
    fn read<R>(&self, f: impl Fn() -> R) -> R {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let r = f();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return r;
                }
            }
            spin();
        }
    }

    /// The raw holders of `key`, if present (no consistency guarantee).
    #[inline]
    fn lookup(&self, key: u64, hash: u64) -> Option<u64> {
        let b = bucket_of(self.level.load(Ordering::Relaxed), hash);
        let mut bucket = self.main.get(b)?;
        for _ in 0..MAX_CHAIN {
            for e in &bucket.slots {
                // Vacant slots keep stale keys, so a key match still needs
                // a live value.
                if e.key.load(Ordering::Relaxed) == key {
                    let v = e.val.load(Ordering::Relaxed);
                    if v != 0 {
                        return Some(v);
                    }
                }
            }
            let next = bucket.next.load(Ordering::Relaxed);
            if next == 0 {
                return None;
            }
            bucket = self.overflow.get((next - 1) as u32)?;
        }
        None
    }

    /// The pods among `candidates` holding `key`: one consistent probe.
    #[inline]
    pub(crate) fn probe(&self, key: u64, candidates: &HostBitmap<W>) -> HostBitmap<W> {
        let hash = mix(key);
        self.read(|| match self.lookup(key, hash) {
            Some(v) => Holders::from_raw(v).and(&self.slab, candidates),
            None => HostBitmap::EMPTY,
        })
    }

    /// Starts a write: takes the shard's mutex and shuts readers out until
    /// the guard drops.
    pub(crate) fn write(&self) -> WriteGuard<'_, W> {
        let state = self.writer.lock();
        let guard = WriteGuard { shard: self, state };
        guard.begin();
        guard
    }

    /// Bytes allocated by the shard.
    pub(crate) fn bytes(&self) -> usize {
        self.main.bytes() + self.overflow.bytes() + self.slab.bytes()
    }
}

/// An exclusive write session on one shard.
pub(crate) struct WriteGuard<'a, const W: usize> {
    shard: &'a Shard<W>,
    state: MutexGuard<'a, WriterState>,
}

impl<const W: usize> Drop for WriteGuard<'_, W> {
    fn drop(&mut self) {
        self.end();
    }
}

impl<'a, const W: usize> WriteGuard<'a, W> {
    fn begin(&self) {
        let s = self.shard.seq.load(Ordering::Relaxed);
        self.shard.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn end(&self) {
        let s = self.shard.seq.load(Ordering::Relaxed);
        self.shard.seq.store(s + 1, Ordering::Release);
    }

    /// Lets waiting readers through mid-pass (the state is consistent).
    fn let_readers_in(&self) {
        self.end();
        self.begin();
    }

    /// The writer's bookkeeping.
    pub(crate) fn state(&mut self) -> &mut WriterState {
        &mut self.state
    }

    fn bucket(&self, overflow: bool, id: u32) -> Option<&'a Bucket> {
        if overflow {
            self.shard.overflow.get(id)
        } else {
            self.shard.main.get(id)
        }
    }

    /// Walks the chain of main bucket `b`, calling `f(overflow, id, bucket)`
    /// until it returns `Some`.
    fn walk<R>(&self, b: u32, mut f: impl FnMut(bool, u32, &'a Bucket) -> Option<R>) -> Option<R> {
        let (mut overflow, mut id) = (false, b);
        loop {
            let bucket = self.bucket(overflow, id)?;
            if let Some(r) = f(overflow, id, bucket) {
                return Some(r);
            }
            let next = bucket.next.load(Ordering::Relaxed);
            if next == 0 {
                return None;
            }
            (overflow, id) = (true, (next - 1) as u32);
        }
    }

    /// Where `key` sits.
    fn find(&self, key: u64) -> Option<Loc> {
        self.find_or_vacant(key).0
    }

    /// Where `key` sits, or else the first vacant slot of its chain, in one walk.
    fn find_or_vacant(&self, key: u64) -> (Option<Loc>, Option<Loc>) {
        let b = bucket_of(self.shard.level.load(Ordering::Relaxed), mix(key));
        let mut vacant = None;
        let found = self.walk(b, |overflow, id, bucket| {
            for (slot, e) in bucket.slots.iter().enumerate() {
                let live = e.val.load(Ordering::Relaxed) != 0;
                if live && e.key.load(Ordering::Relaxed) == key {
                    return Some(Loc { overflow, id, slot });
                }
                if !live && vacant.is_none() {
                    vacant = Some(Loc { overflow, id, slot });
                }
            }
            None
        });
        (found, vacant)
    }

    /// The holders at `loc`.
    fn get(&self, loc: Loc) -> Holders {
        let v = self
            .bucket(loc.overflow, loc.id)
            .map_or(0, |b| b.slots[loc.slot].val.load(Ordering::Relaxed));
        Holders::from_raw(v)
    }

    /// Replaces the holders at `loc`; empty holders remove the entry.
    fn set(&mut self, loc: Loc, holders: Holders) {
        if let Some(b) = self.bucket(loc.overflow, loc.id) {
            if holders.is_empty() {
                b.slots[loc.slot].val.store(0, Ordering::Relaxed);
                self.state.entries -= 1;
            } else {
                b.slots[loc.slot]
                    .val
                    .store(holders.raw(), Ordering::Relaxed);
            }
        }
    }

    /// Adds an entry for a key that is not present (empty holders are not
    /// stored), into `vacant` when the caller found one on its walk.
    fn insert(&mut self, key: u64, holders: Holders, vacant: Option<Loc>) {
        if holders.is_empty() {
            return;
        }
        match vacant.and_then(|l| self.bucket(l.overflow, l.id).map(|b| (b, l.slot))) {
            Some((b, slot)) => {
                b.slots[slot].key.store(key, Ordering::Relaxed);
                b.slots[slot].val.store(holders.raw(), Ordering::Relaxed);
            }
            None => self.place(key, holders.raw()),
        }
        self.state.entries += 1;
        let level = self.shard.level.load(Ordering::Relaxed);
        let buckets = (1u64 << (level >> 32)) + (level as u32 as u64);
        if self.state.entries * LOAD_DEN > buckets * SLOTS as u64 * LOAD_NUM {
            self.split();
        }
    }

    /// Writes `(key, raw)` into a vacant slot of its chain, growing the
    /// chain by an overflow bucket when it is full.
    fn place(&mut self, key: u64, raw: u64) {
        let b = bucket_of(self.shard.level.load(Ordering::Relaxed), mix(key));
        let mut last = None;
        let spot = self.walk(b, |_, _, bucket| {
            last = Some(bucket);
            (0..SLOTS)
                .find(|&i| bucket.slots[i].val.load(Ordering::Relaxed) == 0)
                .map(|i| (bucket, i))
        });
        let (bucket, i) = match spot {
            Some(s) => s,
            None => {
                let id = self.alloc_overflow();
                let Some(fresh) = self.shard.overflow.get(id) else {
                    // Past 2^40 buckets: cannot happen before memory runs out.
                    return;
                };
                if let Some(last) = last {
                    last.next.store(id as u64 + 1, Ordering::Relaxed);
                }
                (fresh, 0)
            }
        };
        bucket.slots[i].key.store(key, Ordering::Relaxed);
        bucket.slots[i].val.store(raw, Ordering::Relaxed);
    }

    fn alloc_overflow(&mut self) -> u32 {
        let id = match self.state.overflow_free.pop() {
            Some(id) => id,
            None => {
                let id = self.state.overflow_next;
                self.state.overflow_next += 1;
                self.shard.overflow.ensure(id, bucket);
                id
            }
        };
        if let Some(b) = self.shard.overflow.get(id) {
            b.clear();
        }
        id
    }

    /// Linear hashing: splits bucket `split` into itself and `split + 2^level`.
    fn split(&mut self) {
        let level = self.shard.level.load(Ordering::Relaxed);
        let (l, split) = (level >> 32, level as u32 as u64);
        let new_id = ((1u64 << l) + split) as u32;
        if !self.shard.main.ensure(new_id, bucket) {
            return;
        }
        if let Some(b) = self.shard.main.get(new_id) {
            b.clear();
        }
        // Take every entry of the old chain out, free its overflow buckets.
        let mut moved = Vec::new();
        let mut freed = Vec::new();
        self.walk::<()>(split as u32, |overflow, id, bucket| {
            for e in &bucket.slots {
                let v = e.val.load(Ordering::Relaxed);
                if v != 0 {
                    moved.push((e.key.load(Ordering::Relaxed), v));
                }
            }
            if overflow {
                freed.push(id);
            }
            None
        });
        if let Some(head) = self.shard.main.get(split as u32) {
            head.clear();
        }
        for id in freed {
            self.state.overflow_free.push(id);
        }
        let next = if split + 1 == 1u64 << l {
            (l + 1) << 32
        } else {
            l << 32 | (split + 1)
        };
        self.shard.level.store(next, Ordering::Relaxed);
        for (key, raw) in moved {
            self.place(key, raw);
        }
    }

    /// Adds `slot` to the holders of `key`; returns whether it was absent.
    pub(crate) fn add(&mut self, key: u64, slot: u16) -> bool {
        let (found, vacant) = self.find_or_vacant(key);
        let newly = match found {
            Some(loc) => {
                let mut h = self.get(loc);
                let newly = h.insert(&mut self.slab(), slot);
                if newly {
                    self.set(loc, h);
                }
                newly
            }
            None => {
                let mut h = Holders::EMPTY;
                h.insert(&mut self.slab(), slot);
                self.insert(key, h, vacant);
                true
            }
        };
        if newly {
            self.state.residencies += 1;
        }
        newly
    }

    /// Whether `slot` holds `key`.
    pub(crate) fn holds(&self, key: u64, slot: u16) -> bool {
        self.find(key)
            .is_some_and(|loc| self.get(loc).contains(&self.shard.slab, slot))
    }

    /// Removes `slot` from the holders of `key`; returns whether it was there.
    pub(crate) fn drop_holder(&mut self, key: u64, slot: u16) -> bool {
        let Some(loc) = self.find(key) else {
            return false;
        };
        let mut h = self.get(loc);
        let was = h.remove(&mut self.slab(), slot);
        if was {
            self.set(loc, h);
            self.state.residencies -= 1;
        }
        was
    }

    /// A slab view for changing holders.
    fn slab(&mut self) -> Slab<'_, W> {
        Slab::new(&self.shard.slab, &mut self.state.slab)
    }

    /// Removes the pods of `mask` from every entry, dropping emptied ones;
    /// returns the (block, pod) pairs removed. Readers get in every few
    /// buckets, so a long pass does not stall queries of the shard.
    pub(crate) fn strip(&mut self, mask: &HostBitmap<W>) -> u64 {
        let level = self.shard.level.load(Ordering::Relaxed);
        let buckets = ((1u64 << (level >> 32)) + (level as u32 as u64)) as u32;
        let mut removed = 0u64;
        let mut emptied = 0u64;
        for b in 0..buckets {
            let WriterState { slab: alloc, .. } = &mut *self.state;
            let mut slab = Slab::new(&self.shard.slab, alloc);
            let shard = self.shard;
            let (mut overflow, mut id) = (false, b);
            loop {
                let bucket = if overflow {
                    shard.overflow.get(id)
                } else {
                    shard.main.get(id)
                };
                let Some(bucket) = bucket else { break };
                for e in &bucket.slots {
                    let v = e.val.load(Ordering::Relaxed);
                    if v == 0 {
                        continue;
                    }
                    let mut h = Holders::from_raw(v);
                    let n = h.remove_mask(&mut slab, mask);
                    if n > 0 {
                        removed += n as u64;
                        if h.is_empty() {
                            e.val.store(0, Ordering::Relaxed);
                            emptied += 1;
                        } else {
                            e.val.store(h.raw(), Ordering::Relaxed);
                        }
                    }
                }
                let next = bucket.next.load(Ordering::Relaxed);
                if next == 0 {
                    break;
                }
                (overflow, id) = (true, (next - 1) as u32);
            }
            if b as usize % PASS_STRIDE == PASS_STRIDE - 1 {
                self.let_readers_in();
            }
        }
        self.state.entries -= emptied;
        self.state.residencies -= removed;
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_splitting_and_finds_every_key() {
        let shard = Shard::<4>::default();
        let n = 20_000u64;
        {
            let mut w = shard.write();
            for k in 0..n {
                w.add(k, (k % 7) as u16);
            }
            assert_eq!(w.state().entries, n);
        }
        let all = HostBitmap::<4>::from_words([u64::MAX; 4]);
        for k in 0..n {
            assert_eq!(
                shard.probe(k, &all),
                HostBitmap::single((k % 7) as usize),
                "key {k}"
            );
        }
        assert!(shard.probe(n + 1, &all).is_empty());
        // Remove every other key, then strip pod 3 everywhere.
        {
            let mut w = shard.write();
            for k in (0..n).step_by(2) {
                assert!(w.drop_holder(k, (k % 7) as u16));
            }
            assert_eq!(w.state().entries, n / 2);
        }
        let removed = shard.write().strip(&HostBitmap::single(3));
        let threes = (0..n).filter(|k| k % 2 == 1 && k % 7 == 3).count() as u64;
        assert_eq!(removed, threes);
        for k in 0..n {
            let want = if k % 2 == 0 || k % 7 == 3 {
                HostBitmap::EMPTY
            } else {
                HostBitmap::single((k % 7) as usize)
            };
            assert_eq!(shard.probe(k, &all), want, "key {k}");
        }
        // Re-inserting reuses vacant slots.
        let bytes = shard.bytes();
        {
            let mut w = shard.write();
            for k in (0..n).step_by(2) {
                w.add(k, 1);
            }
        }
        assert!(shard.bytes() <= bytes * 2);
        assert_eq!(shard.probe(0, &all), HostBitmap::single(1));
    }
}
