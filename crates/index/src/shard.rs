//! The sharded block map.
//!
//! Sharding rules (the index depends on them):
//! - the shard count is a power of two (`1 << shard_bits`, 256 by default);
//! - each shard is `CachePadded`, so two shards' locks never share a line;
//! - the shard is picked from the **top** bits of `h * 0x9E3779B97F4A7C15`
//!   (Fibonacci hashing), which spreads even small sequential keys such as
//!   trace block ids;
//! - the in-shard map hashes keys with [`MixHasher`], a full-avalanche mix
//!   (MurmurHash3's finaliser) unrelated to the Fibonacci product, because
//!   hashbrown takes its SIMD tags from the top 7 bits of the hash: reusing
//!   the shard bits there would give every key of a shard the same tag.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crossbeam_utils::CachePadded;

use crate::holders::{Holders, Slab};
use crate::sync::RwLock;

const FIBONACCI: u64 = router_core::GOLDEN_GAMMA;

/// The shard of a block hash among `1 << bits` shards.
#[inline]
pub(crate) fn shard_of(hash: u64, bits: u32) -> usize {
    hash.wrapping_mul(FIBONACCI)
        .checked_shr(64 - bits)
        .unwrap_or(0) as usize
}

/// The in-shard hasher: [`router_core::mix64`] over the key.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; this keeps the hasher total.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = router_core::mix64(self.0 ^ v);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type BlockMap = HashMap<u64, Holders, BuildHasherDefault<MixHasher>>;

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
        // hashbrown: one (key, value) slot plus one control byte per bucket.
        let bucket = std::mem::size_of::<(u64, Holders)>() + 1;
        self.map.capacity() * bucket + self.slab.bytes()
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

    #[test]
    fn in_shard_hash_tags_vary_within_a_shard() {
        // Keys of one shard must not share hashbrown's top-7-bit tag.
        let keys: Vec<u64> = (0..100_000u64).filter(|k| shard_of(*k, 8) == 3).collect();
        let mut tags = std::collections::HashSet::new();
        for k in &keys {
            let mut h = MixHasher::default();
            h.write_u64(*k);
            tags.insert(h.finish() >> 57);
        }
        assert!(keys.len() > 200);
        assert!(tags.len() > 100, "only {} distinct tags", tags.len());
    }
}
