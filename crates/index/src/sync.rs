//! Every atomic and lock of this crate comes through here, so that loom can
//! replace them under `cfg(router_loom)` (tokio's `src/loom`, crossbeam's
//! `primitive`). Run the models with
//! `RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p router-index --release --lib loom`.
//!
//! Not routed through here: the `OnceLock`s of `pool.rs` (each chunk is
//! initialised once, under the shard's writer mutex, before any id in it is
//! published through the shard's sequence number) and the sweeper threads'
//! handles (thread start-up is not part of the modelled races).

#[cfg(not(router_loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(router_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};

/// A spinning reader's pause.
#[cfg(not(router_loom))]
#[inline]
pub(crate) fn spin() {
    std::hint::spin_loop();
}

#[cfg(router_loom)]
pub(crate) use self::loom_locks::Mutex;
#[cfg(router_loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(router_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};

/// A spinning reader's pause: under loom, a yield, so the model lets the
/// writer it waits for run.
#[cfg(router_loom)]
pub(crate) fn spin() {
    loom::thread::yield_now();
}

#[cfg(router_loom)]
mod loom_locks {
    //! A parking_lot-shaped wrapper over loom's std-shaped mutex.

    /// A mutex whose `lock` cannot fail, like parking_lot's.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(t: T) -> Self {
            Mutex(loom::sync::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            // A poisoned lock means a panicking model: surface it.
            self.0.lock().expect("loom mutex poisoned")
        }
    }
}
