//! The gateway's pods: joined to the index, followed for events, known to
//! the fleet and the HTTP backend, probed for health; changed at run time.
//!
//! A pod that fails its probes `unhealthy_after` times in a row is marked
//! unhealthy in the fleet at once (the `health` filter drops it) but keeps
//! its record: a stall is not a restart. When it answers again within
//! `unhealthy_grace_ms` it is routed to again after its stream is checked
//! ([`Subscriber::recheck`]: a restarted engine's pod is cleared and
//! refilled from its buffer; one that cannot be verified is cleared). Past
//! the grace period it is shut down in the index (it leaves every query;
//! its blocks are swept) and rejoins under a new id with an empty record
//! when it answers. A pod removed from the configuration leaves at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use router_core::{PodDirectory, PodId, PodKey};
use router_events::{EngineMetrics, IngestStats, MetricsError, PodStream, Subscriber};
use router_index::Index;
use router_policy::builtin::{Memory, RoutedChains};
use router_policy::{Fleet, PodState, PodStateSink};
use serde::Serialize;

use crate::Error;
use crate::backend::HttpBackend;
use crate::config::{PodConfig, normalise_pod, normalise_pods};

/// A pod as `GET /admin/pods` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PodView {
    /// Its configuration.
    #[serde(flatten)]
    pub config: PodConfig,
    /// Its current id in the index (slot and epoch).
    pub id: String,
    /// Whether it passes its health probes.
    pub healthy: bool,
    /// Whether the index reports it (false once taken out).
    pub in_index: bool,
    /// Blocks the index holds for it, any tier (0 once taken out).
    pub blocks: u64,
}

#[derive(Debug)]
struct Entry {
    config: PodConfig,
    id: PodId,
    healthy: bool,
    failed_probes: u32,
    /// When it was marked unhealthy (its record kept for the grace period).
    unhealthy_since: Option<Instant>,
    /// Whether it was shut down in the index (past the grace period).
    out: bool,
    /// Whether it answered its last probe (`false` before the first).
    answered: bool,
    /// What its engine last reported on `/metrics` (`None`: nothing read).
    engine: Option<EngineMetrics>,
    /// Whether a failure to read its `/metrics` was logged (once until a
    /// read succeeds).
    metrics_error_logged: bool,
}

/// The pod set.
#[derive(Debug)]
pub(crate) struct Pods {
    pub(crate) index: Arc<Index>,
    pub(crate) subscriber: Subscriber,
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) backend: Arc<HttpBackend>,
    /// What the gateway routed where: speculative registrations, and the
    /// approximate record of pods without events.
    routed: Arc<RoutedChains>,
    /// How pods without events remember what was routed to them.
    approx: Memory,
    entries: Mutex<BTreeMap<String, Entry>>,
    /// Ingestion counts of pods no longer followed, so totals never shrink.
    retired: Mutex<IngestStats>,
    /// The replicas' shared log, when running as one of several.
    pub(crate) replica: Option<Arc<router_nats::Replica>>,
    /// Whether a whole probe round has ended (until then `/health` says
    /// "starting": a pod's health is not known before it is probed).
    probed_once: std::sync::atomic::AtomicBool,
    /// Engine `/metrics` answers that could not be read.
    pub(crate) metrics_errors: std::sync::atomic::AtomicU64,
}

fn key_of(c: &PodConfig) -> PodKey {
    PodKey::new(c.url.as_str(), 0)
}

fn add_stats(a: &mut IngestStats, b: &IngestStats) {
    a.batches += b.batches;
    a.events_applied += b.events_applied;
    a.blocks_stored += b.blocks_stored;
    a.blocks_removed += b.blocks_removed;
    a.unknown_parent += b.unknown_parent;
    a.other_group += b.other_group;
    a.unknown_medium += b.unknown_medium;
    a.token_mismatch += b.token_mismatch;
    a.unknown_removed += b.unknown_removed;
    a.sink_refused += b.sink_refused;
    a.unknown_events += b.unknown_events;
    a.replaced_hashes += b.replaced_hashes;
    a.group_blocks_stored += b.group_blocks_stored;
    a.group_blocks_removed += b.group_blocks_removed;
    a.unsupported_group += b.unsupported_group;
    a.unresolved_group_blocks += b.unresolved_group_blocks;
}

/// A conflict if `c`'s name or URL is one of `entries`'.
fn conflict(entries: &BTreeMap<String, Entry>, c: &PodConfig) -> Result<(), Error> {
    if entries.contains_key(&c.name) {
        return Err(Error::PodConflict(format!(
            "a pod named `{}` exists",
            c.name
        )));
    }
    match entries.iter().find(|(_, e)| e.config.url == c.url) {
        Some((name, _)) => Err(Error::PodConflict(format!(
            "pod `{name}` has the url `{}`",
            c.url
        ))),
        None => Ok(()),
    }
}

impl Pods {
    pub(crate) fn new(
        index: Arc<Index>,
        subscriber: Subscriber,
        fleet: Arc<Fleet>,
        backend: Arc<HttpBackend>,
        routed: Arc<RoutedChains>,
        approx: Memory,
        replica: Option<Arc<router_nats::Replica>>,
    ) -> Self {
        Pods {
            probed_once: std::sync::atomic::AtomicBool::new(false),
            metrics_errors: std::sync::atomic::AtomicU64::new(0),
            replica,
            routed,
            approx,
            index,
            subscriber,
            fleet,
            backend,
            entries: Mutex::new(BTreeMap::new()),
            retired: Mutex::new(IngestStats::default()),
        }
    }

    /// Joins `c` to the index, the fleet, the backend and the subscriber.
    fn join(&self, c: &PodConfig) -> Result<PodId, Error> {
        let id = self.index.join(&key_of(c))?;
        self.fleet.upsert(PodState::new(id, c.role));
        self.backend.set(id, &c.url);
        if c.events.is_none() {
            // Approximate mode: what was routed there stands for its cache.
            self.routed.set_memory(id, self.approx);
        }
        if let Some(r) = &self.replica {
            r.names().set(&c.name, id);
        }
        if let Some(ep) = &c.events {
            let mut s = PodStream::new(id, ep.clone()).topic(c.topic.clone());
            if let Some(r) = &c.replay {
                s = s.replay(r.clone());
            }
            match &self.replica {
                // The batches go into the shared log, which feeds the index.
                Some(r) => self.subscriber.add_with(s, r.relay(&c.name)),
                None => self.subscriber.add(s),
            }
        }
        Ok(id)
    }

    /// Takes `id` out of the index, the fleet's candidates and the
    /// subscriber (keeping its ingestion counts).
    fn leave(&self, id: PodId, keep_in_fleet: bool) {
        if let Some(st) = self.subscriber.ingest_stats(id) {
            add_stats(&mut self.retired.lock(), &st);
        }
        // Stops the stream, if any, and shuts the pod down in the index
        // (the subscriber's directory), followed or not.
        self.subscriber.remove(id);
        self.routed.remove_pod(id);
        if keep_in_fleet {
            self.fleet.set_health(id, false);
        } else {
            self.fleet.remove(id);
            self.backend.remove(id);
        }
    }

    /// Adds a pod.
    pub(crate) fn add(&self, mut c: PodConfig) -> Result<PodId, Error> {
        normalise_pod(&mut c)?;
        let mut entries = self.entries.lock();
        conflict(&entries, &c)?;
        let id = self.join(&c)?;
        entries.insert(
            c.name.clone(),
            Entry {
                config: c,
                id,
                healthy: true,
                failed_probes: 0,
                unhealthy_since: None,
                out: false,
                answered: false,
                engine: None,
                metrics_error_logged: false,
            },
        );
        Ok(id)
    }

    /// Removes a pod; whether it existed.
    pub(crate) fn remove(&self, name: &str) -> bool {
        let Some(e) = self.entries.lock().remove(name) else {
            return false;
        };
        if let Some(r) = &self.replica {
            r.names().remove(name);
        }
        self.leave(e.id, false);
        true
    }

    /// Makes the pod set `wanted`: removes pods not in it, adds new ones,
    /// replaces changed ones. Returns (added, removed) names.
    pub(crate) fn replace_all(
        &self,
        mut wanted: Vec<PodConfig>,
    ) -> Result<(Vec<String>, Vec<String>), Error> {
        normalise_pods(&mut wanted)?;
        let current: BTreeMap<String, PodConfig> = self
            .entries
            .lock()
            .iter()
            .map(|(n, e)| (n.clone(), e.config.clone()))
            .collect();
        let mut removed = Vec::new();
        for (name, c) in &current {
            if !wanted.iter().any(|w| w == c) {
                self.remove(name);
                removed.push(name.clone());
            }
        }
        let mut added = Vec::new();
        for w in wanted {
            if current.get(&w.name) != Some(&w) {
                added.push(w.name.clone());
                self.add(w)?;
            }
        }
        Ok((added, removed))
    }

    /// The pods, by name.
    pub(crate) fn views(&self) -> Vec<PodView> {
        self.entries
            .lock()
            .values()
            .map(|e| PodView {
                config: e.config.clone(),
                id: e.id.to_string(),
                healthy: e.healthy,
                in_index: self.index.pod_key(e.id).is_some(),
                blocks: self.index.pod_blocks(e.id).unwrap_or(0),
            })
            .collect()
    }

    /// The name of the pod with id `id`.
    pub(crate) fn name_of(&self, id: PodId) -> Option<String> {
        self.entries
            .lock()
            .iter()
            .find(|(_, e)| e.id == id)
            .map(|(n, _)| n.clone())
    }

    /// The ids of the pods whose configuration `keep` accepts (nothing
    /// copied: a pick's subset filter runs this per request).
    pub(crate) fn ids_where(&self, keep: impl Fn(&PodConfig) -> bool) -> Vec<PodId> {
        self.entries
            .lock()
            .values()
            .filter(|e| keep(&e.config))
            .map(|e| e.id)
            .collect()
    }

    /// Whether some pod serves the LoRA adapter `adapter`.
    pub(crate) fn serves_adapter(&self, adapter: &str) -> bool {
        self.entries
            .lock()
            .values()
            .any(|e| e.config.adapters.iter().any(|a| a == adapter))
    }

    /// The LoRA adapters the pods serve.
    pub(crate) fn adapters(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .entries
            .lock()
            .values()
            .flat_map(|e| e.config.adapters.iter().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// A conflict if `c`'s name or URL is another pod's here.
    pub(crate) fn refuse_conflict(&self, c: &PodConfig) -> Result<(), Error> {
        conflict(&self.entries.lock(), c)
    }

    /// The name and base URL of the pod with id `id`.
    pub(crate) fn name_and_url(&self, id: PodId) -> Option<(String, String)> {
        self.entries
            .lock()
            .iter()
            .find(|(_, e)| e.id == id)
            .map(|(n, e)| (n.clone(), e.config.url.clone()))
    }

    /// (name, id, healthy) of every pod.
    pub(crate) fn ids(&self) -> Vec<(String, PodId, bool)> {
        self.entries
            .lock()
            .iter()
            .map(|(n, e)| (n.clone(), e.id, e.healthy))
            .collect()
    }

    /// Ingestion counts over every pod, past and present.
    pub(crate) fn ingest_totals(&self) -> IngestStats {
        let mut total = *self.retired.lock();
        if let Some(r) = &self.replica {
            add_stats(&mut total, &r.ingest_stats());
        }
        for (_, id, _) in self.ids() {
            if let Some(s) = self.subscriber.ingest_stats(id) {
                add_stats(&mut total, &s);
            }
        }
        total
    }

    /// Records one probe of `name`: filters the pod out after enough
    /// failures, takes it out of the index after the grace period, brings
    /// it back on success.
    pub(crate) fn probed(&self, name: &str, ok: bool, unhealthy_after: u32, grace: Duration) {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(name) else {
            return; // removed meanwhile
        };
        e.answered = ok;
        if ok {
            e.failed_probes = 0;
            if e.healthy {
                return;
            }
            e.unhealthy_since = None;
            if !e.out {
                // Back within the grace period: its record stands once its
                // stream shows the same engine (a restarted one is cleared).
                e.healthy = true;
                self.subscriber.recheck(e.id);
                self.fleet.set_health(e.id, true);
                tracing::info!(pod = %name, "back; its record is kept");
                return;
            }
            let old = e.id;
            self.fleet.remove(old);
            self.backend.remove(old);
            match self.join(&e.config) {
                Ok(id) => {
                    e.id = id;
                    e.healthy = true;
                    e.out = false;
                    tracing::info!(pod = %name, %id, "back under a new id");
                }
                Err(err) => {
                    // Keep it out; the next probe tries again.
                    self.fleet.upsert({
                        let mut s = PodState::new(old, e.config.role);
                        s.healthy = false;
                        s
                    });
                    tracing::warn!(pod = %name, error = %err, "cannot rejoin");
                }
            }
            return;
        }
        e.failed_probes = e.failed_probes.saturating_add(1);
        if e.healthy && e.failed_probes >= unhealthy_after {
            e.healthy = false;
            e.unhealthy_since = Some(Instant::now());
            self.fleet.set_health(e.id, false);
            tracing::warn!(
                pod = %name,
                failed_probes = e.failed_probes,
                grace_ms = grace.as_millis() as u64,
                "unhealthy: not routed to; its record is kept for the grace period"
            );
        }
        if !e.healthy && !e.out && e.unhealthy_since.is_some_and(|t| t.elapsed() >= grace) {
            e.out = true;
            self.leave(e.id, true);
            tracing::warn!(
                pod = %name,
                "stayed unhealthy past its grace period: out of the index"
            );
        }
    }

    /// Pods that are healthy and answered their last probe.
    pub(crate) fn answering(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| e.healthy && e.answered)
            .count()
    }

    /// Whether a whole probe round has ended.
    pub(crate) fn probed_once(&self) -> bool {
        self.probed_once.load(std::sync::atomic::Ordering::Acquire)
    }

    /// (name, url) of every pod, for the prober.
    /// Records what `name`'s engine reported on `/metrics` (`Ok(None)`: it
    /// serves none). Its KV capacity, in the gateway's blocks of
    /// `block_size` tokens, becomes the pod's `kv_blocks_total`: what
    /// bounds its speculative registrations (the capacity model). A text
    /// that cannot be read is counted and logged once, and the last good
    /// report stands.
    pub(crate) fn scraped(
        &self,
        name: &str,
        report: Result<Option<EngineMetrics>, MetricsError>,
        block_size: u64,
    ) {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(name) else {
            return;
        };
        let m = match report {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(err) => {
                self.metrics_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if !e.metrics_error_logged {
                    e.metrics_error_logged = true;
                    tracing::warn!(pod = %name, error = %err, "its /metrics were not read");
                }
                return;
            }
        };
        e.metrics_error_logged = false;
        // The engine's blocks in the gateway's: a pod configured with
        // another block size still reports its capacity in tokens rightly.
        let engine_bs = m.block_size.unwrap_or(block_size).max(1);
        if let Some(blocks) = m.capacity_blocks(engine_bs) {
            let ours = u128::from(blocks) * u128::from(engine_bs) / u128::from(block_size.max(1));
            let ours = u64::try_from(ours).unwrap_or(u64::MAX);
            if self
                .fleet
                .get(e.id)
                .is_some_and(|s| s.kv_blocks_total != ours)
            {
                self.fleet.update(e.id, &mut |s| s.kv_blocks_total = ours);
                self.routed
                    .set_capacity(e.id, usize::try_from(ours).unwrap_or(usize::MAX));
            }
        }
        e.engine = Some(m);
    }

    /// What each pod's engine last reported on `/metrics`, by name.
    pub(crate) fn engine_reports(&self) -> Vec<(String, EngineMetrics)> {
        self.entries
            .lock()
            .iter()
            .filter_map(|(n, e)| Some((n.clone(), e.engine.clone()?)))
            .collect()
    }

    pub(crate) fn probe_targets(&self) -> Vec<(String, String)> {
        self.entries
            .lock()
            .iter()
            .map(|(n, e)| (n.clone(), e.config.url.clone()))
            .collect()
    }
}

/// The most of an engine's `/metrics` answer read (vLLM's is tens of KiB).
const MAX_METRICS_BYTES: usize = 4 << 20;

/// Reads `url`'s `/metrics`: `Ok(None)` when it serves none (any answer but
/// 200, or no answer in time), the parsed report, or why its text was refused.
async fn scrape(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<Option<EngineMetrics>, MetricsError> {
    let fetch = async {
        let mut r = client
            .get(format!("{}/metrics", url.trim_end_matches('/')))
            .send()
            .await
            .ok()?;
        if r.status() != reqwest::StatusCode::OK {
            return None;
        }
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.ok()? {
            if body.len() + chunk.len() > MAX_METRICS_BYTES {
                return Some(Err(MetricsError::TooLarge {
                    limit: MAX_METRICS_BYTES,
                }));
            }
            body.extend_from_slice(&chunk);
        }
        Some(Ok(body))
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(Some(Ok(body))) => {
            router_events::parse_engine_metrics(&String::from_utf8_lossy(&body)).map(Some)
        }
        Ok(Some(Err(e))) => Err(e),
        _ => Ok(None),
    }
}

/// Probes every pod's `GET /health` each `interval` until dropped, and
/// reads the `/metrics` of those that answer (their engine's capacity and
/// queue, in `block_size`-token blocks).
pub(crate) async fn probe_loop(
    pods: Arc<Pods>,
    client: reqwest::Client,
    interval: Duration,
    unhealthy_after: u32,
    grace: Duration,
    block_size: u64,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets = pods.probe_targets();
        let probes = targets.into_iter().map(|(name, url)| {
            let client = client.clone();
            async move {
                let ok = client
                    .get(format!("{}/health", url.trim_end_matches('/')))
                    .timeout(interval.max(Duration::from_millis(100)))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                let report = if ok {
                    Some(scrape(&client, &url, interval.max(Duration::from_millis(100))).await)
                } else {
                    None
                };
                (name, ok, report)
            }
        });
        for (name, ok, report) in futures::future::join_all(probes).await {
            pods.probed(&name, ok, unhealthy_after, grace);
            if let Some(report) = report {
                pods.scraped(&name, report, block_size);
            }
        }
        pods.probed_once
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use router_index::IndexConfig;

    use super::*;

    fn pods() -> Pods {
        let index: Arc<Index> = Index::new(IndexConfig::default());
        let hasher = router_hash::ChainHasher::new(16).unwrap();
        let subscriber = Subscriber::new(Arc::new(hasher), index.clone(), index.clone(), None, 16);
        let backend = Arc::new(HttpBackend::new(Duration::from_secs(1)).unwrap());
        Pods::new(
            index,
            subscriber,
            Arc::new(Fleet::new()),
            backend,
            Arc::new(RoutedChains::new(Memory::SPECULATIVE)),
            Memory::SPECULATIVE,
            None,
        )
    }

    #[test]
    fn an_unhealthy_pod_keeps_its_record_for_the_grace_period() {
        let pods = pods();
        let first = pods.add(PodConfig::new("a", "http://127.0.0.1:1")).unwrap();
        let view = |p: &Pods| p.views().remove(0);
        let grace = Duration::from_secs(3600);
        pods.probed("a", false, 2, grace);
        pods.probed("a", false, 2, grace);
        let v = view(&pods);
        assert!(!v.healthy && v.in_index, "filtered out, record kept: {v:?}");
        assert!(!pods.fleet.get(first).unwrap().healthy);
        pods.probed("a", true, 2, grace);
        let v = view(&pods);
        assert!(v.healthy && v.in_index);
        assert_eq!(pods.ids()[0].1, first, "the same id: its record stands");
        assert!(pods.fleet.get(first).unwrap().healthy);
    }

    #[test]
    fn a_pod_failing_its_probes_leaves_and_rejoins_under_a_new_id() {
        let pods = pods();
        let first = pods.add(PodConfig::new("a", "http://127.0.0.1:1")).unwrap();
        let view = |p: &Pods| p.views().remove(0);
        let grace = Duration::ZERO;
        pods.probed("a", false, 2, grace);
        assert!(
            view(&pods).healthy && view(&pods).in_index,
            "one failure is not enough"
        );
        pods.probed("a", false, 2, grace);
        assert!(
            !view(&pods).healthy && !view(&pods).in_index,
            "out of the index"
        );
        assert!(
            !pods.fleet.get(first).unwrap().healthy,
            "the health filter drops it"
        );
        pods.probed("a", true, 2, grace);
        let back = view(&pods);
        assert!(back.healthy && back.in_index);
        let now = pods.ids()[0].1;
        assert_ne!(now, first, "a new id: nothing of the old record is trusted");
        assert!(pods.fleet.get(first).is_none() && pods.fleet.get(now).unwrap().healthy);
        assert!(pods.remove("a") && !pods.remove("a"));
        assert!(pods.index.pod_key(now).is_none());
    }
}
