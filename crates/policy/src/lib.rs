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
pub use pod::{Fleet, Outcome, PodState, PodStateSink, Role};
pub use profile::{Decision, Profile, ProfileBuilder};

/// The weight of prefill work against decode load in the default profile:
/// Dynamo's default, 1. Higher weights keep more cache hits on the bundled
/// Mooncake trace (8: 94.6% of the pooled-cache hit rate against 82%) but
/// let a hot prefix pin traffic: at 2 the hot-prefix test already puts all
/// requests on 4 of 8 pods (see `docs/BENCHMARKS.md`).
pub const DEFAULT_OVERLAP_WEIGHT: f64 = 1.0;

/// The default cache-aware profile: query the index once, drop unhealthy
/// pods, score by [`builtin::CacheAwareCost`] (Dynamo's cost: prefill blocks
/// left after the cache credit plus decode load), pick the lowest cost with
/// fair tie-breaking. The caller sets [`keys::CHAIN`] and
/// [`keys::PROMPT_TOKENS`].
pub fn default_profile(index: Arc<dyn router_core::PrefixIndex>, block_size: u64) -> Profile {
    Profile::builder("cache-aware")
        .input(keys::CHAIN.id())
        .input(keys::PROMPT_TOKENS.id())
        .prepare(builtin::PrefixMatchPrepare::new(index))
        .filter(builtin::HealthFilter)
        .scorer(
            builtin::CacheAwareCost::new(DEFAULT_OVERLAP_WEIGHT, block_size),
            1.0,
        )
        .picker(builtin::MaxScore::default())
        .build()
        .expect("the default profile is valid") // checked by a unit test
}

/// [`default_profile`] as a config file, for operators to start from.
pub const DEFAULT_PROFILE_TOML: &str = r#"[profiles.cache-aware]
inputs = ["chain", "prompt_tokens"]
prepare = [{ type = "prefix-match" }]
filters = [{ type = "health" }]
scorers = [{ type = "cache-aware-cost", weight = 1.0, overlap_weight = 1.0, block_size = 16 }]
picker = { type = "max-score" }
"#;
