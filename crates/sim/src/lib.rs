//! Simulated engine pods and trace replay: what cache-aware routing buys,
//! on a real trace, without a GPU.
//!
//! # The design choice
//!
//! The simulator drives the real data and decision layers through their
//! traits: requests are routed by a real `router-policy` profile over a
//! real `router-index`, and the index learns only from the cache events the
//! simulated pods emit (with a configurable delay), exactly as it would
//! from a fleet of engines. What is simulated is the engines: block LRU
//! prefix caches with vLLM's eviction order ([`BlockCache`]), continuous
//! batching with chunked prefill, and a step-time model ([`CostModel`])
//! whose constants are derived from datasheet rates. Time is discrete-event
//! and deterministic: the same trace, cluster and policy give the same
//! report.
//!
//! # Items
//!
//! - [`parse_mooncake`], [`synthetic`]: traces.
//! - [`BlockCache`]: a pod's prefix cache; [`CostModel`]: step times.
//! - [`Simulation`], [`ClusterConfig`], [`Policy`]; [`policies`]: the
//!   compared policies; [`bounds`]: the pooled-cache and infinite-cache
//!   hit rates.
//! - [`Report`]: per-policy figures.
//!
//! ```
//! use router_sim::{ClusterConfig, Simulation, SyntheticParams, policies, synthetic};
//!
//! let mut p = SyntheticParams::default();
//! p.requests = 200;
//! let trace = synthetic(&p, 7);
//! let cfg = ClusterConfig::default();
//! let policy = policies::builtin("cache-aware").unwrap();
//! let report = Simulation::new(&trace, &cfg, &policy).run("cache-aware", |_| {});
//! assert_eq!(report.requests, 200);
//! assert!(report.block_hit_rate > 0.3);
//! ```
#![forbid(unsafe_code)]

mod cache;
mod model;
pub mod policies;
mod report;
mod sim;
mod trace;

pub use cache::{Admission, BlockCache, CacheChange};
pub use model::CostModel;
pub use report::{Report, RequestRecord};
pub use sim::{ClusterConfig, Policy, Simulation, block_hash, bounds};
pub use trace::{
    MOONCAKE_BLOCK_TOKENS, Request, SyntheticParams, TraceError, parse_mooncake, synthetic,
};
