//! A reference OpenAI-compatible gateway over cache-router.
//!
//! # The design choice
//!
//! The gateway is built only from the public crates, the way an embedder
//! would build theirs: the prompt is tokenized and templated exactly as the
//! engine does it (router-hash, whose parity with `transformers` is tested),
//! hashed into a block chain, routed by a profile from the configuration
//! file (router-policy, whose `prefix-match` step queries router-index
//! once), and run by router-exec over an HTTP [`Backend`](router_exec::Backend)
//! with retries on other pods. The index is kept current by router-events
//! subscribed to each engine's ZeroMQ stream. With no GPU at hand,
//! router-sim-engine's `SimGateway` starts simulated engines (real HTTP
//! servers and real ZeroMQ publishers on loopback, whose caches and
//! timings come from router-sim) and this gateway over them, so every byte
//! of the path is exercised; this crate holds no simulation code.
//!
//! # Items
//!
//! - [`Gateway`]: start from a [`Config`] (TOML; [`DEFAULT_CONFIG`] is the
//!   bundled one), serve `POST /v1/completions`, `POST /v1/chat/completions`
//!   (streamed or not), `GET /v1/models`, `GET /health`, `GET /metrics`
//!   ([`Metrics`]), and the admin calls `GET|POST|PUT /admin/pods`,
//!   `DELETE /admin/pods/{name}`, `POST /admin/reload`.
//! - [`HttpBackend`]: pooled HTTP to engines, server-sent events decoded as
//!   they arrive ([`SseDecoder`]).
//! - [`openai`]: the OpenAI API surface both a gateway and an engine
//!   parse (endpoints, prompt tokens, the error shape); [`serve`] and
//!   [`sse_event`] for servers that stream.
//! - [`ApiError`]: errors in OpenAI's shape.
#![forbid(unsafe_code)]

mod backend;
mod config;
mod error;
mod metrics;
pub mod openai;
mod pods;
mod pool;
mod server;
mod sse;

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

pub use backend::HttpBackend;
pub use config::{
    Config, DEFAULT_CONFIG, GatewayConfig, NatsSection, PodConfig, SimulatedConfig, WorkflowKind,
};
pub use error::Error;
pub use metrics::Metrics;
pub use openai::{Api, ApiError, parse_body, prompt_tokens};
pub use pods::PodView;
pub use server::{Gateway, POD_HEADER, PREDICTED_HEADER, PREFILL_POD_HEADER, SESSION_HEADER};
pub use sse::{SseDecoder, SseError, event as sse_event};
