//! One hot system prompt must not pin all traffic to one pod.
//!
//! 8 pods, 2000 requests sharing one 64-block prefix with distinct 4-block
//! suffixes, routed by the default profile over a real `router-index`. Each
//! request runs for 8 arrivals' time: it holds its KV blocks and counts as
//! in flight, and its prefill is queued for one arrival. The pod it lands on
//! then holds its blocks (as the engine's events would say).

use std::collections::VecDeque;

use router_core::{BlockHash, PodDirectory, PodKey, Tier};
use router_index::{Index, IndexConfig};
use router_policy::keys::{CHAIN, PROMPT_TOKENS};
use router_policy::{Context, Fleet, Outcome, PodState, PodStateSink, Role, default_profile};

#[test]
fn default_profile_spreads_a_hot_prefix_and_keeps_its_hits() {
    const PODS: usize = 8;
    const REQUESTS: usize = 2000;
    const BLOCK: u64 = 16;
    const DURATION: usize = 8;
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
    let mut running: VecDeque<(router_core::PodId, u64, u64, usize)> = VecDeque::new();
    let mut per_pod = [0usize; PODS];
    let mut landed_on_cache = 0;
    let mut ctx = Context::new();
    let mut snapshot = Vec::new();
    for r in 0..REQUESTS {
        // Requests finish after DURATION arrivals; prefill after one.
        while running.front().is_some_and(|&(_, _, _, end)| end <= r) {
            let (pod, prefill, blocks, _) = running.pop_front().unwrap();
            fleet.request_finished(
                pod,
                prefill,
                blocks,
                std::time::Duration::from_millis(5),
                Outcome::Success,
            );
        }
        for (pod, prefill, _, end) in running.iter_mut() {
            if *end == r + DURATION - 1 && *prefill > 0 {
                fleet.first_token(*pod, *prefill);
                *prefill = 0;
            }
        }
        let mut chain = prefix.clone();
        chain.extend((0..4).map(|i| BlockHash(((r as u64 + 1) << 20) + i)));
        let blocks = chain.len() as u64;
        ctx.clear();
        ctx.insert(CHAIN, chain.clone());
        ctx.insert(PROMPT_TOKENS, blocks * BLOCK);
        fleet.snapshot_into(&mut snapshot);
        let d = profile.decide(&mut ctx, &mut snapshot).unwrap();
        let slot = ids.iter().position(|&id| id == d.pod).unwrap();
        per_pod[slot] += 1;
        let matched = ctx
            .get(router_policy::keys::CACHE_HITS)
            .map_or(0, |h| h.blocks(d.pod)) as u64;
        if matched >= prefix.len() as u64 {
            landed_on_cache += 1;
        }
        let uncached = (blocks - matched) * BLOCK;
        fleet.request_started(d.pod, uncached, blocks);
        running.push_back((d.pod, uncached, blocks, r + DURATION));
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
}
