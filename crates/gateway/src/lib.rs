//! A reference OpenAI-compatible gateway over cache-router: one front over
//! [`router_service::Router`].
//!
//! # The design choice
//!
//! The routing core (pods and their lifecycle, events, the index, the
//! profiles, the executor, metrics, replication) is router-service's
//! `Router`; this crate adds only what HTTP and OpenAI's API need: the
//! endpoints, body limits and timeouts, the admin calls and their token,
//! the answer whole or streamed as server-sent events, errors in OpenAI's
//! shape. With no GPU at hand, router-sim-engine's `SimGateway` starts
//! simulated engines (real HTTP servers and real ZeroMQ publishers on
//! loopback) and this gateway over them; this crate holds no simulation
//! code.
//!
//! # Items
//!
//! - [`Gateway`]: start from a [`Config`] (TOML; [`DEFAULT_CONFIG`] is the
//!   bundled one), serve `POST /v1/completions`, `POST /v1/chat/completions`
//!   (streamed or not), `GET /v1/models`, `GET /health`, `GET /metrics`
//!   ([`Metrics`]), and the admin calls `GET|POST|PUT /admin/pods`,
//!   `DELETE /admin/pods/{name}`, `POST /admin/reload`.
//! - [`serve`]: serves an axum app with header timeouts, for servers
//!   that stream (the simulated engines use it too).
//! - The router-service items a front uses, re-exported.
#![forbid(unsafe_code)]

mod server;

/// Serves `app` on `listener` until the task is dropped, with `TCP_NODELAY`
/// on every connection (small SSE chunks must not wait for Nagle's
/// algorithm, about 40 ms on a kept-alive connection) and a connection
/// closed when a request's headers take longer than `header_timeout` to
/// arrive, the first request's or, on a kept-alive connection, the next
/// one's (a client trickling headers, or holding an idle connection, is
/// dropped). The gateway and the simulated engines both serve through it.
pub async fn serve(listener: tokio::net::TcpListener, app: axum::Router, header_timeout: Duration) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            let _ = http
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await;
        });
    }
}

use std::time::Duration;

pub use router_service::openai;
pub use router_service::{
    Api, ApiError, Config, Error, GatewayConfig, HttpBackend, Metrics, NatsSection, PodConfig,
    PodView, Request, Router, SimulatedConfig, SseDecoder, SseError, WorkflowKind, parse_body,
    prompt_tokens, sse_event,
};
pub use server::{Gateway, POD_HEADER, PREDICTED_HEADER, PREFILL_POD_HEADER, SESSION_HEADER};

/// The bundled configuration: four simulated engines serving Qwen3's
/// tokenizer, with several profiles to compare (paths relative to this
/// crate's directory).
pub const DEFAULT_CONFIG: &str = include_str!("../gateway.toml");
