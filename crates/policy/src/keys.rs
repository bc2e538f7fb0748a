//! The context keys the built-in plugins share.

use router_core::{BlockHash, PodId, PrefixMatch};

use crate::context::Key;

/// The request's block-hash chain (an input, set by the caller).
pub const CHAIN: Key<Vec<BlockHash>> = Key::new("chain");
/// The request's prompt length in tokens (an input).
pub const PROMPT_TOKENS: Key<u64> = Key::new("prompt_tokens");
/// A session or conversation id (an input, for affinity).
pub const SESSION_ID: Key<String> = Key::new("session_id");
/// A key for consistent hashing, such as a hash of the user or the prefix
/// (an input).
pub const HASH_KEY: Key<u64> = Key::new("hash_key");
/// The request's arrival time in milliseconds on the caller's clock (an
/// optional input): plugins with memory (speculative registrations, the
/// approximate tree) read time from it, so a simulator can replay a trace
/// faster than real time. Without it they use a monotonic wall clock.
pub const NOW_MS: Key<u64> = Key::new("now_ms");
/// The index's answer for the request's chain, produced by the
/// `prefix-match` prepare plugin (or set by a caller that queried already).
pub const CACHE_HITS: Key<CacheHits> = Key::new("cache_hits");

/// Matched blocks per pod, with constant-time lookup by pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheHits {
    chain_len: usize,
    best: u32,
    by_slot: Vec<(u32, u32)>,
}

impl CacheHits {
    /// Builds the lookup from an index's ranked answer.
    pub fn from_match(m: &PrefixMatch) -> Self {
        let max_slot = m.pods().iter().map(|p| p.pod.slot() as usize).max();
        let mut by_slot = vec![(u32::MAX, 0); max_slot.map_or(0, |s| s + 1)];
        for p in m.pods() {
            by_slot[p.pod.slot() as usize] = (p.pod.epoch(), p.blocks);
        }
        CacheHits {
            chain_len: m.chain_len(),
            best: m.best().map_or(0, |b| b.blocks),
            by_slot,
        }
    }

    /// No pod holds anything of a chain of `chain_len` blocks.
    pub fn empty(chain_len: usize) -> Self {
        CacheHits {
            chain_len,
            ..CacheHits::default()
        }
    }

    /// Raises `pod`'s matched blocks to at least `blocks` (capped at the
    /// chain's length): what another source, such as the router's own
    /// routing, says the pod holds.
    pub fn raise(&mut self, pod: PodId, blocks: u32) {
        let blocks = blocks.min(self.chain_len.min(u32::MAX as usize) as u32);
        let slot = pod.slot() as usize;
        if self.by_slot.len() <= slot {
            self.by_slot.resize(slot + 1, (u32::MAX, 0));
        }
        let entry = &mut self.by_slot[slot];
        if entry.0 != pod.epoch() {
            *entry = (pod.epoch(), 0);
        }
        entry.1 = entry.1.max(blocks);
        self.best = self.best.max(entry.1);
    }

    /// Lowers `pod`'s matched blocks to at most `blocks`: what a model of
    /// the pod's cache says will be left of them when the request runs.
    pub fn lower(&mut self, pod: PodId, blocks: u32) {
        let Some(entry) = self.by_slot.get_mut(pod.slot() as usize) else {
            return;
        };
        if entry.0 != pod.epoch() || entry.1 <= blocks {
            return;
        }
        let was = entry.1;
        entry.1 = blocks;
        if was == self.best {
            self.best = self.by_slot.iter().map(|e| e.1).max().unwrap_or(0);
        }
    }

    /// Blocks of the chain `pod` holds (0 if none).
    #[inline]
    pub fn blocks(&self, pod: PodId) -> u32 {
        match self.by_slot.get(pod.slot() as usize) {
            Some(&(epoch, blocks)) if epoch == pod.epoch() => blocks,
            _ => 0,
        }
    }

    /// The longest match of any pod.
    pub fn best(&self) -> u32 {
        self.best
    }

    /// The request chain's length in blocks.
    pub fn chain_len(&self) -> usize {
        self.chain_len
    }
}
