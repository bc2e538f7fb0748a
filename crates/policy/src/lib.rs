//! The decision layer: composable filters, scorers and pickers.
//!
//! # The design choice
//!
//! A routing decision is four stages per request: **prepare** (compute
//! per-request facts, such as the prefix match, once), **filter** (drop pods
//! that cannot serve), **score** (weighted scorers, each in `0..=1`), and
//! **pick**. Each stage is a small trait; plugins hand data to each other
//! through typed [`Key`]s in a per-request [`Context`], and declare what
//! they need and produce. A [`Profile`] is checked when it is built (a need
//! without a producer, no picker, a bad weight, a duplicate name are
//! errors naming the plugin and key), so nothing is discovered under
//! traffic. The layer sees the index only through `router-core`'s
//! `PrefixIndex`.
//!
//! # Items
//!
//! - Stages: [`Prepare`], [`Filter`], [`Scorer`], [`Picker`] (on [`Plugin`]);
//!   closures as plugins: [`filter_fn`], [`scorer_fn`].
//! - [`Profile`], [`ProfileBuilder`], [`Decision`]; [`default_profile`].
//! - Pods: [`PodState`], [`Role`], [`Fleet`], fed through [`PodStateSink`].
//! - Keys: [`keys`]; config: [`Registry`] loads TOML profiles.
//! - Built-ins: [`builtin`].
//!
//! # A custom scorer, composed in a few lines
//!
//! ```
//! use router_core::PodId;
//! use router_policy::builtin::{HealthFilter, MaxScore};
//! use router_policy::{Context, PodState, Profile, Role, scorer_fn};
//!
//! // Prefer pods with free KV cache.
//! let roomy = scorer_fn("roomy", |_ctx: &Context, pod: &PodState| 1.0 - pod.kv_usage());
//! let profile = Profile::builder("roomy-first")
//!     .filter(HealthFilter)
//!     .scorer(roomy, 1.0)
//!     .picker(MaxScore::default())
//!     .build()?;
//!
//! let mut full = PodState::new(PodId::new(0, 0), Role::Both);
//! (full.kv_blocks_used, full.kv_blocks_total) = (90, 100);
//! let mut empty = PodState::new(PodId::new(1, 0), Role::Both);
//! (empty.kv_blocks_used, empty.kv_blocks_total) = (10, 100);
//! let d = profile.decide(&mut Context::new(), &mut vec![full, empty])?;
//! assert_eq!(d.pod, PodId::new(1, 0));
//! # Ok::<(), router_policy::Error>(())
//! ```
#![forbid(unsafe_code)]

pub mod builtin;
mod config;
mod context;
mod error;
pub mod keys;
pub mod peers;
mod plugin;
mod pod;
mod profile;

use std::sync::Arc;

pub use config::{Built, Env, Params, Registry};
pub use context::{Context, Key, KeyId};
pub use error::Error;
pub use plugin::{
    Filter, FnFilter, FnScorer, Picker, Plugin, Prepare, Scorer, filter_fn, scorer_fn,
};
pub use pod::{Fleet, FleetWatcher, Outcome, PodLoad, PodState, PodStateSink, Role};
pub use profile::{Decision, Profile, ProfileBuilder};

/// The default cache-aware profile: query the index once, count what the
/// router itself routed there as cached too until the engine reports it
/// evicted (speculative registration, [`builtin::Memory::SPECULATIVE`]), drop unhealthy pods, and pick the pod with the lowest
/// predicted time to first token plus the prefill work it adds
/// ([`builtin::PredictedTtft`]), ties broken fairly. The caller sets
/// [`keys::CHAIN`] and [`keys::PROMPT_TOKENS`] (and [`keys::NOW_MS`] when
/// it runs on a clock of its own).
///
/// `docs/ARCHITECTURE.md` says why this formula and not Dynamo's cost
/// ([`peers::profile`]`("dynamo")`), which it replaced.
pub fn default_profile(index: Arc<dyn router_core::PrefixIndex>, block_size: u64) -> Profile {
    let table = Arc::new(builtin::RoutedChains::new(builtin::Memory::SPECULATIVE));
    default_profile_with(index, block_size, table)
}

/// [`default_profile`] registering into a given table (share one between a
/// gateway's profiles, or give pods without events a long memory in it:
/// the approximate mode).
pub fn default_profile_with(
    index: Arc<dyn router_core::PrefixIndex>,
    block_size: u64,
    routed: Arc<builtin::RoutedChains>,
) -> Profile {
    Profile::builder("cache-aware")
        .input(keys::CHAIN.id())
        .input(keys::PROMPT_TOKENS.id())
        .prepare(builtin::PrefixMatchPrepare::new(index.clone()))
        .prepare(builtin::Speculative::new(routed).with_index(index.clone()))
        .filter(builtin::HealthFilter)
        .scorer(
            builtin::PredictedTtft::new(
                builtin::TtftModel::with_block_size(block_size),
                Some(index),
            ),
            1.0,
        )
        .picker(builtin::MaxScore::default())
        .build()
        .expect("the default profile is valid") // checked by a unit test
}

/// [`default_profile`] and the peers' profiles ([`peers::profiles_toml`])
/// as a config file, for operators to start from: `block_size` is the
/// engines', `filters` the inline tables of every profile's filter list
/// (router-policy's own profiles use `{ type = "health" }`; a gateway adds
/// its breaker).
pub fn default_profiles_toml(block_size: u64, filters: &str) -> String {
    format!(
        r#"[profiles.cache-aware]
inputs = ["chain", "prompt_tokens"]
prepare = [{{ type = "prefix-match" }}, {{ type = "speculative", ttl_ms = 60000 }}]
filters = [{filters}]
scorers = [{{ type = "predicted-ttft", weight = 1.0, block_size = {block_size} }}]
picker = {{ type = "max-score" }}

"#
    ) + &peers::profiles_toml(block_size, filters)
}

/// [`default_profile`] as a config file (16-token blocks), for operators to
/// start from; [`default_profiles_toml`] adds the peer profiles.
pub const DEFAULT_PROFILE_TOML: &str = r#"[profiles.cache-aware]
inputs = ["chain", "prompt_tokens"]
prepare = [{ type = "prefix-match" }, { type = "speculative", ttl_ms = 60000 }]
filters = [{ type = "health" }]
scorers = [{ type = "predicted-ttft", weight = 1.0, block_size = 16 }]
picker = { type = "max-score" }
"#;
