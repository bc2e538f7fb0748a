//! The cost of one routing decision, index query excluded.
//!
//! Varied: the number of candidate pods (8, 64, 256). The profile is the
//! default cache-aware one minus its prepare step (the index query, which
//! `router-index`'s benchmarks measure): health filter, Dynamo-style cost
//! scorer, max-score picker with fair tie-breaking. The matched blocks are
//! given in the context, a third of the pods holding part of the prefix.
//! Each iteration copies the fleet snapshot (as a gateway does per request)
//! and decides. The target is under 5 us at 256 pods.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_core::{PodId, PodMatch, PrefixMatch};
use router_policy::builtin::{CacheAwareCost, HealthFilter, MaxScore};
use router_policy::keys::{CACHE_HITS, CacheHits, PROMPT_TOKENS};
use router_policy::{Context, PodState, Profile, Role};

fn bench(c: &mut Criterion) {
    let profile = Profile::builder("cache-aware-no-prepare")
        .input(CACHE_HITS.id())
        .input(PROMPT_TOKENS.id())
        .filter(HealthFilter)
        .scorer(CacheAwareCost::new(1.0, 16), 1.0)
        .picker(MaxScore::default())
        .build()
        .expect("valid profile");
    let mut g = c.benchmark_group("decide");
    for n in [8usize, 64, 256] {
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
