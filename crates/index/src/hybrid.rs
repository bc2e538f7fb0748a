//! A hybrid model's other KV-cache groups beside the bitmap index.
//!
//! The [`Index`] keeps the full-attention group: which pods hold each
//! block of a chain, and so each pod's longest held prefix. A hybrid
//! model's engine also needs its other groups (a sliding window, Mamba
//! state, chunked local attention) to serve a hit, and accepts the longest
//! prefix every group can serve ([`router_core::combined_hit`]).
//! [`HybridIndex`] keeps those groups' blocks per pod and shortens the
//! index's answer to that hit. Pods without other groups (every pod of a
//! non-hybrid model) cost one atomic load per query.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;
use router_core::{
    BlockHash, CacheEvent, CacheEventSink, Error, GroupChange, GroupSpec, PodDirectory, PodId,
    PodKey, PrefixIndex, PrefixMatch, Tier, TierCounts, combined_hit,
};

use crate::Index;

/// Block hashes are already mixed: the map uses them as they are.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockMap<V> = HashMap<BlockHash, V, BuildHasherDefault<PassThrough>>;

/// One pod's other groups: their specs, and per group the blocks it holds
/// with their tier bits.
#[derive(Debug, Default)]
struct PodGroups {
    specs: Vec<GroupSpec>,
    held: Vec<BlockMap<u8>>,
}

impl PodGroups {
    fn hit(&self, chain: &[BlockHash], max: usize) -> usize {
        combined_hit(&self.specs, max.min(chain.len()), |g, i| {
            self.held[g].contains_key(&chain[i])
        })
    }
}

/// The bitmap [`Index`] plus, per pod, a hybrid model's other KV-cache
/// groups; answers with the hit every group accepts.
///
/// It is a [`PrefixIndex`], a [`CacheEventSink`] (main-group events go to
/// the index; [`CacheEventSink::apply_group`] to the groups) and a
/// [`PodDirectory`]. Shut pods down through it, so their groups go too.
///
/// ```
/// use router_index::{BlockHash, HybridIndex, Index, IndexConfig, PodKey, Tier};
/// use router_index::{CacheEventSink, GroupChange, GroupKind, GroupSpec, PrefixIndex};
///
/// let index = HybridIndex::new(Index::new(IndexConfig::default()));
/// let pod = index.main().join(&PodKey::new("http://pod-a:8000", 0))?;
/// let chain: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
/// index.main().store(pod, Tier::Gpu, &chain)?; // full attention holds 8 blocks
/// // A window of 32 tokens over blocks of 16 needs 2 blocks ending at the hit.
/// let window = GroupSpec::new(1, GroupKind::SlidingWindow { window: 32 }, 16).unwrap();
/// index.apply_group(pod, &window, Tier::Gpu, GroupChange::Stored, &chain[2..4])?;
/// assert_eq!(index.match_prefix(&chain).blocks_for(pod), 4);
/// # Ok::<(), router_index::Error>(())
/// ```
#[derive(Debug)]
pub struct HybridIndex {
    main: Arc<Index>,
    pods: RwLock<HashMap<PodId, PodGroups>>,
    /// Pods with at least one other group: 0 skips the lock.
    hybrid_pods: AtomicUsize,
    /// The groups an operator declared every pod has, for pods no group
    /// event has described yet (a cold start, a cleared engine): holding
    /// nothing in them, such a pod serves only the hits they accept.
    declared: Vec<GroupSpec>,
}

impl HybridIndex {
    /// Groups kept beside `main`.
    pub fn new(main: Arc<Index>) -> Arc<Self> {
        Self::with_layout(main, Vec::new())
    }

    /// Groups kept beside `main`, every pod declared to have `groups`
    /// until its events describe its own (they replace the declaration).
    /// vLLM publishes a group only once it stores a block, so without a
    /// declaration the first requests of a hybrid model are predicted as
    /// full attention alone.
    pub fn with_layout(main: Arc<Index>, groups: Vec<GroupSpec>) -> Arc<Self> {
        Arc::new(HybridIndex {
            main,
            pods: RwLock::new(HashMap::new()),
            hybrid_pods: AtomicUsize::new(0),
            declared: groups,
        })
    }

    /// The hit of a pod no group event described: the declared groups,
    /// empty.
    fn undescribed(&self, full: usize) -> usize {
        if self.declared.is_empty() {
            full
        } else {
            combined_hit(&self.declared, full, |_, _| false)
        }
    }

    /// The full-attention index.
    pub fn main(&self) -> &Arc<Index> {
        &self.main
    }

    /// The other groups known of `pod`, by group index.
    pub fn groups(&self, pod: PodId) -> Vec<GroupSpec> {
        self.pods
            .read()
            .get(&pod)
            .map_or_else(Vec::new, |g| g.specs.clone())
    }

    /// Blocks `pod`'s group `group` holds (in any tier).
    pub fn group_blocks(&self, pod: PodId, group: u32) -> usize {
        let pods = self.pods.read();
        pods.get(&pod)
            .and_then(|g| {
                let at = g.specs.iter().position(|s| s.group == group)?;
                Some(g.held[at].len())
            })
            .unwrap_or(0)
    }

    /// How many leading blocks of `chain` `pod` can serve as a hit, given
    /// that full attention holds the first `full` of them.
    pub fn hit_for(&self, pod: PodId, chain: &[BlockHash], full: usize) -> usize {
        let full = full.min(chain.len());
        match self.pods.read().get(&pod) {
            Some(g) => g.hit(chain, full),
            None => self.undescribed(full),
        }
    }

    fn forget(&self, pod: PodId) {
        if self.pods.write().remove(&pod).is_some() {
            self.hybrid_pods.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl PrefixIndex for HybridIndex {
    fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
        self.main.match_prefix_into(chain, out);
        if out.is_empty()
            || (self.hybrid_pods.load(Ordering::Relaxed) == 0 && self.declared.is_empty())
        {
            return;
        }
        let pods = self.pods.read();
        out.limit(|m| match pods.get(&m.pod) {
            Some(g) => g.hit(chain, m.blocks as usize) as u32,
            None => self.undescribed(m.blocks as usize) as u32,
        });
    }

    fn tier_counts(&self, pod: PodId, chain: &[BlockHash], depth: usize) -> Option<TierCounts> {
        PrefixIndex::tier_counts(&*self.main, pod, chain, depth)
    }

    fn accepted_hit(&self, pod: PodId, chain: &[BlockHash], full: usize) -> usize {
        if self.hybrid_pods.load(Ordering::Relaxed) == 0 && self.declared.is_empty() {
            return full;
        }
        self.hit_for(pod, chain, full)
    }
}

impl CacheEventSink for HybridIndex {
    fn apply(&self, event: &CacheEvent) -> Result<(), Error> {
        self.main.apply_event(event)?;
        if let CacheEvent::Cleared { pod } | CacheEvent::PodShutdown { pod } = event {
            self.forget(*pod);
        }
        Ok(())
    }

    fn apply_stored(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: Vec<BlockHash>,
    ) -> Result<(), Error> {
        self.main.store_after(pod, tier, parent, &blocks)
    }

    fn apply_group(
        &self,
        pod: PodId,
        spec: &GroupSpec,
        tier: Tier,
        change: GroupChange,
        blocks: &[BlockHash],
    ) -> Result<(), Error> {
        // As the index refuses them: events of a pod that is not live.
        if self.main.pod_key(pod).is_none() {
            return Err(Error::UnknownPod(pod));
        }
        let bit = 1u8 << tier as u8;
        let mut pods = self.pods.write();
        let groups = match (pods.get_mut(&pod), change) {
            (Some(g), _) => g,
            // A removal from a pod with no groups changes nothing.
            (None, GroupChange::Removed) => return Ok(()),
            (None, GroupChange::Stored) => {
                self.hybrid_pods.fetch_add(1, Ordering::Relaxed);
                pods.entry(pod).or_default()
            }
        };
        let at = match groups.specs.iter().position(|s| s.group == spec.group) {
            Some(at) => {
                if groups.specs[at] != *spec && change == GroupChange::Stored {
                    // The group changed its kind or size (a restarted
                    // engine): what it held under the old one is void.
                    groups.specs[at] = *spec;
                    groups.held[at].clear();
                }
                at
            }
            None if change == GroupChange::Removed => return Ok(()),
            None => {
                let at = groups.specs.partition_point(|s| s.group < spec.group);
                groups.specs.insert(at, *spec);
                groups.held.insert(at, BlockMap::default());
                at
            }
        };
        let held = &mut groups.held[at];
        match change {
            GroupChange::Stored => {
                held.reserve(blocks.len());
                for b in blocks {
                    *held.entry(*b).or_insert(0) |= bit;
                }
            }
            GroupChange::Removed => {
                for b in blocks {
                    if let Some(t) = held.get_mut(b) {
                        *t &= !bit;
                        if *t == 0 {
                            held.remove(b);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl PodDirectory for HybridIndex {
    fn join(&self, key: &PodKey) -> Result<PodId, Error> {
        self.main.join(key)
    }

    fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        self.main.pod_id(key)
    }

    fn pod_key(&self, id: PodId) -> Option<PodKey> {
        self.main.pod_key(id)
    }

    fn shutdown(&self, id: PodId) -> Result<(), Error> {
        self.main.shutdown(id)?;
        self.forget(id);
        Ok(())
    }
}

#[cfg(all(test, not(router_loom)))]
mod tests {
    use super::*;
    use crate::IndexConfig;
    use router_core::GroupKind;

    fn setup() -> (Arc<HybridIndex>, PodId, PodId, Vec<BlockHash>) {
        let index = HybridIndex::new(Index::new(IndexConfig::default().background_sweep(false)));
        let a = index.join(&PodKey::new("http://a", 0)).unwrap();
        let b = index.join(&PodKey::new("http://b", 0)).unwrap();
        let chain: Vec<BlockHash> = (0..12u64).map(|i| BlockHash(0xabc0 + i)).collect();
        index.main().store(a, Tier::Gpu, &chain[..10]).unwrap();
        index.main().store(b, Tier::Gpu, &chain[..6]).unwrap();
        (index, a, b, chain)
    }

    #[test]
    fn a_window_shortens_the_hit_and_reranks() {
        let (index, a, b, chain) = setup();
        let sw = GroupSpec::new(1, GroupKind::SlidingWindow { window: 33 }, 16).unwrap();
        // Window 33 over blocks of 16: 2 blocks. Pod a's window holds only
        // blocks 2, 3: a hit of 4, under pod b's plain 6.
        index
            .apply_group(a, &sw, Tier::Gpu, GroupChange::Stored, &chain[2..4])
            .unwrap();
        let m = index.match_prefix(&chain);
        assert_eq!(m.blocks_for(a), 4);
        assert_eq!(m.blocks_for(b), 6);
        assert_eq!(m.best().map(|p| p.pod), Some(b));
        // Its window catches up at 8, 9: the whole prefix again.
        index
            .apply_group(a, &sw, Tier::Cpu, GroupChange::Stored, &chain[8..10])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 10);
        // Removed from another tier than it sits in: still held.
        index
            .apply_group(a, &sw, Tier::Gpu, GroupChange::Removed, &chain[8..10])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 10);
        index
            .apply_group(a, &sw, Tier::Cpu, GroupChange::Removed, &chain[9..10])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 4);
        assert_eq!(index.group_blocks(a, 1), 3);
    }

    #[test]
    fn groups_go_with_their_pod_and_refuse_dead_ones() {
        let (index, a, _, chain) = setup();
        let mamba = GroupSpec::new(2, GroupKind::Mamba, 16).unwrap();
        index
            .apply_group(a, &mamba, Tier::Gpu, GroupChange::Stored, &chain[..1])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 1);
        // An engine reset clears its groups: full attention alone again
        // (then refilled by new events).
        index.apply(&CacheEvent::Cleared { pod: a }).unwrap();
        assert!(index.groups(a).is_empty());
        index.main().store(a, Tier::Gpu, &chain[..10]).unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 10);
        index.shutdown(a).unwrap();
        assert_eq!(
            index.apply_group(a, &mamba, Tier::Gpu, GroupChange::Stored, &chain[..1]),
            Err(Error::UnknownPod(a))
        );
        assert_eq!(index.hybrid_pods.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_declared_layout_holds_until_events_describe_the_pod() {
        let index = HybridIndex::with_layout(
            Index::new(IndexConfig::default().background_sweep(false)),
            vec![GroupSpec::new(0, GroupKind::SlidingWindow { window: 33 }, 16).unwrap()],
        );
        let a = index.join(&PodKey::new("http://a", 0)).unwrap();
        let chain: Vec<BlockHash> = (0..12u64).map(|i| BlockHash(0xabc0 + i)).collect();
        index.main().store(a, Tier::Gpu, &chain[..10]).unwrap();
        // Declared, nothing held in the window: no hit at all.
        assert!(index.match_prefix(&chain).is_empty());
        assert_eq!(index.accepted_hit(a, &chain, 10), 0);
        // The pod's own event: its window holds blocks 4, 5.
        let sw = GroupSpec::new(3, GroupKind::SlidingWindow { window: 33 }, 16).unwrap();
        index
            .apply_group(a, &sw, Tier::Gpu, GroupChange::Stored, &chain[4..6])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 6);
        // A reset: back to the declaration.
        index.apply(&CacheEvent::Cleared { pod: a }).unwrap();
        index.main().store(a, Tier::Gpu, &chain[..10]).unwrap();
        assert!(index.match_prefix(&chain).is_empty());
    }

    #[test]
    fn a_group_that_changes_kind_starts_empty() {
        let (index, a, _, chain) = setup();
        let mamba = GroupSpec::new(1, GroupKind::Mamba, 16).unwrap();
        index
            .apply_group(a, &mamba, Tier::Gpu, GroupChange::Stored, &chain[..9])
            .unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 9);
        let sw = GroupSpec::new(1, GroupKind::SlidingWindow { window: 64 }, 16).unwrap();
        index
            .apply_group(a, &sw, Tier::Gpu, GroupChange::Stored, &chain[9..10])
            .unwrap();
        assert_eq!(index.groups(a), vec![sw]);
        assert_eq!(index.group_blocks(a, 1), 1);
        // Window 64: 4 blocks needed; only block 9 held, none from block 0.
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 0);
    }
}
