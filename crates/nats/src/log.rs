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
    ClearHook, ClearReason, IngestStats, Ingestor, Sequencer, Verdict, decode_batch,
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

    /// Applies one stream message.
    fn apply(&mut self, subject: &str, headers: Option<&async_nats::HeaderMap>, payload: &[u8]) {
        let Some(name) = subject.rsplit('.').next().and_then(unhex) else {
            bump(&self.counters.log_skipped);
            return;
        };
        let Some(id) = self.names.id(&name) else {
            bump(&self.counters.log_skipped);
            return;
        };
        match self.pods.get(&name) {
            Some(p) if p.id == id => {}
            Some(p) => {
                // The pod rejoined under a new id: its old record went with
                // the old id; follow it afresh.
                let old = p.id;
                self.ingest.forget_pod(old);
                self.pods.insert(
                    name.clone(),
                    PodLog {
                        id,
                        seq: Sequencer::new(),
                    },
                );
            }
            None => {
                self.pods.insert(
                    name.clone(),
                    PodLog {
                        id,
                        seq: Sequencer::new(),
                    },
                );
            }
        }
        let header = |k: &str| {
            headers
                .and_then(|h| h.get(k))
                .map(|v| v.as_str().to_owned())
        };
        if header(CLEAR).is_some() {
            bump(&self.counters.log_clears);
            bump(&self.counters.log_applied);
            self.clear(&name, ClearReason::Unverified);
            return;
        }
        let Some(seq) = header(SEQ).and_then(|s| s.parse::<u64>().ok()) else {
            bump(&self.counters.log_skipped);
            return;
        };
        let decoded = decode_batch(payload);
        let ts = decoded.as_ref().ok().map(|b| b.ts);
        let verdict = self.pods[&name].seq.check(seq, ts);
        match verdict {
            Verdict::Stale => {
                bump(&self.counters.log_stale);
                return;
            }
            Verdict::Restart => {
                bump(&self.counters.log_restarts);
                eprintln!("router-nats: pod {name}: its engine restarted: record cleared");
                self.clear(&name, ClearReason::Restart);
            }
            Verdict::Gap { from, upto } => {
                bump(&self.counters.log_gaps);
                eprintln!(
                    "router-nats: pod {name}: batches {from}..{upto} missing from the log: record cleared"
                );
                self.clear(&name, ClearReason::Gap);
            }
            Verdict::Next => {}
        }
        if let Ok(batch) = &decoded {
            self.ingest.apply_batch(id, batch);
        }
        if let Some(p) = self.pods.get_mut(&name) {
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
                PodLog {
                    id,
                    seq: Sequencer::restore(p.expected, p.last_ts),
                },
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
            eprintln!("router-nats: {e}: replaying the whole stream");
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
            eprintln!("router-nats: snapshot {name} unreadable ({e}); trying an older one");
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
                eprintln!(
                    "router-nats: loaded snapshot {name}: {blocks} blocks, stream position {seq}"
                );
                return seq;
            }
            Ok(snap) => {
                bump(&state.counters.snapshots_refused);
                eprintln!(
                    "router-nats: snapshot {name} says position {} against its name's {seq}: refused",
                    snap.stream_seq
                );
            }
            Err(e) => {
                bump(&state.counters.snapshots_refused);
                eprintln!("router-nats: snapshot {name} refused: {e}; trying an older one");
            }
        }
    }
    eprintln!("router-nats: no usable snapshot: replaying the whole stream");
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
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(run(cfg, js, store, state, rx));
    Ok((Handle { tx, task, stats }, at))
}

async fn run(
    cfg: NatsConfig,
    js: jetstream::Context,
    store: ObjectStore,
    mut state: State,
    mut rx: mpsc::Receiver<Cmd>,
) {
    let every = if cfg.snapshot_every.is_zero() {
        Duration::from_secs(3600 * 24 * 365)
    } else {
        cfg.snapshot_every
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written_at = state.position;
    let mut backoff = Duration::from_millis(50);
    loop {
        let start = if state.position == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: state.position + 1,
            }
        };
        let messages = match js.get_stream(cfg.stream()).await {
            Ok(stream) => match stream
                .create_consumer(jetstream::consumer::pull::OrderedConfig {
                    filter_subject: format!("{}.ev.>", cfg.prefix),
                    deliver_policy: start,
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
                eprintln!("router-nats: cannot follow the event stream ({e}); retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        loop {
            tokio::select! {
                m = messages.next() => match m {
                    Some(Ok(m)) => {
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
                        eprintln!("router-nats: the event stream failed ({e}); following it again from {}", state.position + 1);
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if state.position > written_at {
                        written_at = state.position;
                        let snap = state.snapshot();
                        let (cfg, js, store, counters) = (cfg.clone(), js.clone(), store.clone(), state.counters.clone());
                        tokio::spawn(async move {
                            if let Err(e) = store_snapshot(&cfg, &js, &store, snap, &counters).await {
                                eprintln!("router-nats: {e}");
                            }
                        });
                    }
                }
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Snapshot(reply)) => {
                        written_at = state.position;
                        let snap = state.snapshot();
                        let r = store_snapshot(&cfg, &js, &store, snap, &state.counters).await;
                        let _ = reply.send(r);
                    }
                    None => {}
                },
            }
        }
        tokio::time::sleep(backoff).await;
    }
}
