//! What a replay reached, per policy.

use serde::Serialize;

use crate::sim::ClusterConfig;
use crate::trace::Request;

/// One request's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// Arrival time in the replay, ms (after the speed-up).
    pub arrival_ms: f64,
    /// Blocks in the request.
    pub blocks: usize,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Leading blocks found cached on the chosen pod.
    pub hit_blocks: usize,
    /// Leading blocks the decision counted on there (its `cache_hits` for
    /// the chosen pod; 0 for policies that produce none).
    pub predicted_blocks: usize,
    /// The chosen pod (index).
    pub pod: usize,
    /// Time to first token, ms after arrival (modelled).
    pub first_token_ms: Option<f64>,
    /// Time to the last token, ms after arrival (modelled).
    pub done_ms: Option<f64>,
    /// The pod refused it: its prompt needs more blocks than the pod's
    /// whole GPU cache (vLLM rejects a prompt its KV cache cannot hold).
    pub rejected: bool,
}

impl RequestRecord {
    pub(crate) fn new(r: &Request) -> Self {
        RequestRecord {
            arrival_ms: r.arrival_ms,
            blocks: r.blocks.len(),
            input_tokens: r.input_tokens,
            hit_blocks: 0,
            predicted_blocks: 0,
            pod: 0,
            first_token_ms: None,
            done_ms: None,
            rejected: false,
        }
    }
}

/// A policy's figures on one replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The policy.
    pub policy: String,
    /// Requests replayed.
    pub requests: usize,
    /// Requests the pods refused (prompts longer than a pod's whole GPU
    /// cache): no policy can serve them, so they count in no latency.
    pub rejected: usize,
    /// Requests neither refused nor finished when the replay ended (0
    /// unless the simulator is wrong: a test keeps it so).
    pub unfinished: usize,
    /// Share of request blocks found cached.
    pub block_hit_rate: f64,
    /// Share of prompt tokens served from cache.
    pub token_hit_rate: f64,
    /// Share of request blocks the decisions counted on (their predicted
    /// hits on the chosen pods).
    pub predicted_hit_rate: f64,
    /// Share of served requests whose predicted hit was exactly the hit
    /// their engine found.
    pub predicted_exact: f64,
    /// The block hit rate over the pooled-cache bound (filled by the caller).
    pub pooled_share: f64,
    /// Modelled time to first token, ms: median.
    pub ttft_p50_ms: f64,
    /// 90th percentile.
    pub ttft_p90_ms: f64,
    /// 99th percentile.
    pub ttft_p99_ms: f64,
    /// Modelled end-to-end latency, ms: median.
    pub e2e_p50_ms: f64,
    /// 99th percentile.
    pub e2e_p99_ms: f64,
    /// Busiest pod's busy time over the mean busy time.
    pub busiest_over_mean: f64,
    /// Coefficient of variation of the pods' busy times.
    pub busy_cv: f64,
    /// Mean pod utilisation (busy time over the replay's span).
    pub utilisation: f64,
    /// The router's own decision time per request, wall clock: mean, us.
    pub decision_us_mean: f64,
    /// 99th percentile, us.
    pub decision_us_p99: f64,
    /// Requests routed to each pod.
    pub requests_per_pod: Vec<usize>,
    /// Every request's modelled TTFT, sorted (for charts).
    #[serde(skip)]
    pub ttft_sorted_ms: Vec<f64>,
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

impl Report {
    pub(crate) fn build(
        policy: &str,
        cfg: &ClusterConfig,
        records: &[RequestRecord],
        decision_ns: &[u64],
        busy_us: &[u64],
    ) -> Report {
        let blocks: usize = records.iter().map(|r| r.blocks).sum();
        let hits: usize = records.iter().map(|r| r.hit_blocks).sum();
        let tokens: u64 = records.iter().map(|r| r.input_tokens).sum();
        let hit_tokens: u64 = records
            .iter()
            .map(|r| (r.hit_blocks as u64 * cfg.block_tokens).min(r.input_tokens))
            .sum();
        let mut ttft: Vec<f64> = records.iter().filter_map(|r| r.first_token_ms).collect();
        ttft.sort_by(f64::total_cmp);
        let mut e2e: Vec<f64> = records.iter().filter_map(|r| r.done_ms).collect();
        e2e.sort_by(f64::total_cmp);
        let mut dec: Vec<f64> = decision_ns.iter().map(|&n| n as f64 / 1000.0).collect();
        dec.sort_by(f64::total_cmp);
        let busy: Vec<f64> = busy_us.iter().map(|&b| b as f64).collect();
        let mean = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
        let max = busy.iter().copied().fold(0.0, f64::max);
        let var = busy.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / busy.len().max(1) as f64;
        let span_us = records
            .iter()
            .filter_map(|r| r.done_ms.map(|d| r.arrival_ms + d))
            .fold(0.0, f64::max)
            .max(1.0)
            * 1000.0;
        let mut per_pod = vec![0usize; cfg.pods];
        for r in records {
            if let Some(c) = per_pod.get_mut(r.pod) {
                *c += 1;
            }
        }
        Report {
            policy: policy.to_owned(),
            requests: records.len(),
            rejected: records.iter().filter(|r| r.rejected).count(),
            unfinished: records
                .iter()
                .filter(|r| !r.rejected && r.done_ms.is_none())
                .count(),
            block_hit_rate: hits as f64 / blocks.max(1) as f64,
            predicted_hit_rate: records.iter().map(|r| r.predicted_blocks).sum::<usize>() as f64
                / blocks.max(1) as f64,
            predicted_exact: {
                let served = records.iter().filter(|r| !r.rejected);
                let (n, exact) = served.fold((0usize, 0usize), |(n, e), r| {
                    (n + 1, e + usize::from(r.predicted_blocks == r.hit_blocks))
                });
                exact as f64 / n.max(1) as f64
            },
            token_hit_rate: hit_tokens as f64 / tokens.max(1) as f64,
            pooled_share: 0.0,
            ttft_p50_ms: pct(&ttft, 0.5),
            ttft_p90_ms: pct(&ttft, 0.9),
            ttft_p99_ms: pct(&ttft, 0.99),
            e2e_p50_ms: pct(&e2e, 0.5),
            e2e_p99_ms: pct(&e2e, 0.99),
            busiest_over_mean: if mean > 0.0 { max / mean } else { 1.0 },
            busy_cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            utilisation: mean / span_us,
            decision_us_mean: dec.iter().sum::<f64>() / dec.len().max(1) as f64,
            decision_us_p99: pct(&dec, 0.99),
            requests_per_pod: per_pod,
            ttft_sorted_ms: ttft,
        }
    }
}
