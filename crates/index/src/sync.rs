//! Every atomic and lock of this crate comes through here, so that loom can
//! replace them under `cfg(router_loom)` (tokio's `src/loom`, crossbeam's
//! `primitive`). Run the models with
//! `RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p router-index --release --lib loom`.
//!
//! Not routed through here: the list of sweeper threads (`std::sync::Mutex`
//! in `index/`), touched only to start and wake sweepers, which the models
//! run synchronously instead; and the shards' sequence-number lock
//! (`seqlock.rs`), which picks its own cell (an `UnsafeCell` it guards, or a
//! loom mutex under loom) and says why there. A retired array's free is
//! deferred through crossbeam-epoch directly (`array.rs`); under loom the
//! writer keeps it until the shard drops instead.

/// A reader's pinned epoch: arrays it loads are not freed while it lives.
#[cfg(not(router_loom))]
pub(crate) use crossbeam_epoch::{Guard, pin};
#[cfg(not(router_loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(router_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(router_loom)]
pub(crate) use self::loom_locks::Mutex;
#[cfg(router_loom)]
pub(crate) use self::loom_locks::{Guard, pin};
#[cfg(router_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(router_loom)]
mod loom_locks {
    //! parking_lot-shaped wrappers over loom's std-shaped locks, and an
    //! epoch guard that pins nothing: under loom, retired arrays are kept
    //! until their shard drops (`array.rs`).

    /// Stands for crossbeam-epoch's guard.
    #[derive(Debug)]
    pub(crate) struct Guard;

    /// Stands for crossbeam-epoch's `pin`.
    pub(crate) fn pin() -> Guard {
        Guard
    }

    /// A mutex whose `lock` cannot fail, like parking_lot's.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Mutex::new(T::default())
        }
    }

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
