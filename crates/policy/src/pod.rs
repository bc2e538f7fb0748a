//! What plugins know about each pod, and the trait that keeps it current.

use std::time::Duration;

use parking_lot::RwLock;
use router_core::PodId;

/// What a pod does in a disaggregated fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs prefill only.
    Prefill,
    /// Runs decode only.
    Decode,
    /// Runs whole requests.
    #[default]
    Both,
}

/// The load a router adds to a pod, apart from the pod's other figures:
/// what replicas share (router-nats) and the simulator's routers see of
/// each other. Sums and differences saturate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct PodLoad {
    /// Requests in flight.
    pub in_flight: u32,
    /// Requests still before their first token.
    pub prefilling: u32,
    /// Prompt tokens queued for prefill.
    #[serde(rename = "queued")]
    pub queued_prefill_tokens: u64,
    /// KV blocks the requests hold.
    #[serde(rename = "kv")]
    pub kv_blocks_used: u64,
}

impl PodLoad {
    /// A load of these figures.
    pub fn new(
        in_flight: u32,
        prefilling: u32,
        queued_prefill_tokens: u64,
        kv_blocks_used: u64,
    ) -> Self {
        PodLoad {
            in_flight,
            prefilling,
            queued_prefill_tokens,
            kv_blocks_used,
        }
    }

    /// A pod's load figures.
    pub fn of(s: &PodState) -> Self {
        PodLoad::new(
            s.in_flight,
            s.prefilling,
            s.queued_prefill_tokens,
            s.kv_blocks_used,
        )
    }

    /// The two loads together.
    pub fn plus(self, o: PodLoad) -> PodLoad {
        PodLoad::new(
            self.in_flight.saturating_add(o.in_flight),
            self.prefilling.saturating_add(o.prefilling),
            self.queued_prefill_tokens
                .saturating_add(o.queued_prefill_tokens),
            self.kv_blocks_used.saturating_add(o.kv_blocks_used),
        )
    }

    /// This load without `o`.
    pub fn minus(self, o: PodLoad) -> PodLoad {
        PodLoad::new(
            self.in_flight.saturating_sub(o.in_flight),
            self.prefilling.saturating_sub(o.prefilling),
            self.queued_prefill_tokens
                .saturating_sub(o.queued_prefill_tokens),
            self.kv_blocks_used.saturating_sub(o.kv_blocks_used),
        )
    }

    /// `s`'s load figures with `had` replaced by `want`.
    pub fn replace_in(s: &mut PodState, had: PodLoad, want: PodLoad) {
        let now = PodLoad::of(s).minus(had).plus(want);
        s.in_flight = now.in_flight;
        s.prefilling = now.prefilling;
        s.queued_prefill_tokens = now.queued_prefill_tokens;
        s.kv_blocks_used = now.kv_blocks_used;
    }
}

/// A pod as the decision layer sees it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PodState {
    /// The pod.
    pub id: PodId,
    /// Its role.
    pub role: Role,
    /// Whether it is healthy (readiness probes, the gateway's view).
    pub healthy: bool,
    /// Requests sent and not finished.
    pub in_flight: u32,
    /// Prompt tokens sent and not yet prefilled.
    pub queued_prefill_tokens: u64,
    /// Requests sent whose prefill has not finished (no first token yet).
    pub prefilling: u32,
    /// KV-cache blocks in use by running requests.
    pub kv_blocks_used: u64,
    /// KV-cache blocks the pod has (0 when unknown).
    pub kv_blocks_total: u64,
    /// Recent latency (exponentially weighted), in milliseconds.
    pub latency_ms: f64,
}

impl PodState {
    /// An idle, healthy pod.
    pub fn new(id: PodId, role: Role) -> Self {
        PodState {
            id,
            role,
            healthy: true,
            in_flight: 0,
            queued_prefill_tokens: 0,
            prefilling: 0,
            kv_blocks_used: 0,
            kv_blocks_total: 0,
            latency_ms: 0.0,
        }
    }

    /// KV usage in `0..=1` (0 when the total is unknown).
    pub fn kv_usage(&self) -> f64 {
        if self.kv_blocks_total == 0 {
            0.0
        } else {
            (self.kv_blocks_used as f64 / self.kv_blocks_total as f64).min(1.0)
        }
    }
}

/// How a request ended, for the pod-state feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It completed.
    Success,
    /// The pod failed it (error, timeout, reset).
    Failure,
}

/// Keeps pod states current. The execution layer and the gateway feed it;
/// only `update` is required.
pub trait PodStateSink: Send + Sync {
    /// Applies `f` to the state of `pod`, if the pod is known.
    fn update(&self, pod: PodId, f: &mut dyn FnMut(&mut PodState));

    /// A request with `prefill_tokens` uncached prompt tokens was sent.
    fn request_started(&self, pod: PodId, prefill_tokens: u64, kv_blocks: u64) {
        self.update(pod, &mut |s| {
            s.in_flight += 1;
            s.prefilling += 1;
            s.queued_prefill_tokens += prefill_tokens;
            s.kv_blocks_used += kv_blocks;
        });
    }

    /// The request's first token arrived, or it ended before one: its
    /// prefill is over. Called once per request.
    fn first_token(&self, pod: PodId, prefill_tokens: u64) {
        self.update(pod, &mut |s| {
            s.prefilling = s.prefilling.saturating_sub(1);
            s.queued_prefill_tokens = s.queued_prefill_tokens.saturating_sub(prefill_tokens);
        });
    }

    /// The request finished (every path: success, error, cancellation),
    /// after [`PodStateSink::first_token`]. `prefill_tokens` is what is
    /// still queued for it (0 after the first token).
    fn request_finished(
        &self,
        pod: PodId,
        prefill_tokens: u64,
        kv_blocks: u64,
        latency: Duration,
        outcome: Outcome,
    ) {
        let _ = outcome;
        self.update(pod, &mut |s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.queued_prefill_tokens = s.queued_prefill_tokens.saturating_sub(prefill_tokens);
            s.kv_blocks_used = s.kv_blocks_used.saturating_sub(kv_blocks);
            let ms = latency.as_secs_f64() * 1000.0;
            s.latency_ms = if s.latency_ms == 0.0 {
                ms
            } else {
                0.8 * s.latency_ms + 0.2 * ms
            };
        });
    }

    /// The pod's health changed.
    fn set_health(&self, pod: PodId, healthy: bool) {
        self.update(pod, &mut |s| s.healthy = healthy);
    }
}

/// The fleet's pod states: a small, lock-protected table.
#[derive(Default)]
pub struct Fleet {
    pods: RwLock<Vec<PodState>>,
    watcher: RwLock<Option<FleetWatcher>>,
}

/// Told after every change of a pod's state (see [`Fleet::set_watcher`]).
pub type FleetWatcher = std::sync::Arc<dyn Fn(PodId) + Send + Sync>;

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("pods", &*self.pods.read())
            .field("watched", &self.watcher.read().is_some())
            .finish()
    }
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Fleet::default()
    }

    /// Calls `watcher` after every [`PodStateSink::update`] of a known pod
    /// (outside the table's lock), for example to share load with other
    /// router replicas as it changes. `None` removes it.
    pub fn set_watcher(&self, watcher: Option<FleetWatcher>) {
        *self.watcher.write() = watcher;
    }

    /// Adds a pod or replaces its state.
    pub fn upsert(&self, state: PodState) {
        let mut pods = self.pods.write();
        match pods.iter_mut().find(|p| p.id == state.id) {
            Some(p) => *p = state,
            None => pods.push(state),
        }
    }

    /// Removes a pod.
    pub fn remove(&self, pod: PodId) {
        self.pods.write().retain(|p| p.id != pod);
    }

    /// Copies the current states into `out` (cleared first): the candidates
    /// of one decision.
    pub fn snapshot_into(&self, out: &mut Vec<PodState>) {
        out.clear();
        out.extend(self.pods.read().iter().cloned());
    }

    /// The state of one pod.
    pub fn get(&self, pod: PodId) -> Option<PodState> {
        self.pods.read().iter().find(|p| p.id == pod).cloned()
    }
}

impl PodStateSink for Fleet {
    fn update(&self, pod: PodId, f: &mut dyn FnMut(&mut PodState)) {
        let found = match self.pods.write().iter_mut().find(|p| p.id == pod) {
            Some(p) => {
                f(p);
                true
            }
            None => false,
        };
        if found && let Some(w) = self.watcher.read().as_ref() {
            w(pod);
        }
    }
}
