//! Shared, seeded workloads and adapters that run them through
//! `router-index` and, with the `peers` feature, through the best open peer
//! indexes: SGLang Model Gateway's `kv-index` (`ChainIndex`) and NVIDIA
//! Dynamo's `dynamo-kv-router` (`ConcurrentRadixTreeCompressed` behind its
//! `ThreadPoolIndexer`), each driven the way its own benchmarks drive it.
//!
//! The `compare` binary prints the side-by-side tables; `benches/index.rs`
//! holds the criterion benchmarks of the index alone; the `cost` binary
//! runs one workload through one index for `scripts/instructions.sh`,
//! which counts its instructions under callgrind.

pub mod subject;
pub mod workload;

/// The `q`-quantile of sorted nanosecond samples, in microseconds.
pub fn quantile_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64 / 1000.0
}
