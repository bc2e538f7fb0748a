use crate::{
    BlockHash, CacheEvent, Error, GroupChange, GroupSpec, Namespace, PodId, PodKey, PrefixMatch,
    Tier, TierCounts,
};

/// Turns tokens into a cumulative block-hash chain.
///
/// Block `i` hashes its tokens and extra keys together with the hash of block
/// `i - 1`; block 0's parent is [`BlockHasher::root`] of the namespace. The
/// data layer's event ingestion computes router hashes through this trait, so
/// a request and an engine event for the same tokens meet on the same hash.
/// Implementations must be deterministic across processes and machines.
pub trait BlockHasher: Send + Sync {
    /// The parent hash of block 0 for a namespace.
    fn root(&self, namespace: &Namespace) -> BlockHash;

    /// The hash of one block given its parent's hash, its tokens and its
    /// extra keys (for example multimodal content hashes).
    fn hash_block(&self, parent: BlockHash, tokens: &[u32], extra_keys: &[u64]) -> BlockHash;

    /// Hashes the full blocks of `tokens` after `parent`, appending to `out`.
    /// A trailing partial block is ignored. `block_size` must not be zero;
    /// if it is, nothing is appended.
    fn extend_chain(
        &self,
        parent: BlockHash,
        tokens: &[u32],
        block_size: usize,
        out: &mut Vec<BlockHash>,
    ) {
        if block_size == 0 {
            return;
        }
        let mut prev = parent;
        for block in tokens.chunks_exact(block_size) {
            prev = self.hash_block(prev, block, &[]);
            out.push(prev);
        }
    }
}

/// Answers "which live pods hold the longest prefix of this chain".
pub trait PrefixIndex: Send + Sync {
    /// Fills `out` (after resetting it) with every live pod holding at least
    /// the first block of `chain` and the number of leading blocks it holds,
    /// ranked longest first.
    fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch);

    /// Like [`PrefixIndex::match_prefix_into`], into a fresh result.
    fn match_prefix(&self, chain: &[BlockHash]) -> PrefixMatch {
        let mut out = PrefixMatch::new(chain.len());
        self.match_prefix_into(chain, &mut out);
        out
    }

    /// For one pod, how many of the first `depth` blocks of `chain` sit in
    /// each tier. Meant for the chosen pod only (it is off the hot path).
    /// `None` when the index does not track tiers or does not know the pod.
    fn tier_counts(&self, pod: PodId, chain: &[BlockHash], depth: usize) -> Option<TierCounts> {
        let _ = (pod, chain, depth);
        None
    }

    /// The longest hit of at most `full` leading blocks of `chain` that
    /// `pod`'s engine would accept if its full-attention group held them
    /// all: `full` itself unless a hybrid model's other groups (what this
    /// index knows of them) cut it short. For estimates made beside the
    /// index (speculative registrations), so they obey the same rule.
    fn accepted_hit(&self, pod: PodId, chain: &[BlockHash], full: usize) -> usize {
        let _ = (pod, chain);
        full
    }
}

/// Applies cache events to an index.
pub trait CacheEventSink: Send + Sync {
    /// Applies one event. Events are idempotent. An event that cannot apply
    /// (unknown or departed pod) returns a typed error and changes nothing.
    fn apply(&self, event: &CacheEvent) -> Result<(), Error>;

    /// Applies events in order, returning how many were refused. Sinks that
    /// can batch override this.
    fn apply_all(&self, events: &[CacheEvent]) -> usize {
        events.iter().filter(|e| self.apply(e).is_err()).count()
    }

    /// Applies a `CacheEvent::Stored` of `blocks` that extend `parent`, the
    /// chain's block before `blocks[0]` (`None` for a chain's first blocks
    /// or when it is not known), as engines' events name it. The result is
    /// the same event's; a sink that can use the parent (router-index keeps
    /// run hints across events with it) overrides this.
    fn apply_stored(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: Vec<BlockHash>,
    ) -> Result<(), Error> {
        let _ = parent;
        self.apply(&CacheEvent::Stored { pod, tier, blocks })
    }

    /// Applies a store or removal of `blocks` (router hashes of the main
    /// chain's positions) in one of a hybrid model's other KV-cache groups
    /// (`spec`: sliding window, Mamba, ...). Sinks that keep one group per
    /// pod refuse with [`Error::GroupsUnsupported`]: their predictions are
    /// then the full-attention upper bound.
    fn apply_group(
        &self,
        pod: PodId,
        spec: &GroupSpec,
        tier: Tier,
        change: GroupChange,
        blocks: &[BlockHash],
    ) -> Result<(), Error> {
        let _ = (pod, spec, tier, change, blocks);
        Err(Error::GroupsUnsupported)
    }
}

/// Pod lifecycle: external keys in, compact ids out.
pub trait PodDirectory: Send + Sync {
    /// Registers a pod (or returns its id if it is already live).
    fn join(&self, key: &PodKey) -> Result<PodId, Error>;

    /// The live id of a registered pod.
    fn pod_id(&self, key: &PodKey) -> Option<PodId>;

    /// The key of a live pod.
    fn pod_key(&self, id: PodId) -> Option<PodKey>;

    /// Shuts a pod down: queries stop seeing it at once; its state is
    /// cleared afterwards. Unknown pods are an error.
    fn shutdown(&self, id: PodId) -> Result<(), Error>;
}

/// Forwards the traits through smart pointers, so an `Arc<Index>` (how an
/// index is shared between the gateway and its event threads) is itself a
/// `PrefixIndex`, and `Box<dyn PrefixIndex>` works where a generic is wanted.
macro_rules! forward {
    ($($ptr:ty),*) => {$(
        impl<T: BlockHasher + ?Sized> BlockHasher for $ptr {
            fn root(&self, namespace: &Namespace) -> BlockHash {
                (**self).root(namespace)
            }
            fn hash_block(&self, parent: BlockHash, tokens: &[u32], extra_keys: &[u64]) -> BlockHash {
                (**self).hash_block(parent, tokens, extra_keys)
            }
            fn extend_chain(&self, parent: BlockHash, tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
                (**self).extend_chain(parent, tokens, block_size, out)
            }
        }

        impl<T: PrefixIndex + ?Sized> PrefixIndex for $ptr {
            fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
                (**self).match_prefix_into(chain, out)
            }
            fn tier_counts(&self, pod: PodId, chain: &[BlockHash], depth: usize) -> Option<TierCounts> {
                (**self).tier_counts(pod, chain, depth)
            }
            fn accepted_hit(&self, pod: PodId, chain: &[BlockHash], full: usize) -> usize {
                (**self).accepted_hit(pod, chain, full)
            }
        }

        impl<T: CacheEventSink + ?Sized> CacheEventSink for $ptr {
            fn apply(&self, event: &CacheEvent) -> Result<(), Error> {
                (**self).apply(event)
            }
            fn apply_all(&self, events: &[CacheEvent]) -> usize {
                (**self).apply_all(events)
            }
            fn apply_stored(&self, pod: PodId, tier: Tier, parent: Option<BlockHash>, blocks: Vec<BlockHash>) -> Result<(), Error> {
                (**self).apply_stored(pod, tier, parent, blocks)
            }
            fn apply_group(&self, pod: PodId, spec: &GroupSpec, tier: Tier, change: GroupChange, blocks: &[BlockHash]) -> Result<(), Error> {
                (**self).apply_group(pod, spec, tier, change, blocks)
            }
        }

        impl<T: PodDirectory + ?Sized> PodDirectory for $ptr {
            fn join(&self, key: &PodKey) -> Result<PodId, Error> {
                (**self).join(key)
            }
            fn pod_id(&self, key: &PodKey) -> Option<PodId> {
                (**self).pod_id(key)
            }
            fn pod_key(&self, id: PodId) -> Option<PodKey> {
                (**self).pod_key(id)
            }
            fn shutdown(&self, id: PodId) -> Result<(), Error> {
                (**self).shutdown(id)
            }
        }
    )*};
}

forward!(&T, Box<T>, std::sync::Arc<T>);
