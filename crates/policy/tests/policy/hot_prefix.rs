//! One hot system prompt must not pin all traffic to one pod.
//!
//! 8 pods, 2000 requests 1.25 ms apart sharing one 64-block prefix
//! with distinct 4-block suffixes, routed by the default profile over a
//! real `router-index`. Each pod prefills one request at a time, taking
//! what the default's own timing model says (5 ms a step plus 40 us a
//! token): one pod cannot keep up with the suffixes alone, so the prefix
//! must spread. A request holds its blocks and counts as in flight until 8
//! ms after its first token; the pod it lands on then holds its blocks (as
//! the engine's events would say).

use router_core::{BlockHash, PodDirectory, PodKey, PrefixIndex, Tier};
use router_index::{Index, IndexConfig};
use router_policy::builtin::TtftModel;
use router_policy::keys::{CHAIN, NOW_MS, PROMPT_TOKENS};
use router_policy::{Context, Fleet, Outcome, PodState, PodStateSink, Role, default_profile};

#[test]
fn default_profile_spreads_a_hot_prefix_and_keeps_its_hits() {
    const PODS: usize = 8;
    const REQUESTS: usize = 2000;
    const BLOCK: u64 = 16;
    const DECODE_MS: f64 = 8.0;
    let model = TtftModel::with_block_size(BLOCK);
    let index = Index::<4>::new(IndexConfig::default());
    let fleet = Fleet::new();
    let ids: Vec<_> = (0..PODS)
        .map(|i| {
            let id = index.join(&PodKey::new(format!("pod-{i}"), 0)).unwrap();
            fleet.upsert(PodState::new(id, Role::Both));
            id
        })
        .collect();
    let profile = default_profile(index.clone(), BLOCK);
    let prefix: Vec<BlockHash> = (0..64).map(|i| BlockHash(1_000 + i)).collect();
    // (pod, queued prefill tokens, blocks, first token at, done at)
    let mut running: Vec<(router_core::PodId, u64, u64, f64, f64)> = Vec::new();
    let mut lane_free = [0f64; PODS];
    let mut per_pod = [0usize; PODS];
    let mut landed_on_cache = 0;
    let mut ttft_total = 0.0;
    let mut ctx = Context::new();
    let mut snapshot = Vec::new();
    for r in 0..REQUESTS {
        let now = r as f64 * 1.25;
        for (pod, prefill, blocks, first, done) in running.iter_mut() {
            if *prefill > 0 && *first <= now {
                fleet.first_token(*pod, *prefill);
                *prefill = 0;
            }
            if *done <= now && *blocks > 0 {
                fleet.request_finished(
                    *pod,
                    0,
                    *blocks,
                    std::time::Duration::from_millis(5),
                    Outcome::Success,
                );
                *blocks = 0;
            }
        }
        let mut chain = prefix.clone();
        chain.extend((0..4).map(|i| BlockHash(((r as u64 + 1) << 20) + i)));
        let blocks = chain.len() as u64;
        ctx.clear();
        ctx.insert(CHAIN, chain.clone());
        ctx.insert(PROMPT_TOKENS, blocks * BLOCK);
        ctx.insert(NOW_MS, now as u64);
        fleet.snapshot_into(&mut snapshot);
        let d = profile.decide(&mut ctx, &mut snapshot).unwrap();
        let slot = ids.iter().position(|&id| id == d.pod).unwrap();
        per_pod[slot] += 1;
        // What the pod really held (the index, as its events said).
        let held = index
            .match_prefix(&chain)
            .pods()
            .iter()
            .find(|m| m.pod == d.pod)
            .map_or(0, |m| m.blocks) as u64;
        if held >= prefix.len() as u64 {
            landed_on_cache += 1;
        }
        let uncached = (blocks - held) * BLOCK;
        let start = lane_free[slot].max(now);
        lane_free[slot] = start + model.prefill_ms(held * BLOCK, uncached);
        ttft_total += lane_free[slot] - now;
        fleet.request_started(d.pod, uncached, blocks);
        running.push((
            d.pod,
            uncached,
            blocks,
            lane_free[slot],
            lane_free[slot] + DECODE_MS,
        ));
        index.store(d.pod, Tier::Gpu, &chain).unwrap();
    }
    let mean = REQUESTS as f64 / PODS as f64;
    let busiest = *per_pod.iter().max().unwrap() as f64;
    assert!(
        busiest <= 1.25 * mean,
        "busiest pod {busiest} over 1.25 x mean {mean}: {per_pod:?}"
    );
    assert!(
        landed_on_cache as f64 >= 0.9 * REQUESTS as f64,
        "only {landed_on_cache} of {REQUESTS} requests landed where the prefix was cached"
    );
    // Spreading keeps the queues short (the fleet is about 76% busy): a
    // mean TTFT within a few cached prefills (7.6 ms each).
    let mean_ttft = ttft_total / REQUESTS as f64;
    assert!(
        mean_ttft < 20.0,
        "mean modelled TTFT {mean_ttft:.1} ms: {per_pod:?}"
    );
}
