//! Speculative registration, the routed-chains table against its linear
//! oracle, the approximate mode, and the peer profiles.

use std::sync::Arc;

use proptest::prelude::*;
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodId, PodKey, Tier};
use router_index::{Index, IndexConfig};
use router_policy::builtin::{Evictions, Memory, RoutedChains};
use router_policy::keys::{CACHE_HITS, CHAIN, NOW_MS, PROMPT_TOKENS};
use router_policy::{
    Context, Fleet, PodState, PodStateSink, Profile, Role, default_profile, default_profile_with,
    peers,
};

const BLOCK: u64 = 16;

struct Cluster {
    index: Arc<Index>,
    fleet: Fleet,
    ids: Vec<PodId>,
}

fn cluster(pods: usize) -> Cluster {
    let index = Index::<4>::new(IndexConfig::default());
    let fleet = Fleet::new();
    let ids = (0..pods)
        .map(|i| {
            let id = index.join(&PodKey::new(format!("pod-{i}"), 0)).unwrap();
            fleet.upsert(PodState::new(id, Role::Both));
            id
        })
        .collect();
    Cluster { index, fleet, ids }
}

/// Routes one request of `chain` at `now`, accounting it as sent (its
/// uncached tokens queued) as the executor does; returns the pod's slot and
/// the blocks the decision counted as cached there.
fn route(c: &Cluster, profile: &Profile, chain: &[BlockHash], now: u64) -> (usize, u32) {
    let mut ctx = Context::new();
    ctx.insert(CHAIN, chain.to_vec());
    ctx.insert(PROMPT_TOKENS, chain.len() as u64 * BLOCK);
    ctx.insert(NOW_MS, now);
    let mut pods = Vec::new();
    c.fleet.snapshot_into(&mut pods);
    let d = profile.decide(&mut ctx, &mut pods).unwrap();
    let matched = ctx.get(CACHE_HITS).map_or(0, |h| h.blocks(d.pod));
    let uncached = (chain.len() as u64 - u64::from(matched)) * BLOCK;
    c.fleet.request_started(d.pod, uncached, chain.len() as u64);
    (c.ids.iter().position(|&id| id == d.pod).unwrap(), matched)
}

fn sibling(prefix: &[BlockHash], i: u64) -> Vec<BlockHash> {
    let mut chain = prefix.to_vec();
    chain.push(BlockHash((i + 1) << 40));
    chain
}

fn spread_of_a_burst(profile: impl Fn(&Cluster) -> Profile) -> usize {
    let c = cluster(4);
    let profile = profile(&c);
    let prefix: Vec<BlockHash> = (0..64).map(|i| BlockHash(7_000 + i)).collect();
    // 16 requests inside the event delay: no event reaches the index.
    let mut used = [0usize; 4];
    for i in 0..16 {
        used[route(&c, &profile, &sibling(&prefix, i), 1_000 + i).0] += 1;
    }
    used.iter().filter(|&&n| n > 0).count()
}

#[test]
fn a_burst_on_a_new_prefix_follows_its_first_request() {
    // With speculative registration the siblings follow the first request
    // until its pod's queue costs more than recomputing the prefix
    // elsewhere: one copy, at most two.
    let with = spread_of_a_burst(|c| default_profile(c.index.clone(), BLOCK));
    assert!(with <= 2, "the burst was scattered over {with} pods");
    // Without it (an approximate table that forgets at once) the same
    // burst is scattered by load alone: the test can fail.
    let without = spread_of_a_burst(|c| {
        let forgets = Arc::new(RoutedChains::new(Memory::new(1, 1)));
        default_profile_with(c.index.clone(), BLOCK, forgets)
    });
    assert_eq!(without, 4, "without registration the burst spreads by load");
}

#[test]
fn a_registration_expires_after_its_ttl() {
    let c = cluster(4);
    let profile = default_profile(c.index.clone(), BLOCK);
    let prefix: Vec<BlockHash> = (0..32).map(|i| BlockHash(9_000 + i)).collect();
    let ttl = Memory::SPECULATIVE.ttl_ms;
    let (_, first) = route(&c, &profile, &sibling(&prefix, 0), 10_000);
    assert_eq!(first, 0, "nothing was cached yet");
    let (_, soon) = route(&c, &profile, &sibling(&prefix, 1), 10_000 + ttl - 1);
    assert_eq!(soon, 32, "a sibling inside the TTL counts the prefix");
    // Both registrations have expired a TTL after the second.
    let (_, late) = route(&c, &profile, &sibling(&prefix, 2), 10_000 + 2 * ttl);
    assert_eq!(late, 0, "expired registrations count for nothing");
}

#[test]
fn a_registration_outlives_a_long_queue_wait() {
    // Under KV-cache pressure a request can wait seconds in its engine's
    // queue before its prefill stores anything: a sibling arriving 5 s
    // later (past the peers' 2 s TTL) must still find it.
    let c = cluster(4);
    let profile = default_profile(c.index.clone(), BLOCK);
    let prefix: Vec<BlockHash> = (0..32).map(|i| BlockHash(19_000 + i)).collect();
    let (home, _) = route(&c, &profile, &sibling(&prefix, 0), 10_000);
    let (pod, matched) = route(&c, &profile, &sibling(&prefix, 1), 15_000);
    assert_eq!(matched, 32, "the queued request's prefix still counts");
    assert_eq!(pod, home, "the sibling follows it");
    // With the peers' 2 s TTL the same sibling counts nothing: the test
    // can fail.
    let short = Arc::new(RoutedChains::new(Memory::SHORT_TTL));
    let c = cluster(4);
    let profile = default_profile_with(c.index.clone(), BLOCK, short);
    route(&c, &profile, &sibling(&prefix, 0), 10_000);
    assert_eq!(route(&c, &profile, &sibling(&prefix, 1), 15_000).1, 0);
}

#[test]
fn an_engine_eviction_ends_a_registration() {
    let c = cluster(2);
    let table = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
    let sink = Evictions::new(c.index.clone(), table.clone());
    let chain: Vec<BlockHash> = (0..8).map(|i| BlockHash(29_000 + i)).collect();
    let pod = c.ids[0];
    table.insert(pod, &chain, 1_000);
    let depth = |t: &RoutedChains| t.match_linear(&chain, 1_001, pod);
    assert_eq!(depth(&table), 8);
    // Stores and host-memory removals leave the registration alone.
    sink.apply(&CacheEvent::Stored {
        pod,
        tier: Tier::Gpu,
        blocks: chain.clone(),
    })
    .unwrap();
    sink.apply(&CacheEvent::Removed {
        pod,
        tier: Tier::Cpu,
        blocks: chain[4..].to_vec(),
    })
    .unwrap();
    assert_eq!(depth(&table), 8);
    // The engine evicts the tail from the GPU: the registration ends there,
    // and the index agrees.
    sink.apply(&CacheEvent::Removed {
        pod,
        tier: Tier::Gpu,
        blocks: chain[5..].to_vec(),
    })
    .unwrap();
    assert_eq!(depth(&table), 5);
    assert_eq!(c.index.match_prefix(&chain).blocks_for(pod), 5);
    // Another pod's registration of the same blocks is untouched.
    table.insert(c.ids[1], &chain, 1_000);
    sink.apply(&CacheEvent::Cleared { pod }).unwrap();
    assert_eq!(depth(&table), 0);
    assert_eq!(table.pod_blocks(pod), 0);
    assert_eq!(table.match_linear(&chain, 1_001, c.ids[1]), 8);
    // An event the index refuses (a pod that left) tells the table nothing.
    let gone = c.ids[1];
    c.index.shutdown(gone).unwrap();
    let refused = sink.apply(&CacheEvent::Removed {
        pod: gone,
        tier: Tier::Gpu,
        blocks: chain.clone(),
    });
    assert!(refused.is_err());
    assert_eq!(table.match_linear(&chain, 1_001, gone), 8);
}

#[test]
fn registrations_are_bounded_by_the_pods_capacity() {
    // The default learns each pod's capacity from its state: a pod of 64
    // blocks keeps only its 64 most recently routed blocks registered.
    let c = cluster(1);
    c.fleet.update(c.ids[0], &mut |s| s.kv_blocks_total = 64);
    let table = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
    let profile = default_profile_with(c.index.clone(), BLOCK, table.clone());
    let a: Vec<BlockHash> = (0..48).map(|i| BlockHash(39_000 + i)).collect();
    let b: Vec<BlockHash> = (0..48).map(|i| BlockHash(49_000 + i)).collect();
    route(&c, &profile, &a, 1_000);
    assert_eq!(table.memory(c.ids[0]).capacity_blocks, 64);
    route(&c, &profile, &b, 1_001);
    assert_eq!(table.pod_blocks(c.ids[0]), 64);
    assert_eq!(table.match_linear(&b, 1_002, c.ids[0]), 48);
    assert_eq!(
        table.match_linear(&a, 1_002, c.ids[0]),
        16,
        "the oldest routed chain lost its 32 deepest blocks, as the engine frees a tail first"
    );
}

#[test]
fn approximate_mode_keeps_conversations_on_their_pod() {
    // No index at all (engines without events): a long memory per pod.
    let c = cluster(4);
    let blind = Index::<4>::new(IndexConfig::default());
    let table = Arc::new(RoutedChains::new(Memory::new(600_000, 100_000)));
    let profile = default_profile_with(blind, BLOCK, table);
    let mut homes = Vec::new();
    for conv in 0..8u64 {
        let history: Vec<BlockHash> = (0..40).map(|i| BlockHash((conv << 32) + i)).collect();
        let (home, _) = route(&c, &profile, &history, conv * 100);
        homes.push(home);
        // Let the pod finish its prefill before the next turn.
        c.fleet.first_token(c.ids[home], 40 * BLOCK);
    }
    for conv in 0..8u64 {
        let mut next: Vec<BlockHash> = (0..40).map(|i| BlockHash((conv << 32) + i)).collect();
        next.extend((40..44).map(|i| BlockHash((conv << 32) + i)));
        let (pod, matched) = route(&c, &profile, &next, 10_000 + conv);
        assert_eq!(
            pod, homes[conv as usize],
            "conversation {conv} left its pod"
        );
        assert_eq!(matched, 40, "its routed history counted");
        c.fleet.first_token(c.ids[pod], 4 * BLOCK);
    }
}

#[test]
fn peer_profiles_follow_their_own_view_of_the_cache() {
    let chain: Vec<BlockHash> = (0..8).map(|i| BlockHash(300 + i)).collect();
    for name in peers::NAMES {
        let c = cluster(4);
        // The index says pod 2 holds the whole chain.
        c.index.store(c.ids[2], Tier::Gpu, &chain).unwrap();
        let profile = peers::profile(name, c.index.clone(), BLOCK).unwrap();
        let (pod, _) = route(&c, &profile, &chain, 0);
        match name {
            // Event-fed: the pod the index names.
            "dynamo" | "llm-d" => assert_eq!(pod, 2, "{name}"),
            // SMG reads only its tree of what it routed, empty here: the
            // least-loaded pod, ties to the first.
            "smg-cache-aware" => assert_eq!(pod, 0, "{name}"),
            other => panic!("a peer profile without a test: {other}"),
        }
    }
    assert!(peers::profile("nobody", cluster(1).index, BLOCK).is_none());
}

#[test]
fn smg_follows_its_tree_until_load_is_imbalanced() {
    let c = cluster(2);
    let profile = peers::profile("smg-cache-aware", c.index.clone(), BLOCK).unwrap();
    let prefix: Vec<BlockHash> = (0..10).map(|i| BlockHash(500 + i)).collect();
    let (home, _) = route(&c, &profile, &sibling(&prefix, 0), 0);
    // The tree matches 10 of 11 blocks (> 0.3): the same worker, while the
    // spread of in-flight requests stays within 64.
    for i in 1..60 {
        assert_eq!(route(&c, &profile, &sibling(&prefix, i), i).0, home);
    }
    // Past 64 requests more than the idle worker (and 1.5 x), load wins.
    let elsewhere = (60..80)
        .filter(|&i| route(&c, &profile, &sibling(&prefix, i), i).0 != home)
        .count();
    assert!(elsewhere >= 1, "the imbalance gate never opened");
}

proptest! {
    /// The table's match equals the one-pod-at-a-time oracle, whatever was
    /// inserted when, and a pod never holds more than its capacity.
    #[test]
    fn routed_chains_match_their_oracle(
        inserts in proptest::collection::vec(
            (0u16..4, 0u64..6, 1usize..12, 0u64..50, any::<bool>()), 1..40),
        query_root in 0u64..6,
        query_len in 1usize..14,
        now in 0u64..80,
    ) {
        let table = RoutedChains::new(Memory::new(30, 40));
        let chain_of = |root: u64, len: usize| -> Vec<BlockHash> {
            (0..len as u64).map(|i| BlockHash(root * 1000 + i)).collect()
        };
        let mut t = 0;
        for (pod, root, len, dt, evict) in inserts {
            t += dt;
            let id = PodId::new(pod, 0);
            if evict {
                // The engine evicted a chain's tail from `len` on.
                let tail = chain_of(root, 12);
                table.forget(id, &tail[len..]);
                prop_assert!(table.match_linear(&tail, t, id) <= len as u32);
            } else {
                table.insert(id, &chain_of(root, len), t);
            }
            prop_assert!(table.pod_blocks(id) <= 40);
        }
        let query = chain_of(query_root, query_len);
        let at = t.saturating_sub(40) + now;
        let mut got = Vec::new();
        table.match_into(&query, at, &mut got);
        for pod in 0..4u16 {
            let id = PodId::new(pod, 0);
            let fast = got.iter().find(|m| m.0 == id).map_or(0, |m| m.1);
            prop_assert_eq!(fast, table.match_linear(&query, at, id), "pod {}", pod);
        }
    }
}
