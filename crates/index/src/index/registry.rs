//! The registry: pods join (a slot and an epoch), are looked up by key and
//! id, and shut down (one atomic clear of the alive bit).

use super::*;

/// The pod lifecycle (what [`PodDirectory`] calls), usable without the
/// trait in scope.
impl<const W: usize> Index<W> {
    /// The most pods the index can hold at once.
    pub const fn capacity(&self) -> usize {
        HostBitmap::<W>::CAPACITY
    }

    /// Gives `key` a slot (the same id again if it already has one).
    pub fn join(&self, key: &PodKey) -> Result<PodId, Error> {
        let mut reg = self.registry.lock();
        if let Some(&id) = reg.by_key.get(key) {
            return Ok(id);
        }
        let free = self
            .states
            .iter()
            .position(|s| s.load(Ordering::Acquire) & 3 == FREE);
        let Some(s) = free else {
            return Err(Error::TooManyPods {
                limit: self.capacity(),
            });
        };
        let st = &self.states[s];
        let epoch = epoch_of(st.load(Ordering::Acquire));
        st.store(state(epoch, LIVE), Ordering::Release);
        self.alive[s / 64].fetch_or(1 << (s % 64), Ordering::AcqRel);
        let id = PodId::new(s as u16, epoch);
        reg.by_key.insert(key.clone(), id);
        reg.keys[s] = Some(key.clone());
        Ok(id)
    }

    /// The id of a joined pod.
    pub fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        self.registry.lock().by_key.get(key).copied()
    }

    /// The key of a live pod's id (`None` for a departed id).
    pub fn pod_key(&self, id: PodId) -> Option<PodKey> {
        let reg = self.registry.lock();
        let key = reg.keys.get(id.slot() as usize)?.as_ref()?;
        (reg.by_key.get(key) == Some(&id)).then(|| key.clone())
    }

    /// Takes a pod out: gone from every query that starts after this
    /// returns; its blocks are swept afterwards.
    pub fn shutdown(&self, id: PodId) -> Result<(), Error> {
        let mut reg = self.registry.lock();
        let s = id.slot() as usize;
        let Some(st) = self.states.get(s) else {
            return Err(Error::UnknownPod(id));
        };
        let live = state(id.epoch(), LIVE);
        if st
            .compare_exchange(
                live,
                state(id.epoch(), DRAINING),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(Error::UnknownPod(id));
        }
        // Invariant: once this returns, no query that starts later sees the pod.
        self.alive[s / 64].fetch_and(!(1 << (s % 64)), Ordering::AcqRel);
        if let Some(key) = reg.keys[s].take() {
            reg.by_key.remove(&key);
        }
        drop(reg);
        self.pending.lock().push(id.slot());
        self.wake_sweeper();
        Ok(())
    }
}
