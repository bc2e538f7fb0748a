//! The policies the replay compares, as profiles over the real index.

use router_policy::builtin::{
    ConsistentHash, HealthFilter, LeastRequests, LoadScorer, MaxScore, RoundRobin, SessionAffinity,
};
use router_policy::keys::{HASH_KEY, SESSION_ID};

use router_index::{Index, IndexConfig};
use router_policy::builtin::Memory;
use router_policy::{Profile, Registry, default_profile_with, peers};

use crate::sim::Policy;

/// Names accepted by [`builtin`]: the baselines, the peers' decisions
/// ([`router_policy::peers::NAMES`]), the default, and the default in
/// approximate mode (`cache-aware-approx`: the index ignored, only what was
/// routed counts, as for engines that publish no events).
pub const NAMES: [&str; 9] = [
    "round-robin",
    "least-requests",
    "consistent-hash",
    "session-affinity",
    "dynamo",
    "smg-cache-aware",
    "llm-d",
    "cache-aware-approx",
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
        "cache-aware" => Policy::with_routed(name, |index, cfg, table| {
            default_profile_with(index, cfg.block_tokens, table)
        }),
        "cache-aware-approx" => Policy::with_routed(name, |_, cfg, table| {
            // An index no event reaches: the routed chains alone, kept as
            // long as the replay and as many as a pod's GPU holds.
            let blind = Index::<4>::new(IndexConfig::default());
            table.set_default(Memory::forever(cfg.gpu_blocks));
            default_profile_with(blind, cfg.block_tokens, table)
        }),
        "dynamo" | "smg-cache-aware" | "llm-d" => {
            let peer = name.to_owned();
            Policy::new(name, move |index, cfg| {
                peers::profile(&peer, index, cfg.block_tokens).expect("a peer profile's name")
            })
        }
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
            Policy::with_routed(name, move |index, _, table| {
                let mut all = Registry::with_builtins()
                    .with_index(index)
                    .with_routed(table)
                    .load(&text)
                    .expect("parsed once already");
                all.remove(&key).expect("the profile exists")
            })
        })
        .collect())
}
