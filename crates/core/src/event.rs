use crate::{BlockHash, PodId, Tier};

/// A change to what a pod holds, in the router's own terms.
///
/// Event sources (engine subscribers, simulators) produce these; sinks (the
/// index) apply them. Hashes here are router hashes, already translated from
/// whatever the engine announced. Applying an event is idempotent: storing a
/// held block or removing an absent one changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheEvent {
    /// The pod now holds these blocks in `tier`.
    Stored {
        /// The pod that stored them.
        pod: PodId,
        /// Where they are stored.
        tier: Tier,
        /// The blocks, in chain order.
        blocks: Vec<BlockHash>,
    },
    /// The pod dropped these blocks from `tier`.
    Removed {
        /// The pod that dropped them.
        pod: PodId,
        /// The tier they left.
        tier: Tier,
        /// The blocks.
        blocks: Vec<BlockHash>,
    },
    /// The pod dropped every block in every tier (an engine reset).
    Cleared {
        /// The pod.
        pod: PodId,
    },
    /// The pod is gone: stop routing to it and forget what it held.
    PodShutdown {
        /// The pod.
        pod: PodId,
    },
}

impl CacheEvent {
    /// The pod the event is about.
    pub fn pod(&self) -> PodId {
        match self {
            CacheEvent::Stored { pod, .. }
            | CacheEvent::Removed { pod, .. }
            | CacheEvent::Cleared { pod }
            | CacheEvent::PodShutdown { pod } => *pod,
        }
    }
}
