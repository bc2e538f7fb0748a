//! The HTTP front: OpenAI endpoints, health, metrics and the admin calls.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures::StreamExt;
use router_core::Namespace;
use router_events::Subscriber;
use router_exec::{
    BackendError, Chunk, Error as ExecError, Execution, Executor, Feedback, RetryPolicy, Shortcut,
    StepKind, StepRequest, Workflow,
};
use router_hash::{ChainHasher, ModelTokenizer};
use router_index::{Index, IndexConfig};
use router_policy::builtin::{
    BreakerConfig, CircuitBreaker, Evictions, Memory, PrefixMatchPrepare, RoutedChains,
};
use router_policy::keys::{CACHE_HITS, CHAIN, HASH_KEY, PROMPT_TOKENS, SESSION_ID};
use router_policy::{Built, Context, Filter, Fleet, KeyId, Plugin, PodState, Prepare, Registry};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::Error;
use crate::backend::HttpBackend;
use crate::config::{Config, PodConfig, WorkflowKind};
use crate::metrics::{Metrics, raise};
use crate::openai::{self, Api, ApiError};
use crate::pods::{PodView, Pods, probe_loop};

/// Header naming the pod that served a request.
pub const POD_HEADER: &str = "x-cache-router-pod";
/// Header naming the pod that ran the prefill step, in a prefill-decode
/// workflow.
pub const PREFILL_POD_HEADER: &str = "x-cache-router-prefill-pod";
/// Header with the cached tokens the index predicted on that pod.
pub const PREDICTED_HEADER: &str = "x-cache-router-predicted-cached-tokens";
/// Request header carrying a session id (for session affinity); the
/// body's `user` serves when it is absent.
pub const SESSION_HEADER: &str = "x-session-id";

/// The PEM bundle of `gateway.tls_ca_file`, checked to hold certificates
/// that parse (a typo must not start a gateway that trusts nothing extra).
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

struct AppState {
    model: String,
    tokenizer: Arc<ModelTokenizer>,
    hasher: ChainHasher,
    namespace: Namespace,
    block_size: u64,
    max_body: usize,
    body_timeout: Duration,
    admin_token: Option<String>,
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
    simulated: Vec<PodConfig>,
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: std::net::SocketAddr,
    state: Arc<AppState>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model", &self.model)
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
        let t = std::time::Instant::now();
        self.inner.prepare(ctx, pods);
        let m = &self.metrics;
        m.index_query_seconds.observe(t.elapsed().as_secs_f64());
        if let Some(hits) = ctx.get(CACHE_HITS) {
            m.matched_blocks.observe(f64::from(hits.best()));
        }
    }
}

/// The gateway's one circuit breaker, as a filter: the executor feeds the
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

fn workflow(
    config: &Config,
    index: Arc<Index>,
    metrics: Arc<Metrics>,
    breaker_slot: Arc<OnceLock<Arc<CircuitBreaker>>>,
    routed: Arc<RoutedChains>,
) -> Result<Workflow, Error> {
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
    let slot = breaker_slot.clone();
    registry.register("circuit-breaker", move |p, _| {
        let c: BreakerConfig = p.parse()?;
        // One breaker per gateway: the first profile's parameters win.
        let b = slot.get_or_init(|| Arc::new(CircuitBreaker::new(c)));
        Ok(Built::Filter(Box::new(SharedBreaker(b.clone()))))
    });
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
/// gateway's block size and the health and circuit-breaker filters, and a
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
prepare = [{{ type = "prefix-match" }}, {{ type = "speculative", block_size = {block_size} }}]
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

impl Gateway {
    /// Starts the gateway described by `config` on the current tokio
    /// runtime (multi-threaded).
    pub async fn start(mut config: Config) -> Result<Gateway, Error> {
        let g = config.gateway.clone();
        let tokenizer = Arc::new(ModelTokenizer::from_dir(&g.tokenizer)?);
        let model_max_length = tokenizer.model_max_length();
        if config.simulated.is_some() {
            return Err(Error::Config {
                line: 0,
                message: "the [simulated] engines are started by router-sim-engine's SimGateway \
                          (the cache-router command uses it); Gateway::start routes to the \
                          [[pods]] only"
                    .into(),
            });
        }
        let simulated = config.fixed.clone();
        crate::config::normalise_pods(&mut config.pods)?;

        let metrics = Arc::new(Metrics::new());
        let index: Arc<Index> = Index::new(IndexConfig::default());
        let hasher = ChainHasher::new(g.block_size as usize)?;
        let breaker_slot = Arc::new(OnceLock::new());
        let routed = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
        let workflow = workflow(
            &config,
            index.clone(),
            metrics.clone(),
            breaker_slot.clone(),
            routed.clone(),
        )?;
        let breaker = breaker_slot
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::new(CircuitBreaker::new(BreakerConfig::default())));
        let forget = routed.clone();
        // Registrations end when the engine evicts their blocks.
        let sink: Arc<dyn router_core::CacheEventSink> =
            Arc::new(Evictions::new(index.clone(), routed.clone()));
        let subscriber = Subscriber::new(
            Arc::new(hasher),
            sink.clone(),
            index.clone(),
            Some(g.model.clone()),
            g.block_size,
        )
        .on_clear(Arc::new(move |pod, _| forget.remove_pod(pod)));
        let fleet = Arc::new(Fleet::new());
        let extra_ca = match &g.tls_ca_file {
            Some(path) => Some(read_ca(path)?),
            None => None,
        };
        let client_err = |what: &str, e: reqwest::Error| Error::Bind {
            what: what.into(),
            message: error_chain(&e),
        };
        let backend = Arc::new(
            HttpBackend::with_tls(
                Duration::from_millis(g.connect_timeout_ms),
                extra_ca.as_deref(),
            )
            .map_err(|e| client_err("http client", e))?,
        );
        let approx = Memory::new(g.approx_ttl_ms, g.approx_capacity_blocks);
        let replica = match &config.nats {
            Some(n) => Some(Arc::new(
                router_nats::Replica::connect(n.to_config())
                    .await
                    .map_err(|e| Error::Nats(e.to_string()))?,
            )),
            None => None,
        };
        let log_hasher: Arc<dyn router_core::BlockHasher> = Arc::new(hasher);
        let pods = Arc::new(Pods::new(
            index.clone(),
            subscriber,
            fleet.clone(),
            backend.clone(),
            routed.clone(),
            approx,
            replica.clone(),
        ));
        for p in config.pods.clone() {
            pods.add(p)?;
        }
        let named = Arc::downgrade(&pods);
        metrics.set_namer(Arc::new(move |id| named.upgrade()?.name_of(id)));
        if let Some(r) = &replica {
            // The index is built from the shared log (after the newest
            // snapshot); load and registrations are shared.
            let forget = routed.clone();
            r.start_log(
                log_hasher,
                sink.clone(),
                Some(g.model.clone()),
                g.block_size,
                Some(Arc::new(move |pod, _| forget.remove_pod(pod))),
            )
            .await
            .map_err(|e| Error::Nats(e.to_string()))?;
            r.share(fleet.clone(), routed.clone());
        }
        let executor = Executor::new(
            backend,
            fleet,
            Arc::new(Feedback::new(u64::from(g.block_size))),
        )
        .with_breaker(breaker.clone())
        .with_retry(RetryPolicy::new(g.max_attempts, Duration::from_millis(10)))
        .with_observer(metrics.clone());
        let state = Arc::new(AppState {
            namespace: Namespace::model(g.model.clone()),
            model: g.model.clone(),
            tokenizer,
            hasher,
            block_size: u64::from(g.block_size),
            max_body: g.max_body_bytes,
            body_timeout: Duration::from_millis(g.body_timeout_ms.max(1)),
            admin_token: g.admin_token.clone().filter(|t| !t.is_empty()),
            max_prompt_tokens: match g.max_prompt_tokens {
                Some(0) => None,
                Some(n) => Some(n),
                None => model_max_length,
            },
            sanitize_control_tokens: g.sanitize_control_tokens,
            tokenize: Semaphore::new(g.tokenize_concurrency),
            tokenizers: crate::pool::Pool::new("cache-router-tokenize", g.tokenize_concurrency)
                .map_err(|e| Error::Bind {
                    what: "tokenizer threads".into(),
                    message: e.to_string(),
                })?,
            pods: pods.clone(),
            breaker,
            executor,
            workflow,
            metrics,
            config_path: config.path.clone(),
            simulated,
        });
        let listener = tokio::net::TcpListener::bind(g.listen)
            .await
            .map_err(|e| Error::Bind {
                what: g.listen.to_string(),
                message: e.to_string(),
            })?;
        let addr = listener.local_addr().map_err(|e| Error::Bind {
            what: g.listen.to_string(),
            message: e.to_string(),
        })?;
        let app = router(state.clone());
        let probe_client = crate::backend::engine_client(extra_ca.as_deref())
            .and_then(reqwest::ClientBuilder::build)
            .map_err(|e| client_err("probe client", e))?;
        let tasks = vec![
            tokio::spawn(crate::serve(
                listener,
                app,
                Duration::from_millis(g.header_timeout_ms.max(1)),
            )),
            tokio::spawn(probe_loop(
                pods,
                probe_client,
                Duration::from_millis(g.health_interval_ms.max(10)),
                g.unhealthy_after.max(1),
                Duration::from_millis(g.unhealthy_grace_ms),
                u64::from(g.block_size),
            )),
        ];
        // ZeroMQ's slow joiner: a PUB drops what it sends before the SUB's
        // subscription arrives. Give the new subscriptions a moment.
        if config.pods.iter().any(|p| p.events.is_some()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Gateway { addr, state, tasks })
    }

    /// The pods kept across reloads ([`Config::add_fixed_pod`]), as
    /// another gateway (a replica over the same engines) would list them.
    pub fn fixed_pods(&self) -> Vec<PodConfig> {
        self.state.simulated.clone()
    }

    /// The address served.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The base URL (`http://addr`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The pods.
    pub fn pods(&self) -> Vec<PodView> {
        self.state.pods.views()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.state.metrics
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/v1/completions",
            post(|s, h, b| generate(s, Api::Completions, h, b)),
        )
        .route(
            "/v1/chat/completions",
            post(|s, h, b| generate(s, Api::Chat, h, b)),
        )
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route(
            "/admin/pods",
            get(list_pods).post(add_pod).put(replace_pods),
        )
        .route("/admin/pods/{name}", delete(remove_pod))
        .route("/admin/reload", post(reload))
        .fallback(|| async {
            ApiError::new(
                404,
                "invalid_request_error",
                "not_found",
                "no such endpoint".into(),
            )
        })
        .with_state(state)
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [
        {"id": s.model, "object": "model", "owned_by": "cache-router"}
    ]}))
    .into_response()
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    let pods = s.pods.ids();
    if !s.pods.probed_once() {
        // No pod has been probed yet: nothing is known to be healthy.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "starting", "pods": pods.len(), "healthy_pods": 0})),
        )
            .into_response();
    }
    // Healthy and answering its last probe (a pod one failure away from
    // being filtered out is not counted).
    let healthy = s.pods.answering();
    let (status, word) = if healthy > 0 {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    };
    (
        status,
        axum::Json(json!({"status": word, "pods": pods.len(), "healthy_pods": healthy})),
    )
        .into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let m = &s.metrics;
    let ingest = s.pods.ingest_totals();
    let stream = s.pods.subscriber.stream_stats();
    raise(&m.events_batches, stream.batches);
    raise(&m.events_applied, ingest.events_applied);
    raise(&m.event_gaps, stream.gaps);
    raise(&m.event_replayed, stream.replayed);
    raise(&m.engine_restarts, stream.restarts);
    raise(&m.pod_resets, stream.resets);
    raise(&m.event_recovered, stream.recovered);
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
        ("unknown_parent", ingest.unknown_parent),
        ("other_group", ingest.other_group),
        ("unknown_medium", ingest.unknown_medium),
        ("token_mismatch", ingest.token_mismatch),
        ("unknown_removed", ingest.unknown_removed),
        ("sink_refused", ingest.sink_refused),
        ("unknown_event", ingest.unknown_events),
        ("bad_frame", stream.bad_frames),
        ("undecodable_batch", stream.decode_errors),
        ("stale_batch", stream.stale),
    ] {
        raise(&m.events_skipped.with_label_values(&[reason]), n);
    }
    m.event_lag_seconds.set(stream.last_lag_us as f64 / 1e6);
    m.event_lag_max_seconds.set(stream.max_lag_us as f64 / 1e6);
    m.pod_in_flight.reset();
    m.pod_queued_prefill_tokens.reset();
    m.pod_healthy.reset();
    m.pod_breaker_open.reset();
    m.pod_blocks.reset();
    m.pod_kv_blocks_total.reset();
    m.pod_engine_waiting.reset();
    m.pod_engine_running.reset();
    m.pod_engine_kv_usage.reset();
    raise(
        &m.engine_metrics_errors,
        s.pods
            .metrics_errors
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    for (name, e) in s.pods.engine_reports() {
        let n = [name.as_str()];
        let count = |v: Option<u64>| v.map_or(0, |v| v.min(i64::MAX as u64) as i64);
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
            st.as_ref()
                .map_or(0, |p| p.queued_prefill_tokens.min(i64::MAX as u64) as i64),
        );
        gauge(&m.pod_healthy, i64::from(healthy));
        gauge(
            &m.pod_kv_blocks_total,
            st.as_ref()
                .map_or(0, |p| p.kv_blocks_total.min(i64::MAX as u64) as i64),
        );
        gauge(
            &m.pod_blocks,
            s.pods
                .index
                .pod_blocks(id)
                .map_or(0, |b| b.min(i64::MAX as u64) as i64),
        );
        gauge(&m.pod_breaker_open, i64::from(s.breaker.is_tripped(id)));
    }
    let is = s.pods.index.stats();
    m.index_blocks.set(is.entries.min(i64::MAX as u64) as i64);
    m.index_bytes.set(is.bytes.min(i64::MAX as u64) as i64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

async fn list_pods(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    axum::Json(s.pods.views()).into_response()
}

fn admin_error(e: &Error) -> Response {
    match e {
        Error::PodConflict(_) => {
            ApiError::new(409, "invalid_request_error", "pod_conflict", e.to_string())
        }
        _ => ApiError::new(400, "invalid_request_error", "bad_pods", e.to_string()),
    }
    .into_response()
}

/// The largest admin request body read (1 MiB: a pod list).
const MAX_ADMIN_BODY: usize = 1 << 20;

/// An admin call's body, or the JSON refusal to send instead; and the
/// bearer token check when `admin_token` is set.
async fn admin_request(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    admin_auth(s, headers)?;
    axum::body::to_bytes(body, MAX_ADMIN_BODY)
        .await
        .map_err(|_| {
            ApiError::new(
                413,
                "invalid_request_error",
                "request_too_large",
                format!("an admin request body is at most {MAX_ADMIN_BODY} bytes"),
            )
        })
}

/// Refuses an admin call without the configured bearer token (401).
fn admin_auth(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &s.admin_token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compared in full whatever the prefix that matches.
    let ok = given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            401,
            "invalid_request_error",
            "unauthorized",
            "the admin API needs `Authorization: Bearer <admin_token>`".into(),
        ))
    }
}

async fn add_pod(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let body = match admin_request(&s, &headers, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let pod: PodConfig = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return ApiError::bad_request(format!("not a pod: {e}"), None).into_response(),
    };
    match s.pods.add(pod) {
        Ok(id) => (
            StatusCode::CREATED,
            axum::Json(json!({"id": id.to_string()})),
        )
            .into_response(),
        Err(e) => admin_error(&e),
    }
}

async fn replace_pods(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let body = match admin_request(&s, &headers, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let pods: Vec<PodConfig> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return ApiError::bad_request(format!("not a list of pods: {e}"), None).into_response();
        }
    };
    match s.pods.replace_all(pods) {
        Ok((added, removed)) => {
            axum::Json(json!({"added": added, "removed": removed})).into_response()
        }
        Err(e) => admin_error(&e),
    }
}

async fn remove_pod(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    UrlPath(name): UrlPath<String>,
) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    if s.pods.remove(&name) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        ApiError::new(
            404,
            "invalid_request_error",
            "pod_not_found",
            format!("no pod `{}`", name.escape_debug()),
        )
        .into_response()
    }
}

/// Re-reads the configuration file and applies its `[[pods]]`.
async fn reload(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    let Some(path) = &s.config_path else {
        return ApiError::new(
            409,
            "invalid_request_error",
            "no_config_file",
            "the gateway was not started from a file".into(),
        )
        .into_response();
    };
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return admin_error(&e),
    };
    // The fixed pods (simulated engines') are not in the file's list: keep them.
    let mut wanted = config.pods;
    wanted.extend(s.simulated.iter().cloned());
    match s.pods.replace_all(wanted) {
        Ok((added, removed)) => {
            axum::Json(json!({"added": added, "removed": removed})).into_response()
        }
        Err(e) => admin_error(&e),
    }
}

/// The error kind label and the client's answer for a failed workflow.
fn exec_error(e: &ExecError) -> (&'static str, ApiError) {
    match e {
        ExecError::NoPod(_) => (
            "no_pod",
            ApiError::new(
                503,
                "service_unavailable",
                "no_healthy_pod",
                format!("no pod can take the request: {e}"),
            ),
        ),
        ExecError::Timeout { .. } => (
            "timeout",
            ApiError::new(504, "timeout", "backend_timeout", e.to_string()),
        ),
        ExecError::Exhausted { last, .. } => match exec_error(last) {
            ("timeout", api) => ("timeout", api),
            _ => (
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
            ("rejected", api)
        }
        _ => (
            "backend",
            ApiError::new(502, "bad_gateway", "backend_failed", e.to_string()),
        ),
    }
}

async fn generate(
    State(s): State<Arc<AppState>>,
    api: Api,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let endpoint = api.label();
    match route(&s, api, &headers, body).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            s.metrics.request(endpoint, status);
            if let Some(pod) = resp.headers().get(POD_HEADER).and_then(|v| v.to_str().ok()) {
                s.metrics.pod_request(pod, status);
            }
            resp
        }
        Err((kind, e)) => {
            s.metrics.error(kind);
            s.metrics.request(endpoint, e.status);
            e.into_response()
        }
    }
}

type Failure = (&'static str, ApiError);

/// One generation request, from its body to its answer: read, check,
/// tokenize, route and run, answer whole or streamed.
async fn route(
    s: &Arc<AppState>,
    api: Api,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let arrived = std::time::Instant::now();
    let raw = read_body(s, headers, body).await?;
    let body = checked_body(s, &raw)?;
    let asked = check_prompt_bound(s, &body)?;
    let (mut body, tokens) = tokenize(s, api, body).await?;
    check_prompt_length(s, tokens.len() as u64, asked)?;
    let ctx = routing_context(s, headers, &body, &tokens);
    s.metrics.prompt_tokens.inc_by(tokens.len() as u64);

    let stream = openai::is_stream(&body);
    let client_wants_usage = openai::wants_usage(&body);
    if stream {
        // The engine's usage chunk feeds the cache feedback; it is dropped
        // on the way out unless the client asked for it.
        body["stream_options"] = json!({"include_usage": true});
    }
    let req = StepRequest::new(body, tokens.len() as u64);
    let execution = s
        .executor
        .execute(&s.workflow, ctx, req)
        .await
        .map_err(|e| exec_error(&e))?;
    let (out_headers, per_pod) = answer_headers(s, &execution, tokens.len() as u64);
    if stream {
        Ok(answer_streamed(
            s,
            execution,
            out_headers,
            per_pod,
            arrived,
            client_wants_usage,
        ))
    } else {
        answer_whole(s, execution, out_headers, per_pod, arrived).await
    }
}

fn too_large(s: &AppState) -> Failure {
    (
        "body_too_large",
        ApiError::new(
            413,
            "invalid_request_error",
            "request_too_large",
            format!("the request body is larger than {} bytes", s.max_body),
        ),
    )
}

/// The body, up to `max_body_bytes` (413) and within `body_timeout_ms`
/// (408: a body that stops arriving does not hold the connection open).
async fn read_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Failure> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > s.max_body) {
        return Err(too_large(s));
    }
    match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, s.max_body)).await {
        Ok(r) => r.map_err(|_| too_large(s)),
        Err(_) => Err((
            "body_timeout",
            ApiError::new(
                408,
                "invalid_request_error",
                "request_timeout",
                format!(
                    "the request body did not arrive within {} ms",
                    s.body_timeout.as_millis()
                ),
            ),
        )),
    }
}

/// The parsed body, for the served model (404 for another).
fn checked_body(s: &AppState, raw: &[u8]) -> Result<Value, Failure> {
    let body = openai::parse_body(raw).map_err(|e| ("bad_request", e))?;
    openai::check_model(&body, &s.model).map_err(|e| {
        let kind = if e.status == 404 {
            "unknown_model"
        } else {
            "bad_request"
        };
        (kind, e)
    })?;
    Ok(body)
}

fn too_long(what: String) -> Failure {
    (
        "prompt_too_long",
        ApiError::new(
            400,
            "invalid_request_error",
            "context_length_exceeded",
            what,
        ),
    )
}

/// Refuses, before tokenizing, a prompt whose text alone is over the
/// context limit; returns the tokens the request asks for.
fn check_prompt_bound(s: &AppState, body: &Value) -> Result<u64, Failure> {
    let asked = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .unwrap_or(0);
    if let Some(limit) = s.max_prompt_tokens {
        let at_least =
            openai::prompt_tokens_at_least(body, |b| s.tokenizer.min_tokens_for_bytes(b)) as u64;
        if at_least > limit {
            return Err(too_long(format!(
                "this model's maximum context length is {limit} tokens; the prompt has at least {at_least}"
            )));
        }
    }
    Ok(asked)
}

/// Refuses a prompt that, with what it asks for, is over the limit.
fn check_prompt_length(s: &AppState, prompt: u64, asked: u64) -> Result<(), Failure> {
    match s.max_prompt_tokens {
        Some(limit) if prompt.saturating_add(asked) > limit => Err(too_long(format!(
            "this model's maximum context length is {limit} tokens; the request has {} ({prompt} in the prompt, {asked} asked for)",
            prompt.saturating_add(asked)
        ))),
        _ => Ok(()),
    }
}

/// The prompt's tokens, computed on the gateway's tokenizer threads (off
/// the async threads, a bounded number at once; see `pool.rs` for why not
/// `spawn_blocking`); the body comes back with them.
async fn tokenize(s: &AppState, api: Api, body: Value) -> Result<(Value, Vec<u32>), Failure> {
    let _permit = s.tokenize.acquire().await.map_err(|_| {
        (
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
    let (body, tokens) = s
        .tokenizers
        .run(move || {
            let t = openai::prompt_tokens(api, &body, &tok, sanitize);
            (body, t)
        })
        .await
        .ok_or_else(|| {
            (
                "internal",
                ApiError::new(500, "server_error", "internal", "tokenizing failed".into()),
            )
        })?;
    Ok((body, tokens.map_err(|e| ("bad_request", e))?))
}

/// What the profiles read: the chain, the prompt's length, the session
/// (header or `user`) and the hash key.
fn routing_context(s: &AppState, headers: &HeaderMap, body: &Value, tokens: &[u32]) -> Context {
    let chain = s.hasher.chain(&s.namespace, tokens);
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| body.get("user").and_then(Value::as_str).map(str::to_owned));
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

/// Per-pod figures as the answer goes out: a time to first chunk, cached
/// tokens reported.
type PerPod = Arc<dyn Fn(Option<f64>, Option<u64>) + Send + Sync>;

/// The answer's headers (pod, prefill pod, predicted cached tokens), the
/// per-pod figures known now, and the recorder of the rest.
fn answer_headers(s: &AppState, execution: &Execution, prompt_len: u64) -> (HeaderMap, PerPod) {
    let predicted = u64::from(execution.predicted_cached_blocks()) * s.block_size;
    s.metrics.predicted_cached_tokens.inc_by(predicted);
    let mut out = HeaderMap::new();
    let pod_name = execution.pod().and_then(|p| s.pods.name_of(p));
    if let Some(name) = &pod_name {
        let m = &s.metrics;
        m.pod_prompt_tokens
            .with_label_values(&[name])
            .inc_by(prompt_len);
        m.pod_predicted_cached_tokens
            .with_label_values(&[name])
            .inc_by(predicted);
        if let Ok(v) = HeaderValue::from_str(name) {
            out.insert(POD_HEADER, v);
        }
    }
    out.insert(PREDICTED_HEADER, HeaderValue::from(predicted));
    let prefill_pod = execution
        .steps()
        .iter()
        .find(|(kind, _)| *kind == StepKind::Prefill)
        .and_then(|(_, p)| s.pods.name_of(*p));
    if let Some(name) = prefill_pod
        && let Ok(v) = HeaderValue::from_str(&name)
    {
        out.insert(PREFILL_POD_HEADER, v);
    }
    let m = s.metrics.clone();
    let per_pod = Arc::new(move |ttft: Option<f64>, cached: Option<u64>| {
        let Some(name) = &pod_name else { return };
        if let Some(t) = ttft {
            m.pod_ttft_seconds.with_label_values(&[name]).observe(t);
        }
        if let Some(c) = cached {
            m.pod_actual_cached_tokens
                .with_label_values(&[name])
                .inc_by(c);
        }
    });
    (out, per_pod)
}

/// A whole (non-streamed) answer: the engine's last body.
async fn answer_whole(
    s: &AppState,
    mut execution: Execution,
    out_headers: HeaderMap,
    per_pod: PerPod,
    arrived: std::time::Instant,
) -> Result<Response, Failure> {
    let mut data = None;
    while let Some(item) = execution.next().await {
        match item {
            Ok(Chunk::Data(v)) => {
                if data.is_none() {
                    let t = arrived.elapsed().as_secs_f64();
                    s.metrics.ttft_seconds.observe(t);
                    per_pod(Some(t), None);
                }
                data = Some(v);
            }
            Ok(Chunk::Usage { cached_tokens, .. }) => {
                let c = cached_tokens.unwrap_or(0);
                s.metrics.actual_cached_tokens.inc_by(c);
                per_pod(None, Some(c));
            }
            Ok(_) => {}
            Err(e) => return Err(exec_error(&e)),
        }
    }
    let data = data.ok_or_else(|| {
        (
            "backend",
            ApiError::new(
                502,
                "bad_gateway",
                "empty_response",
                "the engine sent no body".into(),
            ),
        )
    })?;
    Ok((out_headers, axum::Json(data)).into_response())
}

/// A streamed answer: the engine's events passed on (usage only when asked
/// for), an error event if it breaks, then `[DONE]`.
fn answer_streamed(
    s: &AppState,
    execution: Execution,
    mut out_headers: HeaderMap,
    per_pod: PerPod,
    arrived: std::time::Instant,
    client_wants_usage: bool,
) -> Response {
    let metrics = s.metrics.clone();
    let mut first = true;
    let on_first = per_pod.clone();
    let mut first_chunk = move || {
        if std::mem::take(&mut first) {
            let secs = arrived.elapsed().as_secs_f64();
            metrics.ttft_seconds.observe(secs);
            on_first(Some(secs), None);
        }
    };
    let metrics = s.metrics.clone();
    let events = execution
        .map(move |item| -> Option<Bytes> {
            match item {
                Ok(Chunk::Data(v)) => {
                    first_chunk();
                    if !client_wants_usage && openai::is_usage_only(&v) {
                        return None;
                    }
                    Some(Bytes::from(crate::sse::event(&v.to_string())))
                }
                Ok(Chunk::Text(text)) => {
                    first_chunk();
                    Some(Bytes::from(crate::sse::event(&text)))
                }
                Ok(Chunk::Usage { cached_tokens, .. }) => {
                    let c = cached_tokens.unwrap_or(0);
                    metrics.actual_cached_tokens.inc_by(c);
                    per_pod(None, Some(c));
                    None
                }
                Ok(_) => None,
                Err(e) => {
                    // One count per failed request, as for the others; the
                    // kind says it broke after streaming began.
                    let (kind, api) = exec_error(&e);
                    metrics.error(if kind == "timeout" {
                        "stream_timeout"
                    } else {
                        "stream_backend"
                    });
                    Some(Bytes::from(crate::sse::event(&api.body().to_string())))
                }
            }
        })
        .filter_map(futures::future::ready)
        .chain(futures::stream::once(async {
            Bytes::from_static(b"data: [DONE]\n\n")
        }))
        .map(Ok::<_, std::convert::Infallible>);
    out_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    out_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (out_headers, Body::from_stream(events)).into_response()
}
