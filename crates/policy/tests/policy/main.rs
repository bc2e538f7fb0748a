//! Integration tests of router-policy.

mod config;
mod hashing;
mod hot_prefix;
mod plugins;
mod profile;
mod speculative;

use router_core::PodId;
use router_policy::{PodState, Role};

/// `n` idle, healthy pods of role `Both` in slots `0..n`.
pub(crate) fn pods(n: usize) -> Vec<PodState> {
    (0..n)
        .map(|i| PodState::new(PodId::new(i as u16, 0), Role::Both))
        .collect()
}

#[test]
fn pod_loads_add_and_subtract_saturating_and_keep_their_wire_names() {
    use router_policy::PodLoad;
    let a = PodLoad::new(2, 1, 100, 7);
    let b = PodLoad::new(3, 0, 40, 9);
    assert_eq!(a.plus(b), PodLoad::new(5, 1, 140, 16));
    assert_eq!(a.minus(b), PodLoad::new(0, 1, 60, 0), "never below zero");
    let mut s =
        router_policy::PodState::new(router_core::PodId::new(0, 0), router_policy::Role::Both);
    s.in_flight = 4;
    s.queued_prefill_tokens = 500;
    PodLoad::replace_in(&mut s, a, b);
    assert_eq!(PodLoad::of(&s), PodLoad::new(5, 0, 440, 9));
    // What replicas of an earlier release send and read.
    let json = serde_json::to_value(a).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"in_flight": 2, "prefilling": 1, "queued": 100, "kv": 7})
    );
    assert_eq!(serde_json::from_value::<PodLoad>(json).unwrap(), a);
}
