//! `predicted-ttft`: each pod priced by the time to first token the request
//! would see there, plus the prefill work it would cost the fleet.

use std::fmt;
use std::sync::Arc;

use router_core::{PrefixIndex, Tier};

use crate::context::{Context, KeyId};
use crate::keys::{CACHE_HITS, CHAIN, PROMPT_TOKENS};
use crate::plugin::{Plugin, Scorer};
use crate::pod::PodState;

/// The engine's prefill timing as the router models it: vLLM's chunked
/// prefill on one GPU. The defaults are router-sim's cost model (an
/// 8B-parameter dense model on one H100); what matters for a decision is
/// their ratios, since a common scale moves every pod's price alike.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TtftModel {
    /// Tokens per KV block (the engines' block size).
    pub block_size: u64,
    /// Fixed time of one engine step, ms (paid once per queued prefill).
    pub step_ms: f64,
    /// Prefill time per uncached token, us.
    pub token_us: f64,
    /// Attention time per (new token x context token), ns.
    pub attention_ns: f64,
    /// Time per step per context token of the requests already running
    /// there (decode reads their KV every step), ns.
    pub kv_read_ns: f64,
    /// Prefill tokens per engine step (vLLM's `max_num_batched_tokens`).
    pub step_tokens: u64,
    /// Loading a token's KV back from host memory, us (CPU-tier hits).
    pub cpu_load_us: f64,
    /// The weight of the prefill work a choice adds to the fleet (its own
    /// uncached tokens' compute) beside the request's own wait: 0 prices
    /// latency alone; 1 also charges recomputing a prefix another pod
    /// holds, so a hot prefix is copied only once its holder's queue costs
    /// more than twice the saving.
    pub compute_weight: f64,
    /// How many of the best-matching pods get their cache tiers read from
    /// the index (0: every matched block counts as on the GPU; at most
    /// [`MAX_TIER_TOP_K`]: tier records are off the hot path).
    pub tier_top_k: usize,
}

/// The most pods [`PredictedTtft`] reads cache tiers for per decision.
pub const MAX_TIER_TOP_K: usize = 4;

impl Default for TtftModel {
    fn default() -> Self {
        TtftModel {
            block_size: 16,
            step_ms: 5.0,
            token_us: 40.0,
            attention_ns: 1.3,
            kv_read_ns: 43.0,
            step_tokens: 8192,
            cpu_load_us: 0.5,
            compute_weight: 1.0,
            tier_top_k: 2,
        }
    }
}

impl TtftModel {
    /// The model with `block_size`-token blocks and the other defaults.
    pub fn with_block_size(block_size: u64) -> Self {
        TtftModel {
            block_size: block_size.max(1),
            ..TtftModel::default()
        }
    }

    /// Prefill time of `new` tokens after `cached` ones, ms.
    pub fn prefill_ms(&self, cached: u64, new: u64) -> f64 {
        let (c, n) = (cached as f64, new as f64);
        self.step_ms + self.token_us * n / 1e3 + self.attention_ns * n * (c + n / 2.0) / 1e6
    }

    /// The price of sending a request of `prompt` tokens to `pod`, which
    /// holds `cached` of them (`cpu` of those in host memory), in ms:
    ///
    /// ```text
    /// new    = prompt - cached
    /// wait   = step_ms * prefilling + token_us * queued_prefill_tokens
    /// steps  = ceil((queued_prefill_tokens + new) / step_tokens)
    /// decode = steps * kv_read_ns * kv_blocks_used * block_size
    /// spill  = token_us * block_size * overflow
    ///          (overflow = kv_blocks_used + ceil(prompt / block_size)
    ///                      - kv_blocks_total, when positive and the total known)
    /// ttft   = wait + decode + prefill_ms(cached, new) + cpu_load_us * cpu
    /// price  = ttft + (1 + compute_weight) * spill
    ///               + compute_weight * prefill_ms(cached, new)
    /// ```
    ///
    /// The spill is what a full pod costs: the request's blocks beside
    /// those of the requests running there exceed the pod's cache, so it
    /// waits for them or pushes out KV that is recomputed later. Without it
    /// new sessions pile onto the pod whose queue is momentarily shortest
    /// and thrash its cache (loadgen's long-document scenario).
    pub fn price(&self, pod: &PodState, prompt: u64, cached: u64, cpu: u64) -> f64 {
        let cached = cached.min(prompt.saturating_sub(1));
        let new = prompt - cached;
        let queued = pod.queued_prefill_tokens;
        let wait = self.step_ms * f64::from(pod.prefilling) + self.token_us * queued as f64 / 1e3;
        let steps = (queued + new).div_ceil(self.step_tokens.max(1)).max(1) as f64;
        let context = (pod.kv_blocks_used * self.block_size) as f64;
        let decode = steps * self.kv_read_ns * context / 1e6;
        let own = self.prefill_ms(cached, new);
        // Past its capacity a pod cannot hold the request beside those
        // running there: its blocks push out theirs (recomputed later) or
        // it waits for them to finish. Priced as recomputing the overflow.
        let overflow = if pod.kv_blocks_total > 0 {
            (pod.kv_blocks_used + prompt.div_ceil(self.block_size.max(1)))
                .saturating_sub(pod.kv_blocks_total)
        } else {
            0
        };
        let spill = self.token_us * (overflow * self.block_size) as f64 / 1e3;
        wait + decode
            + own
            + self.cpu_load_us * cpu as f64 / 1e3
            + (1.0 + self.compute_weight) * spill
            + self.compute_weight * own
    }
}

/// `predicted-ttft`: scores each pod by [`TtftModel::price`], lowest price
/// best (`score = 1 - price / max price`).
///
/// Why this and not Dynamo's cost: the engine's decode load barely slows
/// a new request's first token, while the prefill queued ahead of it and
/// its own uncached tokens decide it. Counting every in-flight request's
/// blocks (Dynamo) pushes requests off the pod that holds their history as
/// soon as it is busy; pricing time keeps them there until the queue
/// really costs more than the cache saves. The compute term keeps a hot
/// prefix from being recomputed on idle pods for no gain in latency.
pub struct PredictedTtft {
    model: TtftModel,
    index: Option<Arc<dyn PrefixIndex>>,
}

impl PredictedTtft {
    /// Prices with `model`; with `index`, CPU-tier hits of the best
    /// matching pods cost their load time.
    pub fn new(model: TtftModel, index: Option<Arc<dyn PrefixIndex>>) -> Self {
        PredictedTtft { model, index }
    }

    /// The model.
    pub fn model(&self) -> &TtftModel {
        &self.model
    }
}

impl fmt::Debug for PredictedTtft {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PredictedTtft")
            .field("model", &self.model)
            .field("tiers", &self.index.is_some())
            .finish()
    }
}

impl Plugin for PredictedTtft {
    fn name(&self) -> &str {
        "predicted-ttft"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id(), PROMPT_TOKENS.id()]
    }
}

impl Scorer for PredictedTtft {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        let prompt = ctx.get(PROMPT_TOKENS).copied().unwrap_or(0).max(1);
        let hits = ctx.get(CACHE_HITS);
        let bs = self.model.block_size;
        let blocks = |p: &PodState| hits.map_or(0, |h| h.blocks(p.id)) as u64;
        // Host-memory hits of the best matches cost their load (read for a
        // few pods only: tier records are off the hot path).
        let mut cpu = [(usize::MAX, 0u64); MAX_TIER_TOP_K];
        let top_k = self.model.tier_top_k.min(cpu.len());
        if let (Some(index), Some(chain), true) = (&self.index, ctx.get(CHAIN), top_k > 0) {
            let mut best = [(0u64, usize::MAX); MAX_TIER_TOP_K];
            for (i, p) in pods.iter().enumerate() {
                let b = blocks(p);
                if b > best[top_k - 1].0 {
                    best[top_k - 1] = (b, i);
                    best[..top_k].sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
                }
            }
            for (slot, &(b, i)) in cpu.iter_mut().zip(&best[..top_k]) {
                if i == usize::MAX {
                    continue;
                }
                if let Some(c) = index.tier_counts(pods[i].id, chain, b as usize) {
                    let gpu = (c[Tier::Gpu] as u64).min(b);
                    *slot = (i, (b - gpu) * bs);
                }
            }
        }
        let mut max: f64 = 0.0;
        for (i, (o, p)) in out.iter_mut().zip(pods).enumerate() {
            let off_gpu = cpu.iter().find(|c| c.0 == i).map_or(0, |c| c.1);
            *o = self.model.price(p, prompt, blocks(p) * bs, off_gpu);
            max = max.max(*o);
        }
        for o in out.iter_mut() {
            *o = if max > 0.0 { 1.0 - *o / max } else { 1.0 };
        }
    }
}
