//! Running workflows: attempts, retries, accounting, streaming.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use router_core::{BlockHash, PodId};
use router_policy::builtin::CircuitBreaker;
use router_policy::keys::{CACHE_HITS, CHAIN};
use router_policy::{Context, Fleet, Outcome, PodStateSink};
use tokio::time::{Instant, Sleep};

use crate::Error;
use crate::backend::{Backend, BackendError, Chunk, ChunkStream, StepKind, StepRequest};
use crate::feedback::Feedback;
use crate::workflow::{CACHE_HANDLE, PREFILL_POD, Step, Workflow};

/// How failed attempts are retried.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts per step, the first included (at least 1).
    pub max_attempts: usize,
    /// Wait before the second attempt; doubled for each further one.
    pub backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
        }
    }
}

impl RetryPolicy {
    /// `max_attempts` attempts with `backoff` doubling up to 20x.
    pub fn new(max_attempts: usize, backoff: Duration) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            backoff,
            max_backoff: backoff * 20,
        }
    }

    fn wait(&self, attempt: usize) -> Duration {
        let factor = 1u32 << attempt.min(16) as u32;
        (self.backoff * factor).min(self.max_backoff)
    }
}

/// Accounting of one attempt on one pod, settled when it drops: whatever
/// path ends the attempt (success, error, timeout, the caller going away),
/// the pod's counters return to where they were.
struct InFlight {
    fleet: Arc<Fleet>,
    breaker: Option<Arc<CircuitBreaker>>,
    pod: PodId,
    prefill_left: u64,
    /// Whether the first token is still to come.
    prefilling: bool,
    kv_blocks: u64,
    started: Instant,
    /// `None`: cancelled by the caller or rejected as invalid, which says
    /// nothing about the pod.
    outcome: Option<Outcome>,
}

impl InFlight {
    fn start(exec: &Executor, pod: PodId, prefill: u64, kv_blocks: u64) -> Self {
        exec.fleet.request_started(pod, prefill, kv_blocks);
        InFlight {
            fleet: exec.fleet.clone(),
            breaker: exec.breaker.clone(),
            pod,
            prefill_left: prefill,
            prefilling: true,
            kv_blocks,
            started: Instant::now(),
            outcome: None,
        }
    }

    fn first_token(&mut self) {
        if self.prefilling {
            self.fleet.first_token(self.pod, self.prefill_left);
            self.prefill_left = 0;
            self.prefilling = false;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let latency = self.started.elapsed();
        // An attempt that ends before its first token ends its prefill too.
        self.first_token();
        self.fleet.request_finished(
            self.pod,
            self.prefill_left,
            self.kv_blocks,
            latency,
            self.outcome.unwrap_or(Outcome::Success),
        );
        if let (Some(b), Some(o)) = (&self.breaker, self.outcome) {
            b.record(self.pod, latency, o);
        }
    }
}

/// A step that has produced its first chunk.
struct Running {
    pod: PodId,
    stream: ChunkStream,
    first: Option<Chunk>,
    guard: InFlight,
    deadline: Pin<Box<Sleep>>,
    feedback: Arc<Feedback>,
    chain: Vec<BlockHash>,
    predicted_blocks: u32,
}

impl Running {
    fn observe(&self, chunk: &Chunk) {
        if let Chunk::Usage {
            cached_tokens: Some(cached),
            ..
        } = chunk
        {
            self.feedback
                .observe(self.pod, &self.chain, self.predicted_blocks, *cached);
        }
    }

    /// Runs the step to its end (a non-final step), returning its handle.
    async fn drain(mut self) -> Result<Option<serde_json::Value>, Error> {
        let mut handle = None;
        let mut next = self.first.take();
        loop {
            let chunk = match next.take() {
                Some(c) => c,
                None => {
                    tokio::select! {
                        _ = self.deadline.as_mut() => {
                            self.guard.outcome = Some(Outcome::Failure);
                            return Err(Error::Timeout { pod: self.pod });
                        }
                        item = self.stream.next() => match item {
                            Some(Ok(c)) => c,
                            Some(Err(e)) => {
                                self.guard.outcome = Some(Outcome::Failure);
                                return Err(Error::Backend { pod: self.pod, source: e });
                            }
                            None => {
                                self.guard.outcome = Some(Outcome::Success);
                                return Ok(handle);
                            }
                        }
                    }
                }
            };
            self.observe(&chunk);
            if let Chunk::Handle(h) = chunk {
                handle = Some(h);
            }
        }
    }
}

/// The caller's view of a running workflow: the last step's chunks.
///
/// Dropping it cancels the backend request and settles the accounting.
pub struct Execution {
    steps: Vec<(StepKind, PodId)>,
    running: Option<Running>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("steps", &self.steps)
            .field("streaming", &self.running.is_some())
            .finish()
    }
}

impl Execution {
    /// The pods that ran each step, in order.
    pub fn steps(&self) -> &[(StepKind, PodId)] {
        &self.steps
    }

    /// The pod streaming the response.
    pub fn pod(&self) -> Option<PodId> {
        self.steps.last().map(|s| s.1)
    }

    /// Blocks of the request's chain the index said the last step's pod
    /// held when it was chosen (the prediction the engine's reported
    /// cached tokens are compared with).
    pub fn predicted_cached_blocks(&self) -> u32 {
        self.running.as_ref().map_or(0, |r| r.predicted_blocks)
    }
}

impl Stream for Execution {
    type Item = Result<Chunk, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(run) = this.running.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(c) = run.first.take() {
            run.observe(&c);
            return Poll::Ready(Some(Ok(c)));
        }
        if run.deadline.as_mut().poll(cx).is_ready() {
            run.guard.outcome = Some(Outcome::Failure);
            let pod = run.pod;
            this.running = None;
            return Poll::Ready(Some(Err(Error::Timeout { pod })));
        }
        match run.stream.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(c))) => {
                run.observe(&c);
                Poll::Ready(Some(Ok(c)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Streaming began: reported, never retried.
                run.guard.outcome = Some(Outcome::Failure);
                let pod = run.pod;
                this.running = None;
                Poll::Ready(Some(Err(Error::Backend { pod, source: e })))
            }
            Poll::Ready(None) => {
                run.guard.outcome = Some(Outcome::Success);
                this.running = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A decision whose request the caller sends ([`Executor::lease`]): the
/// pod's in-flight count, queued prefill and KV blocks stay counted until
/// the lease drops, as for a request the executor runs itself.
pub struct Lease {
    pod: PodId,
    predicted_blocks: u32,
    guard: InFlight,
    feedback: Arc<Feedback>,
    chain: Vec<BlockHash>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("pod", &self.pod)
            .field("predicted_blocks", &self.predicted_blocks)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The pod chosen.
    pub fn pod(&self) -> PodId {
        self.pod
    }

    /// Blocks of the chain the index said the pod held when chosen.
    pub fn predicted_cached_blocks(&self) -> u32 {
        self.predicted_blocks
    }

    /// The first token arrived: the pod's queued prefill ends.
    pub fn first_token(&mut self) {
        self.guard.first_token();
    }

    /// The engine reported `cached_tokens` of the prompt served from its
    /// cache: compared with the prediction ([`Feedback`]).
    pub fn cached_tokens(&mut self, cached_tokens: u64) {
        self.feedback
            .observe(self.pod, &self.chain, self.predicted_blocks, cached_tokens);
    }

    /// The request ended: `ok` says whether the pod served it (a failure
    /// counts against it in the circuit breaker). Dropping a lease without
    /// this says nothing about the pod.
    pub fn finish(mut self, ok: bool) {
        self.guard.outcome = Some(if ok {
            Outcome::Success
        } else {
            Outcome::Failure
        });
    }
}

/// The backend of an executor that only leases.
struct NoBackend;

impl Backend for NoBackend {
    fn send(
        &self,
        _pod: PodId,
        _request: StepRequest,
    ) -> futures::future::BoxFuture<'static, Result<ChunkStream, BackendError>> {
        Box::pin(async {
            Err(BackendError::Unavailable(
                "this executor only leases decisions: its front sends the requests".into(),
            ))
        })
    }
}

/// Watches an executor's decisions and failed attempts (metrics, logs).
/// Every method has a default that does nothing.
pub trait Observer: Send + Sync {
    /// A step's profile chose `pod`; the decision took `took`.
    fn decided(&self, kind: StepKind, pod: PodId, took: Duration) {
        let _ = (kind, pod, took);
    }

    /// An attempt on `pod` failed before its first chunk (`will_retry`: the
    /// step goes on to another pod).
    fn attempt_failed(&self, pod: PodId, error: &Error, will_retry: bool) {
        let _ = (pod, error, will_retry);
    }
}

/// Runs workflows against a backend, keeping the fleet's counters, the
/// circuit breaker and the cache feedback current.
pub struct Executor {
    observer: Option<Arc<dyn Observer>>,
    backend: Arc<dyn Backend>,
    fleet: Arc<Fleet>,
    breaker: Option<Arc<CircuitBreaker>>,
    feedback: Arc<Feedback>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("retry", &self.retry)
            .field("feedback", &self.feedback)
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor sending to `backend`, choosing among `fleet`'s pods.
    pub fn new(backend: Arc<dyn Backend>, fleet: Arc<Fleet>, feedback: Arc<Feedback>) -> Self {
        Executor {
            observer: None,
            backend,
            fleet,
            breaker: None,
            feedback,
            retry: RetryPolicy::default(),
        }
    }

    /// An executor for a front that sends requests itself and only leases
    /// decisions ([`Executor::lease`]): an endpoint picker, a simulator on
    /// its own clock. [`Executor::execute`] on it fails every attempt with
    /// [`BackendError::Unavailable`].
    pub fn for_leases(fleet: Arc<Fleet>, feedback: Arc<Feedback>) -> Self {
        Executor::new(Arc::new(NoBackend), fleet, feedback)
    }

    /// Feeds failures and latencies to `breaker` (use the same breaker as a
    /// filter in the profiles).
    pub fn with_breaker(mut self, breaker: Arc<CircuitBreaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Reports decisions and failed attempts to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The cache feedback.
    pub fn feedback(&self) -> &Feedback {
        &self.feedback
    }

    /// Runs `workflow` for `request`. Every step but the last runs to
    /// completion here; the returned [`Execution`] streams the last one.
    pub async fn execute(
        &self,
        workflow: &Workflow,
        ctx: Context,
        request: StepRequest,
    ) -> Result<Execution, Error> {
        self.execute_excluding(workflow, ctx, request, &[]).await
    }

    /// [`Executor::execute`] among the fleet's pods but `excluded` (pods
    /// that cannot serve this request: another model's, or without its
    /// LoRA adapter), in every step and every retry.
    pub async fn execute_excluding(
        &self,
        workflow: &Workflow,
        mut ctx: Context,
        request: StepRequest,
        excluded: &[PodId],
    ) -> Result<Execution, Error> {
        let plan = workflow.plan(&ctx, request.prompt_tokens);
        let Some((last, before)) = plan.split_last() else {
            return Err(Error::NoPod(router_policy::Error::NoCandidates {
                filter: "workflow has no steps".into(),
            }));
        };
        let mut req = request;
        let mut steps = Vec::with_capacity(plan.len());
        for step in before {
            req.kind = step.kind;
            let run = self.start(step, &mut ctx, &req, excluded).await?;
            let pod = run.pod;
            steps.push((step.kind, pod));
            let handle = run.drain().await?;
            ctx.insert(PREFILL_POD, pod);
            match handle {
                Some(h) => {
                    ctx.insert(CACHE_HANDLE, h.clone());
                    req.handle = Some(h);
                }
                None if step.kind == StepKind::Prefill => {
                    return Err(Error::Protocol {
                        pod,
                        what: "prefill returned no cache handle",
                    });
                }
                None => {}
            }
        }
        req.kind = last.kind;
        let run = self.start(last, &mut ctx, &req, excluded).await?;
        steps.push((last.kind, run.pod));
        Ok(Execution {
            steps,
            running: Some(run),
        })
    }

    /// One decision of `step`'s profile among the fleet's pods but
    /// `excluded`, with its accounting started: the pod, the blocks the
    /// index said it held, the attempt's guard.
    fn decide(
        &self,
        step: &Step,
        ctx: &mut Context,
        excluded: &[PodId],
        prompt_tokens: u64,
        pods: &mut Vec<router_policy::PodState>,
    ) -> Result<(PodId, u32, InFlight), router_policy::Error> {
        self.fleet.snapshot_into(pods);
        pods.retain(|p| !excluded.contains(&p.id));
        let decide_start = std::time::Instant::now();
        let pod = step.profile.decide(ctx, pods)?.pod;
        if let Some(o) = &self.observer {
            o.decided(step.kind, pod, decide_start.elapsed());
        }
        let bs = self.feedback.block_size();
        let predicted = ctx.get(CACHE_HITS).map_or(0, |h| h.blocks(pod));
        let kv_blocks = prompt_tokens.div_ceil(bs);
        let uncached = prompt_tokens.saturating_sub(u64::from(predicted) * bs);
        Ok((
            pod,
            predicted,
            InFlight::start(self, pod, uncached, kv_blocks),
        ))
    }

    /// Decides where a request goes without sending it, for a front that
    /// sends it itself (an endpoint picker in front of Envoy): the
    /// workflow's one step chooses among the pods but `excluded`, and the
    /// returned [`Lease`] keeps the pod's load counted until it drops.
    /// A workflow of several steps (prefill then decode) needs the
    /// executor to run its first steps: [`Error::Protocol`] here.
    pub fn lease(
        &self,
        workflow: &Workflow,
        mut ctx: Context,
        prompt_tokens: u64,
        excluded: &[PodId],
    ) -> Result<Lease, Error> {
        let plan = workflow.plan(&ctx, prompt_tokens);
        let [step] = plan else {
            return Err(Error::Protocol {
                pod: PodId::new(0, 0),
                what: "a lease needs a workflow of one step",
            });
        };
        let mut pods = Vec::new();
        let (pod, predicted, guard) = self
            .decide(step, &mut ctx, excluded, prompt_tokens, &mut pods)
            .map_err(Error::NoPod)?;
        Ok(Lease {
            pod,
            predicted_blocks: predicted,
            guard,
            feedback: self.feedback.clone(),
            chain: ctx.get(CHAIN).cloned().unwrap_or_default(),
        })
    }

    /// Picks a pod (not one of `never`) and sends the step until one
    /// attempt yields a first chunk; a failed pod is excluded from the
    /// next attempt.
    async fn start(
        &self,
        step: &Step,
        ctx: &mut Context,
        req: &StepRequest,
        never: &[PodId],
    ) -> Result<Running, Error> {
        let deadline = Instant::now() + step.timeout;
        let attempts = self.retry.max_attempts.max(1);
        let mut excluded: Vec<PodId> = never.to_vec();
        let mut last_err = None;
        let mut pods = Vec::new();
        for attempt in 0..attempts {
            let (pod, predicted, mut guard) =
                match self.decide(step, ctx, &excluded, req.prompt_tokens, &mut pods) {
                    Ok(d) => d,
                    Err(e) => {
                        return Err(match last_err {
                            Some(last) => Error::Exhausted {
                                attempts: attempt,
                                last: Box::new(last),
                            },
                            None => Error::NoPod(e),
                        });
                    }
                };
            let backend = self.backend.clone();
            let sent = req.clone();
            let attempt_fut = async move {
                let mut s = backend.send(pod, sent).await?;
                let first = s.next().await;
                Ok::<_, BackendError>((s, first))
            };
            match tokio::time::timeout_at(deadline, attempt_fut).await {
                Ok(Ok((stream, Some(Ok(first))))) => {
                    guard.first_token();
                    return Ok(Running {
                        pod,
                        stream,
                        first: Some(first),
                        guard,
                        deadline: Box::pin(tokio::time::sleep_until(deadline)),
                        feedback: self.feedback.clone(),
                        chain: ctx.get(CHAIN).cloned().unwrap_or_default(),
                        predicted_blocks: predicted,
                    });
                }
                Ok(Ok((_, Some(Err(e @ BackendError::Rejected { .. })))))
                | Ok(Err(e @ BackendError::Rejected { .. })) => {
                    // The request's fault, not the pod's: neither retried
                    // nor counted against the pod.
                    guard.outcome = None;
                    return Err(Error::Backend { pod, source: e });
                }
                Ok(Ok((_, Some(Err(e))))) | Ok(Err(e)) => {
                    guard.outcome = Some(Outcome::Failure);
                    last_err = Some(Error::Backend { pod, source: e });
                }
                Ok(Ok((_, None))) => {
                    guard.outcome = Some(Outcome::Failure);
                    last_err = Some(Error::Protocol {
                        pod,
                        what: "stream ended before its first chunk",
                    });
                }
                Err(_) => {
                    // The step's deadline passed: no time left to retry.
                    guard.outcome = Some(Outcome::Failure);
                    return Err(Error::Timeout { pod });
                }
            }
            drop(guard);
            if let (Some(o), Some(e)) = (&self.observer, &last_err) {
                o.attempt_failed(pod, e, attempt + 1 < attempts);
            }
            excluded.push(pod);
            if attempt + 1 < attempts {
                let wake = (Instant::now() + self.retry.wait(attempt)).min(deadline);
                tokio::time::sleep_until(wake).await;
            }
        }
        Err(Error::Exhausted {
            attempts,
            last: Box::new(last_err.unwrap_or(Error::Protocol {
                pod: PodId::new(0, 0),
                what: "no attempt made",
            })),
        })
    }
}
