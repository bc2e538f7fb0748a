//! Scriptable fakes for cache-router's tests (tower-test's role).
//!
//! [`ScriptedBackend`] plays a fleet of engines: per pod, a queue of
//! [`Script`]s decides how each request goes (stream, fail to connect, fail
//! before or after the first chunk, hang, stream slowly); when a pod's queue
//! is empty it answers the default way. It records every call and counts
//! streams dropped before their end (cancellations).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use parking_lot::Mutex;
use router_core::PodId;
use router_exec::{Backend, BackendError, Chunk, ChunkStream, StepKind, StepRequest};
use serde_json::{Value, json};

/// How one request to a pod goes.
#[derive(Clone, Debug)]
pub enum Script {
    /// Answer the default way (see [`ScriptedBackend`]).
    Default,
    /// `send` fails: the pod is unreachable.
    FailToConnect,
    /// The stream's first item is an error.
    FailFirst,
    /// The default chunks, then an error after `n` of them.
    FailAfter(usize),
    /// The stream's first item says the request is invalid (an HTTP 400).
    Reject,
    /// Never answers.
    Hang,
    /// The default chunks, each after `delay`.
    Slow(Duration),
}

/// One recorded request.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The pod it went to.
    pub pod: PodId,
    /// The step kind.
    pub kind: StepKind,
    /// The cache handle it carried.
    pub handle: Option<Value>,
}

#[derive(Debug, Default)]
struct Counters {
    open: AtomicUsize,
    cancelled: AtomicUsize,
}

/// A fleet of fake engines.
///
/// Default answers: a prefill step yields a cache handle naming the pod
/// (`{"prefill_pod": slot}`) and a usage chunk; other steps yield two data
/// chunks and a usage chunk. Usage reports the prompt tokens and the cached
/// tokens set with [`ScriptedBackend::set_cached`] (0 by default).
#[derive(Debug, Default)]
pub struct ScriptedBackend {
    scripts: Mutex<HashMap<PodId, VecDeque<Script>>>,
    cached: Mutex<HashMap<PodId, u64>>,
    calls: Mutex<Vec<Call>>,
    counters: Arc<Counters>,
}

impl ScriptedBackend {
    /// A backend answering every request the default way.
    pub fn new() -> Arc<Self> {
        Arc::new(ScriptedBackend::default())
    }

    /// Queues how the next requests to `pod` go.
    pub fn script(&self, pod: PodId, scripts: impl IntoIterator<Item = Script>) {
        self.scripts.lock().entry(pod).or_default().extend(scripts);
    }

    /// The cached tokens `pod` reports in its usage chunks.
    pub fn set_cached(&self, pod: PodId, tokens: u64) {
        self.cached.lock().insert(pod, tokens);
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// Streams not yet finished or dropped.
    pub fn open_streams(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Streams dropped before their end: cancelled requests.
    pub fn cancelled(&self) -> usize {
        self.counters.cancelled.load(Ordering::SeqCst)
    }

    fn chunks(&self, pod: PodId, req: &StepRequest) -> Vec<Chunk> {
        let usage = Chunk::Usage {
            prompt_tokens: req.prompt_tokens,
            cached_tokens: Some(self.cached.lock().get(&pod).copied().unwrap_or(0)),
        };
        match req.kind {
            StepKind::Prefill => vec![Chunk::Handle(json!({ "prefill_pod": pod.slot() })), usage],
            _ => vec![
                Chunk::Data(json!({ "text": "Hel" })),
                Chunk::Data(json!({ "text": "lo" })),
                usage,
            ],
        }
    }
}

/// A stream that counts itself open and notices being dropped early.
struct Tracked {
    inner: ChunkStream,
    done: bool,
    counters: Arc<Counters>,
}

impl Stream for Tracked {
    type Item = Result<Chunk, BackendError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let r = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(None) = r {
            self.done = true;
        }
        r
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.counters.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Backend for ScriptedBackend {
    fn send(
        &self,
        pod: PodId,
        req: StepRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, BackendError>> {
        self.calls.lock().push(Call {
            pod,
            kind: req.kind,
            handle: req.handle.clone(),
        });
        let script = self
            .scripts
            .lock()
            .get_mut(&pod)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Script::Default);
        let chunks = self.chunks(pod, &req);
        let counters = self.counters.clone();
        let track = move |inner: ChunkStream| -> Result<ChunkStream, BackendError> {
            counters.open.fetch_add(1, Ordering::SeqCst);
            Ok(Box::pin(Tracked {
                inner,
                done: false,
                counters,
            }))
        };
        let fail = || BackendError::Failed(format!("scripted failure on {pod}"));
        match script {
            Script::Default => {
                async move { track(futures::stream::iter(chunks.into_iter().map(Ok)).boxed()) }
                    .boxed()
            }
            Script::FailToConnect => {
                async move { Err(BackendError::Unavailable(format!("{pod} refused"))) }.boxed()
            }
            Script::FailFirst => {
                let e = fail();
                async move { track(futures::stream::iter([Err(e)]).boxed()) }.boxed()
            }
            Script::FailAfter(n) => {
                let e = fail();
                let items: Vec<_> = chunks.into_iter().take(n).map(Ok).chain([Err(e)]).collect();
                async move { track(futures::stream::iter(items).boxed()) }.boxed()
            }
            Script::Reject => {
                let e = BackendError::Rejected {
                    status: 400,
                    body: "scripted rejection".into(),
                };
                async move { track(futures::stream::iter([Err(e)]).boxed()) }.boxed()
            }
            Script::Hang => futures::future::pending().boxed(),
            Script::Slow(delay) => async move {
                let s = futures::stream::iter(chunks).then(move |c| async move {
                    tokio::time::sleep(delay).await;
                    Ok(c)
                });
                track(s.boxed())
            }
            .boxed(),
        }
    }
}
