//! A fixed set of threads for tokenizing: CPU-heavy work kept off the async
//! threads, on threads that live as long as the gateway.
//!
//! Why not `spawn_blocking`: its threads come and go (they exit after 10 s
//! idle), and glibc gives threads their own allocation arenas, which keep
//! the peak of what they once held. A prompt near the context limit takes
//! tens of megabytes to tokenize, so every new blocking thread that met one
//! added that much to the gateway's memory for good (the soak showed steps
//! of about 100 MiB minutes apart). A fixed pool keeps as many arenas as it
//! has threads.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of worker threads. Its queue is not bounded here: callers
/// bound the jobs in flight (the gateway's tokenize semaphore).
#[derive(Debug)]
pub(crate) struct Pool {
    jobs: Mutex<Sender<Job>>,
}

impl Pool {
    /// `threads` threads named `name`.
    pub(crate) fn new(name: &str, threads: usize) -> std::io::Result<Pool> {
        let (jobs, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(&rx))?;
        }
        Ok(Pool {
            jobs: Mutex::new(jobs),
        })
    }

    /// Runs `f` on a pool thread; `None` if the pool is gone or `f`
    /// panicked.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(out.ok());
        });
        self.jobs.lock().ok()?.send(job).ok()?;
        rx.await.ok().flatten()
    }
}

/// Takes jobs until every sender is gone (the gateway stopped).
fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_the_pools_threads_and_panics_are_contained() {
        let pool = Pool::new("test-pool", 2).unwrap();
        let name = pool
            .run(|| std::thread::current().name().map(str::to_owned))
            .await
            .flatten();
        assert!(name.is_some_and(|n| n.starts_with("test-pool-")));
        assert_eq!(pool.run(|| -> u32 { panic!("a bad job") }).await, None);
        // The pool still works after a job panicked.
        assert_eq!(pool.run(|| 7).await, Some(7));
        let many: Vec<_> = (0..16).map(|i| pool.run(move || i * 2)).collect();
        let got: Vec<_> = futures::future::join_all(many).await;
        assert_eq!(got, (0..16).map(|i| Some(i * 2)).collect::<Vec<_>>());
    }
}
