/// The 64-bit odd constant of Fibonacci hashing and of SplitMix64's
/// counter: 2^64 divided by the golden ratio.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Stafford's "Mix13"): a bijection on `u64` whose
/// every output bit depends on every input bit.
///
/// The one mixer of cache-router: the index's in-shard hasher, seeded
/// random streams (`mix64(state += GOLDEN_GAMMA)` is SplitMix64),
/// rendezvous weights, synthetic block ids. It is not a hash of bytes and
/// not keyed: never feed it attacker-chosen values where collisions would
/// hurt; block hashes are XXH3 (`router-hash`).
///
/// ```
/// use router_core::mix64;
/// assert_eq!(mix64(0), 0);
/// assert_ne!(mix64(1), mix64(2));
/// assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
/// ```
#[inline]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
