use std::fmt;
use std::sync::Arc;

/// The stable, external identity of a pod: its endpoint and data-parallel rank.
///
/// Each data-parallel rank of an engine keeps its own KV cache and publishes
/// its own event stream, so it is a pod of its own.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    endpoint: Arc<str>,
    dp_rank: u32,
}

impl PodKey {
    /// A pod at `endpoint` (for example `http://10.0.0.7:8000`) and data-parallel rank `dp_rank`.
    pub fn new(endpoint: impl Into<Arc<str>>, dp_rank: u32) -> Self {
        PodKey {
            endpoint: endpoint.into(),
            dp_rank,
        }
    }

    /// The endpoint the pod serves on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The data-parallel rank within the endpoint.
    pub fn dp_rank(&self) -> u32 {
        self.dp_rank
    }
}

impl fmt::Debug for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodKey({}#{})", self.endpoint, self.dp_rank)
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.endpoint, self.dp_rank)
    }
}

/// The compact identity an index gives a pod: a slot plus the slot's epoch.
///
/// Slots index bitmaps and are reused after a pod leaves; the epoch counts
/// the owners a slot has had. Anything holding a `PodId` from before the
/// slot was reused carries the old epoch, so a sink can tell a late event of
/// a departed pod from an event of the slot's new owner.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId {
    slot: u16,
    epoch: u32,
}

impl PodId {
    /// The pod in `slot` during its `epoch`-th ownership.
    #[inline]
    pub const fn new(slot: u16, epoch: u32) -> Self {
        PodId { slot, epoch }
    }

    /// The bitmap slot.
    #[inline]
    pub const fn slot(self) -> u16 {
        self.slot
    }

    /// How many owners the slot had before this one.
    #[inline]
    pub const fn epoch(self) -> u32 {
        self.epoch
    }
}

impl fmt::Debug for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodId({}@{})", self.slot, self.epoch)
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.slot, self.epoch)
    }
}
