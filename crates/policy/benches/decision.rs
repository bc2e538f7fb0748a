//! The cost of one routing decision, index query excluded.
//!
//! Varied: the number of candidate pods (8, 64, 256). The profile is the
//! default cache-aware one minus its index query (which `router-index`'s
//! benchmarks measure): speculative registration (its table holding a
//! routed 64-block chain for every pod, a third of them sharing part of
//! the request's prefix; each decision registers its chain again), health
//! filter, predicted-TTFT scorer, max-score picker with fair tie-breaking.
//! The index's matched blocks are given in the context, a third of the pods
//! holding part of the prefix. Each iteration copies the fleet snapshot (as
//! a gateway does per request) and decides. A second group, `score-only`,
//! drops the speculative step, so one run shows what the table costs and
//! what the formula does. The target is under 5 us at 256 pods.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_core::{PodId, PodMatch, PrefixMatch};
use std::sync::Arc;

use router_core::BlockHash;
use router_policy::builtin::{
    HealthFilter, MaxScore, Memory, PredictedTtft, RoutedChains, Speculative, TtftModel,
};
use router_policy::keys::{CACHE_HITS, CHAIN, CacheHits, NOW_MS, PROMPT_TOKENS};
use router_policy::{Context, PodState, Profile, Role};

fn bench(c: &mut Criterion) {
    for speculative in [true, false] {
        group(c, speculative);
    }
}

fn group(c: &mut Criterion, speculative: bool) {
    let mut g = c.benchmark_group(if speculative { "decide" } else { "score-only" });
    for n in [8usize, 64, 256] {
        let table = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
        let chain: Vec<BlockHash> = (0..64).map(|i| BlockHash(1 + i)).collect();
        for i in 0..n {
            // A third share the first (i % 64) blocks; the rest their own.
            let routed: Vec<BlockHash> = (0..64u64)
                .map(|k| {
                    if i % 3 == 0 && k <= (i % 64) as u64 {
                        chain[k as usize]
                    } else {
                        BlockHash(((i as u64 + 1) << 32) + k)
                    }
                })
                .collect();
            table.insert(PodId::new(i as u16, 0), &routed, 0);
        }
        let mut profile = Profile::builder("cache-aware-no-index")
            .input(CACHE_HITS.id())
            .input(CHAIN.id())
            .input(PROMPT_TOKENS.id());
        if speculative {
            profile = profile.prepare(Speculative::new(table));
        }
        let profile = profile
            .filter(HealthFilter)
            .scorer(
                PredictedTtft::new(TtftModel::with_block_size(16), None),
                1.0,
            )
            .picker(MaxScore::default())
            .build()
            .expect("valid profile");
        let fleet: Vec<PodState> = (0..n)
            .map(|i| {
                let mut p = PodState::new(PodId::new(i as u16, 0), Role::Both);
                p.in_flight = (i % 7) as u32;
                p.kv_blocks_used = (i * 37 % 500) as u64;
                p.queued_prefill_tokens = (i * 101 % 2000) as u64;
                p.healthy = i % 50 != 49;
                p
            })
            .collect();
        let mut m = PrefixMatch::new(64);
        for i in (0..n).step_by(3) {
            m.push(PodMatch {
                pod: PodId::new(i as u16, 0),
                blocks: (i % 64) as u32 + 1,
            });
        }
        m.rank();
        let mut ctx = Context::new();
        ctx.insert(CACHE_HITS, CacheHits::from_match(&m));
        ctx.insert(PROMPT_TOKENS, 64 * 16);
        ctx.insert(CHAIN, chain.clone());
        ctx.insert(NOW_MS, 1);
        let mut pods = Vec::with_capacity(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &fleet, |b, fleet| {
            b.iter(|| {
                pods.clear();
                pods.extend_from_slice(fleet);
                profile
                    .decide(&mut ctx, &mut pods)
                    .expect("healthy pods")
                    .pod
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
