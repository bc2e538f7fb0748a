//! Integration tests of router-exec against the scripted fake backend.

mod accounting;
mod flows;

use std::sync::Arc;

use router_core::PodId;
use router_exec::{Executor, Feedback, RetryPolicy};
use router_policy::builtin::{LeastRequests, MaxScore, RoleFilter};
use router_policy::{Fleet, PodState, Profile, Role, scorer_fn};
use router_test_support::ScriptedBackend;

/// A fleet of pods with the given roles, in slots 0.., and its ids.
pub(crate) fn fleet(roles: &[Role]) -> (Arc<Fleet>, Vec<PodId>) {
    let fleet = Arc::new(Fleet::new());
    let ids = roles
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let id = PodId::new(i as u16, 0);
            fleet.upsert(PodState::new(id, *r));
            id
        })
        .collect();
    (fleet, ids)
}

pub(crate) fn executor(backend: &Arc<ScriptedBackend>, fleet: &Arc<Fleet>) -> Executor {
    Executor::new(backend.clone(), fleet.clone(), Arc::new(Feedback::new(16)))
        .with_retry(RetryPolicy::new(3, std::time::Duration::from_millis(1)))
}

/// Least requests among pods of `role`.
pub(crate) fn by_role(role: Role) -> Arc<Profile> {
    Arc::new(
        Profile::builder(format!("{role:?}"))
            .filter(RoleFilter::new(role))
            .picker(LeastRequests::default())
            .build()
            .unwrap(),
    )
}

/// Prefers pods in slot order: slot 0 first, then 1, ...
pub(crate) fn in_slot_order() -> Arc<Profile> {
    Arc::new(
        Profile::builder("ordered")
            .scorer(
                scorer_fn("low-slot", |_, p| 1.0 / (1.0 + p.id.slot() as f64)),
                1.0,
            )
            .picker(MaxScore::default())
            .build()
            .unwrap(),
    )
}

/// Every pod's counters are back to zero.
pub(crate) fn assert_idle(fleet: &Fleet, ids: &[PodId]) {
    for id in ids {
        let s = fleet.get(*id).unwrap();
        assert_eq!(
            (s.in_flight, s.queued_prefill_tokens, s.kv_blocks_used),
            (0, 0, 0),
            "{id} not idle"
        );
    }
}
