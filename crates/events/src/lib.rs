//! Engine KV-cache events in, router cache events out.
//!
//! vLLM and SGLang publish what their prefix caches store and evict as
//! MessagePack batches over ZeroMQ. This crate decodes every encoding they
//! have shipped ([`decode_batch`]) and turns the events into
//! `router-core` cache events in the router's own hashes ([`Ingestor`]):
//! engines' hashes are not reproducible across processes, so the router
//! recomputes each stored block's hash from its tokens and its parent's
//! router hash, and keeps a per-pod map from engine hash to router hash for
//! removals.
//!
//! Decoding is strict and total: truncated, oversized or ill-typed input is
//! a [`DecodeError`], never a panic, and nothing is allocated for a length
//! the message cannot hold.
//!
//! ```
//! use router_core::{BlockHash, BlockHasher, CacheEventSink, Namespace, PodDirectory, PodKey, PrefixIndex};
//! use router_events::{Ingestor, decode_batch};
//! # struct Sum;
//! # impl BlockHasher for Sum {
//! #     fn root(&self, _: &Namespace) -> BlockHash { BlockHash(1) }
//! #     fn hash_block(&self, p: BlockHash, t: &[u32], _: &[u64]) -> BlockHash {
//! #         BlockHash(p.0.wrapping_mul(31) + t.iter().map(|&x| x as u64).sum::<u64>())
//! #     }
//! # }
//! # fn wire(index: std::sync::Arc<impl CacheEventSink + PodDirectory + PrefixIndex + 'static>, payload: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! // A gateway wires a pod's event stream to its index:
//! let pod = index.join(&PodKey::new("http://10.0.0.7:8000", 0))?;
//! let mut ingest = Ingestor::new(Sum, index.clone(), Some("Qwen/Qwen3-8B".into()), 16);
//! ingest.apply_batch(pod, &decode_batch(payload)?);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod decode;
mod error;
mod ingest;
mod msgpack;

pub use decode::{BlockRemoved, BlockStored, EngineEvent, EventBatch, decode_batch};
pub use error::DecodeError;
pub use ingest::{IngestStats, Ingestor, tier_of};
