//! A cache-aware proxy for vLLM built on cache-router's `Router`:
//! `cargo run --example embed -- my-router.toml` (the gateway's config
//! format: `[gateway]` keys and the engines as `[[pods]]`).
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cache_router::Router;
use cache_router::service::{Api, Config, Request};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: embed <config.toml>")?;
    let config = Config::load(path.as_ref())?;
    let listener = tokio::net::TcpListener::bind(config.gateway.listen).await?;
    let router = Router::start(config).await?;
    let app = axum::Router::new()
        .route(
            "/v1/completions",
            post(|s, b| proxy(s, Api::Completions, b)),
        )
        .route("/v1/chat/completions", post(|s, b| proxy(s, Api::Chat, b)))
        .route(
            "/metrics",
            get(|State(r): State<Router>| async move { r.metrics_text() }),
        )
        .with_state(router);
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// One request: parsed, routed (to the pod holding the longest cached
/// prefix, balanced against load; retried elsewhere if a pod fails before
/// answering), the engine's answer passed back whole or streamed.
async fn proxy(State(router): State<Router>, api: Api, body: Bytes) -> Response {
    let request = match Request::from_openai(api, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (streamed, usage) = (request.is_stream(), request.wants_usage());
    let routed = match router.route(request).await {
        Ok(r) => r,
        Err(refusal) => return refusal.error.into_response(),
    };
    let pod = [("x-cache-router-pod", routed.pod.clone().unwrap_or_default())];
    if streamed {
        let events = routed.sse(usage).map(Ok::<_, std::convert::Infallible>);
        let sse = [("content-type", "text/event-stream")];
        return (pod, sse, Body::from_stream(events)).into_response();
    }
    match routed.body().await {
        Ok(answer) => (pod, axum::Json(answer)).into_response(),
        Err(refusal) => refusal.error.into_response(),
    }
}
