//! Subscribing to engines' event streams over ZeroMQ.
//!
//! One task per pod (an engine's data-parallel rank): a SUB socket on the
//! engine's publisher, frames `[topic, seq (8 bytes, big-endian), payload]`.
//! The engine's replay endpoint (a ROUTER; we are a DEALER sending
//! `["", start_seq]`) is asked for batches in four cases:
//!
//! - **at start**, from the oldest batch it buffers: a warm engine's cache
//!   is known before it publishes anything new (vLLM keeps the last
//!   `buffer_steps` batches, 10,000 by default: blocks stored before the
//!   oldest of them and still cached are not recoverable, and their
//!   extensions count as unknown parents);
//! - **on a gap**, for the missing batches; when the buffer cannot cover
//!   them, the pod is cleared so it rebuilds from new events instead of
//!   serving stale hits;
//! - **when a store's parent is unknown**, the whole buffer again (at
//!   most every 5 s);
//! - **when the pod returns** from being unhealthy ([`Subscriber::recheck`]):
//!   the same engine still buffers the last batch applied, a restarted one
//!   does not.
//!
//! A sequence number that goes backwards on a batch newer than the last one
//! applied is a restarted engine ([`Sequencer`]): its pod is cleared,
//! counted and logged, and the new stream followed. Malformed frames and
//! payloads are counted and skipped; the stream stays up.
//!
//! Silence is not death (an idle engine sends nothing): a pod leaves only
//! when the gateway says so, through [`Subscriber::remove`] or the
//! [`PodHealth`] trait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use router_core::{BlockHasher, CacheEventSink, PodDirectory, PodId, TierCounts};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::decode::{EventBatch, decode_batch};
use crate::error::DecodeError;
use crate::ingest::{IngestStats, Ingestor};
use crate::sequence::{Sequencer, Verdict};

/// One engine event stream.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodStream {
    /// The pod the stream belongs to.
    pub pod: PodId,
    /// The engine's publisher, for example `tcp://10.0.0.7:5557` (base port
    /// plus the data-parallel rank).
    pub endpoint: String,
    /// The engine's replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// The topic to subscribe to (`""`: all).
    pub topic: String,
}

impl PodStream {
    /// A stream of `pod` at `endpoint`, all topics, no replay.
    pub fn new(pod: PodId, endpoint: impl Into<String>) -> Self {
        PodStream {
            pod,
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
        }
    }

    /// With a replay endpoint.
    pub fn replay(mut self, endpoint: impl Into<String>) -> Self {
        self.replay_endpoint = Some(endpoint.into());
        self
    }

    /// With a topic filter.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = topic.into();
        self
    }
}

/// Stream-level counters, beside the ingestion counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// Batches received.
    pub batches: u64,
    /// Messages without exactly three frames, or with a bad sequence frame.
    pub bad_frames: u64,
    /// Payloads that did not decode.
    pub decode_errors: u64,
    /// Batches older than the next expected sequence number and not newer
    /// than the last one applied: seen twice (skipped).
    pub stale: u64,
    /// Engine restarts detected (the sequence went backwards on newer
    /// batches, or a returning pod's buffer no longer held its last
    /// batch): the pod's record was cleared.
    pub restarts: u64,
    /// Batches applied from replays of an engine's whole buffer: at start
    /// (a warm engine), after a restart, on a pod's return, and for stores
    /// whose parent was unknown.
    pub recovered: u64,
    /// Full replays asked for because a store's parent was unknown.
    pub resyncs: u64,
    /// Gaps detected.
    pub gaps: u64,
    /// Batches recovered through replay.
    pub replayed: u64,
    /// Pods cleared because a gap could not be replayed, or a returning
    /// pod's engine could not be verified.
    pub resets: u64,
    /// Event lag of the latest batch applied, in microseconds: our clock
    /// when it was applied minus the publisher's timestamp (meaningful on
    /// one host or with synchronised clocks; 0 when ahead).
    pub last_lag_us: u64,
    /// The largest event lag seen, in microseconds.
    pub max_lag_us: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    bad_frames: AtomicU64,
    decode_errors: AtomicU64,
    stale: AtomicU64,
    restarts: AtomicU64,
    recovered: AtomicU64,
    resyncs: AtomicU64,
    gaps: AtomicU64,
    replayed: AtomicU64,
    resets: AtomicU64,
    last_lag_us: AtomicU64,
    max_lag_us: AtomicU64,
}

/// The gateway's health feed: a pod reported down leaves the index.
pub trait PodHealth: Send + Sync {
    /// `pod` is gone (failed probes, removed from the configuration).
    fn pod_down(&self, pod: PodId);
}

type SharedIngestor = Arc<Mutex<Ingestor<Arc<dyn BlockHasher>, Arc<dyn CacheEventSink>>>>;

struct Task {
    handle: JoinHandle<()>,
    /// The subscriber's own ingestor (`None`: the stream goes to another
    /// sink, [`Subscriber::add_with`]).
    ingest: Option<SharedIngestor>,
    recheck: Arc<Notify>,
}

/// Subscribes to many pods' event streams and keeps an index current.
pub struct Subscriber {
    hasher: Arc<dyn BlockHasher>,
    sink: Arc<dyn CacheEventSink>,
    directory: Arc<dyn PodDirectory>,
    model: Option<String>,
    block_size: u32,
    replay_timeout: Duration,
    tasks: Mutex<HashMap<PodId, Task>>,
    counters: Arc<Counters>,
    on_clear: Option<ClearHook>,
    chunk_size: Option<u32>,
}

/// Called when a pod's record is cleared (see [`Subscriber::on_clear`]).
pub type ClearHook = Arc<dyn Fn(PodId, ClearReason) + Send + Sync>;

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("pods", &self.tasks.lock().len())
            .field("stats", &self.stream_stats())
            .finish_non_exhaustive()
    }
}

impl Subscriber {
    /// A subscriber hashing with `hasher` (namespace `model`, blocks of
    /// `block_size` tokens unless events say otherwise) into `sink`, whose
    /// pods are managed by `directory` (usually the same index).
    pub fn new(
        hasher: Arc<dyn BlockHasher>,
        sink: Arc<dyn CacheEventSink>,
        directory: Arc<dyn PodDirectory>,
        model: Option<String>,
        block_size: u32,
    ) -> Self {
        Subscriber {
            hasher,
            sink,
            directory,
            model,
            block_size,
            replay_timeout: Duration::from_secs(2),
            tasks: Mutex::new(HashMap::new()),
            counters: Arc::default(),
            on_clear: None,
            chunk_size: None,
        }
    }

    /// Chunked local attention's chunk size in tokens, for hybrid models
    /// that have such a group (see [`crate::Ingestor::with_chunk_size`]). Applies
    /// to streams added afterwards.
    pub fn with_chunk_size(mut self, tokens: Option<u32>) -> Self {
        self.chunk_size = tokens;
        self
    }

    /// Also calls `hook` whenever a followed pod's record is cleared (a
    /// restart, an unhealable gap, an unverified return): what else the
    /// router believes of the pod (its speculative registrations) goes too.
    /// Applies to streams added afterwards.
    pub fn on_clear(mut self, hook: ClearHook) -> Self {
        self.on_clear = Some(hook);
        self
    }

    /// Starts following `stream` (on the current tokio runtime) into the
    /// index. A pod already followed is restarted on the new stream.
    ///
    /// First it replays the engine's whole buffer (a warm engine's cache);
    /// then it follows live batches, healing gaps by replay, clearing the
    /// pod when its engine restarts, and replaying the buffer again (at
    /// most every 5 s) when a store's parent is unknown.
    pub fn add(&self, stream: PodStream) {
        let ingest: SharedIngestor = Arc::new(Mutex::new(
            Ingestor::new(
                self.hasher.clone(),
                self.sink.clone(),
                self.model.clone(),
                self.block_size,
            )
            .with_chunk_size(self.chunk_size),
        ));
        let sink = Arc::new(LocalSink {
            ingest: ingest.clone(),
            counters: self.counters.clone(),
        });
        self.spawn(stream, sink, Some(ingest));
    }

    /// Follows `stream` as [`Subscriber::add`] does, but delivers its
    /// batches to `sink` instead of the index (a relay).
    pub fn add_with(&self, stream: PodStream, sink: Arc<dyn BatchSink>) {
        self.spawn(stream, sink, None);
    }

    fn spawn(&self, stream: PodStream, sink: Arc<dyn BatchSink>, ingest: Option<SharedIngestor>) {
        let pod = stream.pod;
        let recheck = Arc::new(Notify::new());
        let follower = Follower {
            stream,
            sink,
            counters: self.counters.clone(),
            timeout: self.replay_timeout,
            seq: Sequencer::new(),
            last_full_replay: None,
            on_clear: self.on_clear.clone(),
        };
        let handle = tokio::spawn(run_stream(follower, recheck.clone()));
        let task = Task {
            handle,
            ingest,
            recheck,
        };
        if let Some(old) = self.tasks.lock().insert(pod, task) {
            old.handle.abort();
        }
    }

    /// `pod` answers again after being unhealthy: check through its replay
    /// endpoint that its engine is the one whose record is held (the same
    /// engine still buffers the last batch applied). A restarted engine's
    /// pod is cleared and refilled from its buffer; without a replay
    /// endpoint, or when it does not answer, the pod is cleared. Whether
    /// `pod` is followed.
    pub fn recheck(&self, pod: PodId) -> bool {
        self.tasks
            .lock()
            .get(&pod)
            .map(|t| t.recheck.notify_one())
            .is_some()
    }

    /// Stops following `pod` and shuts it down in the directory (it leaves
    /// every query at once; its blocks are swept).
    pub fn remove(&self, pod: PodId) {
        if let Some(t) = self.tasks.lock().remove(&pod) {
            t.handle.abort();
        }
        // A pod unknown to the directory has nothing to shut down.
        let _ = self.directory.shutdown(pod);
    }

    /// Pods followed.
    pub fn pods(&self) -> Vec<PodId> {
        self.tasks.lock().keys().copied().collect()
    }

    /// Stream-level counters, all pods.
    pub fn stream_stats(&self) -> StreamStats {
        let c = &self.counters;
        StreamStats {
            batches: c.batches.load(Ordering::Relaxed),
            bad_frames: c.bad_frames.load(Ordering::Relaxed),
            decode_errors: c.decode_errors.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            restarts: c.restarts.load(Ordering::Relaxed),
            recovered: c.recovered.load(Ordering::Relaxed),
            resyncs: c.resyncs.load(Ordering::Relaxed),
            gaps: c.gaps.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            last_lag_us: c.last_lag_us.load(Ordering::Relaxed),
            max_lag_us: c.max_lag_us.load(Ordering::Relaxed),
        }
    }

    /// Ingestion counters of one pod.
    pub fn ingest_stats(&self, pod: PodId) -> Option<IngestStats> {
        self.tasks
            .lock()
            .get(&pod)
            .and_then(|t| t.ingest.as_ref().map(|i| i.lock().stats()))
    }

    /// Blocks `pod` holds per tier, as its events said.
    pub fn tier_counts(&self, pod: PodId) -> Option<TierCounts> {
        self.tasks
            .lock()
            .get(&pod)
            .and_then(|t| t.ingest.as_ref().map(|i| i.lock().tier_counts(pod)))
    }

    /// Whether `pod` is marked as needing resynchronisation.
    pub fn needs_resync(&self, pod: PodId) -> bool {
        self.tasks
            .lock()
            .get(&pod)
            .and_then(|t| t.ingest.as_ref())
            .is_some_and(|i| i.lock().needs_resync(pod))
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        for (_, t) in self.tasks.lock().drain() {
            t.handle.abort();
        }
    }
}

impl PodHealth for Subscriber {
    fn pod_down(&self, pod: PodId) {
        self.remove(pod);
    }
}

/// The sequence number of a frame (8 bytes, big-endian).
fn seq_of(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

/// Why a pod's record was cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClearReason {
    /// Its engine restarted (a new publisher: the sequence went backwards
    /// on newer batches, or the replay buffer no longer holds the last
    /// batch applied).
    Restart,
    /// Batches were lost and the replay could not cover them.
    Gap,
    /// The pod came back from being unhealthy and its engine could not be
    /// shown to be the same one (no replay endpoint, or it did not answer).
    Unverified,
}

/// Where a followed stream's batches go, in order. The subscriber's own
/// sink decodes them into its index; a relay forwards them (for example
/// into a NATS JetStream stream, `router-nats`).
pub trait BatchSink: Send + Sync {
    /// Batch `seq` of `pod`'s stream (`batch`: its decoding), in order:
    /// every batch is delivered once, gaps healed by replay first.
    fn batch(&self, pod: PodId, seq: u64, payload: &[u8], batch: Result<&EventBatch, &DecodeError>);

    /// Everything `pod` held is unknown or gone: forget it.
    fn clear(&self, pod: PodId, why: ClearReason);

    /// Whether `pod` saw a store whose parent it never saw (then the
    /// subscriber replays the engine's buffer from its oldest batch).
    fn needs_resync(&self, pod: PodId) -> bool {
        let _ = pod;
        false
    }

    /// The replay that `needs_resync` asked for was applied.
    fn resynced(&self, pod: PodId) {
        let _ = pod;
    }
}

/// The subscriber's own sink: decoded batches into its ingestor.
struct LocalSink {
    ingest: SharedIngestor,
    counters: Arc<Counters>,
}

impl BatchSink for LocalSink {
    fn batch(&self, pod: PodId, _: u64, _: &[u8], batch: Result<&EventBatch, &DecodeError>) {
        match batch {
            Ok(batch) => {
                self.ingest.lock().apply_batch(pod, batch);
                self.counters.lag(batch.ts);
            }
            Err(e) => tracing::warn!(%pod, error = %e, "skipped a batch"),
        }
    }
    fn clear(&self, pod: PodId, _: ClearReason) {
        self.ingest.lock().reset_pod(pod);
    }
    fn needs_resync(&self, pod: PodId) -> bool {
        self.ingest.lock().needs_resync(pod)
    }
    fn resynced(&self, pod: PodId) {
        self.ingest.lock().clear_resync(pod);
    }
}

impl Counters {
    fn lag(&self, ts: f64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // A NaN or future timestamp saturates to 0.
        let lag = ((now - ts) * 1e6).max(0.0) as u64;
        self.last_lag_us.store(lag, Ordering::Relaxed);
        self.max_lag_us.fetch_max(lag, Ordering::Relaxed);
    }
}

/// One stream's follower: the socket side's state and what it feeds.
struct Follower {
    stream: PodStream,
    sink: Arc<dyn BatchSink>,
    counters: Arc<Counters>,
    timeout: Duration,
    seq: Sequencer,
    /// When the last replay from the oldest batch was tried.
    last_full_replay: Option<tokio::time::Instant>,
    on_clear: Option<ClearHook>,
}

/// How often a pod with unknown parents may ask for a full replay.
const RESYNC_EVERY: Duration = Duration::from_secs(5);

impl Follower {
    fn pod(&self) -> PodId {
        self.stream.pod
    }

    /// Delivers one batch in order and advances the position.
    fn deliver(&mut self, seq: u64, payload: &[u8], decoded: &Result<EventBatch, DecodeError>) {
        if decoded.is_err() {
            self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.sink.batch(self.pod(), seq, payload, decoded.as_ref());
        self.seq.applied(seq, decoded.as_ref().ok().map(|b| b.ts));
    }

    fn clear(&mut self, why: ClearReason) {
        let pod = self.pod();
        match why {
            ClearReason::Restart => {
                self.counters.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%pod, "its engine restarted: record cleared");
            }
            ClearReason::Gap => {
                self.counters.resets.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%pod, "lost batches not in the replay buffer: record cleared");
            }
            ClearReason::Unverified => {
                self.counters.resets.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %pod,
                    "back, but its engine could not be verified: record cleared"
                );
            }
        }
        self.sink.clear(pod, why);
        if let Some(hook) = &self.on_clear {
            hook(pod, why);
        }
        self.seq.reset();
    }

    /// The batches the replay endpoint buffers from `from` on (`None`: no
    /// endpoint, or it failed; logged).
    async fn fetch(&self, from: u64) -> Option<Vec<(u64, bytes::Bytes)>> {
        let ep = self.stream.replay_endpoint.as_deref()?;
        let pod = self.pod();
        match tokio::time::timeout(self.timeout, fetch(ep, from)).await {
            Ok(Ok(b)) => Some(b),
            Ok(Err(e)) => {
                tracing::warn!(%pod, endpoint = %ep, error = %e, "replay failed");
                None
            }
            Err(_) => {
                tracing::warn!(%pod, endpoint = %ep, "replay timed out");
                None
            }
        }
    }

    /// Replays the engine's whole buffer, from its oldest batch, applying
    /// every batch not yet applied in order (at start: a warm engine's
    /// cache; after unknown parents: the blocks they extend). Batches
    /// below the position are applied again when `again` (re-storing what
    /// the buffer says is idempotent and ends in the engine's state).
    async fn replay_all(&mut self, again: bool) -> bool {
        self.last_full_replay = Some(tokio::time::Instant::now());
        let Some(batches) = self.fetch(0).await else {
            return false;
        };
        let pod = self.pod();
        let mut n = 0u64;
        for (s, payload) in &batches {
            let decoded = decode_batch(payload);
            let fresh = self.seq.expected().is_none_or(|e| *s >= e);
            if fresh {
                self.deliver(*s, payload, &decoded);
            } else if again {
                self.sink.batch(pod, *s, payload, decoded.as_ref());
            } else {
                continue;
            }
            n += 1;
        }
        self.counters.recovered.fetch_add(n, Ordering::Relaxed);
        if n > 0 {
            tracing::info!(%pod, batches = n, "applied batches from the replay buffer");
        }
        true
    }

    /// Heals `from..upto` from the replay endpoint; whether it was covered.
    async fn heal(&mut self, from: u64, upto: u64) -> bool {
        let Some(batches) = self.fetch(from).await else {
            return false;
        };
        // The buffer must start at or before the first missing batch and hold
        // every batch up to the one that revealed the gap.
        let wanted: Vec<&(u64, bytes::Bytes)> = batches
            .iter()
            .filter(|(s, _)| *s >= from && *s < upto)
            .collect();
        let covered =
            wanted.len() as u64 == upto - from && wanted.first().is_some_and(|(s, _)| *s == from);
        if !covered {
            return false;
        }
        for (s, payload) in wanted {
            let decoded = decode_batch(payload);
            self.deliver(*s, payload, &decoded);
            self.counters.replayed.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The position to verify a publisher against: the last batch applied.
    fn anchor(&self) -> Option<(u64, f64)> {
        self.seq.expected().map(|e| (e - 1, self.seq.last_ts()))
    }

    /// Is the engine publishing now the one that published batch
    /// `anchor` (sequence number, timestamp)? The same engine still
    /// buffers it, with the same timestamp; a restarted one does not. Used
    /// when the pod returns from being unhealthy and when the publisher's
    /// connection was lost and made again. The same engine's later batches
    /// are applied; a different one clears the pod, which is refilled from
    /// the new engine's buffer.
    async fn verify(&mut self, anchor: Option<(u64, f64)>) {
        let Some((last, ts)) = anchor else {
            // Nothing applied since the last clear: nothing stale to keep.
            self.replay_all(false).await;
            return;
        };
        match self.fetch(last).await {
            None => {
                self.clear(ClearReason::Unverified);
                self.replay_all(false).await;
            }
            Some(batches) => {
                let same = batches
                    .iter()
                    .find(|(s, _)| *s == last)
                    .is_some_and(|(_, p)| {
                        decode_batch(p).is_ok_and(|b| b.ts.to_bits() == ts.to_bits())
                    });
                if same {
                    let from = self.seq.expected().unwrap_or(0);
                    for (s, payload) in batches.iter().filter(|(s, _)| *s >= from) {
                        let decoded = decode_batch(payload);
                        self.deliver(*s, payload, &decoded);
                        self.counters.recovered.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    self.clear(ClearReason::Restart);
                    self.replay_all(false).await;
                }
            }
        }
    }

    /// One live message.
    async fn on_message(&mut self, frames: Vec<bytes::Bytes>) {
        let Some((seq, payload)) = live_frame(&frames) else {
            self.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let decoded = decode_batch(payload);
        let ts = decoded.as_ref().ok().map(|b| b.ts);
        match self.seq.check(seq, ts) {
            Verdict::Stale => {
                self.counters.stale.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Verdict::Restart => {
                self.clear(ClearReason::Restart);
                // The new engine's earlier batches, if it published any
                // before this one reached us.
                if seq > 0 {
                    self.replay_below(seq).await;
                }
            }
            Verdict::Gap { from, upto } => {
                self.counters.gaps.fetch_add(1, Ordering::Relaxed);
                if !self.heal(from, upto).await {
                    self.clear(ClearReason::Gap);
                }
            }
            Verdict::Next => {
                if self.seq.expected().is_none() && seq > 0 {
                    // Joined mid-stream with no history (the start-up replay
                    // failed or came first): the batches before this one.
                    self.replay_below(seq).await;
                }
            }
        }
        self.deliver(seq, payload, &decoded);
        if self.sink.needs_resync(self.pod())
            && self
                .last_full_replay
                .is_none_or(|t| t.elapsed() >= RESYNC_EVERY)
        {
            self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
            if self.replay_all(true).await {
                self.sink.resynced(self.pod());
            }
        }
    }

    /// Applies the buffered batches below `seq` (a stream followed from
    /// its middle).
    async fn replay_below(&mut self, seq: u64) {
        self.last_full_replay = Some(tokio::time::Instant::now());
        let Some(batches) = self.fetch(0).await else {
            return;
        };
        let mut n = 0;
        for (s, payload) in batches.iter().filter(|(s, _)| *s < seq) {
            let decoded = decode_batch(payload);
            self.deliver(*s, payload, &decoded);
            n += 1;
        }
        self.counters.recovered.fetch_add(n, Ordering::Relaxed);
    }
}

async fn run_stream(mut f: Follower, recheck: Arc<Notify>) {
    let pod = f.pod();
    let mut sub = SubSocket::new();
    // A lost and remade connection may be a restarted publisher on the same
    // address, whose sequence can pass ours before its first batch reaches
    // us: the position at the loss is verified on reconnection.
    let mut monitor = sub.monitor();
    let mut lost_at: Option<Option<(u64, f64)>> = None;
    let mut monitor_open = true;
    if let Err(e) = sub.connect(&f.stream.endpoint).await {
        tracing::warn!(%pod, endpoint = %f.stream.endpoint, error = %e, "cannot connect");
        return;
    }
    if let Err(e) = sub.subscribe(&f.stream.topic).await {
        tracing::warn!(%pod, error = %e, "cannot subscribe");
        return;
    }
    // Cold start: a warm engine's cache is in its replay buffer. Subscribed
    // first, so a batch published meanwhile arrives live too (and is then
    // stale: its timestamp is not newer).
    f.replay_all(false).await;
    loop {
        tokio::select! {
            biased;
            event = monitor.next(), if monitor_open => match event {
                Some(SocketEvent::Disconnected(_)) => {
                    lost_at.get_or_insert(f.anchor());
                }
                Some(SocketEvent::Connected(..)) => {
                    if let Some(anchor) = lost_at.take() {
                        f.verify(anchor).await;
                    }
                }
                Some(_) => {}
                None => monitor_open = false,
            },
            () = recheck.notified() => {
                let anchor = f.anchor();
                f.verify(anchor).await;
            }
            msg = sub.recv() => match msg {
                Ok(m) => f.on_message(m.into_vec()).await,
                Err(e) => {
                    // The socket reconnects on its own; do not spin.
                    tracing::warn!(%pod, error = %e, "receive failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// The batches a replay endpoint returns from `from` on, until its end
/// marker. Accepts the newer reply layout `["", topic, seq, payload]` and
/// the older `["", seq, payload]`; the end is a sequence of all ones.
async fn fetch(endpoint: &str, from: u64) -> Result<Vec<(u64, bytes::Bytes)>, String> {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.map_err(|e| e.to_string())?;
    let mut req = ZmqMessage::from(Vec::<u8>::new());
    req.push_back(from.to_be_bytes().to_vec().into());
    dealer.send(req).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    loop {
        let frames = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
        match replay_frame(&frames)? {
            None => return Ok(out),
            Some((s, i)) => out.push((s, frames[i].clone())),
        }
    }
}

/// A live message's sequence number and payload: frames `[topic, seq
/// (8 bytes, big-endian), payload]`; anything else is `None` (counted as a
/// bad frame).
pub fn live_frame<F: AsRef<[u8]>>(frames: &[F]) -> Option<(u64, &[u8])> {
    match frames {
        [_topic, seq, payload] => Some((seq_of(seq.as_ref())?, payload.as_ref())),
        _ => None,
    }
}

/// One replay reply: `Some((seq, index of the payload frame))`, or `None`
/// at the end marker (a sequence of all ones). Accepts the newer layout
/// `["", topic, seq, payload]` and the older `["", seq, payload]`, with or
/// without the empty delimiter frame; anything else is an error naming it.
pub fn replay_frame<F: AsRef<[u8]>>(frames: &[F]) -> Result<Option<(u64, usize)>, String> {
    let skip = usize::from(frames.first().is_some_and(|f| f.as_ref().is_empty()));
    let body = &frames[skip..];
    let (seq, at) = match body {
        [_topic, seq, _payload] => (seq_of(seq.as_ref()), skip + 2),
        [seq, _payload] => (seq_of(seq.as_ref()), skip + 1),
        _ => return Err(format!("a replay reply of {} frames", frames.len())),
    };
    match seq {
        Some(u64::MAX) => Ok(None),
        Some(s) => Ok(Some((s, at))),
        None => Err("a replay reply with a bad sequence frame".into()),
    }
}
