//! cache-router: route LLM inference requests to the pod that already holds
//! the longest cached KV prefix of the prompt.
//!
//! This facade re-exports the layer crates so an application can depend on
//! one crate. Libraries that plug into a single layer should depend on that
//! layer's crate (and on [`core`]) instead.
//!
//! - [`core`]: block hashes, pods, tiers, cache events and the traits that
//!   glue the layers.
//! - [`hash`]: text to tokens to full blocks to a stable cumulative hash chain.
//! - [`index`]: the sharded bitmap index answering the longest cached prefix per pod.
//! - [`events`]: engine KV-cache event batches decoded and ingested in router hashes.
//! - [`policy`]: filters, scorers and pickers composed into validated profiles.
//! - [`exec`]: single-step and prefill->decode workflows, retries, accounting, feedback.
//! - [`service`] and [`Router`] (the default `service` feature): every layer
//!   wired into one routing core, built from a TOML config or in code, with
//!   `pick` for fronts that send requests themselves and `route` for
//!   proxies.
//!
//! ```
//! use cache_router::core::{BlockHasher, Namespace};
//! use cache_router::hash::ChainHasher;
//!
//! let hasher = ChainHasher::new(4).unwrap();
//! let chain = hasher.chain(&Namespace::model("qwen3"), &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
//! assert_eq!(chain.len(), 2); // the ninth token does not fill a block
//! ```
#![forbid(unsafe_code)]

pub use router_core as core;
pub use router_events as events;
pub use router_exec as exec;
pub use router_hash as hash;
pub use router_index as index;
pub use router_policy as policy;
#[cfg(feature = "service")]
pub use router_service as service;
#[cfg(feature = "service")]
pub use router_service::Router;

/// The README's code, compiled and run as a doc test so it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
