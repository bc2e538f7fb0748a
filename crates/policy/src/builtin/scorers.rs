use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use router_core::{PodId, PrefixIndex, Tier};

use crate::context::{Context, KeyId};
use crate::keys::{CACHE_HITS, CHAIN, HASH_KEY, PROMPT_TOKENS, SESSION_ID};
use crate::plugin::{Plugin, Scorer};
use crate::pod::PodState;

/// Scales `raw` into `0..=1` with the largest value at 1 (all 0 stays 0).
fn scale_to_max(raw: &mut [f64]) {
    let max = raw.iter().copied().fold(0.0, f64::max);
    if max > 0.0 {
        raw.iter_mut().for_each(|x| *x /= max);
    }
}

/// `prefix-cache`: the share of the request's chain each pod holds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PrefixCacheScorer;

impl Plugin for PrefixCacheScorer {
    fn name(&self) -> &str {
        "prefix-cache"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id()]
    }
}

impl Scorer for PrefixCacheScorer {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let Some(hits) = ctx.get(CACHE_HITS) else {
            return;
        };
        let len = hits.chain_len().max(1) as f64;
        for (o, p) in out.iter_mut().zip(pods) {
            *o = hits.blocks(p.id) as f64 / len;
        }
    }
}

/// `load`: idle pods score 1, the busiest 0 (in-flight requests plus KV usage).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoadScorer;

impl Plugin for LoadScorer {
    fn name(&self) -> &str {
        "load"
    }
}

impl Scorer for LoadScorer {
    fn score(&self, _: &Context, pods: &[PodState], out: &mut [f64]) {
        for (o, p) in out.iter_mut().zip(pods) {
            *o = p.in_flight as f64 + p.kv_usage();
        }
        scale_to_max(out);
        out.iter_mut().for_each(|x| *x = 1.0 - *x);
    }
}

/// What a matched block is worth in each tier, relative to GPU.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TierWeights {
    /// Weight of a block in GPU memory.
    pub gpu: f64,
    /// Weight of a block in host memory.
    pub cpu: f64,
    /// Weight of a block on local disk.
    pub disk: f64,
    /// Weight of a block in a remote store.
    pub remote: f64,
    /// How many of the best-matching pods get their tier breakdown read.
    pub top_k: usize,
}

impl Default for TierWeights {
    fn default() -> Self {
        TierWeights {
            gpu: 1.0,
            cpu: 0.5,
            disk: 0.25,
            remote: 0.1,
            top_k: 4,
        }
    }
}

/// `tier-aware`: matched blocks weighted by where they sit (GPU worth more
/// than CPU or disk). The tier breakdown is read from the index for the
/// `top_k` best-matching pods only; the others count their blocks at the
/// lowest weight.
pub struct TierAwareScorer {
    index: Arc<dyn PrefixIndex>,
    weights: TierWeights,
}

impl TierAwareScorer {
    /// Reads tiers from `index`.
    pub fn new(index: Arc<dyn PrefixIndex>, weights: TierWeights) -> Self {
        TierAwareScorer { index, weights }
    }
}

impl fmt::Debug for TierAwareScorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierAwareScorer")
            .field("weights", &self.weights)
            .finish()
    }
}

impl Plugin for TierAwareScorer {
    fn name(&self) -> &str {
        "tier-aware"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id(), CHAIN.id()]
    }
}

impl Scorer for TierAwareScorer {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let (Some(hits), Some(chain)) = (ctx.get(CACHE_HITS), ctx.get(CHAIN)) else {
            return;
        };
        let w = &self.weights;
        let low = w.gpu.min(w.cpu).min(w.disk).min(w.remote);
        let len = hits.chain_len().max(1) as f64;
        let mut order: Vec<usize> = (0..pods.len())
            .filter(|&i| hits.blocks(pods[i].id) > 0)
            .collect();
        order.sort_unstable_by_key(|&i| std::cmp::Reverse(hits.blocks(pods[i].id)));
        for (rank, &i) in order.iter().enumerate() {
            let blocks = hits.blocks(pods[i].id);
            let value = if rank < w.top_k {
                match self.index.tier_counts(pods[i].id, chain, blocks as usize) {
                    Some(c) => {
                        // A block in several tiers counts at its best one.
                        let gpu = c[Tier::Gpu] as f64;
                        let cpu = (c[Tier::Cpu] as f64).min(blocks as f64 - gpu).max(0.0);
                        let disk = (c[Tier::Disk] as f64)
                            .min(blocks as f64 - gpu - cpu)
                            .max(0.0);
                        let remote = (blocks as f64 - gpu - cpu - disk).max(0.0);
                        gpu * w.gpu + cpu * w.cpu + disk * w.disk + remote * w.remote
                    }
                    None => blocks as f64 * w.gpu,
                }
            } else {
                blocks as f64 * low
            };
            out[i] = value / len;
        }
        scale_to_max(out);
    }
}

/// `session-affinity`: the pod that served the session last scores 1.
#[derive(Debug, Default)]
pub struct SessionAffinity {
    last: Mutex<HashMap<String, PodId>>,
}

/// Sessions remembered before the table starts over.
const MAX_SESSIONS: usize = 100_000;

impl Plugin for SessionAffinity {
    fn name(&self) -> &str {
        "session-affinity"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![SESSION_ID.id()]
    }
    fn on_pick(&self, ctx: &Context, pod: &PodState) {
        if let Some(s) = ctx.get(SESSION_ID) {
            let mut last = self.last.lock();
            if last.len() >= MAX_SESSIONS && !last.contains_key(s) {
                last.clear();
            }
            last.insert(s.clone(), pod.id);
        }
    }
}

impl Scorer for SessionAffinity {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let Some(s) = ctx.get(SESSION_ID) else {
            return;
        };
        if let Some(&pod) = self.last.lock().get(s) {
            for (o, p) in out.iter_mut().zip(pods) {
                *o = if p.id == pod { 1.0 } else { 0.0 };
            }
        }
    }
}

/// `no-cache-spread`: for a request no pod has cached anything of, prefers
/// the least loaded pods, so cold traffic spreads instead of following
/// whatever other scorer happens to favour. Neutral for warm requests.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NoCacheSpread;

impl Plugin for NoCacheSpread {
    fn name(&self) -> &str {
        "no-cache-spread"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id()]
    }
}

impl Scorer for NoCacheSpread {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        if ctx.get(CACHE_HITS).is_some_and(|h| h.best() > 0) {
            return;
        }
        LoadScorer.score(ctx, pods, out);
    }
}

/// `cache-aware-cost`: Dynamo's KV-router cost, turned into a score.
///
/// For a request of `R = ceil(prompt_tokens / block_size)` blocks and a pod
/// holding `m` of them:
///
/// ```text
/// prefill(p) = queued_prefill_tokens(p) / block_size + (R - m(p))
/// decode(p)  = kv_blocks_used(p) + R
/// cost(p)    = overlap_weight * prefill(p) + decode(p)
/// score(p)   = 1 - cost(p) / max cost over the candidates
/// ```
///
/// The cache credit lowers prefill work only, while every request adds to
/// the pod's decode load; so a pod holding a hot prefix wins until its load
/// costs more than the prefill it would save, and then the prefix spreads.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareCost {
    overlap_weight: f64,
    block_size: u64,
}

impl CacheAwareCost {
    /// `overlap_weight` (Dynamo's default: 1.0) and the engines' block size.
    pub fn new(overlap_weight: f64, block_size: u64) -> Self {
        CacheAwareCost {
            overlap_weight,
            block_size: block_size.max(1),
        }
    }

    /// The cost of sending a request of `request_blocks` to `pod` holding
    /// `matched` of them.
    pub fn cost(&self, pod: &PodState, request_blocks: u64, matched: u64) -> f64 {
        let prefill = pod.queued_prefill_tokens as f64 / self.block_size as f64
            + request_blocks.saturating_sub(matched) as f64;
        let decode = (pod.kv_blocks_used + request_blocks) as f64;
        self.overlap_weight * prefill + decode
    }
}

impl Plugin for CacheAwareCost {
    fn name(&self) -> &str {
        "cache-aware-cost"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id(), PROMPT_TOKENS.id()]
    }
}

impl Scorer for CacheAwareCost {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let tokens = ctx.get(PROMPT_TOKENS).copied().unwrap_or(0);
        let request_blocks = tokens.div_ceil(self.block_size);
        let hits = ctx.get(CACHE_HITS);
        let mut max: f64 = 0.0;
        for (o, p) in out.iter_mut().zip(pods) {
            let matched = hits.map_or(0, |h| h.blocks(p.id)) as u64;
            *o = self.cost(p, request_blocks, matched);
            max = max.max(*o);
        }
        for o in out.iter_mut() {
            *o = if max > 0.0 { 1.0 - *o / max } else { 1.0 };
        }
    }
}

/// `hash-affinity`: the pod that rendezvous hashing of the request's
/// [`HASH_KEY`] prefers among the candidates scores 1, the others 0. With a
/// small weight beside a cost scorer it settles near-ties the same way for
/// every request of a prefix, so cold prefixes partition across pods
/// instead of being copied wherever load happens to be lowest.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HashAffinity;

impl Plugin for HashAffinity {
    fn name(&self) -> &str {
        "hash-affinity"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![HASH_KEY.id()]
    }
}

impl Scorer for HashAffinity {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let Some(&key) = ctx.get(HASH_KEY) else {
            return;
        };
        let best = pods
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| super::pickers::rendezvous_weight(key, p))
            .map(|(i, _)| i);
        if let Some(i) = best {
            out[i] = 1.0;
        }
    }
}
