//! Bounded-load consistent hashing: the bound holds, keys move minimally.

use proptest::prelude::*;
use router_policy::builtin::ConsistentHash;
use router_policy::keys::HASH_KEY;
use router_policy::{Context, Picker, PodState};

use super::pods;

fn pick(h: &ConsistentHash, key: u64, ps: &[PodState]) -> usize {
    let mut ctx = Context::new();
    ctx.insert(HASH_KEY, key);
    h.pick(&ctx, ps, &vec![0.0; ps.len()]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Requests arrive and finish at random; no pod ever goes over the bound.
    #[test]
    fn no_pod_exceeds_the_bound(
        n in 1usize..12, factor in 1.0f64..2.0,
        ops in prop::collection::vec((any::<u64>(), any::<bool>()), 1..400),
    ) {
        let h = ConsistentHash::new(factor);
        let mut ps = pods(n);
        let mut running: Vec<usize> = Vec::new();
        for (key, finish) in ops {
            if finish && !running.is_empty() {
                let i = running.swap_remove((key as usize) % running.len());
                ps[i].in_flight -= 1;
                continue;
            }
            let bound = h.bound(&ps);
            let i = pick(&h, key % 50, &ps);
            let after = ps[i].in_flight as u64 + 1;
            prop_assert!(after <= bound, "pod at {} over the bound {}", after, bound);
            ps[i].in_flight += 1;
            running.push(i);
        }
    }
}

#[test]
fn keys_move_minimally_when_a_pod_joins_or_leaves() {
    let h = ConsistentHash::new(1.25);
    let ten = pods(10);
    let keys: Vec<u64> = (0..5000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let before: Vec<_> = keys.iter().map(|&k| ten[pick(&h, k, &ten)].id).collect();
    // Pod 3 leaves: only its keys move.
    let nine: Vec<_> = ten.iter().filter(|p| p.id.slot() != 3).cloned().collect();
    for (k, b) in keys.iter().zip(&before) {
        let after = nine[pick(&h, *k, &nine)].id;
        if b.slot() != 3 {
            assert_eq!(after, *b, "a key of a staying pod moved");
        }
    }
    // Pod 10 joins: keys move only to it, about 1/11 of them.
    let eleven = pods(11);
    let mut moved = 0;
    for (k, b) in keys.iter().zip(&before) {
        let after = eleven[pick(&h, *k, &eleven)].id;
        if after != *b {
            assert_eq!(after.slot(), 10, "a key moved between old pods");
            moved += 1;
        }
    }
    assert!((300..620).contains(&moved), "{moved} of 5000 moved");
    // Keys spread over all pods.
    let mut per = [0; 10];
    for b in &before {
        per[b.slot() as usize] += 1;
    }
    assert!(per.iter().all(|&c| c > 350), "{per:?}");
}

#[test]
fn a_loaded_preferred_pod_passes_the_key_on() {
    let h = ConsistentHash::new(1.0);
    let mut ps = pods(4);
    let first = pick(&h, 42, &ps);
    ps[first].in_flight = 10;
    let second = pick(&h, 42, &ps);
    assert_ne!(first, second);
}
