//! Subscribing to engines' event streams over ZeroMQ.
//!
//! One task per pod (an engine's data-parallel rank): a SUB socket on the
//! engine's publisher, frames `[topic, seq (8 bytes, big-endian), payload]`.
//! Sequence numbers are tracked per stream; a gap is lost state, healed by
//! asking the engine's replay endpoint (a ROUTER; we are a DEALER sending
//! `["", start_seq]`) for the missing batches. When the replay cannot cover
//! the gap (the engine's buffer moved on), the pod's state is cleared so it
//! rebuilds from new events instead of serving stale hits. Malformed frames
//! and payloads are counted and skipped; the stream stays up.
//!
//! Silence is not death (an idle engine sends nothing): a pod leaves only
//! when the gateway says so, through [`Subscriber::remove`] or the
//! [`PodHealth`] trait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use router_core::{BlockHasher, CacheEventSink, PodDirectory, PodId, TierCounts};
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::decode::decode_batch;
use crate::ingest::{IngestStats, Ingestor};

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
    /// Batches older than the next expected sequence number (skipped).
    pub stale: u64,
    /// Gaps detected.
    pub gaps: u64,
    /// Batches recovered through replay.
    pub replayed: u64,
    /// Pods cleared because a gap could not be replayed.
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
    ingest: SharedIngestor,
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
}

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
        }
    }

    /// Starts following `stream` (on the current tokio runtime). A pod
    /// already followed is restarted on the new stream.
    pub fn add(&self, stream: PodStream) {
        let ingest: SharedIngestor = Arc::new(Mutex::new(Ingestor::new(
            self.hasher.clone(),
            self.sink.clone(),
            self.model.clone(),
            self.block_size,
        )));
        let pod = stream.pod;
        let handle = tokio::spawn(run_stream(
            stream,
            ingest.clone(),
            self.counters.clone(),
            self.replay_timeout,
        ));
        if let Some(old) = self.tasks.lock().insert(pod, Task { handle, ingest }) {
            old.handle.abort();
        }
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
            gaps: c.gaps.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            last_lag_us: c.last_lag_us.load(Ordering::Relaxed),
            max_lag_us: c.max_lag_us.load(Ordering::Relaxed),
        }
    }

    /// Ingestion counters of one pod.
    pub fn ingest_stats(&self, pod: PodId) -> Option<IngestStats> {
        self.tasks.lock().get(&pod).map(|t| t.ingest.lock().stats())
    }

    /// Blocks `pod` holds per tier, as its events said.
    pub fn tier_counts(&self, pod: PodId) -> Option<TierCounts> {
        self.tasks
            .lock()
            .get(&pod)
            .map(|t| t.ingest.lock().tier_counts(pod))
    }

    /// Whether `pod` is marked as needing resynchronisation.
    pub fn needs_resync(&self, pod: PodId) -> bool {
        self.tasks
            .lock()
            .get(&pod)
            .is_some_and(|t| t.ingest.lock().needs_resync(pod))
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

fn apply(ingest: &SharedIngestor, counters: &Counters, pod: PodId, payload: &[u8]) {
    match decode_batch(payload) {
        Ok(batch) => {
            ingest.lock().apply_batch(pod, &batch);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            // A NaN or future timestamp saturates to 0.
            let lag = ((now - batch.ts) * 1e6).max(0.0) as u64;
            counters.last_lag_us.store(lag, Ordering::Relaxed);
            counters.max_lag_us.fetch_max(lag, Ordering::Relaxed);
        }
        Err(e) => {
            counters.decode_errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("router-events: pod {pod}: skipped a batch: {e}");
        }
    }
}

async fn run_stream(
    stream: PodStream,
    ingest: SharedIngestor,
    counters: Arc<Counters>,
    replay_timeout: Duration,
) {
    let pod = stream.pod;
    let mut sub = SubSocket::new();
    if let Err(e) = sub.connect(&stream.endpoint).await {
        eprintln!(
            "router-events: pod {pod}: cannot connect to {}: {e}",
            stream.endpoint
        );
        return;
    }
    if let Err(e) = sub.subscribe(&stream.topic).await {
        eprintln!("router-events: pod {pod}: cannot subscribe: {e}");
        return;
    }
    let mut expected: Option<u64> = None;
    loop {
        let msg = match sub.recv().await {
            Ok(m) => m,
            Err(e) => {
                // The socket reconnects on its own; do not spin.
                eprintln!("router-events: pod {pod}: receive failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let frames = msg.into_vec();
        let seq = match (frames.len(), frames.get(1).and_then(|f| seq_of(f))) {
            (3, Some(seq)) => seq,
            _ => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        counters.batches.fetch_add(1, Ordering::Relaxed);
        match expected {
            Some(e) if seq < e => {
                counters.stale.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Some(e) if seq > e => {
                counters.gaps.fetch_add(1, Ordering::Relaxed);
                let healed = match &stream.replay_endpoint {
                    Some(ep) => replay(ep, e, seq, &ingest, &counters, pod, replay_timeout).await,
                    None => false,
                };
                if !healed {
                    counters.resets.fetch_add(1, Ordering::Relaxed);
                    ingest.lock().reset_pod(pod);
                }
            }
            _ => {}
        }
        apply(&ingest, &counters, pod, &frames[2]);
        expected = Some(seq + 1);
    }
}

/// Asks the replay endpoint for batches `from..upto` and applies them.
/// Returns whether the gap was covered.
async fn replay(
    endpoint: &str,
    from: u64,
    upto: u64,
    ingest: &SharedIngestor,
    counters: &Counters,
    pod: PodId,
    timeout: Duration,
) -> bool {
    let fetched = tokio::time::timeout(timeout, fetch(endpoint, from)).await;
    let batches = match fetched {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            eprintln!("router-events: pod {pod}: replay from {endpoint} failed: {e}");
            return false;
        }
        Err(_) => {
            eprintln!("router-events: pod {pod}: replay from {endpoint} timed out");
            return false;
        }
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
    for (_, payload) in wanted {
        apply(ingest, counters, pod, payload);
        counters.replayed.fetch_add(1, Ordering::Relaxed);
    }
    true
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
        let body: &[bytes::Bytes] = match frames.first() {
            Some(f) if f.is_empty() => &frames[1..],
            _ => &frames[..],
        };
        let (seq, payload) = match body {
            [_topic, seq, payload] => (seq_of(seq), payload),
            [seq, payload] => (seq_of(seq), payload),
            _ => return Err(format!("a replay reply of {} frames", frames.len())),
        };
        match seq {
            Some(u64::MAX) => return Ok(out),
            Some(s) => out.push((s, payload.clone())),
            None => return Err("a replay reply with a bad sequence frame".into()),
        }
    }
}
