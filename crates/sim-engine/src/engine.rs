//! A simulated engine: an OpenAI-compatible HTTP server whose timing
//! follows router-sim's cost model and which publishes vLLM-format KV
//! events over ZeroMQ, so the gateway exercises every byte of its real path
//! with no GPU.
//!
//! Per request: the prompt is tokenized exactly as the gateway does (the
//! shared [`router_gateway::prompt_tokens`]), cut into blocks hashed with the
//! engine's own per-process seed (like vLLM without `PYTHONHASHSEED`: the
//! router cannot reproduce them and must map them); the blocks are admitted
//! to a router-sim [`BlockCache`] (vLLM's LRU order); the uncached part
//! waits for the engine's single prefill lane for
//!
//! ```text
//! prefill = overhead + per_token * new + attention * new * (cached + new / 2)
//! ```
//!
//! then the computed blocks are announced (`BlockStored`, evictions as
//! `BlockRemoved`) on the PUB socket, and tokens stream one per
//! `overhead + per_token + kv_read * context`, all times `time_scale`. The
//! response's `usage.prompt_tokens_details.cached_tokens` is what the cache
//! held, as vLLM reports it. A ROUTER socket serves replays of the last
//! batches (vLLM's `replay_endpoint` protocol).
//!
//! Each engine runs on its own thread and runtime: [`SimEngine::kill`]
//! drops the runtime, which closes the listener, every open connection and
//! the sockets at once, as a crashed process would.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use router_hash::ModelTokenizer;
use router_sim::{BlockCache, CostModel};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use router_core::{GroupKind, GroupSpec};
use router_events::{Encoding, WireEvent, encode_batch};
use router_gateway::{Api, ApiError, Error, openai};

/// How a simulated engine behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The served model name.
    pub model: String,
    /// The model's tokenizer.
    pub tokenizer: Arc<ModelTokenizer>,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks on the GPU.
    pub gpu_blocks: usize,
    /// Step-time constants.
    pub cost: CostModel,
    /// Multiplies every modelled duration.
    pub time_scale: f64,
    /// Event encoding.
    pub encoding: Encoding,
    /// Event topic.
    pub topic: String,
    /// Batches kept for replay.
    pub replay_buffer: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: u32,
    /// A hybrid model: one more KV-cache group beside full attention.
    pub hybrid: Option<Hybrid>,
    /// LoRA adapters served (vLLM's `--lora-modules` names): a request
    /// naming one as its `model` runs under it, its blocks hashed with the
    /// adapter's name and published with it; any other model is a 404.
    pub adapters: Vec<String>,
}

/// A hybrid model's second KV-cache group, modelled as vLLM runs it with
/// `prefix_cache_retention_interval` at 0: per request the group keeps
/// only what a hit at the prompt's last block boundary needs (a sliding
/// window's blocks before it; Mamba's state block at it), and the engine
/// accepts a hit only where both groups serve it (vLLM's rule). The group
/// is group 0 and full attention group 1, as gpt-oss and Qwen3-Next lay
/// them out (their first layer is not full attention), so a batch
/// announces the group's sparse blocks before their full-attention ones.
/// Each group has a pool of `gpu_blocks` (vLLM shares one pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hybrid {
    /// Sliding-window attention of this many tokens.
    SlidingWindow(u32),
    /// Mamba (or linear attention) state.
    Mamba,
}

impl std::str::FromStr for Hybrid {
    type Err = String;

    /// `sliding-window:<tokens>` or `mamba`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "mamba" => Ok(Hybrid::Mamba),
            Some(("sliding-window", w)) => match w.parse::<u32>() {
                Ok(w) if w >= 2 => Ok(Hybrid::SlidingWindow(w)),
                _ => Err(format!("`{s}`: a sliding window needs at least 2 tokens")),
            },
            _ => Err(format!(
                "unknown hybrid layout `{s}`, expected `sliding-window:<tokens>` or `mamba`"
            )),
        }
    }
}

impl Hybrid {
    fn spec(self, block_size: u32) -> GroupSpec {
        let kind = match self {
            Hybrid::SlidingWindow(window) => GroupKind::SlidingWindow { window },
            Hybrid::Mamba => GroupKind::Mamba,
        };
        // Valid by construction: a window of at least 2 (`from_str`), a
        // block size of at least 1, no chunk.
        GroupSpec {
            group: 0,
            kind,
            block_size: block_size.max(1),
        }
    }

    fn vllm_kind(self) -> (&'static str, Option<u32>) {
        match self {
            Hybrid::SlidingWindow(w) => ("sliding_window", Some(w)),
            Hybrid::Mamba => ("mamba", None),
        }
    }

    /// The positions of a prompt of `len` blocks the group keeps.
    fn kept(self, len: usize, block_size: u32) -> std::ops::Range<usize> {
        match self {
            Hybrid::SlidingWindow(w) => {
                let n = (w as usize)
                    .saturating_sub(1)
                    .div_ceil(block_size.max(1) as usize);
                len.saturating_sub(n)..len
            }
            Hybrid::Mamba => len.saturating_sub(1)..len,
        }
    }
}

impl EngineConfig {
    /// An engine serving `model` with `tokenizer` and the defaults: 16-token
    /// blocks, 4096 GPU blocks, the cost model's defaults at full time,
    /// map-encoded events, a 10000-batch replay buffer.
    pub fn new(model: impl Into<String>, tokenizer: Arc<ModelTokenizer>) -> Self {
        EngineConfig {
            model: model.into(),
            tokenizer,
            block_size: 16,
            gpu_blocks: 4096,
            cost: CostModel::default(),
            time_scale: 1.0,
            encoding: Encoding::Map,
            topic: String::new(),
            replay_buffer: 10_000,
            default_max_tokens: 16,
            hybrid: None,
            adapters: Vec::new(),
        }
    }

    /// Serves the LoRA adapters `adapters`.
    pub fn adapters<S: Into<String>>(mut self, adapters: impl IntoIterator<Item = S>) -> Self {
        self.adapters = adapters.into_iter().map(Into::into).collect();
        self
    }

    /// Makes the model a hybrid one.
    pub fn hybrid(mut self, hybrid: Option<Hybrid>) -> Self {
        self.hybrid = hybrid;
        self
    }

    /// Sets the block size.
    pub fn block_size(mut self, tokens: u32) -> Self {
        self.block_size = tokens.max(1);
        self
    }

    /// Sets the GPU's capacity in blocks.
    pub fn gpu_blocks(mut self, blocks: usize) -> Self {
        self.gpu_blocks = blocks;
        self
    }

    /// Sets the time scale.
    pub fn time_scale(mut self, scale: f64) -> Self {
        self.time_scale = scale;
        self
    }

    /// Sets the event encoding.
    pub fn encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// Sets the default `max_tokens`.
    pub fn default_max_tokens(mut self, n: u32) -> Self {
        self.default_max_tokens = n.max(1);
        self
    }
}

/// A running simulated engine.
#[derive(Debug)]
pub struct SimEngine {
    config: EngineConfig,
    active: Arc<AtomicUsize>,
    url: String,
    events: String,
    replay: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimEngine {
    /// Starts an engine on loopback (HTTP, PUB and ROUTER on free ports).
    pub fn start(config: EngineConfig) -> Result<SimEngine, Error> {
        Self::start_at(config, None)
    }

    /// Restarts the engine as a crash and a supervisor would: killed, then
    /// started again on the same addresses with an empty cache, its event
    /// sequence from 0 and an empty replay buffer.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill();
        let http: SocketAddr = self
            .url
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| bind_err(&self.url, &e))?;
        let at = (http, self.events.clone(), self.replay.clone());
        // The ports were just released; binding again can race the close.
        let mut tries = 0;
        let fresh = loop {
            match Self::start_at(self.config.clone(), Some(at.clone())) {
                Ok(e) => break e,
                Err(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        *self = fresh;
        Ok(())
    }

    fn start_at(
        config: EngineConfig,
        at: Option<(SocketAddr, String, String)>,
    ) -> Result<SimEngine, Error> {
        let http_at = at
            .as_ref()
            .map_or(SocketAddr::from(([127, 0, 0, 1], 0)), |a| a.0);
        let zmq_at = at.map(|a| (a.1, a.2));
        let listener =
            std::net::TcpListener::bind(http_at).map_err(|e| bind_err(&http_at.to_string(), &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| bind_err("127.0.0.1:0", &e))?;
        let http = listener
            .local_addr()
            .map_err(|e| bind_err("127.0.0.1:0", &e))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bind_err("engine runtime", &e))?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let active = Arc::new(AtomicUsize::new(0));
        let active_in = active.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let kept = config.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sim-engine-{}", http.port()))
            .spawn(move || {
                rt.block_on(async move {
                    match run(config, listener, active_in, zmq_at).await {
                        Ok((events, replay, tasks)) => {
                            let _ = ready_tx.send(Ok((events, replay)));
                            // Runs until killed; dropping the runtime then
                            // ends every task and closes every socket.
                            let _ = stop_rx.await;
                            drop(tasks);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| bind_err("engine thread", &e))?;
        let (events, replay) = ready_rx.recv().map_err(|e| bind_err("engine", &e))??;
        Ok(SimEngine {
            config: kept,
            active,
            url: format!("http://{http}"),
            events,
            replay,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The HTTP base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The KV-event publisher endpoint.
    pub fn events_endpoint(&self) -> &str {
        &self.events
    }

    /// The replay endpoint.
    pub fn replay_endpoint(&self) -> &str {
        &self.replay
    }

    /// Requests admitted and not finished (a request the client abandoned
    /// is finished as soon as the engine notices the closed connection).
    pub fn active_requests(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Stops the engine as a crash would: listener, connections and sockets
    /// close at once. Idempotent.
    pub fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SimEngine {
    fn drop(&mut self) {
        self.kill();
    }
}

fn bind_err(what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::Bind {
        what: what.into(),
        message: e.to_string(),
    }
}

struct Engine {
    cfg: EngineConfig,
    seed: u64,
    cache: Mutex<BlockCache>,
    /// A hybrid model's other group (see [`Hybrid`]).
    group: Mutex<BlockCache>,
    /// When the prefill lane is next free.
    lane: Mutex<Instant>,
    events: mpsc::UnboundedSender<Vec<WireEvent>>,
    next_id: AtomicU64,
    active: Arc<AtomicUsize>,
    /// Requests not yet prefilling (waiting for cache room or the lane).
    waiting: AtomicUsize,
    /// Requests prefilling or decoding.
    running: AtomicUsize,
}

/// One request counted in a gauge while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::SeqCst);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

type Tasks = Vec<tokio::task::JoinHandle<()>>;

/// The largest request body the simulated engine reads: above any
/// gateway's `max_body_bytes` default, so the gateway's limit is the one a
/// client meets (vLLM has none of its own).
const ENGINE_MAX_BODY: usize = 64 << 20;

async fn run(
    cfg: EngineConfig,
    listener: std::net::TcpListener,
    active: Arc<AtomicUsize>,
    at: Option<(String, String)>,
) -> Result<(String, String, Tasks), Error> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| bind_err("http", &e))?;
    let (events_at, replay_at) =
        at.unwrap_or_else(|| ("tcp://127.0.0.1:0".into(), "tcp://127.0.0.1:0".into()));
    let mut publisher = PubSocket::new();
    let events = publisher
        .bind(&events_at)
        .await
        .map_err(|e| bind_err("events", &e))?
        .to_string();
    let mut router = RouterSocket::new();
    let replay = router
        .bind(&replay_at)
        .await
        .map_err(|e| bind_err("replay", &e))?
        .to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    let buffer = Arc::new(Mutex::new(VecDeque::new()));
    // A per-process seed, as vLLM's hashes are without PYTHONHASHSEED.
    let seed = {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(listener.local_addr().ok())
    };
    let engine = Arc::new(Engine {
        cache: Mutex::new(BlockCache::new(cfg.gpu_blocks, 0)),
        group: Mutex::new(BlockCache::new(
            if cfg.hybrid.is_some() {
                cfg.gpu_blocks
            } else {
                0
            },
            0,
        )),
        lane: Mutex::new(Instant::now()),
        events: tx,
        next_id: AtomicU64::new(0),
        active,
        waiting: AtomicUsize::new(0),
        running: AtomicUsize::new(0),
        seed,
        cfg,
    });
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(ENGINE_MAX_BODY))
        .with_state(engine.clone());
    let tasks = vec![
        tokio::spawn(router_gateway::serve(
            listener,
            app,
            Duration::from_secs(30),
        )),
        tokio::spawn(publish(
            publisher,
            rx,
            buffer.clone(),
            engine.cfg.topic.clone(),
            engine.cfg.encoding,
            engine.cfg.replay_buffer,
        )),
        tokio::spawn(serve_replay(router, buffer, engine.cfg.topic.clone())),
    ];
    Ok((events, replay, tasks))
}

type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Sends each group of events as one batch `[topic, seq, payload]`,
/// keeping the last batches for replay.
async fn publish(
    mut socket: PubSocket,
    mut rx: mpsc::UnboundedReceiver<Vec<WireEvent>>,
    buffer: Buffer,
    topic: String,
    encoding: Encoding,
    keep: usize,
) {
    let mut seq = 0u64;
    while let Some(events) = rx.recv().await {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = Bytes::from(encode_batch(ts, &events, Some(0), encoding));
        {
            let mut b = buffer.lock();
            b.push_back((seq, payload.clone()));
            while b.len() > keep {
                b.pop_front();
            }
        }
        let mut msg = ZmqMessage::from(topic.clone().into_bytes());
        msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        msg.push_back(payload);
        // PUB drops for slow or absent subscribers; a send error means the
        // socket is gone, which only happens as the engine stops.
        if socket.send(msg).await.is_err() {
            return;
        }
        seq += 1;
    }
}

/// Answers `[identity, "", start_seq]` with every buffered batch from
/// `start_seq` as `[identity, "", topic, seq, payload]`, then the end
/// marker (sequence all ones, empty payload).
async fn serve_replay(mut socket: RouterSocket, buffer: Buffer, topic: String) {
    loop {
        let Ok(msg) = socket.recv().await else { return };
        let frames = msg.into_vec();
        let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            continue;
        };
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        let reply = |seq: u64, payload: Bytes| {
            let mut m = ZmqMessage::from(identity.clone());
            m.push_back(Bytes::new());
            m.push_back(Bytes::from(topic.clone().into_bytes()));
            m.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            m.push_back(payload);
            m
        };
        for (seq, payload) in batches {
            if socket.send(reply(seq, payload)).await.is_err() {
                break;
            }
        }
        let _ = socket.send(reply(u64::MAX, Bytes::new())).await;
    }
}

async fn completions(State(e): State<Arc<Engine>>, body: Bytes) -> Response {
    e.serve(Api::Completions, &body).await
}

async fn chat(State(e): State<Arc<Engine>>, body: Bytes) -> Response {
    e.serve(Api::Chat, &body).await
}

/// The model, then its LoRA adapters with the model as `parent`, as vLLM
/// lists them.
async fn models(State(e): State<Arc<Engine>>) -> Response {
    let m = &e.cfg.model;
    let base = json!({"id": m, "object": "model", "owned_by": "cache-router-sim", "root": m, "parent": null});
    let adapters = e.cfg.adapters.iter().map(
        |a| json!({"id": a, "object": "model", "owned_by": "cache-router-sim", "root": a, "parent": m}),
    );
    axum::Json(json!({"object": "list", "data": std::iter::once(base).chain(adapters).collect::<Vec<_>>()}))
        .into_response()
}

/// What vLLM's `/metrics` reports about the scheduler and the KV cache,
/// under its names (v1): the series a router reads.
async fn metrics(State(e): State<Arc<Engine>>) -> Response {
    let pinned = e.cache.lock().pinned();
    let usage = pinned as f64 / e.cfg.gpu_blocks.max(1) as f64;
    let labels = format!(
        "engine=\"0\",model_name=\"{}\"",
        e.cfg.model.replace(['"', '\\'], "_")
    );
    let text = format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{{labels}}} {}.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{{labels}}} {}.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{{labels}}} {usage}\n\
         # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\"}} 1.0\n",
        e.running.load(Ordering::SeqCst),
        e.waiting.load(Ordering::SeqCst),
        e.cfg.block_size,
        e.cfg.gpu_blocks,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// What a request's blocks hash beside their tokens, as vLLM's extra keys:
/// the LoRA adapter's name on every block, the cache salt on the first.
#[derive(Debug, Default)]
struct Keys {
    /// The adapter's id (its place among the adapters, from 1) and name.
    adapter: Option<(u64, String)>,
    salt: Option<String>,
}

impl Keys {
    /// Block `pos`'s extra keys.
    fn of_block(&self, pos: usize) -> Vec<String> {
        let salt = self.salt.as_ref().filter(|_| pos == 0);
        self.adapter
            .as_ref()
            .map(|(_, a)| a)
            .into_iter()
            .chain(salt)
            .cloned()
            .collect()
    }

    /// `e` as vLLM publishes it with these keys: a store gets the adapter
    /// and each block's extra keys (`at`: where each of the request's
    /// blocks sits in its chain).
    fn publish(&self, e: WireEvent, at: &HashMap<u64, usize>) -> WireEvent {
        if self.adapter.is_none() && self.salt.is_none() {
            return e;
        }
        let hashes = match &e {
            WireEvent::Stored { hashes, .. } | WireEvent::GroupStored { hashes, .. } => hashes,
            _ => return e,
        };
        let extra_keys = hashes
            .iter()
            .map(|h| at.get(h).map_or_else(Vec::new, |&p| self.of_block(p)))
            .collect();
        WireEvent::Keyed {
            lora_id: self.adapter.as_ref().map(|a| a.0),
            lora_name: self.adapter.as_ref().map(|a| a.1.clone()),
            extra_keys,
            event: Box::new(e),
        }
    }
}

/// A request's pinned blocks, unpinned however the request ends.
struct Lease {
    engine: Arc<Engine>,
    blocks: Vec<u64>,
    /// Blocks pinned in the other group of a hybrid model.
    group_blocks: Vec<u64>,
    /// Counted in the engine's running requests (its prefill started).
    running: bool,
}

impl Lease {
    fn start_running(&mut self) {
        if !self.running {
            self.running = true;
            self.engine.running.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.engine.cache.lock().release(&self.blocks);
        if !self.group_blocks.is_empty() {
            self.engine.group.lock().release(&self.group_blocks);
        }
        self.engine.active.fetch_sub(1, Ordering::SeqCst);
        if self.running {
            self.engine.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Engine {
    fn scaled(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms * self.cfg.time_scale / 1000.0).max(0.0))
    }

    /// The engine's own block hashes of the full blocks of `tokens`, each
    /// with its extra keys (as vLLM hashes them with its tokens).
    fn block_hashes(&self, tokens: &[u32], keys: &Keys) -> Vec<u64> {
        let bs = self.cfg.block_size as usize;
        let mut parent = self.seed;
        let mut bytes = Vec::with_capacity(bs * 4);
        tokens
            .chunks_exact(bs)
            .enumerate()
            .map(|(i, block)| {
                bytes.clear();
                bytes.extend(block.iter().flat_map(|t| t.to_le_bytes()));
                for k in keys.of_block(i) {
                    bytes.push(0xff);
                    bytes.extend_from_slice(k.as_bytes());
                }
                parent = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, parent);
                parent
            })
            .collect()
    }

    /// The request's keys: the adapter its `model` names (a 404 for a
    /// model this engine does not serve, as vLLM answers) and its salt.
    fn keys(&self, body: &Value) -> Result<Keys, ApiError> {
        let model = body.get("model").and_then(Value::as_str);
        let adapter = match model {
            Some(m) if m != self.cfg.model => match self.cfg.adapters.iter().position(|a| a == m) {
                Some(i) => Some((i as u64 + 1, m.to_owned())),
                None => return Err(ApiError::unknown_model(m)),
            },
            _ => {
                openai::check_model(body, &self.cfg.model)?;
                None
            }
        };
        let salt = body
            .get("cache_salt")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Keys { adapter, salt })
    }

    /// The full-attention cache's changes as events; stores of `blocks`
    /// (the request's chain over `tokens`) become `BlockStored` runs with
    /// their tokens.
    fn full_events(
        &self,
        changes: Vec<router_sim::CacheChange>,
        blocks: &[u64],
        tokens: &[u32],
    ) -> Vec<WireEvent> {
        let bs = self.cfg.block_size as usize;
        // Where each of the request's blocks sits in its chain, built only
        // when something was stored (evictions alone need no tokens).
        let mut pos: Option<HashMap<u64, usize>> = None;
        let mut out: Vec<WireEvent> = Vec::new();
        for c in changes {
            if !c.stored {
                match out.last_mut() {
                    Some(WireEvent::Removed { hashes, .. }) => hashes.push(c.block),
                    _ => out.push(WireEvent::Removed {
                        hashes: vec![c.block],
                        medium: "GPU",
                    }),
                }
                continue;
            }
            let pos = pos
                .get_or_insert_with(|| blocks.iter().enumerate().map(|(i, b)| (*b, i)).collect());
            let Some(&i) = pos.get(&c.block) else {
                continue; // not this request's block: never happens for stores
            };
            let toks = &tokens[i * bs..(i + 1) * bs];
            if let Some(WireEvent::Stored {
                hashes, tokens: t, ..
            }) = out.last_mut()
                && hashes.last().is_some_and(|h| i > 0 && blocks[i - 1] == *h)
            {
                hashes.push(c.block);
                t.extend_from_slice(toks);
                continue;
            }
            out.push(WireEvent::Stored {
                hashes: vec![c.block],
                parent: i.checked_sub(1).map(|p| blocks[p]),
                tokens: toks.to_vec(),
                block_size: self.cfg.block_size,
                medium: "GPU",
            });
        }
        out
    }

    /// Publishes the caches' changes: a hybrid model's other group first
    /// (its group index is 0), then full attention; stores with the
    /// request's `keys`.
    fn announce(&self, blocks: &[u64], tokens: &[u32], from: usize, keys: &Keys) {
        let main = self.cache.lock().drain_changes();
        let group = match self.cfg.hybrid {
            Some(_) => self.group.lock().drain_changes(),
            None => Vec::new(),
        };
        if main.is_empty() && group.is_empty() {
            return;
        }
        let keyed = |out: Vec<WireEvent>| {
            if keys.adapter.is_none() && keys.salt.is_none() {
                return out;
            }
            let at: HashMap<u64, usize> = blocks.iter().enumerate().map(|(i, b)| (*b, i)).collect();
            out.into_iter().map(|e| keys.publish(e, &at)).collect()
        };
        let Some(hybrid) = self.cfg.hybrid else {
            let _ = self
                .events
                .send(keyed(self.full_events(main, blocks, tokens)));
            return;
        };
        let mut out = self.group_events(hybrid, group, blocks, tokens, from);
        out.extend(
            self.full_events(main, blocks, tokens)
                .into_iter()
                .map(|e| match e {
                    WireEvent::Stored {
                        hashes,
                        parent,
                        tokens,
                        block_size,
                        medium,
                    } => WireEvent::GroupStored {
                        hashes,
                        parent,
                        tokens,
                        block_size,
                        medium,
                        group: 1,
                        kind: "full_attention",
                        window: None,
                    },
                    WireEvent::Removed { hashes, medium } => WireEvent::GroupRemoved {
                        hashes,
                        medium,
                        group: 1,
                    },
                    other => other,
                }),
        );
        let _ = self.events.send(keyed(out));
    }

    /// The other group's changes as vLLM publishes a sparse group's: the
    /// blocks it stored, with the tokens of the whole range the request
    /// computed (from block `from`), which covers blocks it skipped.
    fn group_events(
        &self,
        hybrid: Hybrid,
        changes: Vec<router_sim::CacheChange>,
        blocks: &[u64],
        tokens: &[u32],
        from: usize,
    ) -> Vec<WireEvent> {
        let bs = self.cfg.block_size as usize;
        let mut out = Vec::new();
        let removed: Vec<u64> = changes
            .iter()
            .filter(|c| !c.stored)
            .map(|c| c.block)
            .collect();
        if !removed.is_empty() {
            out.push(WireEvent::GroupRemoved {
                hashes: removed,
                medium: "GPU",
                group: 0,
            });
        }
        let stored: std::collections::HashSet<u64> = changes
            .iter()
            .filter(|c| c.stored)
            .map(|c| c.block)
            .collect();
        let at: Vec<usize> = (0..blocks.len())
            .filter(|i| stored.contains(&blocks[*i]))
            .collect();
        if let (Some(&first), Some(&last)) = (at.first(), at.last()) {
            let start = from.min(first);
            let (kind, window) = hybrid.vllm_kind();
            out.push(WireEvent::GroupStored {
                hashes: at.iter().map(|&i| blocks[i]).collect(),
                parent: start.checked_sub(1).map(|p| blocks[p]),
                tokens: tokens[start * bs..(last + 1) * bs].to_vec(),
                block_size: self.cfg.block_size,
                medium: "GPU",
                group: 0,
                kind,
                window,
            });
        }
        out
    }

    async fn serve(self: Arc<Self>, api: Api, raw: &[u8]) -> Response {
        match self.clone().generate(api, raw).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        }
    }

    async fn generate(self: Arc<Self>, api: Api, raw: &[u8]) -> Result<Response, ApiError> {
        // Parsed and tokenized off the runtime's thread: a large prompt must
        // not stop this engine from answering `/health` meanwhile.
        let (raw, engine) = (raw.to_vec(), self.clone());
        let (body, tokens, keys) = tokio::task::spawn_blocking(move || {
            let body = openai::parse_body(&raw)?;
            let keys = engine.keys(&body)?;
            // vLLM renders chat templates to text: it never sanitizes.
            let tokens = openai::prompt_tokens(api, &body, &engine.cfg.tokenizer, false)?;
            Ok::<_, ApiError>((body, tokens, keys))
        })
        .await
        .map_err(|e| ApiError::new(500, "server_error", "engine_task", e.to_string()))??;
        let bs = self.cfg.block_size.max(1) as usize;
        if tokens.len().div_ceil(bs) > self.cfg.gpu_blocks {
            // As vLLM refuses a prompt longer than the model's context.
            return Err(ApiError::new(
                400,
                "invalid_request_error",
                "prompt_too_long",
                format!(
                    "the prompt has {} tokens, more than this engine's KV cache holds ({} blocks of {bs})",
                    tokens.len(),
                    self.cfg.gpu_blocks
                ),
            ));
        }
        let max_tokens = ["max_tokens", "max_completion_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_u64))
            .unwrap_or(u64::from(self.cfg.default_max_tokens))
            .clamp(1, 4096) as u32;
        let blocks = self.block_hashes(&tokens, &keys);
        let waiting = Counted::new(&self.waiting);
        // Admission: wait while running requests pin the whole GPU.
        let give_up = Instant::now() + Duration::from_secs(30);
        let admission = loop {
            if let Some(a) = self.cache.lock().admit(&blocks) {
                break a;
            }
            if Instant::now() > give_up {
                return Err(ApiError::new(
                    503,
                    "server_error",
                    "engine_full",
                    "the KV cache is full".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.active.fetch_add(1, Ordering::SeqCst);
        let mut lease = Lease {
            engine: self.clone(),
            blocks: blocks.clone(),
            group_blocks: Vec::new(),
            running: false,
        };
        let mut hit = admission.gpu_hits + admission.cpu_hits;
        let mut group_computed = Vec::new();
        if let Some(hybrid) = self.cfg.hybrid {
            // vLLM's rule: the longest hit both groups serve.
            let spec = hybrid.spec(self.cfg.block_size);
            let mut group = self.group.lock();
            hit = spec.longest_hit(hit, |i| group.tier_of(blocks[i]).is_some());
            let kept = blocks[hybrid.kept(blocks.len(), self.cfg.block_size)].to_vec();
            if let Some(a) = group.admit(&kept) {
                lease.group_blocks = kept;
                group_computed = a.computed;
            }
        }
        self.announce(&blocks, &tokens, hit, &keys); // evictions made room
        let cached = (hit * bs).min(tokens.len());
        let new = (tokens.len() - cached) as f64;
        let c = &self.cfg.cost;
        let transfer = |key: &str| {
            body.pointer(&format!("/kv_transfer_params/{key}"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        // Disaggregated serving, as vLLM's connectors do it: a prefill
        // request (`do_remote_decode`) answers with the handle of its KV;
        // a decode request holding a handle (`do_remote_prefill`) pulls the
        // blocks it lacks instead of computing them (timed as loads).
        let (remote_decode, remote_prefill) =
            (transfer("do_remote_decode"), transfer("do_remote_prefill"));
        if remote_prefill {
            drop(waiting);
            lease.start_running();
            let pulled = admission.computed.len() as f64;
            tokio::time::sleep(self.scaled(c.cpu_load_ms * pulled)).await;
        } else {
            let prefill_ms = c.overhead_ms
                + c.per_token_us * new / 1e3
                + c.attention_ns * new * (cached as f64 + new / 2.0) / 1e6;
            let (start, done) = {
                let mut lane = self.lane.lock();
                let start = (*lane).max(Instant::now());
                *lane = start + self.scaled(prefill_ms);
                (start, *lane)
            };
            tokio::time::sleep_until(start).await;
            drop(waiting);
            lease.start_running();
            tokio::time::sleep_until(done).await;
        }
        self.cache.lock().computed(&admission.computed);
        if !group_computed.is_empty() {
            self.group.lock().computed(&group_computed);
        }
        self.announce(&blocks, &tokens, hit, &keys);
        let step = self.scaled(
            c.overhead_ms + c.per_token_us / 1e3 + c.kv_read_ns * tokens.len() as f64 / 1e6,
        );
        let usage = json!({
            "prompt_tokens": tokens.len(),
            "completion_tokens": max_tokens,
            "total_tokens": tokens.len() as u64 + u64::from(max_tokens),
            "prompt_tokens_details": {"cached_tokens": cached},
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = Reply {
            api,
            id: match api {
                Api::Completions => format!("cmpl-{id}"),
                Api::Chat => format!("chatcmpl-{id}"),
            },
            model: keys
                .adapter
                .as_ref()
                .map_or_else(|| self.cfg.model.clone(), |a| a.1.clone()),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        if remote_decode || !openai::is_stream(&body) {
            let out = if remote_decode { 1 } else { max_tokens };
            tokio::time::sleep(step * out).await;
            drop(lease);
            let text: String = (0..out).map(word).collect();
            let mut whole = reply.whole(&text, usage);
            if remote_decode {
                whole["kv_transfer_params"] = json!({
                    "do_remote_prefill": true, "do_remote_decode": false,
                    "remote_engine_id": format!("sim-{:x}", self.seed),
                    "remote_block_ids": blocks, "remote_host": "127.0.0.1",
                    "remote_port": 0,
                });
            }
            return Ok(axum::Json(whole).into_response());
        }
        // The stream's items: the chat role opener (vLLM sends one), a
        // token per decode step, the usage chunk if asked, `[DONE]`.
        let opener = u32::from(api == Api::Chat);
        let usage_at = opener + max_tokens;
        let done_at = usage_at + u32::from(openai::wants_usage(&body));
        let stream = futures::stream::unfold((0u32, Some(lease)), move |(k, lease)| {
            let reply = reply.clone();
            let usage = usage.clone();
            async move {
                let lease = lease?;
                let item = if k < opener {
                    sse(&reply.chunk(Some("assistant"), "", None))
                } else if k < usage_at {
                    tokio::time::sleep(step).await;
                    let n = k - opener;
                    let finish = (n + 1 == max_tokens).then_some("length");
                    sse(&reply.chunk(None, &word(n), finish))
                } else if k < done_at {
                    sse(&reply.usage_chunk(usage))
                } else {
                    drop(lease);
                    return Some((
                        Ok::<_, std::io::Error>(Bytes::from_static(b"data: [DONE]\n\n")),
                        (k, None),
                    ));
                };
                Some((Ok(item), (k + 1, Some(lease))))
            }
        });
        Ok((
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from_stream(stream),
        )
            .into_response())
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(router_gateway::sse_event(&v.to_string()))
}

/// The `n`th generated word.
fn word(n: u32) -> String {
    const WORDS: [&str; 8] = [
        " the", " cache", " router", " keeps", " the", " prefix", " warm", ".",
    ];
    WORDS[n as usize % WORDS.len()].to_owned()
}

#[derive(Clone)]
struct Reply {
    api: Api,
    id: String,
    model: String,
    created: u64,
}

impl Reply {
    fn object(&self, streamed: bool) -> &'static str {
        match (self.api, streamed) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        }
    }

    fn chunk(&self, role: Option<&str>, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.api {
            Api::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
            Api::Chat => {
                let mut delta = json!({"content": text});
                if let Some(r) = role {
                    delta["role"] = json!(r);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        };
        json!({"id": self.id, "object": self.object(true), "created": self.created,
               "model": self.model, "choices": [choice]})
    }

    fn usage_chunk(&self, usage: Value) -> Value {
        json!({"id": self.id, "object": self.object(true), "created": self.created,
               "model": self.model, "choices": [], "usage": usage})
    }

    fn whole(&self, text: &str, usage: Value) -> Value {
        let choice = match self.api {
            Api::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
            }
            Api::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": null, "finish_reason": "length"}),
        };
        json!({"id": self.id, "object": self.object(false), "created": self.created,
               "model": self.model, "choices": [choice], "usage": usage})
    }
}
