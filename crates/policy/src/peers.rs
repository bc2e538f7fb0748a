//! The peer routers' decisions, rebuilt from their published formulas and
//! defaults so every comparison runs them on the same engines and traces:
//! kept apart from the production policies ([`crate::builtin`]), and one
//! name away in a profile ([`profile`], [`NAMES`], [`profiles_toml`]).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use router_core::PodId;

use crate::builtin::routed::{Memory, RoutedChains, now_ms};
use crate::context::{Context, KeyId};
use crate::keys::{self, CACHE_HITS, CHAIN};
use crate::plugin::{Picker, Plugin, Scorer};
use crate::pod::PodState;
use crate::{Profile, builtin};

/// What SMG's `cache_aware` policy does when a request matches little.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum SmgFallback {
    /// The least-loaded worker (SMG's code since its event-driven mode).
    #[default]
    MinLoad,
    /// The worker whose tree is smallest (SMG's documented rule, and its
    /// older releases).
    SmallestTree,
}

/// SMG's `cache_aware` parameters (`python -m smg launch --help`, 1.13).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SmgConfig {
    /// `--cache-threshold`: the match share above which the best-matching
    /// worker is taken.
    pub cache_threshold: f64,
    /// `--balance-abs-threshold`: in-flight requests between the busiest and
    /// the idlest worker before load wins.
    pub balance_abs_threshold: u32,
    /// `--balance-rel-threshold`: and the busiest over the idlest.
    pub balance_rel_threshold: f64,
    /// `--max-tree-size` in blocks: what the tree keeps per worker.
    pub max_tree_blocks: usize,
    /// The low-match rule.
    pub fallback: SmgFallback,
}

impl Default for SmgConfig {
    fn default() -> Self {
        SmgConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_blocks: 1 << 22,
            fallback: SmgFallback::MinLoad,
        }
    }
}

/// `smg-cache-aware`: SMG's `cache_aware` policy over an approximate tree
/// of what it routed (no engine events).
///
/// ```text
/// if max_load - min_load > balance_abs && max_load > balance_rel * min_load:
///     the least-loaded worker                      (load = in-flight requests)
/// else if matched / request > cache_threshold:     (over the routed tree)
///     the best-matching worker
/// else:
///     the least-loaded worker (or the smallest tree)
/// then the request's chain joins the tree under the chosen worker
/// ```
///
/// SMG matches characters of the request text over HTTP and tokens over
/// gRPC; this one matches the request's full blocks, which is its gRPC
/// token tree at block granularity. Load ties go to the worker that has
/// processed fewer requests, as SMG's do.
#[derive(Debug)]
pub struct SmgCacheAware {
    cfg: SmgConfig,
    tree: RoutedChains,
    processed: Mutex<HashMap<PodId, u64>>,
}

impl SmgCacheAware {
    /// The policy with `cfg`.
    pub fn new(cfg: SmgConfig) -> Self {
        let tree = RoutedChains::new(Memory::forever(cfg.max_tree_blocks));
        SmgCacheAware {
            cfg,
            tree,
            processed: Mutex::new(HashMap::new()),
        }
    }
}

impl Plugin for SmgCacheAware {
    fn name(&self) -> &str {
        "smg-cache-aware"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CHAIN.id()]
    }
    fn on_pick(&self, ctx: &Context, pod: &PodState) {
        if let Some(chain) = ctx.get(CHAIN) {
            self.tree.insert(pod.id, chain, now_ms(ctx));
        }
        *self.processed.lock().entry(pod.id).or_default() += 1;
    }
}

impl Picker for SmgCacheAware {
    fn pick(&self, ctx: &Context, pods: &[PodState], _: &[f64]) -> Option<usize> {
        if pods.is_empty() {
            return None;
        }
        let min_load = {
            let processed = self.processed.lock();
            (0..pods.len()).min_by_key(|&i| {
                (
                    pods[i].in_flight,
                    processed.get(&pods[i].id).copied().unwrap_or(0),
                    i,
                )
            })
        };
        let (lo, hi) = pods.iter().fold((u32::MAX, 0), |(lo, hi), p| {
            (lo.min(p.in_flight), hi.max(p.in_flight))
        });
        if hi - lo > self.cfg.balance_abs_threshold
            && f64::from(hi) > self.cfg.balance_rel_threshold * f64::from(lo)
        {
            return min_load;
        }
        let chain = ctx.get(CHAIN).map_or(&[][..], Vec::as_slice);
        let mut best: Option<(usize, u32)> = None;
        self.tree.for_each_match(chain, now_ms(ctx), |pod, blocks| {
            if let Some(i) = pods.iter().position(|p| p.id == pod) {
                // Longest match; ties to the earlier candidate.
                if best
                    .is_none_or(|(j, b)| (blocks, std::cmp::Reverse(i)) > (b, std::cmp::Reverse(j)))
                {
                    best = Some((i, blocks));
                }
            }
        });
        if let Some((i, blocks)) = best
            && f64::from(blocks) / chain.len().max(1) as f64 > self.cfg.cache_threshold
        {
            return Some(i);
        }
        match self.cfg.fallback {
            SmgFallback::MinLoad => min_load,
            SmgFallback::SmallestTree => {
                (0..pods.len()).min_by_key(|&i| (self.tree.pod_blocks(pods[i].id), i))
            }
        }
    }
}

/// Scales `raw` to `0..=1` by min-max (all equal: all 1), as llm-d's
/// scorers normalise.
fn min_max(raw: &mut [f64], higher_is_better: bool) {
    let (lo, hi) = raw
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    for x in raw.iter_mut() {
        *x = if hi > lo {
            let v = (*x - lo) / (hi - lo);
            if higher_is_better { v } else { 1.0 - v }
        } else {
            1.0
        };
    }
}

/// `queue`: llm-d's queue scorer, the pods' waiting requests (here: those
/// not past their prefill) min-max normalised, the shortest queue 1.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct QueueScorer;

impl Plugin for QueueScorer {
    fn name(&self) -> &str {
        "queue"
    }
}

impl Scorer for QueueScorer {
    fn score(&self, _: &Context, pods: &[PodState], out: &mut [f64]) {
        for (o, p) in out.iter_mut().zip(pods) {
            *o = f64::from(p.prefilling);
        }
        min_max(out, false);
    }
}

/// `kv-utilization`: llm-d's KV-cache utilisation scorer, `1 - usage`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KvUtilization;

impl Plugin for KvUtilization {
    fn name(&self) -> &str {
        "kv-utilization"
    }
}

impl Scorer for KvUtilization {
    fn score(&self, _: &Context, pods: &[PodState], out: &mut [f64]) {
        for (o, p) in out.iter_mut().zip(pods) {
            *o = 1.0 - p.kv_usage();
        }
    }
}

/// `precise-prefix`: llm-d's precise prefix-cache scorer, each pod's
/// matched blocks min-max normalised over the candidates (no match
/// anywhere: no opinion).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PrecisePrefix;

impl Plugin for PrecisePrefix {
    fn name(&self) -> &str {
        "precise-prefix"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id()]
    }
}

impl Scorer for PrecisePrefix {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let Some(hits) = ctx.get(CACHE_HITS).filter(|h| h.best() > 0) else {
            return;
        };
        for (o, p) in out.iter_mut().zip(pods) {
            *o = f64::from(hits.blocks(p.id));
        }
        min_max(out, true);
    }
}

/// Names accepted by [`profile`].
pub const NAMES: [&str; 3] = ["dynamo", "smg-cache-aware", "llm-d"];

/// A peer router's decision as a profile, from its published formula and
/// defaults:
///
/// - `dynamo`: Dynamo's KV-router cost ([`builtin::CacheAwareCost`],
///   overlap weight 1, temperature 0) over the exact index.
/// - `smg-cache-aware`: SMG's `cache_aware` ([`SmgCacheAware`]),
///   an approximate tree of what it routed; it reads no index.
/// - `llm-d`: llm-d's precise-prefix-cache scorer 3, KV-cache utilisation 2
///   and queue 2 (its well-lit-path weights), max score.
pub fn profile(
    name: &str,
    index: Arc<dyn router_core::PrefixIndex>,
    block_size: u64,
) -> Option<Profile> {
    let b = Profile::builder(name)
        .input(keys::CHAIN.id())
        .input(keys::PROMPT_TOKENS.id());
    let b = match name {
        "dynamo" => b
            .prepare(builtin::PrefixMatchPrepare::new(index))
            .filter(builtin::HealthFilter)
            .scorer(builtin::CacheAwareCost::new(1.0, block_size), 1.0)
            .picker(builtin::MaxScore::default()),
        // It queries the index only so callers can report what its choice
        // had cached; the tree alone decides.
        "smg-cache-aware" => b
            .prepare(builtin::PrefixMatchPrepare::new(index))
            .filter(builtin::HealthFilter)
            .picker(SmgCacheAware::new(SmgConfig::default())),
        "llm-d" => b
            .prepare(builtin::PrefixMatchPrepare::new(index))
            .filter(builtin::HealthFilter)
            .scorer(PrecisePrefix, 3.0)
            .scorer(KvUtilization, 2.0)
            .scorer(QueueScorer, 2.0)
            .picker(builtin::MaxScore::default()),
        _ => return None,
    };
    Some(b.build().expect("the peer profiles are valid")) // each built in a unit test
}

/// The peers' profiles as config-file tables (what [`profile`] builds in
/// code): `block_size` is the engines', `filters` every profile's filter
/// list as inline tables.
pub fn profiles_toml(block_size: u64, filters: &str) -> String {
    format!(
        r#"
[profiles.dynamo]
inputs = ["chain", "prompt_tokens"]
prepare = [{{ type = "prefix-match" }}]
filters = [{filters}]
scorers = [{{ type = "cache-aware-cost", weight = 1.0, overlap_weight = 1.0, block_size = {block_size} }}]
picker = {{ type = "max-score" }}

[profiles.smg-cache-aware]
inputs = ["chain"]
prepare = [{{ type = "prefix-match" }}]
filters = [{filters}]
picker = {{ type = "smg-cache-aware", cache_threshold = 0.3, balance_abs_threshold = 64, balance_rel_threshold = 1.5 }}

[profiles.llm-d]
inputs = ["chain"]
prepare = [{{ type = "prefix-match" }}]
filters = [{filters}]
scorers = [{{ type = "precise-prefix", weight = 3.0 }}, {{ type = "kv-utilization", weight = 2.0 }}, {{ type = "queue", weight = 2.0 }}]
picker = {{ type = "max-score" }}
"#
    )
}
