//! The endpoint picker's own throughput beside the gateway's, in one run,
//! over one `Router` and the same instant simulated engines.
//!
//! `cargo bench -p router-epp --bench picker` (env: `REQUESTS`, default
//! 6000 per round; `CONCURRENCY`, default 32; `ROUNDS`, default 3).
//!
//! The gateway rounds post one-word chat completions to the gateway, which
//! decides and proxies them to the engines. The picker rounds play Envoy's
//! part with the shipped `envoy.yaml`'s two ext_proc filters: a decision
//! stream (request headers, then the body, answered with the destination)
//! and an observing stream (the response's headers with the decision's
//! exchange id, then a body carrying `usage`), so the picker does per
//! request all it does behind a real Envoy: decode, tokenize, decide,
//! account the response. What it leaves out is Envoy itself: its proxying
//! and its side of the gRPC exchange, which `scripts/compare_envoy.sh`
//! measures end to end. Every answer is checked (a 200 from the gateway, a
//! destination from the picker); a round with a wrong one fails the bench.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as In;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Out;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use router_epp::{DESTINATION_HEADER, EXCHANGE_HEADER, Epp, EppConfig, OBSERVER_METADATA};
use router_gateway::Gateway;
use router_service::Config;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const MODEL: &str = "Qwen/Qwen3-0.6B";
const BODY: &str = r#"{"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}"#;
const ANSWER: &str = r#"{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}}"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn header(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn message(request: In) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..Default::default()
    }
}

fn headers(list: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: list.iter().map(|(k, v)| header(k, v)).collect(),
        }),
        end_of_stream,
        ..Default::default()
    }
}

fn body(text: &str) -> HttpBody {
    HttpBody {
        body: text.as_bytes().to_vec(),
        end_of_stream: true,
        ..Default::default()
    }
}

/// What a decision's body answer sets: the destination and the exchange id.
fn decided(out: &Out) -> Option<(String, String)> {
    let Out::RequestBody(b) = out else {
        return None;
    };
    let set = &b.response.as_ref()?.header_mutation.as_ref()?.set_headers;
    let find = |name: &str| {
        set.iter().find_map(|h| {
            let h = h.header.as_ref()?;
            (h.key == name).then(|| String::from_utf8_lossy(&h.raw_value).into_owned())
        })
    };
    Some((find(DESTINATION_HEADER)?, find(EXCHANGE_HEADER)?))
}

/// Opens one ext_proc stream, sends `messages` one reply at a time, and
/// returns the replies.
async fn exchange(
    client: &mut ExternalProcessorClient<Channel>,
    observer: bool,
    messages: Vec<ProcessingRequest>,
) -> Result<Vec<Out>, String> {
    let (tx, rx) = mpsc::channel(4);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if !observer {
        // The decision filter of the shipped envoy.yaml: its response side
        // is watched by the observing filter.
        request
            .metadata_mut()
            .insert(OBSERVER_METADATA, "separate".parse().expect("ascii"));
    }
    let mut messages = messages.into_iter();
    let first = messages.next().ok_or("no message")?;
    tx.send(first).await.map_err(|e| e.to_string())?;
    let mut replies = client
        .process(request)
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut out = Vec::new();
    loop {
        let reply = replies.message().await.map_err(|e| e.to_string())?;
        let Some(reply) = reply.and_then(|r| r.response) else {
            break;
        };
        let immediate = matches!(reply, Out::ImmediateResponse(_));
        out.push(reply);
        if immediate {
            break;
        }
        match messages.next() {
            Some(m) => tx.send(m).await.map_err(|e| e.to_string())?,
            None => break,
        }
    }
    Ok(out)
}

/// One request as Envoy's two filters would carry it.
async fn through_picker(client: &mut ExternalProcessorClient<Channel>) -> Result<(), String> {
    let decision = exchange(
        client,
        false,
        vec![
            message(In::RequestHeaders(headers(
                &[
                    (":path", "/v1/chat/completions"),
                    (":method", "POST"),
                    ("content-type", "application/json"),
                ],
                false,
            ))),
            message(In::RequestBody(body(BODY))),
        ],
    )
    .await?;
    let (_, id) = decision
        .last()
        .and_then(decided)
        .ok_or_else(|| format!("no decision: {decision:?}"))?;
    let observed = exchange(
        client,
        true,
        vec![
            message(In::ResponseHeaders(headers(
                &[
                    (":status", "200"),
                    ("content-type", "application/json"),
                    (EXCHANGE_HEADER, &id),
                ],
                false,
            ))),
            message(In::ResponseBody(body(ANSWER))),
        ],
    )
    .await?;
    if observed.len() != 2 {
        return Err(format!("the observer got {} replies", observed.len()));
    }
    Ok(())
}

async fn through_gateway(client: &reqwest::Client, url: &str) -> Result<(), String> {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let text = r.text().await.map_err(|e| e.to_string())?;
    if status != 200 || !text.contains("\"usage\"") {
        return Err(format!("{status}: {text}"));
    }
    Ok(())
}

/// `requests` requests, `concurrency` at once; requests per second.
async fn round<F, Fut>(requests: usize, concurrency: usize, one: F) -> Result<f64, String>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let left = Arc::new(AtomicUsize::new(requests));
    let one = Arc::new(one);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (left, one) = (left.clone(), one.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                tokio::time::timeout(Duration::from_secs(10), one())
                    .await
                    .map_err(|_| "a request took over 10 s".to_owned())??;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(requests as f64 / start.elapsed().as_secs_f64())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the line.
    let requests = env("REQUESTS", 6000).max(1);
    let concurrency = env("CONCURRENCY", 32).max(1);
    let rounds = env("ROUNDS", 3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(e) = rt.block_on(run(requests, concurrency, rounds)) {
        eprintln!("picker bench: {e}");
        std::process::exit(1);
    }
}

async fn run(requests: usize, concurrency: usize, rounds: usize) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\n\
         tokenizer = \"assets/tokenizers/qwen3\"\n\n\
         [simulated]\nengines = 4\ntime_scale = 0.0\n"
    );
    let mut config = Config::parse(&text, &root).map_err(|e| e.to_string())?;
    let listener = Gateway::bind(&config).await.map_err(|e| e.to_string())?;
    let _engines = router_sim_engine::start_engines(&mut config).map_err(|e| e.to_string())?;
    let gateway = Gateway::serve(listener, config)
        .await
        .map_err(|e| e.to_string())?;
    let epp = Epp::new(gateway.router().clone(), EppConfig::default());
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let grpc_url = format!("http://{}", grpc.local_addr().map_err(|e| e.to_string())?);
    tokio::spawn(epp.serve(grpc, std::future::pending()));
    let chat = format!("{}/v1/chat/completions", gateway.url());
    let http = reqwest::Client::new();
    // Two connections, as Envoy's two worker threads keep to the picker.
    let mut channels = Vec::new();
    for _ in 0..2 {
        let c = ExternalProcessorClient::connect(grpc_url.clone())
            .await
            .map_err(|e| e.to_string())?;
        channels.push(c);
    }
    println!(
        "{requests} one-word chat requests a round, {concurrency} at once, 4 instant engines, {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("round  gateway req/s  picker req/s  picker / gateway");
    let (mut gw, mut pk) = (Vec::new(), Vec::new());
    for r in 1..=rounds {
        let (h, u) = (http.clone(), chat.clone());
        let g = round(requests, concurrency, move || {
            let (h, u) = (h.clone(), u.clone());
            async move { through_gateway(&h, &u).await }
        })
        .await?;
        let next = Arc::new(AtomicUsize::new(0));
        let chans = channels.clone();
        let p = round(requests, concurrency, move || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let mut c = chans[i % chans.len()].clone();
            async move { through_picker(&mut c).await }
        })
        .await?;
        println!("{r:>5}  {g:>13.0}  {p:>12.0}  {:>15.2}", p / g);
        gw.push(g);
        pk.push(p);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (g, p) = (median(&mut gw), median(&mut pk));
    println!("median {g:>13.0}  {p:>12.0}  {:>15.2}", p / g);
    let in_flight: f64 = gateway
        .router()
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("cache_router_pod_in_flight{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    if in_flight != 0.0 {
        return Err(format!("{in_flight} requests still held after the rounds"));
    }
    Ok(())
}
