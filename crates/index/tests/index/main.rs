//! Integration tests of router-index: properties against the linear oracle
//! and a model, lifecycle, tiers, bad input and a multi-threaded stress test.

mod lifecycle;
mod props;
mod stress;
mod tiers;

use std::sync::Arc;

use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodId, PodKey, Tier};
use router_index::{Index, IndexConfig};

/// An index swept by hand, so tests decide when sweeps happen.
pub(crate) fn manual_index() -> Arc<Index> {
    Index::new(IndexConfig::default().background_sweep(false))
}

pub(crate) fn key(i: usize) -> PodKey {
    PodKey::new(format!("http://pod-{i}:8000"), 0)
}

pub(crate) fn join_n(index: &impl PodDirectory, n: usize) -> Vec<PodId> {
    (0..n).map(|i| index.join(&key(i)).unwrap()).collect()
}

pub(crate) fn chain(seed: u64, n: usize) -> Vec<BlockHash> {
    (0..n as u64).map(|i| BlockHash(seed << 32 | i)).collect()
}

pub(crate) fn store(index: &impl CacheEventSink, pod: PodId, blocks: &[BlockHash]) {
    index
        .apply(&CacheEvent::Stored {
            pod,
            tier: Tier::Gpu,
            blocks: blocks.to_vec(),
        })
        .unwrap();
}
