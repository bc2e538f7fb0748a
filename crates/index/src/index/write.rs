//! Writes: stores, removals and clears of a pod's blocks, under each
//! shard's lock, checked against the slot's liveness and epoch (no
//! inherited bits), and cache events applied.

use super::*;

impl<const W: usize> Index<W> {
    /// The write path shared by stores and removes: checks the pod, takes
    /// its event lock, then walks the blocks **last to first**, locking each
    /// block's shard, re-checking liveness and calling `f` on the block.
    ///
    /// The same pass sets each remaining block's run hint ([`Hint`]):
    /// blocks are in chain order, so walking backwards a block's holders
    /// can be compared with its successor's, which were just written. Then
    /// `parent` (the block before the first, when the caller knows it) gets
    /// its hint extended over this event. Backwards also means a concurrent
    /// query, which starts from block 0, sees a stored run only once it is
    /// whole.
    ///
    /// `skip` names blocks a validated lock-free read may leave alone, when
    /// their hint would not change either: for a GPU store, blocks the pod
    /// already holds (engines repeat most of what they store: a prompt's
    /// shared prefix is stored again with every request that extends it);
    /// for a remove, blocks the pod does not hold. The read costs no lock
    /// and writes no line. A store with tier records takes the locked path,
    /// which keeps them.
    pub(super) fn write_blocks(
        &self,
        pod: PodId,
        parent: Option<BlockHash>,
        skip: Skip,
        blocks: &[BlockHash],
        mut f: impl FnMut(
            &mut ShardWrite<'_, W>,
            &mut i64,
            &mut PodState,
            u64,
        ) -> Option<(usize, Holders)>,
    ) -> Result<(), Error> {
        let (slot, st) = self.live_slot(pod)?;
        let live = state(pod.epoch(), LIVE);
        let mut ps = slot.pod.lock();
        if let Some(BlockHash(p)) = parent.filter(|_| self.config.validate_parents) {
            // Under the pod's event lock, so no event of this pod can take
            // the parent away between the check and the store.
            let me = HostBitmap::<W>::single(pod.slot() as usize);
            let (held, _) = self.shard(p).look(&pin(), p, &me);
            if held.is_empty() {
                self.counters.skipped_parent.fetch_add(1, Ordering::Relaxed);
                return Err(Error::UnknownParent {
                    pod,
                    parent: BlockHash(p),
                });
            }
        }
        // The holders of the block after the current one, and its run;
        // `None` past the event's end or after a block left with no pod.
        let mut next: Option<(HostBitmap<W>, Run)> = None;
        let mut after_end = true;
        // Blocks the pod gained (or lost), added to its count once, still
        // under its event lock (a sweep takes that lock before zeroing it).
        let mut added = 0i64;
        let count = |added: i64| {
            if added >= 0 {
                slot.blocks.fetch_add(added as u64, Ordering::Relaxed);
            } else {
                slot.blocks
                    .fetch_sub(added.unsigned_abs(), Ordering::Relaxed);
            }
        };
        let skip = match skip {
            Skip::Held if !ps.tiers.is_empty() => Skip::Nothing,
            other => other,
        };
        // Whether to try the lock-free check on this block: from the start
        // for a remove, and after a locked write that changed nothing,
        // until a check fails. A store's new blocks (an event's tail,
        // typically) thus go straight to the locked path, where the check
        // would be a wasted lookup.
        let mut try_skip = skip == Skip::NotHeld;
        // Pinned on first use: most events never check a block without the
        // lock, and a pin costs a locked instruction.
        let mut guard: Option<Guard> = None;
        let me = pod.slot() as usize;
        // Each block's shard and cell are cold in a large index, and the
        // write of one block does not depend on the next one's memory: the
        // shard header `2 * AHEAD` blocks on and the cell line `AHEAD` on
        // are prefetched, so their misses overlap this block's work.
        const AHEAD: usize = 4;
        let n = blocks.len();
        for &BlockHash(b) in &blocks[n.saturating_sub(2 * AHEAD)..] {
            self.shard(b).prefetch_header();
        }
        for &BlockHash(b) in &blocks[n.saturating_sub(AHEAD)..] {
            self.shard(b).prefetch_entry(mix64(b));
        }
        for (j, &BlockHash(h)) in blocks.iter().enumerate().rev() {
            if let Some(&BlockHash(far)) = j.checked_sub(2 * AHEAD).map(|k| &blocks[k]) {
                self.shard(far).prefetch_header();
            }
            if let Some(&BlockHash(near)) = j.checked_sub(AHEAD).map(|k| &blocks[k]) {
                self.shard(near).prefetch_entry(mix64(near));
            }
            if try_skip {
                let g = guard.get_or_insert_with(pin);
                let held = skip == Skip::Held;
                if let Some(seen) = self.unchanged(g, h, me, held, next.as_ref(), after_end) {
                    // Nothing is written, so no bit can outlive the pod;
                    // the check keeps the result the locked path gives.
                    if st.load(Ordering::Acquire) != live {
                        count(added);
                        self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::PodShutDown(pod));
                    }
                    next = seen;
                    after_end = false;
                    continue;
                }
            }
            let mut w = self.shard(h).write();
            // Invariant: a write checks liveness under the shard lock. A
            // sweep locks every shard after the pod left, so either it sees
            // this write's bits, or this write sees the pod gone.
            if st.load(Ordering::Acquire) != live {
                count(added);
                self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                return Err(Error::PodShutDown(pod));
            }
            // `f` hands back the position of the block's entry if one is
            // left, and its new holders, stored here with their hint.
            let gained = added;
            next = f(&mut w, &mut added, &mut ps, h).map(|(at, mut e)| {
                let (mut map, slab, _) = w.parts();
                let set = e.to_bitmap(&slab);
                let run = Run::before(next.as_ref(), &set, after_end);
                e.set_hint(run.stored.0);
                map.set(at, e);
                (set, run)
            });
            try_skip = skip != Skip::Nothing && added == gained;
            after_end = false;
        }
        if let (Some(BlockHash(p)), Some(first)) = (parent, next)
            && !self.parent_hint_holds(guard.get_or_insert_with(pin), p, &first)
        {
            let mut w = self.shard(p).write();
            let (mut map, slab, _) = w.parts();
            if let Some(at) = map.find(p) {
                let mut e = map.get(at);
                let mine = e.to_bitmap(&slab);
                e.set_hint(Run::before(Some(&first), &mine, false).stored.0);
                map.set(at, e);
            }
        }
        count(added);
        self.counters.events_applied.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A validated lock-free read of block `h`, when writing it would
    /// change nothing: `slot` holds it (`held`) or does not, and the hint a
    /// write would give it (after `next`) is the one it has. Gives what the
    /// write path would have passed on as the block's holders and hint:
    /// `None` for a block no pod holds.
    #[allow(clippy::option_option)] // outer: skippable; inner: the entry, as the write path has it
    #[inline(always)]
    pub(super) fn unchanged(
        &self,
        guard: &Guard,
        h: u64,
        slot: usize,
        held: bool,
        next: Option<&(HostBitmap<W>, Run)>,
        event_end: bool,
    ) -> Option<Option<(HostBitmap<W>, Run)>> {
        let sh = self.shard(h);
        let s = sh.lock.begin_check()?;
        let (set, raw) = sh.entry_unchecked(guard, h);
        let seen = if set.is_empty() {
            // No entry: a remove has nothing to do, a store must insert.
            (!held).then_some(None)
        } else {
            let run = Run::before(next, &set, event_end);
            (set.contains(slot) == held && run.stored.0 == raw).then_some(Some((set, run)))
        };
        seen.filter(|_| sh.lock.still_check(s))
    }

    /// Whether the parent `p` already has the hint a store after it would
    /// give it (so its shard need not be locked).
    pub(super) fn parent_hint_holds(
        &self,
        guard: &Guard,
        p: u64,
        next: &(HostBitmap<W>, Run),
    ) -> bool {
        let sh = self.shard(p);
        let Some(s) = sh.lock.begin_check() else {
            return false;
        };
        let (mine, raw) = sh.entry_unchecked(guard, p);
        !mine.is_empty()
            && Run::before(Some(next), &mine, false).stored.0 == raw
            && sh.lock.still_check(s)
    }

    /// Records that `pod` holds `blocks` in `tier` (a `CacheEvent::Stored`
    /// without building the event). Idempotent; one shard lock per block.
    pub fn store(&self, pod: PodId, tier: Tier, blocks: &[BlockHash]) -> Result<(), Error> {
        self.store_after(pod, tier, None, blocks)
    }

    /// [`Index::store`] of blocks that extend `parent` (the chain's block
    /// before `blocks[0]`, as engines' events name it). The answer is the
    /// same; naming the parent lets the index carry its run hint across
    /// events, so later searches of a long run stored in many events take
    /// fewer probes. With [`IndexConfig::validate_parents`], a store whose
    /// parent the pod does not hold is refused ([`Error::UnknownParent`])
    /// and counted.
    pub fn store_after(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: &[BlockHash],
    ) -> Result<(), Error> {
        let s = pod.slot();
        let tier_bit = 1u8 << tier as u8;
        let skip = if tier == Tier::Gpu {
            Skip::Held
        } else {
            Skip::Nothing
        };
        self.write_blocks(pod, parent, skip, blocks, |w, added, ps, h| {
            let (mut map, mut slab, residencies) = w.parts();
            let at = map.insert(h);
            let mut entry = map.get(at);
            let newly = entry.insert(&mut slab, s);
            if newly {
                *residencies += 1;
                *added += 1;
            }
            // A fleet with one tier keeps no records and skips this.
            if tier != Tier::Gpu || !ps.tiers.is_empty() {
                let current = if newly {
                    0
                } else {
                    ps.tiers.get(&h).copied().unwrap_or(TIER_BITS_GPU)
                };
                let mask = current | tier_bit;
                if mask == TIER_BITS_GPU {
                    ps.tiers.remove(&h);
                } else {
                    ps.tiers.insert(h, mask);
                }
            }
            Some((at, entry))
        })
    }

    /// Records that `pod` dropped `blocks` from `tier` (a
    /// `CacheEvent::Removed`). Absent blocks are ignored.
    pub fn remove(&self, pod: PodId, tier: Tier, blocks: &[BlockHash]) -> Result<(), Error> {
        let s = pod.slot();
        let tier_bit = 1u8 << tier as u8;
        self.write_blocks(pod, None, Skip::NotHeld, blocks, |w, added, ps, h| {
            let (mut map, mut slab, residencies) = w.parts();
            let at = map.find(h)?;
            let mut holders = map.get(at);
            let current = ps.tiers.get(&h).copied().unwrap_or(TIER_BITS_GPU);
            let mask = current & !tier_bit;
            if !holders.contains(&slab, s) || mask == current {
                // Not held, or not in that tier: nothing to do.
            } else if mask == 0 {
                holders.remove(&mut slab, s);
                *residencies -= 1;
                *added -= 1;
                ps.tiers.remove(&h);
                if holders.is_empty() {
                    map.remove_at(at);
                    return None;
                }
            } else if mask == TIER_BITS_GPU {
                ps.tiers.remove(&h);
            } else {
                ps.tiers.insert(h, mask);
            }
            Some((at, holders))
        })
    }

    /// Drops every block of a live pod (an engine's `AllBlocksCleared`)
    /// while it stays live. Scans every shard: engines reset rarely.
    pub fn clear(&self, pod: PodId) -> Result<(), Error> {
        let (slot, st) = self.live_slot(pod)?;
        let live = state(pod.epoch(), LIVE);
        let mut ps = slot.pod.lock();
        let mask = HostBitmap::<W>::single(pod.slot() as usize);
        for shard in self.shards.iter() {
            let mut sh = shard.write();
            if st.load(Ordering::Acquire) != live {
                self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                return Err(Error::PodShutDown(pod));
            }
            let removed = strip(&mut sh, &mask);
            slot.blocks.fetch_sub(removed, Ordering::Relaxed);
        }
        ps.tiers.clear();
        self.counters.events_applied.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Applies one event (the same as [`CacheEventSink::apply`], without
    /// the trait in scope).
    pub fn apply_event(&self, event: &CacheEvent) -> Result<(), Error> {
        match event {
            CacheEvent::Stored { pod, tier, blocks } => self.store(*pod, *tier, blocks),
            CacheEvent::Removed { pod, tier, blocks } => self.remove(*pod, *tier, blocks),
            CacheEvent::Cleared { pod } => self.clear(*pod),
            CacheEvent::PodShutdown { pod } => self.shutdown(*pod),
            // `CacheEvent` is non-exhaustive: a kind this index does not
            // know is refused, not guessed at.
            _ => Err(Error::UnknownPod(event.pod())),
        }
    }
}
