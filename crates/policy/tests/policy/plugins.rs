//! Each built-in plugin's behaviour, edge cases included.

use std::collections::HashMap;
use std::time::Duration;

use router_core::{
    BlockHash, CacheEventSink, PodDirectory, PodId, PodKey, PodMatch, PrefixMatch, Tier,
};
use router_index::{Index, IndexConfig};
use router_policy::builtin::*;
use router_policy::keys::{CACHE_HITS, CHAIN, CacheHits, PROMPT_TOKENS, SESSION_ID};
use router_policy::{Context, Fleet, Outcome, Picker, PodStateSink, Profile, Role, Scorer};

use super::pods;

fn hits(chain_len: usize, held: &[(u16, u32)]) -> CacheHits {
    let mut m = PrefixMatch::new(chain_len);
    for &(slot, blocks) in held {
        m.push(PodMatch {
            pod: PodId::new(slot, 0),
            blocks,
        });
    }
    m.rank();
    CacheHits::from_match(&m)
}

fn scores(s: &dyn Scorer, ctx: &Context, n: usize) -> Vec<f64> {
    let ps = pods(n);
    let mut out = vec![0.0; n];
    s.score(ctx, &ps, &mut out);
    out
}

#[test]
fn prefix_cache_scores_the_share_held() {
    let mut ctx = Context::new();
    ctx.insert(CACHE_HITS, hits(8, &[(0, 8), (2, 2)]));
    assert_eq!(scores(&PrefixCacheScorer, &ctx, 3), vec![1.0, 0.0, 0.25]);
    // No hits at all: every score 0, no opinion.
    ctx.insert(CACHE_HITS, hits(8, &[]));
    assert_eq!(scores(&PrefixCacheScorer, &ctx, 2), vec![0.0, 0.0]);
    // A stale epoch is another pod.
    let mut m = PrefixMatch::new(4);
    m.push(PodMatch {
        pod: PodId::new(0, 7),
        blocks: 4,
    });
    ctx.insert(CACHE_HITS, CacheHits::from_match(&m));
    assert_eq!(scores(&PrefixCacheScorer, &ctx, 1), vec![0.0]);
}

#[test]
fn load_scorer_prefers_idle_pods_and_is_neutral_when_all_idle() {
    let ctx = Context::new();
    let mut ps = pods(3);
    ps[0].in_flight = 4;
    ps[1].in_flight = 2;
    let mut out = vec![0.0; 3];
    LoadScorer.score(&ctx, &ps, &mut out);
    assert_eq!(out, vec![0.0, 0.5, 1.0]);
    assert_eq!(scores(&LoadScorer, &ctx, 3), vec![1.0, 1.0, 1.0]);
}

#[test]
fn cache_aware_cost_follows_dynamo_formula() {
    let c = CacheAwareCost::new(1.0, 16);
    let mut p = pods(1).remove(0);
    // 64-token request = 4 blocks; pod holds 3, has 32 queued tokens (2
    // blocks) and 10 blocks in use: prefill 2 + 1, decode 10 + 4.
    p.queued_prefill_tokens = 32;
    p.kv_blocks_used = 10;
    assert_eq!(c.cost(&p, 4, 3), 3.0 + 14.0);
    assert_eq!(CacheAwareCost::new(2.0, 16).cost(&p, 4, 3), 6.0 + 14.0);
    let mut ctx = Context::new();
    ctx.insert(PROMPT_TOKENS, 64);
    ctx.insert(CACHE_HITS, hits(4, &[(1, 4)]));
    let out = scores(&c, &ctx, 2);
    assert!(
        out[1] > out[0],
        "the pod holding the prefix costs less: {out:?}"
    );
    // Equal pods: equal scores.
    let eq = scores(&c, &Context::new(), 3);
    assert!(eq.iter().all(|&x| x == eq[0]), "{eq:?}");
}

#[test]
fn tier_aware_values_gpu_over_cpu_reading_tiers_of_the_best_only() {
    let index = Index::<4>::new(IndexConfig::default().background_sweep(false));
    let a = index.join(&PodKey::new("a", 0)).unwrap();
    let b = index.join(&PodKey::new("b", 0)).unwrap();
    let chain: Vec<BlockHash> = (1..=4).map(BlockHash).collect();
    index
        .apply(&router_core::CacheEvent::Stored {
            pod: a,
            tier: Tier::Gpu,
            blocks: chain.clone(),
        })
        .unwrap();
    index
        .apply(&router_core::CacheEvent::Stored {
            pod: b,
            tier: Tier::Cpu,
            blocks: chain.clone(),
        })
        .unwrap();
    let mut ctx = Context::new();
    ctx.insert(CHAIN, chain.clone());
    let m = router_core::PrefixIndex::match_prefix(&*index, &chain);
    ctx.insert(CACHE_HITS, CacheHits::from_match(&m));
    let s = TierAwareScorer::new(index.clone(), TierWeights::default());
    let ps = vec![
        router_policy::PodState::new(a, Role::Both),
        router_policy::PodState::new(b, Role::Both),
    ];
    let mut out = vec![0.0; 2];
    s.score(&ctx, &ps, &mut out);
    assert_eq!(out, vec![1.0, 0.5], "GPU blocks worth twice CPU ones");
}

#[test]
fn session_affinity_returns_to_the_last_pod() {
    let profile = Profile::builder("p")
        .input(SESSION_ID.id())
        .scorer(SessionAffinity::default(), 1.0)
        .picker(MaxScore::default())
        .build()
        .unwrap();
    let mut ctx = Context::new();
    ctx.insert(SESSION_ID, "conv-1".to_owned());
    let first = profile.decide(&mut ctx, &mut pods(8)).unwrap().pod;
    for _ in 0..20 {
        assert_eq!(profile.decide(&mut ctx, &mut pods(8)).unwrap().pod, first);
    }
    // Its pod gone, the session moves, and sticks to the new one.
    let mut without: Vec<_> = pods(8).into_iter().filter(|p| p.id != first).collect();
    let second = profile.decide(&mut ctx, &mut without).unwrap().pod;
    assert_ne!(second, first);
    assert_eq!(profile.decide(&mut ctx, &mut pods(8)).unwrap().pod, second);
}

#[test]
fn no_cache_spread_balances_cold_requests_and_is_neutral_for_warm() {
    let mut ctx = Context::new();
    ctx.insert(CACHE_HITS, hits(4, &[]));
    let mut ps = pods(2);
    ps[0].in_flight = 3;
    let mut out = vec![0.0; 2];
    NoCacheSpread.score(&ctx, &ps, &mut out);
    assert_eq!(out, vec![0.0, 1.0]);
    ctx.insert(CACHE_HITS, hits(4, &[(0, 2)]));
    let mut out = vec![0.0; 2];
    NoCacheSpread.score(&ctx, &ps, &mut out);
    assert_eq!(out, vec![0.0, 0.0]);
}

#[test]
fn hash_affinity_prefers_one_pod_per_key_and_is_neutral_without_one() {
    let ps = pods(8);
    let mut ctx = Context::new();
    assert_eq!(scores(&HashAffinity, &ctx, 8), vec![0.0; 8]);
    let mut favourites = std::collections::HashSet::new();
    for key in 0..64u64 {
        ctx.insert(router_policy::keys::HASH_KEY, key);
        let mut out = vec![0.0; 8];
        HashAffinity.score(&ctx, &ps, &mut out);
        assert_eq!(out.iter().filter(|&&x| x == 1.0).count(), 1);
        let mut again = vec![0.0; 8];
        HashAffinity.score(&ctx, &ps, &mut again);
        assert_eq!(out, again, "stable per key");
        favourites.insert(out.iter().position(|&x| x == 1.0));
    }
    assert!(
        favourites.len() >= 6,
        "keys spread over pods: {favourites:?}"
    );
}

fn pick_counts(p: &dyn Picker, n: usize, rounds: usize, scores: &[f64]) -> HashMap<usize, usize> {
    let ps = pods(n);
    let ctx = Context::new();
    let mut counts = HashMap::new();
    for _ in 0..rounds {
        *counts
            .entry(p.pick(&ctx, &ps, scores).unwrap())
            .or_default() += 1;
    }
    counts
}

#[test]
fn max_score_breaks_ties_fairly() {
    let c = pick_counts(&MaxScore::default(), 4, 4000, &[0.5, 0.9, 0.9, 0.1]);
    assert_eq!(c.len(), 2, "only the tied best: {c:?}");
    assert!(c[&1] > 1700 && c[&2] > 1700, "{c:?}");
    let all_equal = pick_counts(&MaxScore::default(), 4, 4000, &[0.0; 4]);
    assert!(all_equal.values().all(|&v| v > 800), "{all_equal:?}");
    assert_eq!(pick_counts(&MaxScore::default(), 1, 10, &[0.0])[&0], 10);
    assert_eq!(MaxScore::default().pick(&Context::new(), &[], &[]), None);
}

#[test]
fn weighted_random_follows_the_scores() {
    let c = pick_counts(&WeightedRandom::default(), 3, 6000, &[1.0, 2.0, 0.0]);
    assert!(!c.contains_key(&2), "zero weight never picked");
    assert!(
        (1700..2300).contains(&c[&0]) && (3700..4300).contains(&c[&1]),
        "{c:?}"
    );
    let uniform = pick_counts(&WeightedRandom::default(), 3, 3000, &[0.0; 3]);
    assert!(uniform.values().all(|&v| v > 800), "{uniform:?}");
}

#[test]
fn round_robin_random_least_requests_and_power_of_two() {
    let rr = pick_counts(&RoundRobin::default(), 3, 300, &[0.0; 3]);
    assert_eq!((rr[&0], rr[&1], rr[&2]), (100, 100, 100));
    let rnd = pick_counts(&RandomPick::default(), 4, 4000, &[0.0; 4]);
    assert!(rnd.values().all(|&v| v > 800), "{rnd:?}");
    let mut ps = pods(4);
    for (i, p) in ps.iter_mut().enumerate() {
        p.in_flight = [3, 1, 1, 5][i];
    }
    let ctx = Context::new();
    let mut seen = HashMap::new();
    for _ in 0..1000 {
        *seen
            .entry(LeastRequests::default().pick(&ctx, &ps, &[0.0; 4]).unwrap())
            .or_insert(0) += 1;
    }
    assert!(seen.keys().all(|&k| k == 1 || k == 2));
    // Power of two never picks the busiest of any pair: pod 3 never wins.
    let p2 = PowerOfTwo::default();
    for _ in 0..1000 {
        assert_ne!(p2.pick(&ctx, &ps, &[0.0; 4]).unwrap(), 3);
    }
    assert_eq!(p2.pick(&ctx, &ps[..1], &[0.0]), Some(0));
}

#[test]
fn fleet_feedback_keeps_counters_and_health() {
    let fleet = Fleet::new();
    let id = PodId::new(0, 0);
    fleet.upsert(router_policy::PodState::new(id, Role::Prefill));
    fleet.request_started(id, 100, 7);
    fleet.first_token(id, 100);
    assert_eq!(fleet.get(id).unwrap().queued_prefill_tokens, 0);
    fleet.request_finished(id, 0, 7, Duration::from_millis(30), Outcome::Success);
    let s = fleet.get(id).unwrap();
    assert_eq!((s.in_flight, s.kv_blocks_used, s.latency_ms), (0, 0, 30.0));
    fleet.set_health(id, false);
    let mut snap = Vec::new();
    fleet.snapshot_into(&mut snap);
    assert!(!snap[0].healthy);
    fleet.remove(id);
    assert!(fleet.get(id).is_none());
}

#[test]
fn circuit_breaker_filters_through_a_profile() {
    let breaker = std::sync::Arc::new(CircuitBreaker::new(BreakerConfig::default()));
    #[derive(Debug)]
    struct Shared(std::sync::Arc<CircuitBreaker>);
    impl router_policy::Plugin for Shared {
        fn name(&self) -> &str {
            "breaker"
        }
    }
    impl router_policy::Filter for Shared {
        fn keep(&self, ctx: &Context, pod: &router_policy::PodState) -> bool {
            self.0.keep(ctx, pod)
        }
    }
    let profile = Profile::builder("p")
        .filter(Shared(breaker.clone()))
        .picker(RoundRobin::default())
        .build()
        .unwrap();
    for _ in 0..5 {
        breaker.record(PodId::new(0, 0), Duration::from_millis(1), Outcome::Failure);
    }
    for _ in 0..10 {
        let d = profile.decide(&mut Context::new(), &mut pods(2)).unwrap();
        assert_eq!(d.pod, PodId::new(1, 0));
    }
}

#[test]
fn predicted_ttft_charges_a_pod_that_cannot_hold_the_request_beside_its_running_ones() {
    let model = TtftModel::with_block_size(16);
    let prompt = 16 * 500; // 500 blocks
    let mut roomy = pods(1).remove(0);
    roomy.kv_blocks_total = 2048;
    roomy.kv_blocks_used = 1000;
    let mut full = roomy.clone();
    full.kv_blocks_used = 1800; // 1800 + 500 = 2300: 252 blocks too many
    let base = model.price(&roomy, prompt, 0, 0);
    // Capacity is not charged while the request fits (the decode term
    // grows with the blocks in use, a little).
    let fits = {
        let mut p = roomy.clone();
        p.kv_blocks_used = 1548; // exactly full
        model.price(&p, prompt, 0, 0)
    };
    let decode_only = |used: u64| {
        let mut p = roomy.clone();
        p.kv_blocks_total = 0; // unknown capacity: never charged
        p.kv_blocks_used = used;
        model.price(&p, prompt, 0, 0)
    };
    assert_eq!(fits, decode_only(1548));
    assert_eq!(base, decode_only(1000));
    // Past it, the overflow is priced as recomputing its tokens, once for
    // the wait and again as the fleet's work.
    let over = model.price(&full, prompt, 0, 0) - decode_only(1800);
    let spill = model.token_us * (252 * 16) as f64 / 1e3;
    assert!(
        (over - (1.0 + model.compute_weight) * spill).abs() < 1e-9,
        "{over} against {spill}"
    );
    // A half-cached prompt on the full pod can still beat the roomy pod,
    // so a session's history keeps it where it is unless the overflow
    // costs more than the saving.
    let p = PredictedTtft::new(model.clone(), None);
    let mut ctx = Context::new();
    ctx.insert(PROMPT_TOKENS, prompt);
    ctx.insert(CACHE_HITS, hits(500, &[(0, 450)]));
    let mut ps = pods(2);
    ps[0].kv_blocks_total = 2048;
    ps[0].kv_blocks_used = 1800;
    ps[1].kv_blocks_total = 2048;
    ps[1].kv_blocks_used = 1000;
    let mut out = vec![0.0; 2];
    p.score(&ctx, &ps, &mut out);
    assert!(
        out[0] > out[1],
        "history outweighs a small overflow: {out:?}"
    );
    // Uncached everywhere: the pod with room wins.
    ctx.insert(CACHE_HITS, hits(500, &[]));
    p.score(&ctx, &ps, &mut out);
    assert!(out[1] > out[0], "a new prompt goes where it fits: {out:?}");
}
