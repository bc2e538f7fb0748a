//! The [`Router`]: every layer wired from a [`Config`], with the two ways
//! in a front needs: [`Router::pick`] (decide, the front sends) and
//! [`Router::route`] (decide and send through the HTTP backend, with
//! retries).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use router_core::{GroupKind, GroupSpec, Namespace, PodId, PrefixIndex};
use router_events::Subscriber;
use router_exec::{
    BackendError, Chunk, Error as ExecError, Execution, Executor, Feedback, Lease, RetryPolicy,
    Shortcut, StepKind, StepRequest, Workflow,
};
use router_hash::{ChainHasher, ModelTokenizer};
use router_index::{HybridIndex, Index, IndexConfig};
use router_policy::builtin::{
    BreakerConfig, CircuitBreaker, Evictions, Memory, PrefixMatchPrepare, RoutedChains,
};
use router_policy::keys::{CACHE_HITS, CHAIN, HASH_KEY, PROMPT_TOKENS, SESSION_ID};
use router_policy::{Built, Context, Filter, Fleet, KeyId, Plugin, PodState, Prepare, Registry};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::backend::HttpBackend;
use crate::config::{Config, PodConfig, WorkflowKind};
use crate::metrics::{Metrics, raise};
use crate::openai::{self, ApiError};
use crate::pods::{PodView, Pods, probe_loop};
use crate::{Error, Request};

/// A request the router will not serve, or could not: the metrics label
/// of the reason and the client's answer in OpenAI's shape.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{kind}: {error}")]
#[non_exhaustive]
pub struct Refusal {
    /// The reason, as `cache_router_errors_total` labels it
    /// (`bad_request`, `unknown_model`, `prompt_too_long`, `no_pod`,
    /// `timeout`, `backend`, `rejected`, ...).
    pub kind: &'static str,
    /// The answer for the client.
    pub error: ApiError,
}

impl Refusal {
    /// A refusal labelled `kind` answered with `error`.
    pub fn new(kind: &'static str, error: ApiError) -> Self {
        Refusal { kind, error }
    }
}

/// The pods a change of the pod set added and removed, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PodChanges {
    /// Pods added (or replaced by a changed configuration).
    pub added: Vec<String>,
    /// Pods removed (or replaced).
    pub removed: Vec<String>,
}

/// How many pods there are and how many answer (the gateway's `/health`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Pods configured.
    pub pods: usize,
    /// Pods healthy and answering their last probe.
    pub answering: usize,
    /// Whether any pod has been probed yet (before that, nothing is known
    /// to be healthy).
    pub probed: bool,
}

/// A decision for a front that sends the request itself
/// ([`Router::pick`]): the pod, where it listens, what the index predicted.
/// The pod's load stays counted until the pick drops; report the first
/// token, the engine's cached tokens and the end as they happen.
#[derive(Debug)]
pub struct Pick {
    /// The pod's name.
    pub pod: String,
    /// The pod's base URL.
    pub url: String,
    /// Cached prompt tokens the index said the pod held.
    pub predicted_cached_tokens: u64,
    /// The prompt's length in tokens.
    pub prompt_tokens: u64,
    lease: Lease,
    metrics: Arc<Metrics>,
    arrived: Instant,
    first: bool,
}

impl Pick {
    /// The first token arrived (time to first token is recorded, the pod's
    /// queued prefill ends).
    pub fn first_token(&mut self) {
        if std::mem::take(&mut self.first) {
            let t = self.arrived.elapsed().as_secs_f64();
            self.metrics.ttft_seconds.observe(t);
            self.metrics
                .pod_ttft_seconds
                .with_label_values(&[&self.pod])
                .observe(t);
            self.lease.first_token();
        }
    }

    /// The engine reported `cached` prompt tokens served from its cache.
    pub fn cached_tokens(&mut self, cached: u64) {
        self.metrics.actual_cached_tokens.inc_by(cached);
        self.metrics
            .pod_actual_cached_tokens
            .with_label_values(&[&self.pod])
            .inc_by(cached);
        self.lease.cached_tokens(cached);
    }

    /// The request ended; `ok`: the pod served it. An answer that never
    /// sent a token records no time to first token (the pod's queued
    /// prefill ends with the lease all the same).
    pub fn finish(self, ok: bool) {
        self.lease.finish(ok);
    }
}

/// A request sent by [`Router::route`]: the pods chosen and the engine's
/// answer as a stream of chunks (dropping it cancels the request and
/// settles the accounting). The time to the first chunk and the engine's
/// cached tokens are recorded as they pass. [`Routed::body`] and
/// [`Routed::sse`] give the answer as an OpenAI front sends it.
pub struct Routed {
    /// The pod streaming the answer.
    pub pod: Option<String>,
    /// The pod that ran the prefill step (a prefill-decode workflow).
    pub prefill_pod: Option<String>,
    /// Cached prompt tokens the index said `pod` held.
    pub predicted_cached_tokens: u64,
    /// The prompt's length in tokens.
    pub prompt_tokens: u64,
    execution: Execution,
    metrics: Arc<Metrics>,
    arrived: Instant,
    first: bool,
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed")
            .field("pod", &self.pod)
            .field("prefill_pod", &self.prefill_pod)
            .field("predicted_cached_tokens", &self.predicted_cached_tokens)
            .finish_non_exhaustive()
    }
}

impl Routed {
    /// The whole answer of a request not streamed: the engine's last body
    /// (a 502 refusal if it sent none).
    pub async fn body(mut self) -> Result<Value, Refusal> {
        use futures::StreamExt;
        let mut data = None;
        while let Some(item) = self.next().await {
            if let Chunk::Data(v) = item? {
                data = Some(v);
            }
        }
        data.ok_or_else(|| {
            Refusal::new(
                "backend",
                ApiError::new(
                    502,
                    "bad_gateway",
                    "empty_response",
                    "the engine sent no body".into(),
                ),
            )
        })
    }

    /// A streamed answer as OpenAI's server-sent events: the engine's
    /// events passed on (the usage-only chunk when `include_usage`), an
    /// error event if it breaks (counted as `stream_timeout` or
    /// `stream_backend`), then `data: [DONE]`.
    pub fn sse(self, include_usage: bool) -> impl Stream<Item = bytes::Bytes> + Send + 'static {
        use futures::StreamExt;
        let metrics = self.metrics.clone();
        self.filter_map(move |item| {
            let event = match item {
                Ok(Chunk::Data(v)) if include_usage || !openai::is_usage_only(&v) => {
                    Some(crate::sse::event(&v.to_string()))
                }
                Ok(Chunk::Text(text)) => Some(crate::sse::event(&text)),
                Ok(_) => None,
                Err(r) => {
                    // One count per failed request; the kind says it broke
                    // after streaming began.
                    metrics.error(if r.kind == "timeout" {
                        "stream_timeout"
                    } else {
                        "stream_backend"
                    });
                    Some(crate::sse::event(&r.error.body().to_string()))
                }
            };
            futures::future::ready(event.map(bytes::Bytes::from))
        })
        .chain(futures::stream::once(futures::future::ready(
            bytes::Bytes::from_static(b"data: [DONE]\n\n"),
        )))
    }

    fn record(&mut self, chunk: &Chunk) {
        let pod = self.pod.as_deref().unwrap_or("");
        match chunk {
            Chunk::Data(_) | Chunk::Text(_) if std::mem::take(&mut self.first) => {
                let t = self.arrived.elapsed().as_secs_f64();
                self.metrics.ttft_seconds.observe(t);
                if self.pod.is_some() {
                    self.metrics
                        .pod_ttft_seconds
                        .with_label_values(&[pod])
                        .observe(t);
                }
            }
            Chunk::Usage { cached_tokens, .. } => {
                let c = cached_tokens.unwrap_or(0);
                self.metrics.actual_cached_tokens.inc_by(c);
                if self.pod.is_some() {
                    self.metrics
                        .pod_actual_cached_tokens
                        .with_label_values(&[pod])
                        .inc_by(c);
                }
            }
            _ => {}
        }
    }
}

impl Stream for Routed {
    type Item = Result<Chunk, Refusal>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match Pin::new(&mut this.execution).poll_next(cx) {
            Poll::Ready(Some(Ok(c))) => {
                this.record(&c);
                Poll::Ready(Some(Ok(c)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(refusal(&e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A request checked, tokenized and hashed: what a decision reads.
struct Prepared {
    body: Value,
    prompt_tokens: u64,
    ctx: Context,
    /// The LoRA adapter the request names, served by some pods only.
    adapter: Option<String>,
}

/// What the models behind one [`Router`] share: the index (pod ids are
/// unique across models; blocks never collide, since each model's chains
/// hash in its own namespace) and the metrics.
#[derive(Clone)]
struct Shared {
    index: Arc<Index>,
    metrics: Arc<Metrics>,
}

struct Inner {
    model: String,
    tokenizer: Arc<ModelTokenizer>,
    hasher: ChainHasher,
    namespace: Namespace,
    block_size: u64,
    /// The context limit on prompt (and requested) tokens.
    max_prompt_tokens: Option<u64>,
    sanitize_control_tokens: bool,
    tokenize: Semaphore,
    /// The threads that tokenize (as many as `tokenize` has permits).
    tokenizers: crate::pool::Pool,
    pods: Arc<Pods>,
    breaker: Arc<CircuitBreaker>,
    executor: Executor,
    workflow: Workflow,
    metrics: Arc<Metrics>,
    config_path: Option<PathBuf>,
    /// The fixed pods ([`Config::add_fixed_pod`]), which a reloaded file
    /// does not list.
    fixed: Vec<PodConfig>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// cache-router's routing core: the pods and their lifecycle (health
/// probes and grace, engine metrics, event followers, restarts), the index,
/// the profiles, the executor with its retries and accounting, the metrics
/// and, with `[nats]`, replication. Cheap to clone (one shared core); the
/// background tasks stop when the last clone drops.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use router_service::{Config, PodConfig, Request, Router};
///
/// let mut config = Config::parse(
///     "[gateway]\nmodel = \"Qwen/Qwen3-0.6B\"\ntokenizer = \"assets/tokenizers/qwen3\"\n",
///     std::path::Path::new("."),
/// )?;
/// config.pods.push(PodConfig::new("a", "http://10.0.0.1:8000").with_events("tcp://10.0.0.1:5557", None));
/// let router = Router::start(config).await?;
/// let pick = router.pick(Request::chat("Qwen/Qwen3-0.6B", [("user", "Hello")])).await?;
/// println!("send it to {} ({} tokens cached)", pick.url, pick.predicted_cached_tokens);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Router {
    /// The first model's core (`[gateway]`'s).
    inner: Arc<Inner>,
    /// With `[[models]]`: every model's router, the first one first (each
    /// with no models of its own); empty when one model is served.
    models: Arc<[Router]>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("model", &self.inner.model)
            .finish_non_exhaustive()
    }
}

/// router-policy's `prefix-match` with its query timed into the metrics.
#[derive(Debug)]
struct MeteredPrefixMatch {
    inner: PrefixMatchPrepare,
    metrics: Arc<Metrics>,
}

impl Plugin for MeteredPrefixMatch {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn needs(&self) -> Vec<KeyId> {
        self.inner.needs()
    }
    fn produces(&self) -> Vec<KeyId> {
        self.inner.produces()
    }
}

impl Prepare for MeteredPrefixMatch {
    fn prepare(&self, ctx: &mut Context, pods: &[PodState]) {
        let t = Instant::now();
        self.inner.prepare(ctx, pods);
        let m = &self.metrics;
        m.index_query_seconds.observe(t.elapsed().as_secs_f64());
        if let Some(hits) = ctx.get(CACHE_HITS) {
            m.matched_blocks.observe(f64::from(hits.best()));
        }
    }
}

/// The router's one circuit breaker, as a filter: the executor feeds the
/// same instance.
#[derive(Debug)]
struct SharedBreaker(Arc<CircuitBreaker>);

impl Plugin for SharedBreaker {
    fn name(&self) -> &str {
        "circuit-breaker"
    }
}

impl Filter for SharedBreaker {
    fn keep(&self, ctx: &Context, pod: &PodState) -> bool {
        self.0.keep(ctx, pod)
    }
}

/// The plugin registry: the built-ins, `prefix-match` timed into the
/// metrics, and one circuit breaker shared by every profile.
fn registry(
    index: Arc<dyn PrefixIndex>,
    metrics: Arc<Metrics>,
    breaker_slot: Arc<OnceLock<Arc<CircuitBreaker>>>,
    routed: Arc<RoutedChains>,
) -> Registry {
    let mut registry = Registry::with_builtins()
        .with_index(index.clone())
        .with_routed(routed);
    registry.register("prefix-match", move |p, _| {
        p.none()?;
        Ok(Built::Prepare(Box::new(MeteredPrefixMatch {
            inner: PrefixMatchPrepare::new(index.clone()),
            metrics: metrics.clone(),
        })))
    });
    registry.register("circuit-breaker", move |p, _| {
        let c: BreakerConfig = p.parse()?;
        // One breaker per router: the first profile's parameters win.
        let b = breaker_slot.get_or_init(|| Arc::new(CircuitBreaker::new(c)));
        Ok(Built::Filter(Box::new(SharedBreaker(b.clone()))))
    });
    registry
}

/// The workflow `config` names, from its profiles (or the defaults).
fn workflow(config: &Config, registry: &Registry) -> Result<Workflow, Error> {
    let text = if config.has_profiles() {
        config.text.clone()
    } else {
        default_profiles(config.gateway.block_size)
    };
    let mut all = registry.load_embedded(&text)?;
    let mut take = |name: &str, key: &str| {
        all.remove(name).map(Arc::new).ok_or_else(|| Error::Config {
            line: 0,
            message: format!(
                "gateway.{key} `{name}` is not among the profiles ({})",
                all.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        })
    };
    let g = &config.gateway;
    let w = match g.workflow {
        WorkflowKind::Single => Workflow::single(take(&g.profile, "profile")?),
        WorkflowKind::PrefillDecode => {
            let prefill = take(&g.prefill_profile, "prefill_profile")?;
            let decode = take(&g.decode_profile, "decode_profile")?;
            let w = Workflow::prefill_decode(prefill, decode);
            if g.decode_only_below_tokens > 0 {
                w.with_shortcut(Shortcut {
                    max_prompt_tokens: g.decode_only_below_tokens,
                    min_cached_fraction: f64::INFINITY,
                })
            } else {
                w
            }
        }
    };
    Ok(w.with_timeout(Duration::from_millis(g.request_timeout_ms)))
}

/// Profiles for a file without any: router-policy's default with the
/// configured block size and the health and circuit-breaker filters, and a
/// prefill and a decode profile for disaggregated serving (the prefill pod
/// chosen for its cache, the decode pod for its load).
fn default_profiles(block_size: u32) -> String {
    let mut text = router_policy::default_profiles_toml(
        u64::from(block_size),
        r#"{ type = "health" }, { type = "circuit-breaker" }"#,
    );
    text.push_str(&format!(
        r#"
[profiles.prefill]
inputs = ["chain", "prompt_tokens"]
prepare = [{{ type = "prefix-match" }}, {{ type = "speculative" }}]
filters = [{{ type = "health" }}, {{ type = "circuit-breaker" }}, {{ type = "role", role = "prefill" }}]
scorers = [{{ type = "predicted-ttft", weight = 1.0, block_size = {block_size} }}]
picker = {{ type = "max-score" }}

[profiles.decode]
filters = [{{ type = "health" }}, {{ type = "circuit-breaker" }}, {{ type = "role", role = "decode" }}]
picker = {{ type = "least-requests" }}
"#
    ));
    text
}

/// The PEM bundle of `gateway.tls_ca_file`, checked to hold certificates
/// that parse (a typo must not start a router that trusts nothing extra).
#[cfg(feature = "rustls")]
fn read_ca(path: &Path) -> Result<Vec<u8>, Error> {
    let pem = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    let bad = |why: String| Error::Config {
        line: 0,
        message: format!("gateway.tls_ca_file {}: {why}", path.display()),
    };
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if certs.is_empty() => Err(bad("holds no PEM certificate".into())),
        Ok(_) => Ok(pem),
        Err(e) => Err(bad(format!(
            "not a PEM certificate bundle ({})",
            error_chain(&e)
        ))),
    }
}

/// Without TLS built in there is no authority to read (the config check
/// already refused `tls_ca_file`).
#[cfg(not(feature = "rustls"))]
fn read_ca(path: &Path) -> Result<Vec<u8>, Error> {
    Err(Error::Config {
        line: 0,
        message: format!(
            "gateway.tls_ca_file {}: needs a build with the `rustls` feature",
            path.display()
        ),
    })
}

/// An error and its causes, `: `-separated (reqwest's own text is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The error kind label and the client's answer for a failed workflow.
fn refusal(e: &ExecError) -> Refusal {
    match e {
        ExecError::NoPod(_) => Refusal::new(
            "no_pod",
            ApiError::new(
                503,
                "service_unavailable",
                "no_healthy_pod",
                format!("no pod can take the request: {e}"),
            ),
        ),
        ExecError::Timeout { .. } => Refusal::new(
            "timeout",
            ApiError::new(504, "timeout", "backend_timeout", e.to_string()),
        ),
        ExecError::Exhausted { last, .. } => match refusal(last) {
            r if r.kind == "timeout" => r,
            _ => Refusal::new(
                "backend",
                ApiError::new(502, "bad_gateway", "backend_failed", e.to_string()),
            ),
        },
        ExecError::Backend {
            source: BackendError::Rejected { status, body },
            ..
        } => {
            let message = serde_json::from_str::<Value>(body)
                .ok()
                .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| body.clone());
            let mut api = ApiError::bad_request(message, None);
            api.status = *status;
            Refusal::new("rejected", api)
        }
        _ => Refusal::new(
            "backend",
            ApiError::new(502, "bad_gateway", "backend_failed", e.to_string()),
        ),
    }
}

fn too_long(what: String) -> Refusal {
    Refusal::new(
        "prompt_too_long",
        ApiError::new(
            400,
            "invalid_request_error",
            "context_length_exceeded",
            what,
        ),
    )
}

/// The pieces [`Router::start`] wires before the pods join.
struct Parts {
    index: Arc<Index>,
    /// The index plus hybrid models' other KV-cache groups: what the
    /// decision reads and the events feed (with `hybrid_groups`).
    hybrid: Arc<HybridIndex>,
    fleet: Arc<Fleet>,
    routed: Arc<RoutedChains>,
    backend: Arc<HttpBackend>,
    metrics: Arc<Metrics>,
    breaker: Arc<CircuitBreaker>,
    workflow: Workflow,
}

impl Parts {
    fn new(config: &Config, shared: Option<&Shared>) -> Result<(Parts, Option<Vec<u8>>), Error> {
        let g = &config.gateway;
        let (index, metrics) = match shared {
            Some(s) => (s.index.clone(), s.metrics.clone()),
            None => (Index::new(IndexConfig::default()), Arc::new(Metrics::new())),
        };
        let mut declared = Vec::with_capacity(g.kv_groups.len());
        for (i, k) in g.kv_groups.iter().enumerate() {
            let spec = k
                .parse::<GroupKind>()
                .and_then(|kind| GroupSpec::new(i as u32, kind, g.block_size))
                .map_err(|e| Error::Config {
                    line: 0,
                    message: format!("gateway.kv_groups: `{k}`: {e}"),
                })?;
            declared.push(spec);
        }
        let hybrid = HybridIndex::with_layout(index.clone(), declared);
        // The full-attention-only view reads the index alone.
        let decided: Arc<dyn PrefixIndex> = if g.hybrid_groups {
            hybrid.clone()
        } else {
            index.clone()
        };
        let breaker_slot = Arc::new(OnceLock::new());
        let routed = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
        let registry = registry(
            decided,
            metrics.clone(),
            breaker_slot.clone(),
            routed.clone(),
        );
        let workflow = workflow(config, &registry)?;
        let breaker = breaker_slot
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::new(CircuitBreaker::new(BreakerConfig::default())));
        let extra_ca = match &g.tls_ca_file {
            Some(path) => Some(read_ca(path)?),
            None => None,
        };
        let backend = Arc::new(
            HttpBackend::with_tls(
                Duration::from_millis(g.connect_timeout_ms),
                extra_ca.as_deref(),
            )
            .map_err(|e| client_error("http client", &e))?,
        );
        let parts = Parts {
            index,
            hybrid,
            fleet: Arc::new(Fleet::new()),
            routed,
            backend,
            metrics,
            breaker,
            workflow,
        };
        Ok((parts, extra_ca))
    }
}

fn client_error(what: &str, e: &reqwest::Error) -> Error {
    Error::Bind {
        what: what.into(),
        message: error_chain(e),
    }
}

impl Router {
    /// Starts the router `config` describes on the current tokio runtime
    /// (multi-threaded): joins its `[[pods]]`, follows their events,
    /// probes their health, connects to NATS when `[nats]` is set. With
    /// `[[models]]`, each model gets its own tokenizer, chains, profiles,
    /// pods and event followers; the index and the metrics are shared.
    pub async fn start(mut config: Config) -> Result<Router, Error> {
        // Pods added in code ([`Config::add_fixed_pod`]) are checked here.
        crate::config::check_pod_models(&config.pods, &config.model_names())?;
        if config.models.is_empty() {
            return Router::start_one(config, None).await;
        }
        // Names and URLs are unique across every model's pods.
        crate::config::normalise_pods(&mut config.pods)?;
        let shared = Shared {
            index: Index::new(IndexConfig::default()),
            metrics: Arc::new(Metrics::new()),
        };
        let mut all = vec![Router::start_one(config.for_model(None), Some(shared.clone())).await?];
        for m in &config.models {
            all.push(Router::start_one(config.for_model(Some(m)), Some(shared.clone())).await?);
        }
        let pods: Vec<_> = all.iter().map(|r| Arc::downgrade(&r.inner.pods)).collect();
        shared.metrics.set_namer(Arc::new(move |id| {
            pods.iter().find_map(|p| p.upgrade()?.name_of(id))
        }));
        Ok(Router {
            inner: all[0].inner.clone(),
            models: all.into(),
        })
    }

    /// One model's router: `shared` holds what the models behind one
    /// router share (none: a router of one model).
    async fn start_one(mut config: Config, shared: Option<Shared>) -> Result<Router, Error> {
        let g = config.gateway.clone();
        let mut tokenizer = ModelTokenizer::from_dir(&g.tokenizer)?;
        if g.tokenize_cache_mb << 20 != router_hash::SEGMENT_CACHE_BYTES {
            tokenizer.set_segment_cache(g.tokenize_cache_mb.saturating_mul(1 << 20));
        }
        let tokenizer = Arc::new(tokenizer);
        if config.simulated.is_some() {
            return Err(Error::Config {
                line: 0,
                message: "the [simulated] engines are started by router-sim-engine's SimGateway \
                          (the cache-router command uses it); a Router routes to the \
                          [[pods]] only"
                    .into(),
            });
        }
        crate::config::normalise_pods(&mut config.pods)?;
        let hasher = ChainHasher::new(g.block_size as usize)?;
        let (p, extra_ca) = Parts::new(&config, shared.as_ref())?;
        let forget = p.routed.clone();
        // Registrations end when the engine evicts their blocks.
        // With `hybrid_groups` off, the plain index refuses other groups'
        // events (counted as `other_group`).
        let sink: Arc<dyn router_core::CacheEventSink> = if g.hybrid_groups {
            Arc::new(Evictions::new(p.hybrid.clone(), p.routed.clone()))
        } else {
            Arc::new(Evictions::new(p.index.clone(), p.routed.clone()))
        };
        let subscriber = Subscriber::new(
            Arc::new(hasher),
            sink.clone(),
            // Shutdowns through it forget a pod's groups too.
            p.hybrid.clone(),
            Some(g.model.clone()),
            g.block_size,
        )
        .with_chunk_size(g.attention_chunk_size)
        .on_clear(Arc::new(move |pod, _| forget.remove_pod(pod)));
        let replica = match &config.nats {
            Some(n) => Some(Arc::new(
                router_nats::Replica::connect({
                    let mut c = n.to_config();
                    c.attention_chunk_size = g.attention_chunk_size;
                    c
                })
                .await
                .map_err(|e| Error::Nats(e.to_string()))?,
            )),
            None => None,
        };
        let pods = Arc::new(Pods::new(
            p.index.clone(),
            subscriber,
            p.fleet.clone(),
            p.backend.clone(),
            p.routed.clone(),
            Memory::new(g.approx_ttl_ms, g.approx_capacity_blocks),
            replica.clone(),
        ));
        for pod in config.pods.clone() {
            pods.add(pod)?;
        }
        if shared.is_none() {
            let named = Arc::downgrade(&pods);
            p.metrics
                .set_namer(Arc::new(move |id| named.upgrade()?.name_of(id)));
        }
        if let Some(r) = &replica {
            // The index is built from the shared log (after the newest
            // snapshot); load and registrations are shared.
            let forget = p.routed.clone();
            r.start_log(
                Arc::new(hasher),
                sink,
                Some(g.model.clone()),
                g.block_size,
                Some(Arc::new(move |pod, _| forget.remove_pod(pod))),
            )
            .await
            .map_err(|e| Error::Nats(e.to_string()))?;
            r.share(p.fleet.clone(), p.routed.clone());
        }
        let executor = Executor::new(
            p.backend,
            p.fleet,
            Arc::new(Feedback::new(u64::from(g.block_size))),
        )
        .with_breaker(p.breaker.clone())
        .with_retry(RetryPolicy::new(g.max_attempts, Duration::from_millis(10)))
        .with_observer(p.metrics.clone());
        let probe_client = crate::backend::engine_client(extra_ca.as_deref())
            .and_then(reqwest::ClientBuilder::build)
            .map_err(|e| client_error("probe client", &e))?;
        let mut tasks = vec![tokio::spawn(probe_loop(
            pods.clone(),
            probe_client,
            Duration::from_millis(g.health_interval_ms.max(10)),
            g.unhealthy_after.max(1),
            Duration::from_millis(g.unhealthy_grace_ms),
            u64::from(g.block_size),
        ))];
        if let (Some(path), true) = (&config.path, g.watch_pods_ms > 0) {
            tasks.push(tokio::spawn(watch_pods(
                Arc::downgrade(&pods),
                path.clone(),
                g.model.clone(),
                config.fixed.clone(),
                Duration::from_millis(g.watch_pods_ms),
                config.loaded_stamp.or_else(|| stamp(path)),
            )));
        }
        let inner = Inner {
            namespace: Namespace::model(g.model.clone()),
            model: g.model.clone(),
            max_prompt_tokens: match g.max_prompt_tokens {
                Some(0) => None,
                Some(n) => Some(n),
                None => tokenizer.model_max_length(),
            },
            tokenizer,
            hasher,
            block_size: u64::from(g.block_size),
            sanitize_control_tokens: g.sanitize_control_tokens,
            tokenize: Semaphore::new(g.tokenize_concurrency),
            tokenizers: crate::pool::Pool::new("cache-router-tokenize", g.tokenize_concurrency)
                .map_err(|e| Error::Bind {
                    what: "tokenizer threads".into(),
                    message: e.to_string(),
                })?,
            pods,
            breaker: p.breaker,
            executor,
            workflow: p.workflow,
            metrics: p.metrics,
            config_path: config.path.clone(),
            fixed: config.fixed.clone(),
            tasks,
        };
        // ZeroMQ's slow joiner: a PUB drops what it sends before the SUB's
        // subscription arrives. Give the new subscriptions a moment.
        if config.pods.iter().any(|p| p.events.is_some()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Router {
            inner: Arc::new(inner),
            models: Arc::from(Vec::new()),
        })
    }

    /// Every model's router (this one alone when it serves one model).
    fn all(&self) -> &[Router] {
        if self.models.is_empty() {
            std::slice::from_ref(self)
        } else {
            &self.models
        }
    }

    /// The first model served (`[gateway]`'s).
    pub fn model(&self) -> &str {
        &self.inner.model
    }

    /// Every model served, the first one first (requests for another, or
    /// for an adapter no pod serves, are refused with a 404).
    pub fn models(&self) -> Vec<String> {
        self.all().iter().map(|r| r.inner.model.clone()).collect()
    }

    /// The LoRA adapters some pod serves, each with its base model, sorted.
    pub fn adapters(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .all()
            .iter()
            .flat_map(|r| {
                r.inner
                    .pods
                    .adapters()
                    .into_iter()
                    .map(|a| (a, r.inner.model.clone()))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The model's router a request for `model` goes to, with the LoRA
    /// adapter it names (a model's name first; then an adapter some pod
    /// serves); a 404 as vLLM answers otherwise.
    fn target(&self, model: &str) -> Result<(&Router, Option<String>), Refusal> {
        let all = self.all();
        if let Some(r) = all.iter().find(|r| r.inner.model == model) {
            return Ok((r, None));
        }
        match all.iter().find(|r| r.inner.pods.serves_adapter(model)) {
            Some(r) => Ok((r, Some(model.to_owned()))),
            None => Err(Refusal::new(
                "unknown_model",
                ApiError::unknown_model(model),
            )),
        }
    }

    /// Decides where `request` goes without sending it (for a front that
    /// sends it itself, such as an endpoint picker): checked, tokenized,
    /// hashed, decided by the configured profile (one step: a
    /// prefill-decode workflow needs [`Router::route`]).
    pub async fn pick(&self, request: Request) -> Result<Pick, Refusal> {
        self.pick_among(request, |_| true).await
    }

    /// [`Router::pick`] among the pods whose base URL `eligible` accepts
    /// (an endpoint picker's subset hint).
    pub async fn pick_among(
        &self,
        request: Request,
        eligible: impl Fn(&str) -> bool,
    ) -> Result<Pick, Refusal> {
        let arrived = Instant::now();
        let (r, adapter) = self.target(request.model())?;
        let p = r.prepare(request, adapter).await?;
        r.decide(p, arrived, eligible)
    }

    /// [`Router::pick`] done entirely on the calling thread, tokenizing
    /// included: for a caller with threads of its own that may block (the
    /// Python binding calls it with the GIL released), saving the hop to
    /// the tokenizer threads and back. Never call it on an async thread;
    /// the tokenizing bound (`tokenize_concurrency`) is the caller's to
    /// keep here.
    pub fn pick_blocking(&self, request: Request) -> Result<Pick, Refusal> {
        let arrived = Instant::now();
        let (r, adapter) = self.target(request.model())?;
        let asked = r.check(&request)?;
        let session = request.session().map(str::to_owned);
        let s = &r.inner;
        let (api, body) = request.into_parts();
        let tokens = openai::prompt_tokens(api, &body, &s.tokenizer, s.sanitize_control_tokens)
            .map_err(|e| Refusal::new("bad_request", e))?;
        let p = r.prepared(session, body, tokens, asked, adapter)?;
        r.decide(p, arrived, |_| true)
    }

    /// The decision of a prepared request among the pods `eligible`
    /// accepts, as a [`Pick`].
    fn decide(
        &self,
        p: Prepared,
        arrived: Instant,
        eligible: impl Fn(&str) -> bool,
    ) -> Result<Pick, Refusal> {
        let s = &self.inner;
        let adapter = p.adapter.as_deref();
        let excluded = s
            .pods
            .ids_where(|c| !eligible(&c.url) || adapter.is_some_and(|a| !serves(c, a)));
        let lease = s
            .executor
            .lease(&s.workflow, p.ctx, p.prompt_tokens, &excluded)
            .map_err(|e| refusal(&e))?;
        let predicted = u64::from(lease.predicted_cached_blocks()) * s.block_size;
        let (pod, url) = s.pods.name_and_url(lease.pod()).ok_or_else(|| {
            refusal(&ExecError::NoPod(router_policy::Error::NoCandidates {
                filter: "the pod chosen left".into(),
            }))
        })?;
        self.count_routed(&pod, p.prompt_tokens, predicted);
        Ok(Pick {
            pod,
            url,
            predicted_cached_tokens: predicted,
            prompt_tokens: p.prompt_tokens,
            lease,
            metrics: s.metrics.clone(),
            arrived,
            first: true,
        })
    }

    /// Decides and sends `request` through the HTTP backend (retrying on
    /// other pods before the first chunk; both steps of a prefill-decode
    /// workflow); the answer streams from the returned [`Routed`].
    pub async fn route(&self, request: Request) -> Result<Routed, Refusal> {
        let arrived = Instant::now();
        let (r, adapter) = self.target(request.model())?;
        r.route_here(request, adapter, arrived).await
    }

    /// [`Router::route`] on this model's pods (those serving `adapter`).
    async fn route_here(
        &self,
        request: Request,
        adapter: Option<String>,
        arrived: Instant,
    ) -> Result<Routed, Refusal> {
        let stream = request.is_stream();
        let p = self.prepare(request, adapter).await?;
        let s = &self.inner;
        let excluded = match p.adapter.as_deref() {
            Some(a) => s.pods.ids_where(|c| !serves(c, a)),
            None => Vec::new(),
        };
        let mut body = p.body;
        if stream {
            // The engine's usage chunk feeds the cache feedback; a front
            // drops it on the way out unless the client asked for it.
            body["stream_options"] = json!({"include_usage": true});
        }
        let req = StepRequest::new(body, p.prompt_tokens);
        let execution = s
            .executor
            .execute_excluding(&s.workflow, p.ctx, req, &excluded)
            .await
            .map_err(|e| refusal(&e))?;
        let predicted = u64::from(execution.predicted_cached_blocks()) * s.block_size;
        let pod = execution.pod().and_then(|id| s.pods.name_of(id));
        if let Some(name) = &pod {
            self.count_routed(name, p.prompt_tokens, predicted);
        } else {
            s.metrics.predicted_cached_tokens.inc_by(predicted);
        }
        let prefill_pod = execution
            .steps()
            .iter()
            .find(|(kind, _)| *kind == StepKind::Prefill)
            .and_then(|(_, id)| s.pods.name_of(*id));
        Ok(Routed {
            pod,
            prefill_pod,
            predicted_cached_tokens: predicted,
            prompt_tokens: p.prompt_tokens,
            execution,
            metrics: s.metrics.clone(),
            arrived,
            first: true,
        })
    }

    fn count_routed(&self, pod: &str, prompt_tokens: u64, predicted: u64) {
        let m = &self.inner.metrics;
        m.predicted_cached_tokens.inc_by(predicted);
        m.pod_prompt_tokens
            .with_label_values(&[pod])
            .inc_by(prompt_tokens);
        m.pod_predicted_cached_tokens
            .with_label_values(&[pod])
            .inc_by(predicted);
    }

    /// Checks `request` (the context limit; its model is this router's or
    /// `adapter`), tokenizes it as the engine will and hashes it into what
    /// the profiles read.
    async fn prepare(
        &self,
        request: Request,
        adapter: Option<String>,
    ) -> Result<Prepared, Refusal> {
        let asked = self.check(&request)?;
        let session = request.session().map(str::to_owned);
        let (body, tokens) = self.tokenize(request).await?;
        self.prepared(session, body, tokens, asked, adapter)
    }

    /// The checks before tokenizing: a lower bound of the prompt against
    /// the context limit; the tokens asked for.
    fn check(&self, request: &Request) -> Result<u64, Refusal> {
        let s = &self.inner;
        let asked = request.max_tokens();
        if let Some(limit) = s.max_prompt_tokens {
            let at_least = openai::prompt_tokens_at_least(request.body(), |b| {
                s.tokenizer.min_tokens_for_bytes(b)
            }) as u64;
            if at_least > limit {
                return Err(too_long(format!(
                    "this model's maximum context length is {limit} tokens; the prompt has at least {at_least}"
                )));
            }
        }
        Ok(asked)
    }

    /// The checks after tokenizing, and what the profiles read.
    fn prepared(
        &self,
        session: Option<String>,
        body: Value,
        tokens: Vec<u32>,
        asked: u64,
        adapter: Option<String>,
    ) -> Result<Prepared, Refusal> {
        let s = &self.inner;
        let prompt = tokens.len() as u64;
        if let Some(limit) = s.max_prompt_tokens
            && prompt.saturating_add(asked) > limit
        {
            return Err(too_long(format!(
                "this model's maximum context length is {limit} tokens; the request has {} ({prompt} in the prompt, {asked} asked for)",
                prompt.saturating_add(asked)
            )));
        }
        s.metrics.prompt_tokens.inc_by(prompt);
        // vLLM's `cache_salt`: the request's blocks hash in its namespace.
        let salt = body.get("cache_salt").and_then(Value::as_str);
        let ctx = self.context(session, adapter.as_deref(), salt, &tokens);
        Ok(Prepared {
            body,
            prompt_tokens: prompt,
            ctx,
            adapter,
        })
    }

    /// The prompt's tokens: a light prompt's here ([`openai::is_light`]: a
    /// short chat costs tens of microseconds, less than the hop), any other
    /// on the router's tokenizer threads (off the async threads, a bounded
    /// number at once; see `pool.rs` for why not `spawn_blocking`); the
    /// body comes back with them.
    async fn tokenize(&self, request: Request) -> Result<(Value, Vec<u32>), Refusal> {
        let s = &self.inner;
        let failed = || {
            Refusal::new(
                "internal",
                ApiError::new(500, "server_error", "internal", "tokenizing failed".into()),
            )
        };
        if openai::is_light(request.body()) {
            let (api, body) = request.into_parts();
            // Contained as on the tokenizer threads: a tokenizer that panics
            // fails this request, not the connection's task.
            let tokens = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                openai::prompt_tokens(api, &body, &s.tokenizer, s.sanitize_control_tokens)
            }))
            .map_err(|_| failed())?;
            return Ok((body, tokens.map_err(|e| Refusal::new("bad_request", e))?));
        }
        let _permit = s.tokenize.acquire().await.map_err(|_| {
            Refusal::new(
                "shutdown",
                ApiError::new(
                    503,
                    "service_unavailable",
                    "shutting_down",
                    "shutting down".into(),
                ),
            )
        })?;
        let (tok, sanitize) = (s.tokenizer.clone(), s.sanitize_control_tokens);
        let (api, body) = request.into_parts();
        let (body, tokens) = s
            .tokenizers
            .run(move || {
                let t = openai::prompt_tokens(api, &body, &tok, sanitize);
                (body, t)
            })
            .await
            .ok_or_else(failed)?;
        Ok((body, tokens.map_err(|e| Refusal::new("bad_request", e))?))
    }

    /// What the profiles read: the chain (in the namespace of the model,
    /// its LoRA adapter and the cache salt), the prompt's length, the
    /// session and the hash key.
    fn context(
        &self,
        session: Option<String>,
        adapter: Option<&str>,
        salt: Option<&str>,
        tokens: &[u32],
    ) -> Context {
        let s = &self.inner;
        let chain = if adapter.is_none() && salt.is_none() {
            s.hasher.chain(&s.namespace, tokens)
        } else {
            let mut ns = s.namespace.clone();
            ns.lora_name = adapter.map(str::to_owned);
            ns.cache_salt = salt.map(str::to_owned);
            s.hasher.chain(&ns, tokens)
        };
        let mut ctx = Context::new();
        ctx.insert(PROMPT_TOKENS, tokens.len() as u64);
        ctx.insert(
            HASH_KEY,
            match &session {
                Some(id) => xxhash_rust::xxh3::xxh3_64(id.as_bytes()),
                None => chain.first().map_or(0, |h| h.0),
            },
        );
        if let Some(id) = session {
            ctx.insert(SESSION_ID, id);
        }
        ctx.insert(CHAIN, chain);
        ctx
    }

    /// Adds a pod (joined to the index, followed, probed) to its model's
    /// pods; its id.
    pub fn add_pod(&self, mut pod: PodConfig) -> Result<PodId, Error> {
        crate::config::normalise_pod(&mut pod)?;
        let r = self.owner(&pod)?;
        for other in self.all() {
            if !Arc::ptr_eq(&other.inner, &r.inner) {
                other.inner.pods.refuse_conflict(&pod)?;
            }
        }
        r.inner.pods.add(pod)
    }

    /// The model's router that `pod` joins: its `model`'s (`[gateway]`'s
    /// without one), its adapters checked.
    fn owner(&self, pod: &PodConfig) -> Result<&Router, Error> {
        let names = self.models();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::config::check_pod_models(std::slice::from_ref(pod), &names)?;
        let model = pod.model.as_deref().unwrap_or(&self.inner.model);
        Ok(self
            .all()
            .iter()
            .find(|r| r.inner.model == model)
            .unwrap_or(self))
    }

    /// Removes the pod named `name`; whether there was one.
    pub fn remove_pod(&self, name: &str) -> bool {
        self.all().iter().any(|r| r.inner.pods.remove(name))
    }

    /// Makes the pod set `wanted` (pods changed are replaced, each pod in
    /// its model's set); the names added and removed.
    pub fn replace_pods(&self, mut wanted: Vec<PodConfig>) -> Result<PodChanges, Error> {
        crate::config::normalise_pods(&mut wanted)?;
        let mut by_model: Vec<Vec<PodConfig>> = vec![Vec::new(); self.all().len()];
        for pod in wanted {
            let owner = self.owner(&pod)?;
            let at = self
                .all()
                .iter()
                .position(|r| Arc::ptr_eq(&r.inner, &owner.inner))
                .unwrap_or(0);
            by_model[at].push(pod);
        }
        let mut changes = PodChanges::default();
        for (r, wanted) in self.all().iter().zip(by_model) {
            let (added, removed) = r.inner.pods.replace_all(wanted)?;
            changes.added.extend(added);
            changes.removed.extend(removed);
        }
        Ok(changes)
    }

    /// Re-reads the configuration file the router was started from and
    /// applies its `[[pods]]` (the fixed pods kept); the names added and
    /// removed. `None`: not started from a file.
    pub fn reload(&self) -> Option<Result<PodChanges, Error>> {
        let path = self.inner.config_path.as_ref()?;
        Some(Config::load(path).and_then(|config| {
            let mut wanted = config.pods;
            wanted.extend(self.fixed_pods());
            self.replace_pods(wanted)
        }))
    }

    /// The pods, by name (model by model).
    pub fn pods(&self) -> Vec<PodView> {
        self.all()
            .iter()
            .flat_map(|r| r.inner.pods.views())
            .collect()
    }

    /// The pods kept across reloads ([`Config::add_fixed_pod`]).
    pub fn fixed_pods(&self) -> Vec<PodConfig> {
        self.all()
            .iter()
            .flat_map(|r| r.inner.fixed.iter().cloned())
            .collect()
    }

    /// How many pods there are and how many answer (every model's).
    pub fn health(&self) -> Health {
        let mut h = Health {
            pods: 0,
            answering: 0,
            probed: true,
        };
        for r in self.all() {
            let pods = &r.inner.pods;
            h.pods += pods.ids().len();
            h.answering += pods.answering();
            h.probed &= pods.probed_once();
        }
        h
    }

    /// The metrics, recorded as requests pass.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The Prometheus text of every metric, the figures other parts own
    /// (events, pod load, breakers, the index, the replica) read now.
    pub fn metrics_text(&self) -> String {
        self.refresh_metrics();
        self.inner.metrics.render()
    }

    /// Brings the metrics other parts own up to date: the totals summed
    /// over every model's pods (the models share one [`Metrics`]).
    fn refresh_metrics(&self) {
        let s = &self.inner;
        let m = &s.metrics;
        let all = self.all();
        let ingests: Vec<_> = all.iter().map(|r| r.inner.pods.ingest_totals()).collect();
        let streams: Vec<_> = all
            .iter()
            .map(|r| r.inner.pods.subscriber.stream_stats())
            .collect();
        let stream = |f: fn(&router_events::StreamStats) -> u64| streams.iter().map(f).sum::<u64>();
        let ingested =
            |f: fn(&router_events::IngestStats) -> u64| ingests.iter().map(f).sum::<u64>();
        raise(&m.events_batches, stream(|s| s.batches));
        raise(&m.events_applied, ingested(|s| s.events_applied));
        raise(&m.event_gaps, stream(|s| s.gaps));
        raise(&m.event_replayed, stream(|s| s.replayed));
        raise(&m.engine_restarts, stream(|s| s.restarts));
        raise(&m.pod_resets, stream(|s| s.resets));
        raise(&m.event_recovered, stream(|s| s.recovered));
        if let Some(r) = &s.pods.replica {
            let st = r.stats();
            for (what, n) in [
                ("relayed", st.relayed),
                ("relay_retries", st.relay_retries),
                ("relay_dropped", st.relay_dropped),
                ("log_applied", st.log_applied),
                ("log_stale", st.log_stale),
                ("log_gaps", st.log_gaps),
                ("log_restarts", st.log_restarts),
                ("log_skipped", st.log_skipped),
                ("snapshots_written", st.snapshots_written),
                ("snapshots_refused", st.snapshots_refused),
                ("load_received", st.load_received),
                ("routed_received", st.routed_received),
                ("routed_dropped", st.routed_dropped),
            ] {
                raise(&m.replica.with_label_values(&[what]), n);
            }
        }
        for (reason, n) in [
            ("unknown_parent", ingested(|s| s.unknown_parent)),
            ("other_group", ingested(|s| s.other_group)),
            ("unsupported_group", ingested(|s| s.unsupported_group)),
            (
                "unresolved_group_block",
                ingested(|s| s.unresolved_group_blocks),
            ),
            ("unknown_medium", ingested(|s| s.unknown_medium)),
            ("token_mismatch", ingested(|s| s.token_mismatch)),
            ("unknown_removed", ingested(|s| s.unknown_removed)),
            ("sink_refused", ingested(|s| s.sink_refused)),
            ("unknown_event", ingested(|s| s.unknown_events)),
            ("bad_frame", stream(|s| s.bad_frames)),
            ("undecodable_batch", stream(|s| s.decode_errors)),
            ("stale_batch", stream(|s| s.stale)),
        ] {
            raise(&m.events_skipped.with_label_values(&[reason]), n);
        }
        // The lag of the latest batch is the first model's (the maximum is
        // every model's).
        m.event_lag_seconds
            .set(streams.first().map_or(0, |s| s.last_lag_us) as f64 / 1e6);
        m.event_lag_max_seconds
            .set(streams.iter().map(|s| s.max_lag_us).max().unwrap_or(0) as f64 / 1e6);
        raise(
            &m.engine_metrics_errors,
            all.iter()
                .map(|r| {
                    r.inner
                        .pods
                        .metrics_errors
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
                .sum(),
        );
        self.refresh_pod_gauges();
        let is = s.pods.index.stats();
        m.index_blocks.set(clamp(is.entries));
        m.index_bytes.set(clamp(is.bytes));
    }

    fn refresh_pod_gauges(&self) {
        let m = &self.inner.metrics;
        for g in [
            &m.pod_in_flight,
            &m.pod_queued_prefill_tokens,
            &m.pod_healthy,
            &m.pod_breaker_open,
            &m.pod_blocks,
            &m.pod_kv_blocks_total,
            &m.pod_engine_waiting,
            &m.pod_engine_running,
        ] {
            g.reset();
        }
        m.pod_engine_kv_usage.reset();
        for r in self.all() {
            r.set_pod_gauges();
        }
    }

    /// This model's pods' gauges (reset by the caller).
    fn set_pod_gauges(&self) {
        let s = &self.inner;
        let m = &s.metrics;
        for (name, e) in s.pods.engine_reports() {
            let n = [name.as_str()];
            let count = |v: Option<u64>| v.map_or(0, clamp);
            m.pod_engine_waiting
                .with_label_values(&n)
                .set(count(e.waiting));
            m.pod_engine_running
                .with_label_values(&n)
                .set(count(e.running));
            m.pod_engine_kv_usage
                .with_label_values(&n)
                .set(e.kv_usage.unwrap_or(0.0));
        }
        for (name, id, healthy) in s.pods.ids() {
            let st = s.pods.fleet.get(id);
            let gauge = |g: &prometheus::IntGaugeVec, v: i64| g.with_label_values(&[&name]).set(v);
            gauge(
                &m.pod_in_flight,
                st.as_ref().map_or(0, |p| i64::from(p.in_flight)),
            );
            gauge(
                &m.pod_queued_prefill_tokens,
                st.as_ref().map_or(0, |p| clamp(p.queued_prefill_tokens)),
            );
            gauge(&m.pod_healthy, i64::from(healthy));
            gauge(
                &m.pod_kv_blocks_total,
                st.as_ref().map_or(0, |p| clamp(p.kv_blocks_total)),
            );
            gauge(&m.pod_blocks, s.pods.index.pod_blocks(id).map_or(0, clamp));
            gauge(&m.pod_breaker_open, i64::from(s.breaker.is_tripped(id)));
        }
    }
}

/// Applies the file's `[[pods]]` whenever its modification time or length
/// changes. A file that does not parse is logged and skipped: the pods
/// stay as they were until a good version arrives.
/// A file's modification time and length (what a change of it changes).
type Stamp = Option<(Option<std::time::SystemTime>, u64)>;

fn stamp(p: &Path) -> Stamp {
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

/// `seen`: the file's stamp when the router read it (taken before the
/// task starts, so a change made meanwhile is not missed).
async fn watch_pods(
    pods: std::sync::Weak<Pods>,
    path: PathBuf,
    model: String,
    fixed: Vec<PodConfig>,
    every: Duration,
    mut seen: Stamp,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(pods) = pods.upgrade() else { return };
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        // This model's pods only: each model's router watches the file.
        let applied = Config::load(&path).and_then(|c| {
            let mut wanted = c.pods_of(&model);
            wanted.extend(fixed.iter().cloned());
            pods.replace_all(wanted)
        });
        match applied {
            Ok((added, removed)) => {
                tracing::info!(file = %path.display(), ?added, ?removed, "pods file changed: applied");
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "pods file changed but is not valid: pods kept");
            }
        }
    }
}

/// Whether the pod serves the LoRA adapter `adapter`.
fn serves(pod: &PodConfig, adapter: &str) -> bool {
    pod.adapters.iter().any(|a| a == adapter)
}

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}
