//! Applying the event stream, and snapshots of what it built.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, object_store::ObjectStore};
use futures::StreamExt;
use parking_lot::Mutex;
use router_core::{BlockHasher, CacheEventSink, PodId};
use router_events::{
    ClearHook, ClearReason, DecodeError, EventBatch, IngestStats, Ingestor, Sequencer, Verdict,
    decode_batch,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

use crate::relay::{CLEAR, SEQ};
use crate::snapshot::{PodSnapshot, Snapshot};
use crate::{Counters, NatsConfig, NatsError, PodNames, bump, server, unhex};

type LogIngestor = Ingestor<Arc<dyn BlockHasher>, Arc<dyn CacheEventSink>>;

pub(crate) enum Cmd {
    Snapshot(oneshot::Sender<Result<u64, NatsError>>),
}

/// The running log follower.
pub(crate) struct Handle {
    tx: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Mutex<IngestStats>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Handle {
    pub(crate) fn clone_sender(&self) -> mpsc::Sender<Cmd> {
        self.tx.clone()
    }
    pub(crate) fn ingest_stats(&self) -> IngestStats {
        *self.stats.lock()
    }
}

pub(crate) async fn snapshot_now(tx: mpsc::Sender<Cmd>) -> Result<u64, NatsError> {
    let (reply, rx) = oneshot::channel();
    tx.send(Cmd::Snapshot(reply))
        .await
        .map_err(|_| NatsError::Config("the log stopped".into()))?;
    rx.await
        .map_err(|_| NatsError::Config("the log stopped".into()))?
}

struct PodLog {
    id: PodId,
    seq: Sequencer,
    /// The id of the last clear marker this replica applied itself (its
    /// copy from the log is then skipped).
    last_clear: Option<String>,
}

impl PodLog {
    fn new(id: PodId, seq: Sequencer) -> Self {
        PodLog {
            id,
            seq,
            last_clear: None,
        }
    }
}

/// The log's state, shared by the task following the stream and this
/// replica's own relays: a batch is applied by whichever path brings it
/// first (the engine's stream through the relay, or the log), and is stale
/// on the other. Both carry one engine's batches in its order, so the
/// result is the same; the log is what restarts and other replicas rely
/// on. `None` until the log has started (the snapshot is loaded first).
#[derive(Default)]
pub(crate) struct LogShared {
    state: Mutex<Option<State>>,
}

impl LogShared {
    /// A batch of pod `name` from this replica's own relay.
    /// A batch of pod `name` from this replica's own relay, decoded there.
    pub(crate) fn local_batch(
        &self,
        name: &str,
        seq: u64,
        decoded: Result<&EventBatch, &DecodeError>,
    ) {
        if let Some(st) = self.state.lock().as_mut() {
            st.apply_decoded(name, seq, decoded);
        }
    }

    /// This replica's relay cleared pod `name` with marker `marker`.
    pub(crate) fn local_clear(&self, name: &str, marker: String, why: ClearReason) {
        if let Some(st) = self.state.lock().as_mut()
            && st.pod(name).is_some()
        {
            st.clear(name, why);
            if let Some(p) = st.pods.get_mut(name) {
                p.last_clear = Some(marker);
            }
        }
    }
}

struct State {
    ingest: LogIngestor,
    pods: HashMap<String, PodLog>,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    on_clear: Option<ClearHook>,
    position: u64,
    stats: Arc<Mutex<IngestStats>>,
}

impl State {
    fn clear(&mut self, name: &str, why: ClearReason) {
        if let Some(p) = self.pods.get_mut(name) {
            self.ingest.reset_pod(p.id);
            p.seq.reset();
            if let Some(hook) = &self.on_clear {
                hook(p.id, why);
            }
        }
    }

    /// The pod named `name`, made current: `None` when this replica does
    /// not route to it; a pod that rejoined under a new id is followed
    /// afresh (its old record went with the old id).
    fn pod(&mut self, name: &str) -> Option<PodId> {
        let id = self.names.id(name)?;
        match self.pods.get(name) {
            Some(p) if p.id == id => {}
            Some(p) => {
                self.ingest.forget_pod(p.id);
                self.pods
                    .insert(name.to_owned(), PodLog::new(id, Sequencer::new()));
            }
            None => {
                self.pods
                    .insert(name.to_owned(), PodLog::new(id, Sequencer::new()));
            }
        }
        Some(id)
    }

    /// Applies one stream message.
    fn apply(&mut self, subject: &str, headers: Option<&async_nats::HeaderMap>, payload: &[u8]) {
        let Some(name) = subject.rsplit('.').next().and_then(unhex) else {
            bump(&self.counters.log_skipped);
            return;
        };
        if self.pod(&name).is_none() {
            bump(&self.counters.log_skipped);
            return;
        }
        let header = |k: &str| {
            headers
                .and_then(|h| h.get(k))
                .map(|v| v.as_str().to_owned())
        };
        if header(CLEAR).is_some() {
            let id = header("Nats-Msg-Id");
            let p = self.pods.get_mut(&name).expect("made current above");
            if id.is_some() && p.last_clear == id {
                // Applied already, when this replica's relay made it.
                p.last_clear = None;
                return;
            }
            bump(&self.counters.log_clears);
            bump(&self.counters.log_applied);
            self.clear(&name, ClearReason::Unverified);
            return;
        }
        let Some(seq) = header(SEQ).and_then(|s| s.parse::<u64>().ok()) else {
            bump(&self.counters.log_skipped);
            return;
        };
        self.apply_batch(&name, seq, payload);
    }

    /// Applies batch `seq` of pod `name`, from either path.
    fn apply_batch(&mut self, name: &str, seq: u64, payload: &[u8]) {
        let decoded = decode_batch(payload);
        self.apply_decoded(name, seq, decoded.as_ref());
    }

    /// Applies batch `seq` of pod `name`, decoded (or not) already.
    fn apply_decoded(&mut self, name: &str, seq: u64, decoded: Result<&EventBatch, &DecodeError>) {
        let Some(id) = self.pod(name) else {
            return;
        };
        let ts = decoded.as_ref().ok().map(|b| b.ts);
        let verdict = self.pods[name].seq.check(seq, ts);
        match verdict {
            Verdict::Stale => {
                bump(&self.counters.log_stale);
                return;
            }
            Verdict::Restart => {
                bump(&self.counters.log_restarts);
                tracing::warn!(pod = %name, "its engine restarted: record cleared");
                self.clear(name, ClearReason::Restart);
            }
            Verdict::Gap { from, upto } => {
                bump(&self.counters.log_gaps);
                tracing::warn!(
                    pod = %name,
                    from,
                    upto,
                    "batches missing from the log: record cleared"
                );
                self.clear(name, ClearReason::Gap);
            }
            Verdict::Next => {}
        }
        if let Ok(batch) = decoded {
            self.ingest.apply_batch(id, batch);
        }
        if let Some(p) = self.pods.get_mut(name) {
            p.seq.applied(seq, ts);
        }
        bump(&self.counters.log_applied);
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            stream_seq: self.position,
            pods: self
                .pods
                .iter()
                .map(|(name, p)| PodSnapshot {
                    name: name.clone(),
                    expected: p.seq.expected(),
                    last_ts: p.seq.last_ts(),
                    blocks: self.ingest.export_pod(p.id),
                })
                .collect(),
        }
    }

    fn import(&mut self, snap: Snapshot) {
        for p in snap.pods {
            let Some(id) = self.names.id(&p.name) else {
                continue;
            };
            self.ingest.import_pod(id, &p.blocks);
            self.pods.insert(
                p.name,
                PodLog::new(id, Sequencer::restore(p.expected, p.last_ts)),
            );
        }
        self.position = snap.stream_seq;
    }
}

fn snapshot_name(seq: u64, replica: &str) -> String {
    format!("snap-{seq:020}-{replica}")
}

fn seq_of_name(name: &str) -> Option<u64> {
    name.strip_prefix("snap-")?.get(..20)?.parse().ok()
}

/// The snapshots in the store, newest first.
async fn listed(store: &ObjectStore) -> Result<Vec<(u64, String)>, NatsError> {
    let mut list = store
        .list()
        .await
        .map_err(|e| server("list snapshots", e))?;
    let mut out = Vec::new();
    while let Some(info) = list.next().await {
        let info = info.map_err(|e| server("list snapshots", e))?;
        if info.deleted {
            continue;
        }
        if let Some(seq) = seq_of_name(&info.name) {
            out.push((seq, info.name));
        }
    }
    out.sort_by(|a, b| b.cmp(a));
    Ok(out)
}

/// Loads the newest snapshot that checks out; its stream position.
async fn load_newest(store: &ObjectStore, state: &mut State) -> u64 {
    let listed = match listed(store).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "replaying the whole stream");
            return 0;
        }
    };
    for (seq, name) in listed {
        let mut bytes = Vec::new();
        let read = match store.get(&name).await {
            Ok(mut object) => object
                .read_to_end(&mut bytes)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = read {
            bump(&state.counters.snapshots_refused);
            tracing::warn!(snapshot = %name, error = %e, "snapshot unreadable; trying an older one");
            continue;
        }
        match Snapshot::decode(&bytes) {
            Ok(snap) if snap.stream_seq == seq => {
                let blocks = snap.blocks();
                state.import(snap);
                state
                    .counters
                    .snapshot_loaded_at
                    .store(seq, Ordering::Relaxed);
                tracing::info!(snapshot = %name, blocks, position = seq, "loaded snapshot");
                return seq;
            }
            Ok(snap) => {
                bump(&state.counters.snapshots_refused);
                tracing::warn!(
                    snapshot = %name,
                    says = snap.stream_seq,
                    named = seq,
                    "snapshot's position disagrees with its name: refused"
                );
            }
            Err(e) => {
                bump(&state.counters.snapshots_refused);
                tracing::warn!(snapshot = %name, error = %e, "snapshot refused; trying an older one");
            }
        }
    }
    tracing::info!("no usable snapshot: replaying the whole stream");
    0
}

/// Stores `snap`, prunes old snapshots and purges the stream behind the
/// oldest one kept.
async fn store_snapshot(
    cfg: &NatsConfig,
    js: &jetstream::Context,
    store: &ObjectStore,
    snap: Snapshot,
    counters: &Counters,
) -> Result<u64, NatsError> {
    let seq = snap.stream_seq;
    let bytes = snap.encode();
    store
        .put(
            snapshot_name(seq, &cfg.replica).as_str(),
            &mut bytes.as_slice(),
        )
        .await
        .map_err(|e| server("write a snapshot", e))?;
    bump(&counters.snapshots_written);
    let listed = listed(store).await?;
    for (_, name) in listed.iter().skip(cfg.snapshots_kept) {
        let _ = store.delete(name).await;
    }
    if listed.len() >= cfg.snapshots_kept
        && let Some((oldest, _)) = listed.get(cfg.snapshots_kept - 1)
        && *oldest > 0
    {
        let stream = js
            .get_stream(cfg.stream())
            .await
            .map_err(|e| server("find the event stream", e))?;
        stream
            .purge()
            .sequence(*oldest + 1)
            .await
            .map_err(|e| server("purge the event stream", e))?;
    }
    Ok(seq)
}

pub(crate) async fn start(
    cfg: NatsConfig,
    js: jetstream::Context,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    ingest: LogIngestor,
    on_clear: Option<ClearHook>,
    shared: Arc<LogShared>,
) -> Result<(Handle, u64), NatsError> {
    let store = js
        .get_object_store(cfg.bucket())
        .await
        .map_err(|e| server("open the snapshot store", e))?;
    let stats = Arc::new(Mutex::new(IngestStats::default()));
    let mut state = State {
        ingest,
        pods: HashMap::new(),
        names,
        counters,
        on_clear,
        position: 0,
        stats: stats.clone(),
    };
    let at = load_newest(&store, &mut state).await;
    *shared.state.lock() = Some(state);
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(run(cfg, js, store, shared, rx, at));
    Ok((Handle { tx, task, stats }, at))
}

async fn run(
    cfg: NatsConfig,
    js: jetstream::Context,
    store: ObjectStore,
    shared: Arc<LogShared>,
    mut rx: mpsc::Receiver<Cmd>,
    loaded_at: u64,
) {
    let position = || {
        shared
            .state
            .lock()
            .as_ref()
            .map_or(0, |s: &State| s.position)
    };
    let every = if cfg.snapshot_every.is_zero() {
        Duration::from_secs(3600 * 24 * 365)
    } else {
        cfg.snapshot_every
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written_at = loaded_at;
    let mut backoff = Duration::from_millis(50);
    loop {
        let at = position();
        let start = if at == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: at + 1,
            }
        };
        let messages = match js.get_stream(cfg.stream()).await {
            Ok(stream) => match stream
                .create_consumer(jetstream::consumer::pull::OrderedConfig {
                    filter_subject: format!("{}.ev.>", cfg.prefix),
                    deliver_policy: start,
                    // Short pulls: a restarted server (whose consumers are
                    // gone) is noticed within seconds, not half a minute.
                    max_expires: Duration::from_secs(2),
                    ..Default::default()
                })
                .await
            {
                Ok(c) => c.messages().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow the event stream; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // A server that restarted lost this consumer: noticing it by missed
        // heartbeats takes the client tens of seconds, so a new connection
        // makes the consumer again at once.
        let connections = |c: &Counters| c.connections.load(Ordering::Relaxed);
        let counters = shared.state.lock().as_ref().map(|s| s.counters.clone());
        let connected = counters.as_deref().map_or(0, connections);
        let mut watch = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = watch.tick() => {
                    if counters.as_deref().map_or(0, connections) != connected {
                        break;
                    }
                }
                m = messages.next() => match m {
                    Some(Ok(m)) => {
                        let mut guard = shared.state.lock();
                        let Some(state) = guard.as_mut() else { continue };
                        let Ok(info) = m.info() else {
                            bump(&state.counters.log_skipped);
                            continue;
                        };
                        let at = info.stream_sequence;
                        if at <= state.position {
                            continue; // seen before the consumer was made again
                        }
                        state.apply(m.subject.as_str(), m.headers.as_ref(), &m.payload);
                        state.position = at;
                        state.counters.log_position.store(at, Ordering::Relaxed);
                        *state.stats.lock() = state.ingest.stats();
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, from = position() + 1, "the event stream failed; following it again");
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    let taken = shared.state.lock().as_ref().and_then(|state| {
                        (state.position > written_at).then(|| (state.snapshot(), state.counters.clone()))
                    });
                    if let Some((snap, counters)) = taken {
                        written_at = snap.stream_seq;
                        let (cfg, js, store) = (cfg.clone(), js.clone(), store.clone());
                        tokio::spawn(async move {
                            if let Err(e) = store_snapshot(&cfg, &js, &store, snap, &counters).await {
                                tracing::warn!(error = %e, "storing a snapshot failed");
                            }
                        });
                    }
                }
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Snapshot(reply)) => {
                        let taken = shared.state.lock().as_ref().map(|state| (state.snapshot(), state.counters.clone()));
                        let r = match taken {
                            Some((snap, counters)) => {
                                written_at = snap.stream_seq;
                                store_snapshot(&cfg, &js, &store, snap, &counters).await
                            }
                            None => Err(NatsError::Config("the log is not started".into())),
                        };
                        let _ = reply.send(r);
                    }
                    None => {}
                },
            }
        }
        tokio::time::sleep(backoff).await;
    }
}
