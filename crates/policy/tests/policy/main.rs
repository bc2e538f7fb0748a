//! Integration tests of router-policy.

mod config;
mod hashing;
mod hot_prefix;
mod plugins;
mod profile;
mod speculative;

use router_core::PodId;
use router_policy::{PodState, Role};

/// `n` idle, healthy pods of role `Both` in slots `0..n`.
pub(crate) fn pods(n: usize) -> Vec<PodState> {
    (0..n)
        .map(|i| PodState::new(PodId::new(i as u16, 0), Role::Both))
        .collect()
}
