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
//! the message cannot hold. [`Subscriber`] follows many engines over
//! ZeroMQ (a pure-Rust implementation, tested against libzmq through
//! pyzmq), tracks sequence numbers, heals gaps by replay and clears a pod
//! whose gap cannot be replayed.
//!
//! A gateway wires engines' streams to its index in a few lines:
//!
//! ```no_run
//! # async fn wire() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use router_core::{PodDirectory, PodKey};
//! use router_events::{PodStream, Subscriber};
//! use router_hash::ChainHasher;
//! use router_index::{Index, IndexConfig};
//!
//! let index = Index::<4>::new(IndexConfig::default());
//! let hasher = Arc::new(ChainHasher::new(16)?); // the engines' block size
//! let events = Subscriber::new(hasher, index.clone(), index.clone(), Some("Qwen/Qwen3-8B".into()), 16);
//! let pod = index.join(&PodKey::new("http://10.0.0.7:8000", 0))?;
//! events.add(PodStream::new(pod, "tcp://10.0.0.7:5557").replay("tcp://10.0.0.7:5558").topic("kv-events"));
//! // ... route with `index` as a `PrefixIndex`; when the pod goes away:
//! events.remove(pod);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod decode;
mod encode;
mod error;
mod ingest;
mod metrics;
mod msgpack;
mod sequence;
mod subscriber;

pub use decode::{BlockRemoved, BlockStored, EngineEvent, EventBatch, decode_batch};
pub use encode::{Encoding, WireEvent, encode_batch};
pub use error::DecodeError;
pub use ingest::{IngestStats, Ingestor, KnownBlock, tier_of};
pub use metrics::{EngineMetrics, MetricsError, parse_engine_metrics};
pub use sequence::{Sequencer, Verdict};
pub use subscriber::{
    BatchSink, ClearHook, ClearReason, PodHealth, PodStream, StreamStats, Subscriber, live_frame,
    replay_frame,
};
