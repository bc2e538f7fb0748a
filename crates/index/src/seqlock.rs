//! A shard's sequence number, used both as its writers' lock and as the
//! version readers validate against.
//!
//! - A writer takes the lock by moving the number from even to odd (one
//!   compare-and-swap) and releases it by storing the next even number
//!   (a plain `Release` store): one locked instruction per write, and the
//!   release does not wait for the write's stores to reach memory.
//! - A reader loads the number (`Acquire`), refuses an odd one, reads the
//!   shard's atomics with `Acquire` loads, and accepts what it read only if
//!   the number is unchanged afterwards. It writes nothing.
//! - The writer's state behind the lock (`T`) is reached only through a
//!   [`SeqGuard`], so only one thread at a time touches it.
//!
//! Waiting (a writer for another writer, a reader for a writer) spins
//! briefly, then yields the thread: a sweep may hold a shard for a whole
//! pass over it.
//!
//! Under loom the writers' exclusion is a loom mutex beside the number
//! (bumped to odd after taking it, to even before releasing it), and a
//! reader that must wait takes and drops that mutex: loom cannot explore
//! spin loops in models of this size, so the models check the number's
//! protocol (orderings, validation, the arrays it guards) and not the
//! compare-and-swap lock, a textbook one.

#![allow(unsafe_code)] // the lock owns its state through an UnsafeCell: see the SAFETY comments.

use crate::sync::{AtomicU64, Ordering};

#[cfg(not(router_loom))]
type Cell<T> = std::cell::UnsafeCell<T>;
#[cfg(router_loom)]
type Cell<T> = loom::sync::Mutex<T>;

/// A sequence number guarding a writer's state `T`.
pub(crate) struct SeqLock<T> {
    seq: AtomicU64,
    state: Cell<T>,
}

impl<T: Default> Default for SeqLock<T> {
    fn default() -> Self {
        SeqLock {
            seq: AtomicU64::new(0),
            state: Cell::new(T::default()),
        }
    }
}

impl<T> std::fmt::Debug for SeqLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqLock")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(not(router_loom))]
// SAFETY: `state` is reached only through a `SeqGuard`, which exists for
// one thread at a time (the compare-and-swap from even to odd admits one),
// so sharing the lock shares `T` between threads one at a time: `T: Send`
// is what that needs.
unsafe impl<T: Send> Sync for SeqLock<T> {}

/// Backs off while the number is odd: spins, then yields.
#[cfg(not(router_loom))]
#[inline]
fn wait(round: &mut u32) {
    *round += 1;
    if *round < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl<T> SeqLock<T> {
    /// Takes the lock; the number stays odd until the guard drops.
    #[cfg(router_loom)]
    pub(crate) fn lock(&self) -> SeqGuard<'_, T> {
        let held = self.state.lock().expect("loom mutex poisoned");
        // A read-modify-write: loom's DPOR keeps only the last access of
        // each atomic, and a load before the store would hide the readers'
        // loads from it.
        let s = self.seq.fetch_add(1, Ordering::Relaxed);
        SeqGuard {
            lock: self,
            release: s + 2,
            held,
        }
    }

    /// Takes the lock; the number stays odd until the guard drops.
    #[cfg(not(router_loom))]
    #[inline]
    pub(crate) fn lock(&self) -> SeqGuard<'_, T> {
        let mut round = 0;
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            // Acquire: the previous holder's writes (released when it made
            // the number even) are seen. Relaxed would not order this
            // writer's own stores after the odd number, but they are all
            // `Release` stores, which do.
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return SeqGuard::new(self, s + 2);
            }
            wait(&mut round);
        }
    }

    /// The number to validate an optimistic read against, or `None` while
    /// a write is under way.
    #[inline]
    pub(crate) fn begin_read(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// Whether no write started since [`SeqLock::begin_read`] gave `s`.
    /// The reads before it were `Acquire` loads, so this load cannot be
    /// ordered before them.
    #[inline]
    pub(crate) fn still(&self, s: u64) -> bool {
        self.seq.load(Ordering::Relaxed) == s
    }

    /// [`SeqLock::begin_read`] for a writer's lock-free check of a block
    /// it may not need to write. Under loom it is a read-modify-write of
    /// nothing: the writer's later compare-and-swap would otherwise follow
    /// its own load, and loom's DPOR, which keeps only the last access of
    /// each atomic, would lose the readers' loads before it. A
    /// read-modify-write reads the newest value, one a load may read.
    #[inline]
    pub(crate) fn begin_check(&self) -> Option<u64> {
        #[cfg(router_loom)]
        let s = self.seq.fetch_add(0, Ordering::Acquire);
        #[cfg(not(router_loom))]
        let s = self.seq.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// [`SeqLock::still`] for a writer's check, by the rule of
    /// [`SeqLock::begin_check`].
    #[inline]
    pub(crate) fn still_check(&self, s: u64) -> bool {
        #[cfg(router_loom)]
        let now = self.seq.fetch_add(0, Ordering::Relaxed);
        #[cfg(not(router_loom))]
        let now = self.seq.load(Ordering::Relaxed);
        now == s
    }

    /// Waits out a write in progress before an optimistic read is retried.
    #[cfg(not(router_loom))]
    #[inline]
    pub(crate) fn wait_for_writer(&self, round: &mut u32) {
        wait(round);
    }

    /// Waits out a write in progress: takes and drops the writers' mutex.
    #[cfg(router_loom)]
    pub(crate) fn wait_for_writer(&self, _round: &mut u32) {
        drop(self.state.lock().expect("loom mutex poisoned"));
    }
}

/// The lock, held: the writer's state, and the even number its release
/// stores.
pub(crate) struct SeqGuard<'a, T> {
    lock: &'a SeqLock<T>,
    release: u64,
    #[cfg(router_loom)]
    held: loom::sync::MutexGuard<'a, T>,
}

impl<T> std::fmt::Debug for SeqGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqGuard")
            .field("release", &self.release)
            .finish_non_exhaustive()
    }
}

impl<'a, T> SeqGuard<'a, T> {
    #[cfg(not(router_loom))]
    #[inline]
    fn new(lock: &'a SeqLock<T>, release: u64) -> Self {
        SeqGuard { lock, release }
    }

    /// The writer's state.
    #[inline]
    pub(crate) fn state(&mut self) -> &mut T {
        #[cfg(not(router_loom))]
        // SAFETY: this guard is the only one (see `SeqLock`'s Sync), and
        // the `&mut self` borrow keeps the reference unique within it.
        unsafe {
            &mut *self.lock.state.get()
        }
        #[cfg(router_loom)]
        &mut self.held
    }
}

impl<T> Drop for SeqGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: a reader or writer that sees this even number sees every
        // write made under the lock. (Under loom, a read-modify-write, for
        // the reason in `lock`; the mutex is released after it.)
        #[cfg(not(router_loom))]
        self.lock.seq.store(self.release, Ordering::Release);
        #[cfg(router_loom)]
        self.lock.seq.fetch_add(1, Ordering::Release);
    }
}
