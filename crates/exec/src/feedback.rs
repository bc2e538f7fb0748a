//! The engine's reported cache hits against the router's prediction.

use std::sync::Arc;

use parking_lot::Mutex;
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodId, Tier};

/// Running totals of predicted against actual cached tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FeedbackStats {
    /// Responses that reported cached tokens.
    pub reports: u64,
    /// Cached tokens the router predicted for them.
    pub predicted_tokens: u64,
    /// Cached tokens the engines reported.
    pub actual_tokens: u64,
    /// Reports with fewer cached tokens than predicted.
    pub misses: u64,
    /// Blocks removed from the index after misses.
    pub corrected_blocks: u64,
}

impl FeedbackStats {
    /// Predicted minus actual cached tokens, summed: how much the index
    /// over-claims (negative: it under-claims).
    pub fn difference(&self) -> i64 {
        self.predicted_tokens as i64 - self.actual_tokens as i64
    }
}

/// Compares reported cache hits with predictions and, optionally, corrects
/// the index: a pod that missed predicted blocks loses them.
pub struct Feedback {
    block_size: u64,
    corrector: Option<Arc<dyn CacheEventSink>>,
    stats: Mutex<FeedbackStats>,
}

impl std::fmt::Debug for Feedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feedback")
            .field("block_size", &self.block_size)
            .field("corrects", &self.corrector.is_some())
            .field("stats", &*self.stats.lock())
            .finish()
    }
}

impl Feedback {
    /// Feedback for engines with `block_size`-token blocks, observing only.
    pub fn new(block_size: u64) -> Self {
        Feedback {
            block_size: block_size.max(1),
            corrector: None,
            stats: Mutex::new(FeedbackStats::default()),
        }
    }

    /// Also removes missed blocks from `index`.
    pub fn correcting(mut self, index: Arc<dyn CacheEventSink>) -> Self {
        self.corrector = Some(index);
        self
    }

    /// The engines' block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The totals so far.
    pub fn stats(&self) -> FeedbackStats {
        *self.stats.lock()
    }

    /// Records one report: the router predicted `predicted_blocks` of
    /// `chain` cached on `pod`; the engine reported `cached_tokens`.
    pub fn observe(
        &self,
        pod: PodId,
        chain: &[BlockHash],
        predicted_blocks: u32,
        cached_tokens: u64,
    ) {
        let predicted_tokens = predicted_blocks as u64 * self.block_size;
        let actual_blocks = (cached_tokens / self.block_size).min(u32::MAX as u64) as u32;
        let mut missed: &[BlockHash] = &[];
        {
            let mut s = self.stats.lock();
            s.reports += 1;
            s.predicted_tokens += predicted_tokens;
            s.actual_tokens += cached_tokens;
            if actual_blocks < predicted_blocks {
                s.misses += 1;
                let end = (predicted_blocks as usize).min(chain.len());
                let start = (actual_blocks as usize).min(end);
                missed = &chain[start..end];
            }
        }
        if let (Some(index), false) = (&self.corrector, missed.is_empty()) {
            let event = CacheEvent::Removed {
                pod,
                tier: Tier::Gpu,
                blocks: missed.to_vec(),
            };
            // A departed pod has nothing to correct; not an error here.
            if index.apply(&event).is_ok() {
                self.stats.lock().corrected_blocks += missed.len() as u64;
            }
        }
    }
}
