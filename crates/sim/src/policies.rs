//! The policies the replay compares, as profiles over the real index.

use router_policy::builtin::{
    ConsistentHash, HealthFilter, LeastRequests, LoadScorer, MaxScore, RoundRobin, SessionAffinity,
};
use router_policy::keys::{HASH_KEY, SESSION_ID};
use router_policy::{Profile, Registry, default_profile};

use crate::sim::Policy;

/// Names accepted by [`builtin`].
pub const NAMES: [&str; 5] = [
    "round-robin",
    "least-requests",
    "consistent-hash",
    "session-affinity",
    "cache-aware",
];

fn valid(b: router_policy::ProfileBuilder) -> Profile {
    b.build().expect("built-in policies are valid") // each is built in a unit test
}

/// A built-in policy by name.
pub fn builtin(name: &str) -> Option<Policy> {
    Some(match name {
        "round-robin" => Policy::new(name, |_, _| {
            valid(
                Profile::builder("round-robin")
                    .filter(HealthFilter)
                    .picker(RoundRobin::default()),
            )
        }),
        "least-requests" => Policy::new(name, |_, _| {
            valid(
                Profile::builder("least-requests")
                    .filter(HealthFilter)
                    .picker(LeastRequests::default()),
            )
        }),
        "consistent-hash" => Policy::new(name, |_, _| {
            valid(
                Profile::builder("consistent-hash")
                    .input(HASH_KEY.id())
                    .filter(HealthFilter)
                    .picker(ConsistentHash::new(1.25)),
            )
        }),
        "session-affinity" => Policy::new(name, |_, _| {
            valid(
                Profile::builder("session-affinity")
                    .input(SESSION_ID.id())
                    .filter(HealthFilter)
                    .scorer(SessionAffinity::default(), 1.0)
                    .scorer(LoadScorer, 0.1)
                    .picker(MaxScore::default()),
            )
        }),
        "cache-aware" => Policy::new(name, |index, cfg| default_profile(index, cfg.block_tokens)),
        _ => return None,
    })
}

/// Every profile of a TOML config file, as policies (the inputs the replay
/// sets are `chain`, `prompt_tokens`, `hash_key` and `session_id`).
pub fn from_config(text: &str) -> Result<Vec<Policy>, router_policy::Error> {
    // Parse once up front so errors surface before the replay starts.
    let probe = router_index::Index::<4>::new(router_index::IndexConfig::default());
    let names: Vec<String> = Registry::with_builtins()
        .with_index(probe)
        .load(text)?
        .into_keys()
        .collect();
    let text = std::sync::Arc::new(text.to_owned());
    Ok(names
        .into_iter()
        .map(|name| {
            let (text, key) = (text.clone(), name.clone());
            Policy::new(name, move |index, _| {
                let mut all = Registry::with_builtins()
                    .with_index(index)
                    .load(&text)
                    .expect("parsed once already");
                all.remove(&key).expect("the profile exists")
            })
        })
        .collect())
}
