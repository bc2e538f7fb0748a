//! The engine cost model: how long one batched engine step takes.
//!
//! An engine runs continuous batching with chunked prefill (vLLM's default
//! scheduler): each step decodes one token for every running request past
//! its prefill and fills the rest of a token budget with prefill chunks,
//! oldest request first. A step's time is
//!
//! ```text
//! step = overhead
//!      + per_token      * (decode tokens + prefill tokens)
//!      + attention      * sum over prefill chunks of (chunk * context so far)
//!      + kv_read        * sum over decoding requests of their context
//!      + cpu_load       * blocks loaded back from the CPU tier this step
//! ```
//!
//! The defaults model an 8B-parameter dense model (Llama-3-8B or Qwen3-8B
//! shapes: 32 layers, hidden 4096, 8 KV heads of 128) on one H100:
//! - `overhead` 5 ms: one step reads the 16 GB of weights at ~3.3 TB/s.
//! - `per_token` 40 us: 2 x 8e9 FLOPs per token at ~400 TFLOP/s effective.
//! - `attention` 1.3 ns per (new token x context token): 4 x 32 x 4096
//!   FLOPs at the same rate.
//! - `kv_read` 43 ns per context token of a decoding request: 128 KiB of KV
//!   per token (32 layers x 2 x 8 x 128 x 2 bytes) at ~3 TB/s.
//! - `cpu_load` 0.25 ms per 512-token block: 64 MiB over PCIe at ~25 GB/s.
//!
//! The figures are round numbers from the hardware's datasheet rates, not
//! measurements of an engine; what the simulator compares is policies
//! under one model, where the ratios matter more than the absolute times.

/// Constants of the step-time model (see the module docs).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct CostModel {
    /// Fixed time per step, milliseconds.
    pub overhead_ms: f64,
    /// Time per token in the step, microseconds.
    pub per_token_us: f64,
    /// Attention time per (prefill token x context token), nanoseconds.
    pub attention_ns: f64,
    /// KV read time per context token of a decoding request, nanoseconds.
    pub kv_read_ns: f64,
    /// Time to load one block back from the CPU tier, milliseconds.
    pub cpu_load_ms: f64,
    /// Token budget of one step (prefill chunks plus decode tokens).
    pub token_budget: u64,
    /// Most requests running at once on one pod.
    pub max_batch: usize,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            overhead_ms: 5.0,
            per_token_us: 40.0,
            attention_ns: 1.3,
            kv_read_ns: 43.0,
            cpu_load_ms: 0.25,
            token_budget: 8192,
            max_batch: 128,
        }
    }
}
