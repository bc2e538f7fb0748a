//! router-gateway end to end: real sockets, four simulated engines
//! publishing real vLLM-format events, the real index behind the router.

mod bad_input;
mod config;
mod engine_metrics;
mod hybrid;
mod lifecycle;
mod models;
mod replicas;
mod routing;
#[cfg(feature = "rustls")]
mod tls;
mod wire;

use std::path::Path;
use std::time::Duration;

use router_gateway::{Config, Gateway, POD_HEADER, PREDICTED_HEADER};
use router_sim_engine::SimGateway;
use serde_json::{Value, json};

pub(crate) const MODEL: &str = "Qwen/Qwen3-0.6B";

/// A gateway on a free port with `engines` simulated engines, configured
/// by `extra` TOML lines under `[gateway]` and `sim` lines under `[simulated]`.
pub(crate) async fn gateway(engines: usize, extra: &str, sim: &str) -> SimGateway {
    let text = format!("{extra}\n\n[simulated]\nengines = {engines}\n{sim}\n");
    SimGateway::start(config(&text))
        .await
        .expect("gateway starts")
}

/// The tests' `[gateway]` table (free port, bundled tokenizer, 100 ms
/// probes) followed by `rest`: more `[gateway]` keys, then other tables.
pub(crate) fn config(rest: &str) -> Config {
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
model = "{MODEL}"
tokenizer = "../../assets/tokenizers/qwen3"
health_interval_ms = 100
{rest}
"#
    );
    Config::parse(&text, Path::new(env!("CARGO_MANIFEST_DIR"))).expect("valid config")
}

/// The bundled Qwen3 tokenizer.
pub(crate) fn qwen3() -> std::sync::Arc<router_hash::ModelTokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/qwen3");
    std::sync::Arc::new(router_hash::ModelTokenizer::from_dir(dir).unwrap())
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// What a non-streamed answer said.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub pod: Option<String>,
    pub predicted: u64,
    pub cached: u64,
    pub body: Value,
}

/// Posts `body` as JSON to `path`.
pub(crate) async fn send(
    gw: &Gateway,
    path: &str,
    body: &impl serde::Serialize,
) -> reqwest::Response {
    client()
        .post(format!("{}{path}", gw.url()))
        .json(body)
        .send()
        .await
        .unwrap()
}

pub(crate) async fn post(gw: &Gateway, path: &str, body: &Value) -> Answer {
    let r = send(gw, path, body).await;
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let pod = header(POD_HEADER);
    let predicted = header(PREDICTED_HEADER).map_or(0, |v| v.parse().unwrap());
    let body: Value = r.json().await.unwrap();
    let cached = body
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Answer {
        status,
        pod,
        predicted,
        cached,
        body,
    }
}

/// A chat request.
pub(crate) fn chat(messages: &[Value]) -> Value {
    json!({"model": MODEL, "messages": messages, "max_tokens": 4})
}

/// A system prompt of about `words` words, different for each `seed`.
pub(crate) fn system_prompt(seed: u32, words: usize) -> String {
    let vocab = [
        "cache", "prefix", "router", "block", "engine", "token", "latency", "pod", "shard",
        "bitmap", "event", "profile",
    ];
    let mut s = format!("You are assistant number {seed}. Rules:");
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(7);
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s.push(' ');
        s.push_str(vocab[x as usize % vocab.len()]);
    }
    s
}

/// Waits until `f` holds, up to `limit`.
pub(crate) async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Scrapes `/metrics` and parses it as Prometheus text.
pub(crate) async fn scrape(gw: &Gateway) -> prometheus_parse::Scrape {
    let text = client()
        .get(format!("{}/metrics", gw.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text")
}

/// The value of `name` with labels `labels` (0 if absent).
pub(crate) fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Every pod's in-flight gauge is back to 0 (no load counter leaked).
pub(crate) async fn assert_no_load_leaked(gw: &Gateway) {
    eventually(
        Duration::from_secs(3),
        "in-flight gauges back to 0",
        || async {
            let s = scrape(gw).await;
            value(&s, "cache_router_pod_in_flight", &[]) == 0.0
                && value(&s, "cache_router_pod_queued_prefill_tokens", &[]) == 0.0
        },
    )
    .await;
}

/// Posts and, when the engine computed new blocks, waits until their
/// event batch has reached the index, so the next request can see them.
pub(crate) async fn post_settled(gw: &Gateway, path: &str, body: &Value) -> Answer {
    let before = value(&scrape(gw).await, "cache_router_event_batches_total", &[]);
    let a = post(gw, path, body).await;
    let prompt = a
        .body
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if a.status == 200 && prompt / 16 > a.cached / 16 {
        eventually(
            Duration::from_secs(5),
            "the request's events reach the index",
            || async { value(&scrape(gw).await, "cache_router_event_batches_total", &[]) > before },
        )
        .await;
    }
    a
}
