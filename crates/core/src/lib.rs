//! The shared vocabulary of cache-router and the traits that glue its layers.
//!
//! cache-router is split into a data layer (hashing, the index, engine
//! events), a decision layer (policies) and an execution layer. The layers
//! never name each other's concrete types: they meet here. This crate is
//! therefore kept tiny and dependency-free (the way `tower-service` is), so
//! that an embedder can swap any layer for their own by implementing a trait
//! from this crate.
//!
//! # Items
//!
//! - Blocks: [`BlockHash`] (one node of a cumulative hash chain) and
//!   [`Namespace`] (model, adapter and cache salt that seed a chain).
//! - Pods: [`PodKey`] (stable external identity: endpoint plus data-parallel
//!   rank) and [`PodId`] (the compact slot the index uses, with an epoch so a
//!   reused slot is never confused with its previous owner).
//! - Storage: [`Tier`] and [`TierCounts`].
//! - Results: [`PodMatch`] and [`PrefixMatch`], the ranked answer to "which
//!   pods hold the longest prefix of this chain".
//! - Events: [`CacheEvent`], what event sources produce and sinks apply.
//! - Hybrid models: [`GroupSpec`] and [`GroupKind`] (a KV-cache group and
//!   the hit its layers accept), [`combined_hit`] (the engine's rule over
//!   all groups).
//! - Mixing: [`mix64`], the one 64-bit mixer every crate uses.
//! - Traits: [`BlockHasher`] (tokens to chain), [`PrefixIndex`] (query),
//!   [`CacheEventSink`] (apply events), [`PodDirectory`] (pod lifecycle).
//!
//! # Example
//!
//! ```
//! use router_core::{BlockHash, PodId, PodMatch, PrefixMatch};
//!
//! let mut m = PrefixMatch::new(4);
//! m.push(PodMatch { pod: PodId::new(3, 0), blocks: 2 });
//! m.push(PodMatch { pod: PodId::new(1, 0), blocks: 4 });
//! m.rank();
//! assert_eq!(m.best().map(|b| b.pod.slot()), Some(1));
//! assert_eq!(m.blocks_for(PodId::new(3, 0)), 2);
//! # let _ = BlockHash(7);
//! ```
#![forbid(unsafe_code)]

mod block;
mod error;
mod event;
mod group;
mod matching;
mod mix;
mod pod;
mod tier;
mod traits;

pub use block::{BlockHash, Namespace};
pub use error::Error;
pub use event::CacheEvent;
pub use group::{GroupChange, GroupError, GroupKind, GroupSpec, combined_hit};
pub use matching::{PodMatch, PrefixMatch};
pub use mix::{GOLDEN_GAMMA, mix64};
pub use pod::{PodId, PodKey};
pub use tier::{Tier, TierCounts};
pub use traits::{BlockHasher, CacheEventSink, PodDirectory, PrefixIndex};
