//! Prometheus metrics, all named `cache_router_*`.
//!
//! Request-path figures are recorded as they happen; figures owned by other
//! parts (events ingested, pod load, breaker state, index size) are read
//! from them when `/metrics` is scraped, so the hot path never waits on
//! the metrics.

use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use router_core::PodId;
use router_exec::{Error as ExecError, Observer, StepKind};

/// A pod's name from its id.
pub(crate) type PodNamer = std::sync::Arc<dyn Fn(PodId) -> Option<String> + Send + Sync>;

struct Namer(PodNamer);

impl std::fmt::Debug for Namer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Namer")
    }
}

/// Every metric the gateway exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and status.
    pub requests: IntCounterVec,
    /// Failed requests, one count each, by kind.
    pub errors: IntCounterVec,
    /// Time a profile took to choose a pod.
    pub decision_seconds: Histogram,
    /// Time of the index query (the `prefix-match` step).
    pub index_query_seconds: Histogram,
    /// Longest matched prefix per request, in blocks.
    pub matched_blocks: Histogram,
    /// Time from a request's arrival to its first chunk.
    pub ttft_seconds: Histogram,
    /// Prompt tokens routed.
    pub prompt_tokens: IntCounter,
    /// Cached tokens the index predicted on the chosen pods.
    pub predicted_cached_tokens: IntCounter,
    /// Cached tokens the engines reported.
    pub actual_cached_tokens: IntCounter,
    /// Attempts retried on another pod.
    pub retries: IntCounter,
    /// Answers by pod and status (the pod that served the request).
    pub pod_requests: IntCounterVec,
    /// Time to the first chunk, by the pod that served it.
    pub pod_ttft_seconds: HistogramVec,
    /// Prompt tokens routed, by pod.
    pub pod_prompt_tokens: IntCounterVec,
    /// Cached tokens the index predicted, by pod.
    pub pod_predicted_cached_tokens: IntCounterVec,
    /// Cached tokens the engine reported, by pod.
    pub pod_actual_cached_tokens: IntCounterVec,
    /// Attempts that failed on a pod and went to another, by the pod.
    pub pod_retries: IntCounterVec,
    /// Pod names for the executor's reports (which carry ids).
    names: std::sync::OnceLock<Namer>,
    pub(crate) events_batches: IntCounter,
    pub(crate) events_applied: IntCounter,
    pub(crate) events_skipped: IntCounterVec,
    pub(crate) event_lag_seconds: Gauge,
    pub(crate) event_lag_max_seconds: Gauge,
    pub(crate) event_gaps: IntCounter,
    pub(crate) engine_restarts: IntCounter,
    pub(crate) pod_resets: IntCounter,
    pub(crate) event_recovered: IntCounter,
    pub(crate) pod_blocks: IntGaugeVec,
    pub(crate) replica: IntCounterVec,
    pub(crate) event_replayed: IntCounter,
    pub(crate) pod_in_flight: IntGaugeVec,
    pub(crate) pod_queued_prefill_tokens: IntGaugeVec,
    pub(crate) pod_healthy: IntGaugeVec,
    pub(crate) pod_breaker_open: IntGaugeVec,
    pub(crate) pod_kv_blocks_total: IntGaugeVec,
    pub(crate) pod_engine_waiting: IntGaugeVec,
    pub(crate) pod_engine_running: IntGaugeVec,
    pub(crate) pod_engine_kv_usage: GaugeVec,
    pub(crate) engine_metrics_errors: IntCounter,
    pub(crate) index_blocks: IntGauge,
    pub(crate) index_bytes: IntGauge,
}

fn hist(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid histogram")
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set, registered.
    pub fn new() -> Self {
        let micro = prometheus::exponential_buckets(1e-7, 4.0, 12).expect("valid buckets");
        let m = Metrics {
            registry: Registry::new(),
            requests: IntCounterVec::new(
                Opts::new("cache_router_requests_total", "Requests answered."),
                &["endpoint", "status"],
            )
            .expect("valid"),
            errors: IntCounterVec::new(
                Opts::new("cache_router_errors_total", "Errors by kind."),
                &["kind"],
            )
            .expect("valid"),
            decision_seconds: hist(
                "cache_router_decision_seconds",
                "Time a routing profile took to choose a pod.",
                micro.clone(),
            ),
            index_query_seconds: hist(
                "cache_router_index_query_seconds",
                "Time of the index's longest-prefix query.",
                micro,
            ),
            matched_blocks: hist(
                "cache_router_matched_blocks",
                "Longest cached prefix of a request on any pod, in blocks.",
                prometheus::exponential_buckets(1.0, 2.0, 14).expect("valid buckets"),
            ),
            ttft_seconds: hist(
                "cache_router_ttft_seconds",
                "Time from a request's arrival to its first chunk.",
                prometheus::exponential_buckets(0.001, 2.0, 16).expect("valid buckets"),
            ),
            prompt_tokens: IntCounter::new(
                "cache_router_prompt_tokens_total",
                "Prompt tokens routed.",
            )
            .expect("valid"),
            predicted_cached_tokens: IntCounter::new(
                "cache_router_predicted_cached_tokens_total",
                "Prompt tokens the index said the chosen pod had cached.",
            )
            .expect("valid"),
            actual_cached_tokens: IntCounter::new(
                "cache_router_actual_cached_tokens_total",
                "Prompt tokens the engines reported served from cache.",
            )
            .expect("valid"),
            retries: IntCounter::new(
                "cache_router_retries_total",
                "Attempts that failed before their first chunk and were retried on another pod.",
            )
            .expect("valid"),
            pod_requests: IntCounterVec::new(
                Opts::new(
                    "cache_router_pod_requests_total",
                    "Answers by the pod that served them and status.",
                ),
                &["pod", "status"],
            )
            .expect("valid"),
            pod_ttft_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "cache_router_pod_ttft_seconds",
                    "Time from a request's arrival to its first chunk, by the pod that served it.",
                )
                .buckets(prometheus::exponential_buckets(1e-3, 2.0, 16).expect("valid buckets")),
                &["pod"],
            )
            .expect("valid"),
            pod_prompt_tokens: IntCounterVec::new(
                Opts::new("cache_router_pod_prompt_tokens_total", "Prompt tokens routed, by pod."),
                &["pod"],
            )
            .expect("valid"),
            pod_predicted_cached_tokens: IntCounterVec::new(
                Opts::new(
                    "cache_router_pod_predicted_cached_tokens_total",
                    "Cached tokens the index predicted on the chosen pod, by pod.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_actual_cached_tokens: IntCounterVec::new(
                Opts::new(
                    "cache_router_pod_actual_cached_tokens_total",
                    "Cached tokens the engine reported, by pod.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_retries: IntCounterVec::new(
                Opts::new(
                    "cache_router_pod_retries_total",
                    "Attempts that failed on a pod and were retried on another, by the failing pod.",
                ),
                &["pod"],
            )
            .expect("valid"),
            names: std::sync::OnceLock::new(),
            events_batches: IntCounter::new(
                "cache_router_event_batches_total",
                "Engine event batches received.",
            )
            .expect("valid"),
            events_applied: IntCounter::new(
                "cache_router_events_applied_total",
                "Engine events applied to the index.",
            )
            .expect("valid"),
            events_skipped: IntCounterVec::new(
                Opts::new(
                    "cache_router_events_skipped_total",
                    "Engine events or batches skipped, by reason.",
                ),
                &["reason"],
            )
            .expect("valid"),
            event_lag_seconds: Gauge::new(
                "cache_router_event_lag_seconds",
                "Age of the latest event batch when applied.",
            )
            .expect("valid"),
            event_lag_max_seconds: Gauge::new(
                "cache_router_event_lag_max_seconds",
                "Largest event batch age seen when applied.",
            )
            .expect("valid"),
            event_gaps: IntCounter::new(
                "cache_router_event_gaps_total",
                "Sequence gaps in engine event streams.",
            )
            .expect("valid"),
            engine_restarts: IntCounter::new(
                "cache_router_engine_restarts_total",
                "Engine restarts detected on event streams (the pod's record was cleared).",
            )
            .expect("valid"),
            pod_resets: IntCounter::new(
                "cache_router_pod_resets_total",
                "Pods cleared because lost batches could not be replayed or a returning engine could not be verified.",
            )
            .expect("valid"),
            event_recovered: IntCounter::new(
                "cache_router_event_recovered_total",
                "Event batches applied from replays of an engine's whole buffer (start, restart, return, unknown parents).",
            )
            .expect("valid"),
            replica: IntCounterVec::new(
                Opts::new(
                    "cache_router_replica_total",
                    "This replica's NATS side (with [nats]), by what was counted: relayed batches, relay retries and drops, log messages applied, stale, gaps, restarts, skipped, snapshots written and refused, load and registrations received.",
                ),
                &["what"],
            )
            .expect("valid"),
            pod_blocks: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_blocks",
                    "Blocks the index holds per pod (any tier).",
                ),
                &["pod"],
            )
            .expect("valid"),
            event_replayed: IntCounter::new(
                "cache_router_event_replayed_total",
                "Event batches recovered through replay.",
            )
            .expect("valid"),
            pod_kv_blocks_total: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_kv_blocks_total",
                    "KV blocks of the pod's engine, from its /metrics (0: not reported).",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_engine_waiting: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_engine_waiting",
                    "Requests waiting in the pod's engine, from its /metrics.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_engine_running: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_engine_running",
                    "Requests running in the pod's engine, from its /metrics.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_engine_kv_usage: GaugeVec::new(
                Opts::new(
                    "cache_router_pod_engine_kv_usage",
                    "KV-cache usage the pod's engine reports, 0 to 1.",
                ),
                &["pod"],
            )
            .expect("valid"),
            engine_metrics_errors: IntCounter::new(
                "cache_router_engine_metrics_errors_total",
                "Engine /metrics answers that could not be read (logged once per pod until one reads).",
            )
            .expect("valid"),
            pod_in_flight: IntGaugeVec::new(
                Opts::new("cache_router_pod_in_flight", "Requests in flight per pod."),
                &["pod"],
            )
            .expect("valid"),
            pod_queued_prefill_tokens: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_queued_prefill_tokens",
                    "Prompt tokens sent and not yet prefilled, per pod.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_healthy: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_healthy",
                    "1 while the pod passes its health probes.",
                ),
                &["pod"],
            )
            .expect("valid"),
            pod_breaker_open: IntGaugeVec::new(
                Opts::new(
                    "cache_router_pod_breaker_open",
                    "1 while the pod's circuit breaker is open or half-open.",
                ),
                &["pod"],
            )
            .expect("valid"),
            index_blocks: IntGauge::new(
                "cache_router_index_blocks",
                "Distinct blocks held by at least one pod.",
            )
            .expect("valid"),
            index_bytes: IntGauge::new("cache_router_index_bytes", "Bytes allocated by the index.")
                .expect("valid"),
        };
        let r = &m.registry;
        let all: [Box<dyn prometheus::core::Collector>; 39] = [
            Box::new(m.requests.clone()),
            Box::new(m.errors.clone()),
            Box::new(m.decision_seconds.clone()),
            Box::new(m.index_query_seconds.clone()),
            Box::new(m.matched_blocks.clone()),
            Box::new(m.ttft_seconds.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.predicted_cached_tokens.clone()),
            Box::new(m.actual_cached_tokens.clone()),
            Box::new(m.retries.clone()),
            Box::new(m.pod_requests.clone()),
            Box::new(m.pod_ttft_seconds.clone()),
            Box::new(m.pod_prompt_tokens.clone()),
            Box::new(m.pod_predicted_cached_tokens.clone()),
            Box::new(m.pod_actual_cached_tokens.clone()),
            Box::new(m.pod_retries.clone()),
            Box::new(m.events_batches.clone()),
            Box::new(m.events_applied.clone()),
            Box::new(m.events_skipped.clone()),
            Box::new(m.event_lag_seconds.clone()),
            Box::new(m.event_lag_max_seconds.clone()),
            Box::new(m.event_gaps.clone()),
            Box::new(m.event_replayed.clone()),
            Box::new(m.engine_restarts.clone()),
            Box::new(m.pod_resets.clone()),
            Box::new(m.event_recovered.clone()),
            Box::new(m.pod_blocks.clone()),
            Box::new(m.replica.clone()),
            Box::new(m.pod_in_flight.clone()),
            Box::new(m.pod_queued_prefill_tokens.clone()),
            Box::new(m.pod_healthy.clone()),
            Box::new(m.pod_breaker_open.clone()),
            Box::new(m.pod_kv_blocks_total.clone()),
            Box::new(m.pod_engine_waiting.clone()),
            Box::new(m.pod_engine_running.clone()),
            Box::new(m.pod_engine_kv_usage.clone()),
            Box::new(m.engine_metrics_errors.clone()),
            Box::new(m.index_blocks.clone()),
            Box::new(m.index_bytes.clone()),
        ];
        for c in all {
            r.register(c).expect("metric names are unique");
        }
        m
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on a malformed family, which the
        // constructors above rule out.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Counts a request's answer.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .with_label_values(&[endpoint, &status.to_string()])
            .inc();
    }

    /// Names pods in the executor's reports.
    pub(crate) fn set_namer(&self, namer: PodNamer) {
        let _ = self.names.set(Namer(namer));
    }

    /// Counts a request's answer served by pod `pod`.
    pub fn pod_request(&self, pod: &str, status: u16) {
        self.pod_requests
            .with_label_values(&[pod, &status.to_string()])
            .inc();
    }

    /// Counts an error.
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }
}

/// Raises a counter to `total` (totals read from elsewhere only grow).
pub(crate) fn raise(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

impl Observer for Metrics {
    fn decided(&self, _: StepKind, _: PodId, took: Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
    }

    fn attempt_failed(&self, pod: PodId, _: &ExecError, will_retry: bool) {
        // An attempt is not a request: `errors` counts each failed request
        // once (by the gateway), `retries` the attempts that went elsewhere.
        if will_retry {
            self.retries.inc();
            if let Some(name) = self.names.get().and_then(|n| (n.0)(pod)) {
                self.pod_retries.with_label_values(&[&name]).inc();
            }
        }
    }
}
