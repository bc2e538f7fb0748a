//! Load generator for the gateway: multi-turn chat sessions sharing a few
//! system prompts, streamed, reporting time to first token, throughput, and
//! the cached tokens the router predicted against what the engines reported.
//!
//! ```text
//! cargo run --release --example loadgen                        # each profile on a fresh embedded gateway
//! cargo run --release --example loadgen -- --url http://127.0.0.1:8000  # a running gateway
//! ```
//!
//! Without `--url` it starts the bundled gateway (four simulated engines)
//! once per profile named in `--profiles`, so the profiles are compared on
//! the same sessions from the same cold start. `--replicas 2` puts two
//! gateways over the same engines and alternates requests between them (as
//! a round-robin proxy in front of router replicas would); with `--nats
//! URL` they share their event log, load and registrations as `[nats]`
//! replicas (`--share` narrows what). Every row shows
//! the scenario's ceiling: the cached share if every turn met its whole
//! history and its system prompt on its pod, with no eviction.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use router_core::Namespace;
use router_gateway::{Config, DEFAULT_CONFIG, POD_HEADER, PREDICTED_HEADER, SseDecoder};
use router_hash::ChainHasher;
use router_sim_engine::SimGateway;
use serde_json::{Value, json};

/// The bundled configuration for an embedded gateway running `profile`,
/// its simulated engines set by the flags.
fn embedded(args: &Args, base: &Config, profile: &str) -> Config {
    let mut config = base.clone();
    config.gateway.listen = ([127, 0, 0, 1], 0).into();
    config.gateway.profile = profile.to_owned();
    if let Some(sim) = config.simulated.as_mut() {
        sim.time_scale = args.time_scale;
        if let Some(blocks) = args.gpu_blocks {
            sim.gpu_blocks = blocks;
        }
        sim.events = !args.no_events;
        sim.hybrid = args.hybrid.clone();
    }
    config
}

/// Pass 1 then pass 2 of the same sessions over one set of engines, pass 2
/// through the gateway of pass 1 (`kept`) or a new one (`restarted`), each
/// on fresh engines. Returns the failed turns.
async fn restart_rows(
    args: &Arc<Args>,
    base: &Config,
    profile: &str,
    tok: &router_hash::ModelTokenizer,
    hasher: &ChainHasher,
) -> usize {
    let mut failed = 0;
    for restart in [false, true] {
        let config = embedded(args, base, profile);
        // The engines' owner serves no request; the gateways route to them.
        let owner = SimGateway::start(config.clone()).await.expect("a gateway");
        let mut over = config.clone();
        over.simulated = None;
        over.pods = owner.engine_pods();
        let first = SimGateway::start(over.clone()).await.expect("a gateway");
        let s = drive(
            args.clone(),
            &[first.url()],
            &format!("{profile} pass 1"),
            tok,
            hasher,
        )
        .await;
        println!("{}", s.row());
        failed += s.failed();
        let (label, second) = if restart {
            drop(first);
            let g = SimGateway::start(over).await.expect("a gateway");
            // What it learns at start (the engines' replay buffers).
            tokio::time::sleep(Duration::from_millis(500)).await;
            ("pass 2 restarted", g)
        } else {
            ("pass 2 kept", first)
        };
        let s = drive(
            args.clone(),
            &[second.url()],
            &format!("{profile} {label}"),
            tok,
            hasher,
        )
        .await;
        println!("{}", s.row());
        failed += s.failed();
    }
    failed
}

/// A `[nats]` table for replica `replica` on stream `prefix`, sharing
/// what `share` names (`load`, `routed`; `all`, `none`).
fn nats_section(
    url: &str,
    prefix: &str,
    replica: &str,
    share: &str,
) -> router_gateway::NatsSection {
    let on = |what: &str| share == "all" || share.split(',').any(|s| s.trim() == what);
    let text = format!(
        "url = \"{url}\"\nprefix = \"{prefix}\"\nreplica = \"{replica}\"\nshare_load = {}\nshare_routed = {}\n",
        on("load"),
        on("routed")
    );
    toml::from_str(&text).expect("a valid [nats] table")
}

#[derive(Parser, Debug, Clone)]
#[command(about = "Drive the cache-router gateway with multi-turn chat sessions")]
struct Args {
    /// A running gateway (or several, comma-separated, alternated request
    /// by request); without it, one is started per profile.
    #[arg(long)]
    url: Option<String>,
    /// Label of the `--url` row.
    #[arg(long, default_value = "(remote)")]
    label: String,
    /// Profiles to compare on embedded gateways (comma-separated).
    #[arg(
        long,
        default_value = "cache-aware,smg-cache-aware,llm-d,dynamo,session-affinity,least-requests,round-robin"
    )]
    profiles: String,
    /// Embedded gateways per profile, over the same engines, alternated
    /// request by request.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// The replicas share their event log, load and registrations through
    /// this NATS server (JetStream on), as `[nats]` does.
    #[arg(long)]
    nats: Option<String>,
    /// Two passes of the same sessions over the same engines, the second
    /// through a freshly started gateway (and, for comparison, through the
    /// one that served the first): a restarted gateway on warm engines.
    #[arg(long)]
    restart_between_passes: bool,
    /// Restart embedded engine 0 this long into each run (down for 300 ms,
    /// back on the same addresses with an empty cache and its event
    /// sequence from 0): the `exact` column shows whether anything stale
    /// was routed on.
    #[arg(long)]
    restart_engine_after_ms: Option<u64>,
    /// With `--nats`: what the replicas share besides the event log
    /// (`all`, `none`, or `load`, `routed` comma-separated).
    #[arg(long, default_value = "all")]
    share: String,
    /// Embedded engines' GPU capacity in blocks (default: the bundled
    /// configuration's).
    #[arg(long)]
    gpu_blocks: Option<usize>,
    /// Embedded engines publish no events: the gateway routes in
    /// approximate mode.
    #[arg(long)]
    no_events: bool,
    /// Embedded engines serve a hybrid model (`sliding-window:<tokens>` or
    /// `mamba`); each profile then runs twice, the second time with the
    /// full-attention-only view (`hybrid_groups = false`, every peer's).
    #[arg(long)]
    hybrid: Option<String>,
    /// After each row, the turns whose prediction was wrong (to stderr):
    /// over (the engine had evicted what the router counted) or under (it
    /// held more than the router knew), with their tokens.
    #[arg(long)]
    mismatches: bool,
    /// The model name to send.
    #[arg(long, default_value = "Qwen/Qwen3-0.6B")]
    model: String,
    /// Chat sessions.
    #[arg(long, default_value_t = 48)]
    sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Distinct system prompts the sessions share.
    #[arg(long, default_value_t = 4)]
    system_prompts: usize,
    /// Words per system prompt (a word is a token or two).
    #[arg(long, default_value_t = 300)]
    system_words: usize,
    /// Words of a document each session pastes in its first turn (its own
    /// context, which only the pod that saw it has cached).
    #[arg(long, default_value_t = 800)]
    doc_words: usize,
    /// Sessions running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Tokens generated per turn.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Embedded engines' time scale (1.0: the modelled GPU).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
}

const VOCAB: [&str; 16] = [
    "cache", "prefix", "router", "block", "engine", "token", "latency", "pod", "shard", "bitmap",
    "event", "profile", "decode", "prefill", "queue", "tier",
];

/// `words` pseudo-random words from `seed` (xorshift; no dependency).
fn text(seed: u64, words: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = String::new();
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(' ');
        s.push_str(VOCAB[(x % VOCAB.len() as u64) as usize]);
    }
    s
}

#[derive(Debug, Default)]
struct Turn {
    /// When it was sent, from the run's start.
    sent: Duration,
    /// The request body (for the ceiling).
    body: Value,
    ok: bool,
    ttft: Duration,
    prompt_tokens: u64,
    output_tokens: u64,
    predicted: u64,
    cached: u64,
    pod: String,
}

async fn one_turn(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    body: &Value,
) -> (Turn, String) {
    let mut turn = Turn {
        body: body.clone(),
        ..Turn::default()
    };
    let start = Instant::now();
    let Ok(resp) = client
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
    else {
        return (turn, String::new());
    };
    if !resp.status().is_success() {
        return (turn, String::new());
    }
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    turn.pod = header(POD_HEADER);
    turn.predicted = header(PREDICTED_HEADER).parse().unwrap_or(0);
    let mut reply = String::new();
    let mut decoder = SseDecoder::default();
    let mut events = Vec::new();
    let mut bytes = resp.bytes_stream();
    let mut done = false;
    while let Some(Ok(piece)) = bytes.next().await {
        if decoder.feed(&piece, &mut events).is_err() {
            break;
        }
        for data in events.drain(..) {
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if v.get("error").is_some() {
                return (turn, reply);
            }
            if let Some(c) = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                && !c.is_empty()
            {
                if turn.output_tokens == 0 {
                    turn.ttft = start.elapsed();
                }
                turn.output_tokens += 1;
                reply.push_str(c);
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                turn.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                turn.cached = u
                    .pointer("/prompt_tokens_details/cached_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
            }
        }
    }
    turn.ok = done && turn.output_tokens > 0;
    (turn, reply)
}

/// The URLs requests go to, alternated request by request.
struct Targets {
    urls: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    start: Instant,
}

impl Targets {
    fn next(&self) -> &str {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.urls[i % self.urls.len()]
    }
}

async fn session(
    args: Arc<Args>,
    targets: Arc<Targets>,
    client: reqwest::Client,
    id: usize,
) -> Vec<Turn> {
    let system = format!(
        "You are support agent {}.{}",
        id % args.system_prompts,
        text((id % args.system_prompts) as u64 + 1, args.system_words)
    );
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut out = Vec::new();
    for t in 0..args.turns {
        let mut question = format!(
            "Question {t} of user {id}:{}?",
            text((id * 100 + t) as u64 + 7, 30)
        );
        if t == 0 {
            question = format!(
                "Here is my document:{}\n{question}",
                text(1_000_000 + id as u64, args.doc_words)
            );
        }
        messages.push(json!({"role": "user", "content": question}));
        let body = json!({
            "model": args.model, "messages": messages, "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": args.max_tokens,
        });
        let sent = targets.start.elapsed();
        let (mut turn, reply) =
            one_turn(&client, targets.next(), &format!("session-{id}"), &body).await;
        turn.sent = sent;
        out.push(turn);
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

struct Summary {
    label: String,
    turns: Vec<Turn>,
    wall: Duration,
    /// The scenario's ceiling (see the module docs).
    ceiling: f64,
}

/// The cached share if every turn met, on its pod, every full block any
/// earlier-sent turn had (its own history and its system prompt), with no
/// eviction: an infinite pooled cache in send order.
fn ceiling(turns: &[Turn], tok: &router_hash::ModelTokenizer, hasher: &ChainHasher) -> f64 {
    let mut order: Vec<&Turn> = turns.iter().filter(|t| t.ok).collect();
    order.sort_by_key(|t| t.sent);
    let namespace = Namespace::model("ceiling");
    let mut seen = std::collections::HashSet::new();
    let (mut cached, mut total) = (0usize, 0usize);
    for t in order {
        let Ok(ids) = router_gateway::prompt_tokens(router_gateway::Api::Chat, &t.body, tok, false)
        else {
            continue;
        };
        let chain = hasher.chain(&namespace, &ids);
        cached += chain.iter().take_while(|h| seen.contains(*h)).count() * hasher.block_size();
        seen.extend(chain);
        total += ids.len();
    }
    cached as f64 / total.max(1) as f64
}

impl Summary {
    fn failed(&self) -> usize {
        self.turns.iter().filter(|t| !t.ok).count()
    }

    /// The wrong predictions, over and under, to stderr.
    fn mismatches(&self) {
        let ok = self.turns.iter().filter(|t| t.ok);
        let (mut over, mut under) = ((0, 0), (0, 0));
        for t in ok.clone().filter(|t| t.predicted != t.cached) {
            let side = if t.predicted > t.cached {
                &mut over
            } else {
                &mut under
            };
            side.0 += 1;
            side.1 += t.predicted.abs_diff(t.cached);
            eprintln!(
                "loadgen: {} at {:.2}s on {}: predicted {} cached {} of {}",
                self.label,
                t.sent.as_secs_f64(),
                t.pod,
                t.predicted,
                t.cached,
                t.prompt_tokens
            );
        }
        eprintln!(
            "loadgen: {}: {} turns, over-predicted {} ({} tokens), under-predicted {} ({} tokens)",
            self.label,
            ok.count(),
            over.0,
            over.1,
            under.0,
            under.1
        );
    }

    fn row(&self) -> String {
        let ok: Vec<&Turn> = self.turns.iter().filter(|t| t.ok).collect();
        let mut ttft: Vec<Duration> = ok.iter().map(|t| t.ttft).collect();
        ttft.sort_unstable();
        let prompt: u64 = ok.iter().map(|t| t.prompt_tokens).sum();
        let cached: u64 = ok.iter().map(|t| t.cached).sum();
        let predicted: u64 = ok.iter().map(|t| t.predicted).sum();
        let exact = ok.iter().filter(|t| t.predicted == t.cached).count();
        let output: u64 = ok.iter().map(|t| t.output_tokens).sum();
        let mut pods: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &ok {
            *pods.entry(t.pod.as_str()).or_default() += 1;
        }
        let busiest = pods.values().max().copied().unwrap_or(0) as f64;
        let mean = ok.len() as f64 / pods.len().max(1) as f64;
        format!(
            "{:<17} {:>5} {:>4} {:>8.1} {:>8.1} {:>8.1} {:>7.1} {:>7.0} {:>7.1}% {:>7.1}% {:>7.1}% {:>6.1}% {:>6.2}",
            self.label,
            ok.len(),
            self.turns.len() - ok.len(),
            percentile(&ttft, 0.5),
            percentile(&ttft, 0.9),
            percentile(&ttft, 0.99),
            ok.len() as f64 / self.wall.as_secs_f64(),
            output as f64 / self.wall.as_secs_f64(),
            100.0 * cached as f64 / prompt.max(1) as f64,
            100.0 * self.ceiling,
            100.0 * predicted as f64 / prompt.max(1) as f64,
            100.0 * exact as f64 / ok.len().max(1) as f64,
            busiest / mean.max(1e-9),
        )
    }
}

async fn drive(
    args: Arc<Args>,
    urls: &[String],
    label: &str,
    tok: &router_hash::ModelTokenizer,
    hasher: &ChainHasher,
) -> Summary {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let targets = Arc::new(Targets {
        urls: urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect(),
        next: Default::default(),
        start: Instant::now(),
    });
    let turns: Vec<Turn> = futures::stream::iter(0..args.sessions)
        .map(|id| session(args.clone(), targets.clone(), client.clone(), id))
        .buffer_unordered(args.concurrency.max(1))
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let wall = targets.start.elapsed();
    Summary {
        label: label.to_owned(),
        ceiling: ceiling(&turns, tok, hasher),
        turns,
        wall,
    }
}

#[tokio::main]
async fn main() {
    let args = Arc::new(Args::parse());
    println!(
        "{} sessions x {} turns, {} shared system prompts of ~{} words, a {}-word document per session, {} sessions at once, {} tokens out",
        args.sessions,
        args.turns,
        args.system_prompts,
        args.system_words,
        args.doc_words,
        args.concurrency,
        args.max_tokens
    );
    println!(
        "{:<17} {:>5} {:>4} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>6}",
        "profile",
        "ok",
        "err",
        "ttft p50",
        "p90",
        "p99",
        "req/s",
        "tok/s",
        "cached",
        "ceiling",
        "predict",
        "exact",
        "max/µ"
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/gateway");
    let base = match Config::parse(DEFAULT_CONFIG, &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let tok = match router_hash::ModelTokenizer::from_dir(&base.gateway.tokenizer) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("loadgen: tokenizer: {e}");
            std::process::exit(2);
        }
    };
    let hasher = ChainHasher::new(base.gateway.block_size as usize).expect("a positive block size");
    let mut failed = 0;
    if let Some(url) = &args.url {
        let urls: Vec<String> = url.split(',').map(|u| u.trim().to_owned()).collect();
        let s = drive(args.clone(), &urls, &args.label, &tok, &hasher).await;
        println!("{}", s.row());
        if args.mismatches {
            s.mismatches();
        }
        failed += s.failed();
    }
    let profiles = if args.url.is_some() {
        ""
    } else {
        args.profiles.as_str()
    };
    let views: &[bool] = if args.hybrid.is_some() {
        &[true, false]
    } else {
        &[true]
    };
    let runs = profiles
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| views.iter().map(move |v| (p, *v)));
    for (profile, groups) in runs {
        if args.restart_between_passes {
            failed += restart_rows(&args, &base, profile, &tok, &hasher).await;
            continue;
        }
        let mut config = embedded(&args, &base, profile);
        config.gateway.hybrid_groups = groups;
        if groups {
            // The operator declares the layout: exact from the first request.
            config.gateway.kv_groups = args.hybrid.iter().cloned().collect();
        }
        let label = if groups {
            profile.to_owned()
        } else {
            format!("{profile} (full-attention view)")
        };
        if let Some(url) = &args.nats {
            // A stream of its own per run: rows do not share a log.
            let prefix = format!("loadgen-{}-{profile}", std::process::id());
            config.nats = Some(nats_section(url, &prefix, "r0", &args.share));
        }
        let mut gateways = Vec::new();
        match SimGateway::start(config.clone()).await {
            Ok(g) => gateways.push(g),
            Err(e) => {
                eprintln!("loadgen: profile {profile}: {e}");
                std::process::exit(1);
            }
        }
        // Further replicas route to the first one's engines.
        let pods = gateways[0].engine_pods();
        for r in 1..args.replicas.max(1) {
            let mut c = config.clone();
            c.simulated = None;
            c.pods = pods.clone();
            if let Some(n) = c.nats.as_mut() {
                n.replica = Some(format!("r{r}"));
            }
            match SimGateway::start(c).await {
                Ok(g) => gateways.push(g),
                Err(e) => {
                    eprintln!("loadgen: profile {profile} replica: {e}");
                    std::process::exit(1);
                }
            }
        }
        let urls: Vec<String> = gateways.iter().map(|g| g.url()).collect();
        let restarter = args.restart_engine_after_ms.map(|after| {
            let mut owner = gateways.remove(0);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                tokio::task::spawn_blocking(move || {
                    owner.engines_mut()[0].kill();
                    std::thread::sleep(Duration::from_millis(300));
                    if let Err(e) = owner.engines_mut()[0].restart() {
                        eprintln!("loadgen: engine 0 did not restart: {e}");
                    }
                    owner
                })
                .await
                .expect("the restart ran")
            })
        });
        let s = drive(args.clone(), &urls, &label, &tok, &hasher).await;
        if let Some(r) = restarter {
            let owner = r.await.expect("the restart ran");
            let m = reqwest::get(format!("{}/metrics", owner.url()))
                .await
                .expect("metrics")
                .text()
                .await
                .unwrap_or_default();
            let restarts = m
                .lines()
                .find(|l| l.starts_with("cache_router_engine_restarts_total "))
                .unwrap_or("cache_router_engine_restarts_total ?");
            eprintln!("loadgen: engine 0 restarted; the gateway says {restarts}");
        }
        println!("{}", s.row());
        if args.mismatches {
            s.mismatches();
        }
        failed += s.failed();
        drop(gateways);
    }
    println!(
        "cached: prompt tokens the engines served from cache; ceiling: the cached share if every \
         turn met its whole history and system prompt on its pod; predict: what the router \
         said the chosen pod held; exact: turns where the two agree; max/µ: busiest pod's share \
         over the mean"
    );
    if failed > 0 {
        eprintln!("loadgen: {failed} turns failed");
        std::process::exit(1);
    }
}
