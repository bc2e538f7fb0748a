//! The sharded block map.
//!
//! Sharding rules (the index depends on them):
//! - the shard count is a power of two (`1 << shard_bits`, 256 by default);
//! - each shard is `CachePadded`, so two shards' locks never share a line;
//! - the shard is picked from the **top** bits of `h * 0x9E3779B97F4A7C15`
//!   (Fibonacci hashing), which spreads even small sequential keys such as
//!   trace block ids;
//! - the in-shard map ([`BlockMap`], `table.rs`) places keys by
//!   `router_core::mix64`, a full-avalanche mix unrelated to the Fibonacci
//!   product: reusing the shard bits would crowd a shard's keys together.

use crossbeam_utils::CachePadded;

use crate::holders::Slab;
use crate::sync::RwLock;
pub(crate) use crate::table::BlockMap;

const FIBONACCI: u64 = router_core::GOLDEN_GAMMA;

/// The shard of a block hash among `1 << bits` shards.
#[inline]
pub(crate) fn shard_of(hash: u64, bits: u32) -> usize {
    hash.wrapping_mul(FIBONACCI)
        .checked_shr(64 - bits)
        .unwrap_or(0) as usize
}

/// One shard's state, behind its lock.
#[derive(Debug, Default)]
pub(crate) struct ShardInner<const W: usize> {
    pub(crate) map: BlockMap,
    pub(crate) slab: Slab<W>,
    /// Sum over entries of the pods holding them.
    pub(crate) residencies: u64,
}

impl<const W: usize> ShardInner<W> {
    /// Bytes allocated by the shard's map and slab.
    pub(crate) fn bytes(&self) -> usize {
        self.map.bytes() + self.slab.bytes()
    }
}

pub(crate) type Shard<const W: usize> = CachePadded<RwLock<ShardInner<W>>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_keys_spread_over_shards() {
        let mut counts = [0usize; 256];
        for k in 0..256 * 64u64 {
            counts[shard_of(k, 8)] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min >= 32 && *max <= 96, "min {min} max {max}");
        assert_eq!(shard_of(12345, 0), 0);
    }
}
