//! Which shard, and which bucket within it, a block hash goes to.
//!
//! Sharding rules (the index depends on them):
//! - the shard count is a power of two (`1 << shard_bits`, 256 by default);
//! - each shard is `CachePadded`, so two shards' sequence words and mutexes
//!   never share a line;
//! - the shard is picked from the **top** bits of `h * 0x9E3779B97F4A7C15`
//!   (Fibonacci hashing), which spreads even small sequential keys such as
//!   trace block ids;
//! - within the shard the bucket comes from the **low** bits of [`mix`], a
//!   full-avalanche mix (MurmurHash3's finaliser) unrelated to the Fibonacci
//!   product: reusing the shard bits would crowd a shard's keys into a few
//!   buckets.

const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// The shard of a block hash among `1 << bits` shards.
#[inline]
pub(crate) fn shard_of(hash: u64, bits: u32) -> usize {
    hash.wrapping_mul(FIBONACCI)
        .checked_shr(64 - bits)
        .unwrap_or(0) as usize
}

/// The in-shard hash: MurmurHash3's 64-bit finaliser, unrelated to the
/// Fibonacci product, so the bits that pick the shard say nothing about the
/// bits that pick the bucket.
#[inline]
pub(crate) fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

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
    fn in_shard_buckets_spread_within_a_shard() {
        // Keys of one shard must not crowd into few buckets.
        let mut per_bucket = [0u32; 256];
        for k in (0..1_000_000u64).filter(|k| shard_of(*k, 8) == 3) {
            per_bucket[(mix(k) & 255) as usize] += 1;
        }
        // About 15 keys per bucket on average.
        let (min, max) = (
            per_bucket.iter().min().unwrap(),
            per_bucket.iter().max().unwrap(),
        );
        assert!(*min >= 3 && *max <= 40, "bucket loads from {min} to {max}");
    }
}
