//! Router replicas over NATS JetStream.
//!
//! Several gateways in front of one fleet must agree on what every engine
//! caches and on how loaded every engine is; a gateway that restarts must
//! not come back blind. This crate does it with NATS JetStream, the
//! distributed log Dynamo's router uses, rather than a protocol of its own:
//!
//! - **One durable event log.** Every replica follows every engine's ZeroMQ
//!   stream as before (gaps healed by replay, restarts detected: see
//!   `router-events`) but, instead of applying the batches, relays them
//!   ([`Replica::relay`]) into one JetStream stream: a subject per pod
//!   (`{prefix}.ev.{hex(pod name)}`), each message identified by pod,
//!   sequence number and a hash of its payload, so the copies relayed by
//!   other replicas are dropped by JetStream's duplicate window. Every
//!   replica applies the stream in its order ([`Replica::start_log`]), so
//!   all indexes are built from the same log, and a relay that could not
//!   publish (NATS restarting) retries until it can, losing nothing.
//! - **Snapshots.** Each replica periodically writes what it knows of every
//!   pod, with the stream position it covers, into a JetStream object store
//!   (versioned and checksummed, [`Snapshot`]); a starting replica loads the
//!   newest one that checks out and replays the stream from there (a
//!   corrupt one is refused with a logged error and the next older one, or
//!   the whole stream, is used). The stream is purged behind the oldest
//!   snapshot kept.
//! - **Shared load and registrations.** Each replica publishes its own
//!   in-flight load per pod on `{prefix}.load.{replica}` whenever it
//!   changes (and as a heartbeat); the others add it to their pod states
//!   for a lease, so a replica that dies leaves no phantom load behind.
//!   Speculative registrations (what was just routed where) go out on
//!   `{prefix}.routed` and are registered by the others.
//!
//! Pods are named, not numbered, across replicas: [`PodNames`] maps each
//! replica's pod ids to the names in its configuration.

#![forbid(unsafe_code)]

mod log;
mod relay;
mod shared;
mod snapshot;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use parking_lot::{Mutex, RwLock};
use router_core::PodId;

pub use snapshot::{PodSnapshot, Snapshot, SnapshotError, VERSION as SNAPSHOT_VERSION};

/// How a replica uses NATS.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NatsConfig {
    /// The server, for example `nats://127.0.0.1:4222`.
    pub url: String,
    /// Names the stream (`{prefix}-events`), the object store
    /// (`{prefix}-snapshots`) and the subjects (`{prefix}.…`). Letters,
    /// digits, `-` and `_`.
    pub prefix: String,
    /// This replica's name (unique among the replicas).
    pub replica: String,
    /// How often the index is snapshotted (`ZERO`: never).
    pub snapshot_every: Duration,
    /// Snapshots kept; the stream is purged behind the oldest.
    pub snapshots_kept: usize,
    /// How long another replica's published load counts without news.
    pub lease: Duration,
    /// How often this replica's own load is checked for changes.
    pub load_every: Duration,
    /// JetStream's duplicate window for relayed batches.
    pub duplicate_window: Duration,
    /// Whether in-flight load is shared.
    pub share_load: bool,
    /// Whether speculative registrations are shared.
    pub share_routed: bool,
    /// Chunked local attention's chunk in tokens, for the log's ingestor
    /// (the events do not carry it; see router-events'
    /// `Ingestor::with_chunk_size`).
    pub attention_chunk_size: Option<u32>,
}

impl NatsConfig {
    /// The defaults for server `url`, replica `replica`: prefix
    /// `cache-router`, a snapshot every 10 s, 2 kept, a 1.5 s lease, load
    /// checked every 5 ms, a 10 min duplicate window, everything shared.
    pub fn new(url: impl Into<String>, replica: impl Into<String>) -> Self {
        NatsConfig {
            url: url.into(),
            prefix: "cache-router".into(),
            replica: replica.into(),
            snapshot_every: Duration::from_secs(10),
            snapshots_kept: 2,
            lease: Duration::from_millis(1500),
            load_every: Duration::from_millis(5),
            duplicate_window: Duration::from_secs(600),
            share_load: true,
            share_routed: true,
            attention_chunk_size: None,
        }
    }

    /// Checks the names.
    pub fn check(&self) -> Result<(), NatsError> {
        let token = |what: &str, s: &str| {
            if s.is_empty()
                || s.len() > 64
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                Err(NatsError::Config(format!(
                    "{what} `{s}` must be 1-64 letters, digits, `-` or `_`"
                )))
            } else {
                Ok(())
            }
        };
        token("prefix", &self.prefix)?;
        token("replica", &self.replica)?;
        if self.snapshots_kept == 0 {
            return Err(NatsError::Config(
                "snapshots_kept must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn stream(&self) -> String {
        format!("{}-events", self.prefix)
    }
    fn bucket(&self) -> String {
        format!("{}-snapshots", self.prefix)
    }
    fn events_subject(&self, pod: &str) -> String {
        format!("{}.ev.{}", self.prefix, hex(pod))
    }
}

/// What went wrong with NATS.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// A bad setting.
    #[error("nats: {0}")]
    Config(String),
    /// The server could not be reached or refused a request.
    #[error("nats: {what}: {message}")]
    Server {
        /// What was being done.
        what: String,
        /// The client's error.
        message: String,
    },
}

fn server(what: &str, e: impl std::fmt::Display) -> NatsError {
    NatsError::Server {
        what: what.into(),
        message: e.to_string(),
    }
}

/// Lower-case hex of a name: a subject token whatever the name holds.
pub(crate) fn hex(s: &str) -> String {
    use std::fmt::Write;
    s.bytes()
        .fold(String::with_capacity(s.len() * 2), |mut o, b| {
            let _ = write!(o, "{b:02x}");
            o
        })
}

/// The name a hex token spells (`None`: not hex of UTF-8).
pub(crate) fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The pods a replica routes to, by the names replicas share.
#[derive(Debug, Default)]
pub struct PodNames {
    by_name: RwLock<HashMap<String, PodId>>,
}

impl PodNames {
    /// `name` is `id` in this replica.
    pub fn set(&self, name: &str, id: PodId) {
        self.by_name.write().insert(name.to_owned(), id);
    }
    /// `name` left.
    pub fn remove(&self, name: &str) {
        self.by_name.write().remove(name);
    }
    /// The id of `name`.
    pub fn id(&self, name: &str) -> Option<PodId> {
        self.by_name.read().get(name).copied()
    }
    /// The name of `id`.
    pub fn name_of(&self, id: PodId) -> Option<String> {
        self.by_name
            .read()
            .iter()
            .find(|(_, i)| **i == id)
            .map(|(n, _)| n.clone())
    }

    /// Every (name, id).
    pub fn all(&self) -> Vec<(String, PodId)> {
        self.by_name
            .read()
            .iter()
            .map(|(n, &i)| (n.clone(), i))
            .collect()
    }
}

/// Counters of a replica's NATS side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaStats {
    /// Batches and markers this replica relayed (acknowledged by JetStream,
    /// duplicates included).
    pub relayed: u64,
    /// Publish attempts that failed and were retried (NATS unreachable).
    pub relay_retries: u64,
    /// Batches dropped because the relay queue was full (counted; the log
    /// then shows a gap and the pod is cleared).
    pub relay_dropped: u64,
    /// Log messages applied (batches and clear markers).
    pub log_applied: u64,
    /// Log batches older than their pod's position (a copy relayed after
    /// the duplicate window): skipped.
    pub log_stale: u64,
    /// Sequence gaps within a pod's log (lost batches): the pod is cleared.
    pub log_gaps: u64,
    /// Engine restarts seen in the log.
    pub log_restarts: u64,
    /// Clear markers applied (a relay cleared a pod).
    pub log_clears: u64,
    /// Log messages of pods this replica does not route to, or malformed.
    pub log_skipped: u64,
    /// The last stream sequence number applied.
    pub log_position: u64,
    /// Snapshots written.
    pub snapshots_written: u64,
    /// Snapshots refused at load (corrupt, other version).
    pub snapshots_refused: u64,
    /// The stream position of the snapshot loaded at start (0: none).
    pub snapshot_loaded_at: u64,
    /// Load messages received from other replicas.
    pub load_received: u64,
    /// Registrations received from other replicas.
    pub routed_received: u64,
    /// Registrations not shared (queue full).
    pub routed_dropped: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) relayed: AtomicU64,
    pub(crate) relay_retries: AtomicU64,
    pub(crate) relay_dropped: AtomicU64,
    pub(crate) log_applied: AtomicU64,
    pub(crate) log_stale: AtomicU64,
    pub(crate) log_gaps: AtomicU64,
    pub(crate) log_restarts: AtomicU64,
    pub(crate) log_clears: AtomicU64,
    pub(crate) log_skipped: AtomicU64,
    pub(crate) log_position: AtomicU64,
    pub(crate) snapshots_written: AtomicU64,
    pub(crate) snapshots_refused: AtomicU64,
    pub(crate) snapshot_loaded_at: AtomicU64,
    pub(crate) load_received: AtomicU64,
    pub(crate) routed_received: AtomicU64,
    pub(crate) routed_dropped: AtomicU64,
    /// Connections made to the server (1 after the first).
    pub(crate) connections: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One router replica's connection to NATS.
pub struct Replica {
    cfg: NatsConfig,
    client: async_nats::Client,
    js: jetstream::Context,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    relay: relay::Publisher,
    shared_log: Arc<log::LogShared>,
    log: Mutex<Option<log::Handle>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("replica", &self.cfg.replica)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// Connects to the server and makes sure the stream and the object
    /// store exist (file storage: they survive a server restart).
    pub async fn connect(cfg: NatsConfig) -> Result<Replica, NatsError> {
        cfg.check()?;
        let counters = Arc::new(Counters::default());
        let seen = counters.clone();
        let client = async_nats::ConnectOptions::new()
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if matches!(event, async_nats::Event::Connected) {
                        bump(&seen.connections);
                    }
                }
            })
            .name(format!("cache-router {}", cfg.replica))
            .connection_timeout(Duration::from_secs(2))
            .retry_on_initial_connect()
            .max_reconnects(None)
            // A restarted server is found again within a second, not the
            // client's default backoff of up to several seconds.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((attempts as u64 * 100).min(1000))
            })
            .connect(cfg.url.as_str())
            .await
            .map_err(|e| server("connect", e))?;
        let js = jetstream::new(client.clone());
        // The first connection is made in the background: wait for it, but
        // not forever.
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            js.get_or_create_stream(jetstream::stream::Config {
                name: cfg.stream(),
                subjects: vec![format!("{}.ev.>", cfg.prefix)],
                storage: jetstream::stream::StorageType::File,
                duplicate_window: cfg.duplicate_window,
                ..Default::default()
            }),
        )
        .await
        .map_err(|_| server("create the event stream", "timed out"))?;
        stream.map_err(|e| server("create the event stream", e))?;
        if js.get_object_store(cfg.bucket()).await.is_err() {
            js.create_object_store(jetstream::object_store::Config {
                bucket: cfg.bucket(),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| server("create the snapshot store", e))?;
        }
        let relay = relay::Publisher::start(js.clone(), counters.clone());
        Ok(Replica {
            cfg,
            client,
            js,
            names: Arc::default(),
            counters,
            relay,
            shared_log: Arc::default(),
            log: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NatsConfig {
        &self.cfg
    }

    /// The pod names this replica routes to (keep it current: the log, the
    /// load and the registrations are matched to pods through it).
    pub fn names(&self) -> &Arc<PodNames> {
        &self.names
    }

    /// The sink that relays pod `name`'s engine batches into the stream
    /// (give it to `router_events::Subscriber::add_with`). Once the log has
    /// started, it also applies them at once: whichever of the engine's
    /// stream and the log brings a batch first applies it, and it is stale
    /// on the other (both carry one engine's batches in its order).
    pub fn relay(&self, name: &str) -> Arc<dyn router_events::BatchSink> {
        Arc::new(
            self.relay
                .sink(name, self.cfg.events_subject(name), self.shared_log.clone()),
        )
    }

    /// Loads the newest snapshot that checks out into `ingest`'s sink and
    /// follows the stream from the position it covers, applying every batch
    /// of a named pod. `on_clear` is called when a pod's record is cleared.
    /// Returns the stream position the snapshot covered (0: none).
    pub async fn start_log(
        &self,
        hasher: Arc<dyn router_core::BlockHasher>,
        sink: Arc<dyn router_core::CacheEventSink>,
        model: Option<String>,
        block_size: u32,
        on_clear: Option<router_events::ClearHook>,
    ) -> Result<u64, NatsError> {
        let ingest = router_events::Ingestor::new(hasher, sink, model, block_size)
            .with_chunk_size(self.cfg.attention_chunk_size);
        let (handle, at) = log::start(
            self.cfg.clone(),
            self.js.clone(),
            self.names.clone(),
            self.counters.clone(),
            ingest,
            on_clear,
            self.shared_log.clone(),
        )
        .await?;
        *self.log.lock() = Some(handle);
        Ok(at)
    }

    /// Writes a snapshot now (besides the periodic ones); its stream
    /// position once stored.
    pub async fn snapshot_now(&self) -> Result<u64, NatsError> {
        let handle = self.log.lock().as_ref().map(log::Handle::clone_sender);
        match handle {
            Some(tx) => log::snapshot_now(tx).await,
            None => Err(NatsError::Config("the log is not started".into())),
        }
    }

    /// Ingestion counts of the log.
    pub fn ingest_stats(&self) -> router_events::IngestStats {
        self.log
            .lock()
            .as_ref()
            .map(log::Handle::ingest_stats)
            .unwrap_or_default()
    }

    /// Shares this replica's load and registrations with the others, and
    /// adds theirs to `fleet` and `routed`.
    pub fn share(
        &self,
        fleet: Arc<router_policy::Fleet>,
        routed: Arc<router_policy::builtin::RoutedChains>,
    ) {
        let tasks = shared::start(
            self.cfg.clone(),
            self.client.clone(),
            self.names.clone(),
            self.counters.clone(),
            fleet,
            routed,
        );
        self.tasks.lock().extend(tasks);
    }

    /// The counters.
    pub fn stats(&self) -> ReplicaStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReplicaStats {
            relayed: l(&c.relayed),
            relay_retries: l(&c.relay_retries),
            relay_dropped: l(&c.relay_dropped),
            log_applied: l(&c.log_applied),
            log_stale: l(&c.log_stale),
            log_gaps: l(&c.log_gaps),
            log_restarts: l(&c.log_restarts),
            log_clears: l(&c.log_clears),
            log_skipped: l(&c.log_skipped),
            log_position: l(&c.log_position),
            snapshots_written: l(&c.snapshots_written),
            snapshots_refused: l(&c.snapshots_refused),
            snapshot_loaded_at: l(&c.snapshot_loaded_at),
            load_received: l(&c.load_received),
            routed_received: l(&c.routed_received),
            routed_dropped: l(&c.routed_dropped),
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_subject_tokens_and_back() {
        for name in ["sim-0", "", "a.b c\n", "ünï"] {
            let h = hex(name);
            assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(unhex(&h).as_deref(), Some(name));
        }
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("ff"), None, "not UTF-8");
    }

    #[test]
    fn config_names_are_checked() {
        let ok = NatsConfig::new("nats://127.0.0.1:4222", "r1");
        assert!(ok.check().is_ok());
        let mut bad = ok.clone();
        bad.replica = "a.b".into();
        assert!(bad.check().is_err());
        let mut bad = ok.clone();
        bad.prefix = String::new();
        assert!(bad.check().is_err());
        let mut bad = ok;
        bad.snapshots_kept = 0;
        assert!(bad.check().is_err());
    }
}
