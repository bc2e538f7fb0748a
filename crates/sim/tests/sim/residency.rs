//! The router's capacity model against the engine it predicts: what
//! [`RoutedChains`] says a pod will hold when a request's prefill runs,
//! against what the simulated engine ([`BlockCache`], vLLM's block pool)
//! really holds then.

use std::collections::VecDeque;

use proptest::prelude::*;
use router_core::{BlockHash, PodId};
use router_policy::builtin::{Memory, RoutedChains};
use router_sim::BlockCache;

/// Request `(root, len)`: blocks `root*100 .. root*100+len`, so requests
/// with one root share a prefix, as cumulative block hashes do.
fn request(root: u64, len: u64) -> Vec<u64> {
    (0..len).map(|i| root * 100 + i).collect()
}

fn hashes(blocks: &[u64]) -> Vec<BlockHash> {
    blocks.iter().map(|&b| BlockHash(b)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Requests are routed to one pod, whose engine runs them in arrival
    /// order, one at a time, some while others are still queued. The
    /// prediction is taken when a request is routed (the requests queued
    /// ahead of it already registered, their inserts not yet made by the
    /// engine) and must equal the engine's prefix hits when its prefill
    /// runs: the capacity bound and the tail-first eviction order are the
    /// engine's own.
    #[test]
    fn predicted_residency_at_prefill_equals_the_engines(
        cap in 4usize..48,
        ops in prop::collection::vec((0u64..8, 1u64..16, 0usize..3), 1..120),
    ) {
        let pod = PodId::new(0, 0);
        let table = RoutedChains::new(Memory::forever(cap));
        table.set_capacity(pod, cap);
        let mut engine = BlockCache::new(cap, 0);
        let mut queue: VecDeque<(Vec<u64>, u32)> = VecDeque::new();
        let run = |engine: &mut BlockCache, r: &[u64], predicted: u32| {
            let adm = engine.admit(r).expect("one request at a time always fits");
            engine.computed(&adm.computed);
            engine.release(r);
            adm.gpu_hits as u32 == predicted
        };
        for (root, len, engine_steps) in ops {
            let r = request(root, len.min(cap as u64));
            let chain = hashes(&r);
            let predicted = table.match_linear(&chain, 0, pod);
            let mut fast = Vec::new();
            table.match_into(&chain, 0, &mut fast);
            prop_assert_eq!(fast.first().map_or(0, |m| m.1), predicted);
            table.insert(pod, &chain, 0);
            queue.push_back((r, predicted));
            for _ in 0..engine_steps {
                let Some((r, predicted)) = queue.pop_front() else { break };
                let engine_hits = engine.cached_prefix(&r);
                prop_assert!(run(&mut engine, &r, predicted),
                    "predicted {} of {:?}, the engine held {}", predicted, r, engine_hits);
            }
        }
        while let Some((r, predicted)) = queue.pop_front() {
            let engine_hits = engine.cached_prefix(&r);
            prop_assert!(run(&mut engine, &r, predicted),
                "predicted {} of {:?}, the engine held {}", predicted, r, engine_hits);
        }
        prop_assert!(table.pod_blocks(pod) <= cap);
    }
}

/// The order that makes the model right: past capacity a chain loses its
/// tail first (vLLM frees a finished request's deepest block first), so
/// its head still matches.
#[test]
fn past_capacity_a_registered_chain_keeps_its_head() {
    let pod = PodId::new(0, 0);
    let table = RoutedChains::new(Memory::forever(8));
    let a = hashes(&request(1, 6));
    table.insert(pod, &a, 0);
    table.insert(pod, &hashes(&request(2, 4)), 0);
    // Ten blocks registered, room for eight: `a`'s two deepest left.
    assert_eq!(table.match_linear(&a, 0, pod), 4);
    let mut engine = BlockCache::new(8, 0);
    for r in [request(1, 6), request(2, 4)] {
        engine.admit(&r).unwrap();
        engine.release(&r);
    }
    assert_eq!(engine.cached_prefix(&request(1, 6)), 4);
}
