//! Sweeps: a departed pod's bits stripped from every shard, on background
//! threads or when called, before its slot is reused.

use super::*;

impl<const W: usize> Index<W> {
    /// Clears the bits of every pod waiting for a sweep, drops emptied
    /// entries, then frees their slots for reuse. Returns the pods swept.
    ///
    /// With [`IndexConfig::background_sweep`] this runs on its own; call it
    /// directly to sweep synchronously.
    pub fn sweep(&self) -> usize {
        let batch: Vec<u16> = std::mem::take(&mut *self.pending.lock());
        if batch.is_empty() {
            return 0;
        }
        self.counters.sweeps_running.fetch_add(1, Ordering::Relaxed);
        let mask: HostBitmap<W> = batch.iter().map(|&s| s as usize).collect();
        let mut swept = 0;
        for shard in self.shards.iter() {
            swept += strip(&mut shard.write(), &mask);
        }
        for &s in &batch {
            let slot = &self.slots[s as usize];
            // Taking the pod lock waits out any event still running for it.
            let mut ps = slot.pod.lock();
            ps.tiers = HashMap::new();
            slot.blocks.store(0, Ordering::Relaxed);
            let st = &self.states[s as usize];
            let old = st.load(Ordering::Acquire);
            // Invariant: a slot is reusable only after its sweep, and its
            // next owner gets a new epoch.
            st.store(
                state(epoch_of(old).wrapping_add(1), FREE),
                Ordering::Release,
            );
        }
        self.counters
            .blocks_swept
            .fetch_add(swept, Ordering::Relaxed);
        self.counters.sweeps_running.fetch_sub(1, Ordering::Relaxed);
        self.counters
            .sweeps_completed
            .fetch_add(1, Ordering::Relaxed);
        batch.len()
    }

    /// Pods shut down and not yet swept.
    pub fn pending_sweeps(&self) -> usize {
        self.pending.lock().len()
    }

    pub(super) fn wake_sweeper(&self) {
        if !self.config.background_sweep {
            return;
        }
        let mut threads = self.sweepers.lock().unwrap_or_else(|e| e.into_inner());
        if threads.len() < self.config.sweep_threads {
            let me = self.me.clone();
            let spawned = std::thread::Builder::new()
                .name("router-index-sweep".into())
                .spawn(move || sweeper_loop(me));
            if let Ok(handle) = spawned {
                threads.push(handle.thread().clone());
            }
        }
        for t in threads.iter() {
            t.unpark();
        }
    }
}
