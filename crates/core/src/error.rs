use crate::{PodId, PodKey};

/// Why a trait call of this crate's vocabulary was refused.
///
/// Implementations return these for input they cannot apply; callers count
/// and log them. None of them leaves an index half-changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pod id names no live pod (never registered, or its slot has a
    /// newer owner).
    #[error("unknown pod {0}")]
    UnknownPod(PodId),
    /// The pod key is not registered.
    #[error("unknown pod {0}")]
    UnknownPodKey(PodKey),
    /// The pod has been shut down; its events are ignored.
    #[error("pod {0} is shut down")]
    PodShutDown(PodId),
    /// A store named a parent block the pod does not hold (a missed event
    /// upstream), and the index was asked to check parents.
    #[error("pod {pod} stored blocks after {parent}, a block it does not hold")]
    UnknownParent {
        /// The pod that sent the store.
        pod: PodId,
        /// The parent it named.
        parent: crate::BlockHash,
    },
    /// The sink keeps one group per pod (a plain index): a hybrid model's
    /// other groups need one that keeps them (router-index's `HybridIndex`).
    #[error("this index does not keep a hybrid model's other KV-cache groups")]
    GroupsUnsupported,
    /// Every pod slot is taken.
    #[error("no free pod slot: the index holds at most {limit} pods")]
    TooManyPods {
        /// The number of slots the index has.
        limit: usize,
    },
}
