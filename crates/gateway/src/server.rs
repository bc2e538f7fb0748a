//! The HTTP front: OpenAI endpoints, health, metrics and the admin calls,
//! over a [`router_service::Router`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures::StreamExt;
use router_service::openai::{Api, ApiError};
use router_service::{Config, Error, Metrics, PodConfig, PodView, Refusal, Request, Routed};
use serde_json::json;
use tokio::task::JoinHandle;

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

/// What the handlers share: the router and the HTTP limits.
struct AppState {
    router: router_service::Router,
    max_body: usize,
    body_timeout: Duration,
    admin_token: Option<String>,
}

/// A running gateway: a [`router_service::Router`] served over HTTP.
#[derive(Debug)]
pub struct Gateway {
    addr: std::net::SocketAddr,
    router: router_service::Router,
    tasks: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Starts the router `config` describes and serves it on
    /// `gateway.listen`, on the current tokio runtime (multi-threaded).
    ///
    /// The address is bound first: a port in use is reported before the
    /// tokenizer loads, and clients that connect while the router starts
    /// wait in the listen backlog instead of being refused.
    pub async fn start(config: Config) -> Result<Gateway, Error> {
        let listener = Gateway::bind(&config).await?;
        Gateway::serve(listener, config).await
    }

    /// Binds `config`'s `gateway.listen`, for [`Gateway::serve`]. A caller
    /// that starts other listeners of its own on ephemeral ports (simulated
    /// engines) binds this first, so none of them can take its port.
    pub async fn bind(config: &Config) -> Result<tokio::net::TcpListener, Error> {
        let listen = config.gateway.listen;
        tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Error::Bind {
                what: listen.to_string(),
                message: e.to_string(),
            })
    }

    /// Starts the router `config` describes and serves it on `listener`
    /// (from [`Gateway::bind`]).
    pub async fn serve(
        listener: tokio::net::TcpListener,
        config: Config,
    ) -> Result<Gateway, Error> {
        let g = config.gateway.clone();
        let addr = listener.local_addr().map_err(|e| Error::Bind {
            what: g.listen.to_string(),
            message: e.to_string(),
        })?;
        let router = router_service::Router::start(config).await?;
        let state = Arc::new(AppState {
            router: router.clone(),
            max_body: g.max_body_bytes,
            body_timeout: Duration::from_millis(g.body_timeout_ms.max(1)),
            admin_token: g.admin_token.clone().filter(|t| !t.is_empty()),
        });
        let tasks = vec![tokio::spawn(crate::serve(
            listener,
            app(state),
            Duration::from_millis(g.header_timeout_ms.max(1)),
        ))];
        Ok(Gateway {
            addr,
            router,
            tasks,
        })
    }

    /// The router served.
    pub fn router(&self) -> &router_service::Router {
        &self.router
    }

    /// The pods kept across reloads ([`Config::add_fixed_pod`]), as
    /// another gateway (a replica over the same engines) would list them.
    pub fn fixed_pods(&self) -> Vec<PodConfig> {
        self.router.fixed_pods()
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
        self.router.pods()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        self.router.metrics()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn app(state: Arc<AppState>) -> Router {
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

/// The models served, then the LoRA adapters some pod serves, as vLLM
/// lists them (an adapter's `parent` is its base model).
async fn models(State(s): State<Arc<AppState>>) -> Response {
    let models = s.router.models().into_iter().map(|m| {
        json!({"id": m, "object": "model", "owned_by": "cache-router", "root": m, "parent": null})
    });
    let adapters = s.router.adapters().into_iter().map(|(a, base)| {
        json!({"id": a, "object": "model", "owned_by": "cache-router", "root": a, "parent": base})
    });
    axum::Json(json!({"object": "list", "data": models.chain(adapters).collect::<Vec<_>>()}))
        .into_response()
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    let h = s.router.health();
    // Before any probe nothing is known to be healthy; after, a pod counts
    // when healthy and answering its last probe (one failure away from
    // being filtered out does not count).
    let (status, word) = match (h.probed, h.answering) {
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
        (true, 0) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        (true, _) => (StatusCode::OK, "ok"),
    };
    let healthy = if h.probed { h.answering } else { 0 };
    (
        status,
        axum::Json(json!({"status": word, "pods": h.pods, "healthy_pods": healthy})),
    )
        .into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.router.metrics_text(),
    )
        .into_response()
}

async fn list_pods(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    axum::Json(s.router.pods()).into_response()
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
    match s.router.add_pod(pod) {
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
    match s.router.replace_pods(pods) {
        Ok(changes) => axum::Json(changes).into_response(),
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
    if s.router.remove_pod(&name) {
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
    match s.router.reload() {
        None => ApiError::new(
            409,
            "invalid_request_error",
            "no_config_file",
            "the gateway was not started from a file".into(),
        )
        .into_response(),
        Some(Ok(changes)) => axum::Json(changes).into_response(),
        Some(Err(e)) => admin_error(&e),
    }
}

async fn generate(
    State(s): State<Arc<AppState>>,
    api: Api,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let endpoint = api.label();
    let m = s.router.metrics();
    match route(&s, api, &headers, body).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            m.request(endpoint, status);
            if let Some(pod) = resp.headers().get(POD_HEADER).and_then(|v| v.to_str().ok()) {
                m.pod_request(pod, status);
            }
            resp
        }
        Err(r) => {
            m.error(r.kind);
            m.request(endpoint, r.error.status);
            r.error.into_response()
        }
    }
}

fn refused(kind: &'static str, error: ApiError) -> Refusal {
    Refusal::new(kind, error)
}

/// One generation request, from its body to its answer: read, parse,
/// route and run, answer whole or streamed.
async fn route(
    s: &AppState,
    api: Api,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let raw = read_body(s, headers, body).await?;
    let mut request = Request::from_openai(api, &raw).map_err(|e| refused("bad_request", e))?;
    if let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        request = request.with_session(id);
    }
    let (stream, wants_usage) = (request.is_stream(), request.wants_usage());
    let routed = s.router.route(request).await?;
    let out = answer_headers(&routed);
    if stream {
        Ok(answer_streamed(routed, out, wants_usage))
    } else {
        answer_whole(routed, out).await
    }
}

fn too_large(s: &AppState) -> Refusal {
    refused(
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
async fn read_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > s.max_body) {
        return Err(too_large(s));
    }
    match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, s.max_body)).await {
        Ok(r) => r.map_err(|_| too_large(s)),
        Err(_) => Err(refused(
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

/// The answer's headers: the pod, the prefill pod, the predicted cached
/// tokens.
fn answer_headers(routed: &Routed) -> HeaderMap {
    let mut out = HeaderMap::new();
    let named = [
        (POD_HEADER, &routed.pod),
        (PREFILL_POD_HEADER, &routed.prefill_pod),
    ];
    for (header, name) in named {
        if let Some(v) = name.as_deref().and_then(|n| HeaderValue::from_str(n).ok()) {
            out.insert(header, v);
        }
    }
    out.insert(
        PREDICTED_HEADER,
        HeaderValue::from(routed.predicted_cached_tokens),
    );
    out
}

/// A whole (non-streamed) answer: the engine's last body.
async fn answer_whole(routed: Routed, out: HeaderMap) -> Result<Response, Refusal> {
    Ok((out, axum::Json(routed.body().await?)).into_response())
}

/// A streamed answer: server-sent events ([`Routed::sse`]).
fn answer_streamed(routed: Routed, mut out: HeaderMap, wants_usage: bool) -> Response {
    let events = routed
        .sse(wants_usage)
        .map(Ok::<_, std::convert::Infallible>);
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (out, Body::from_stream(events)).into_response()
}
