//! Every atomic and lock of this crate comes through here, so that loom can
//! replace them under `cfg(router_loom)` (tokio's `src/loom`, crossbeam's
//! `primitive`). Run the models with
//! `RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p router-index --release --lib loom`.
//!
//! Not routed through here: the list of sweeper threads (`std::sync::Mutex`
//! in `index.rs`), touched only to start and wake sweepers, which the models
//! run synchronously instead.

#[cfg(not(router_loom))]
pub(crate) use parking_lot::{Mutex, RwLock};
#[cfg(not(router_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(router_loom)]
pub(crate) use self::loom_locks::{Mutex, RwLock};
#[cfg(router_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(router_loom)]
mod loom_locks {
    //! parking_lot-shaped wrappers over loom's std-shaped locks.

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

    /// A reader-writer lock whose guards cannot fail, like parking_lot's.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(t: T) -> Self {
            RwLock(loom::sync::RwLock::new(t))
        }
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("loom rwlock poisoned")
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("loom rwlock poisoned")
        }
    }
}
