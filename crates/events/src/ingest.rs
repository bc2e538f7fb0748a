//! Engine events to router cache events: router hashes, tiers, groups.

use std::collections::HashMap;

use router_core::{BlockHash, BlockHasher, CacheEvent, CacheEventSink, Namespace, PodId, Tier};

use crate::decode::{BlockRemoved, BlockStored, EngineEvent, EventBatch};

type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// Counts of what ingestion did and skipped, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestStats {
    /// Batches applied.
    pub batches: u64,
    /// Events turned into router events and applied.
    pub events_applied: u64,
    /// Blocks stored (router hashes computed).
    pub blocks_stored: u64,
    /// Blocks removed.
    pub blocks_removed: u64,
    /// Stores whose parent block the router never saw (a missed event):
    /// skipped, and the pod marked for resynchronisation.
    pub unknown_parent: u64,
    /// Events of other KV-cache groups (sliding window, mamba, ...), which
    /// do not feed prefix routing.
    pub other_group: u64,
    /// Events with a medium the router does not know.
    pub unknown_medium: u64,
    /// Stores whose token count did not cover their blocks.
    pub token_mismatch: u64,
    /// Removals of blocks the router does not know (already gone).
    pub unknown_removed: u64,
    /// Events the sink refused (for example a pod shut down meanwhile).
    pub sink_refused: u64,
    /// Events of unknown kinds, skipped by the decoder.
    pub unknown_events: u64,
    /// Stores that reused an engine hash for other content: the block it
    /// stood for was removed first.
    pub replaced_hashes: u64,
}

/// Maps an engine's medium name to a tier.
pub fn tier_of(medium: Option<&str>) -> Option<Tier> {
    match medium {
        None | Some("GPU") => Some(Tier::Gpu),
        Some("CPU") | Some("CPU_PINNED") => Some(Tier::Cpu),
        Some("STORAGE") | Some("DISK") => Some(Tier::Disk),
        Some("EXTERNAL") => Some(Tier::Remote),
        Some(_) => None,
    }
}

/// One block as a snapshot keeps it: the engine's hash, the router's, and
/// the tiers holding it (bit `t` for [`Tier`] `t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownBlock {
    /// The engine's block hash.
    pub engine: u64,
    /// The router's hash of the same block.
    pub router: BlockHash,
    /// Tier bits.
    pub tiers: u8,
}

/// What the router knows of one engine block.
#[derive(Clone, Copy, Debug)]
struct Known {
    router: BlockHash,
    tiers: u8,
}

#[derive(Debug, Default)]
struct PodState {
    blocks: FastMap<u64, Known>,
    needs_resync: bool,
}

/// Turns decoded engine batches into router cache events for a sink.
///
/// Engines' block hashes are not reproducible across processes, so the
/// router computes its own: for each stored block, from its tokens and its
/// parent's router hash (through [`BlockHasher`]). A per-pod map from
/// engine hash to router hash lets removals find their blocks; an entry
/// goes when its block has left every tier.
pub struct Ingestor<H, S> {
    hasher: H,
    sink: S,
    model: Option<String>,
    default_block_size: u32,
    pods: FastMap<PodId, PodState>,
    stats: IngestStats,
    scratch: Vec<BlockHash>,
}

impl<H, S> std::fmt::Debug for Ingestor<H, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingestor")
            .field("pods", &self.pods.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<H: BlockHasher, S: CacheEventSink> Ingestor<H, S> {
    /// Ingests into `sink`, hashing with `hasher` in the namespace of
    /// `model`; `block_size` is used when an event does not say.
    pub fn new(hasher: H, sink: S, model: Option<String>, block_size: u32) -> Self {
        Ingestor {
            hasher,
            sink,
            model,
            default_block_size: block_size,
            pods: FastMap::default(),
            stats: IngestStats::default(),
            scratch: Vec::new(),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> IngestStats {
        self.stats
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Whether `pod` missed events and should be resynchronised (replay, or
    /// [`Ingestor::reset_pod`]).
    pub fn needs_resync(&self, pod: PodId) -> bool {
        self.pods.get(&pod).is_some_and(|p| p.needs_resync)
    }

    /// Drops everything known of `pod` and clears it in the sink, so it
    /// rebuilds from new events rather than serve stale hits.
    pub fn reset_pod(&mut self, pod: PodId) {
        self.pods.remove(&pod);
        if self.sink.apply(&CacheEvent::Cleared { pod }).is_err() {
            self.stats.sink_refused += 1;
        }
    }

    /// Blocks the router knows `pod` holds, per tier (from the events).
    pub fn tier_counts(&self, pod: PodId) -> router_core::TierCounts {
        let mut c = router_core::TierCounts::default();
        if let Some(state) = self.pods.get(&pod) {
            for k in state.blocks.values() {
                for t in Tier::ALL {
                    if k.tiers & (1 << t as u8) != 0 {
                        c[t] += 1;
                    }
                }
            }
        }
        c
    }

    /// Clears `pod`'s resynchronisation mark (after a replay from the
    /// engine's oldest batch).
    pub fn clear_resync(&mut self, pod: PodId) {
        if let Some(p) = self.pods.get_mut(&pod) {
            p.needs_resync = false;
        }
    }

    /// Everything known of `pod`'s blocks, for a snapshot (in no order).
    pub fn export_pod(&self, pod: PodId) -> Vec<KnownBlock> {
        self.pods.get(&pod).map_or_else(Vec::new, |p| {
            p.blocks
                .iter()
                .map(|(&engine, k)| KnownBlock {
                    engine,
                    router: k.router,
                    tiers: k.tiers,
                })
                .collect()
        })
    }

    /// Replaces what is known of `pod` with `blocks` (a snapshot): clears
    /// the pod in the sink, then stores each block in each of its tiers.
    /// Returns the blocks imported.
    pub fn import_pod(&mut self, pod: PodId, blocks: &[KnownBlock]) -> usize {
        self.reset_pod(pod);
        let state = self.pods.entry(pod).or_default();
        state.blocks.reserve(blocks.len());
        let mut per_tier: [Vec<BlockHash>; 4] = Default::default();
        for b in blocks {
            let tiers = b.tiers & 0b1111;
            if tiers == 0 {
                continue;
            }
            state.blocks.insert(
                b.engine,
                Known {
                    router: b.router,
                    tiers,
                },
            );
            for t in Tier::ALL {
                if tiers & (1 << t as u8) != 0 {
                    per_tier[t as usize].push(b.router);
                }
            }
        }
        let imported = state.blocks.len();
        for t in Tier::ALL {
            let blocks = std::mem::take(&mut per_tier[t as usize]);
            if blocks.is_empty() {
                continue;
            }
            self.send(CacheEvent::Stored {
                pod,
                tier: t,
                blocks,
            });
        }
        imported
    }

    /// Forgets a pod that left (its index state goes with its shutdown).
    pub fn forget_pod(&mut self, pod: PodId) {
        self.pods.remove(&pod);
    }

    /// Applies one batch from `pod`.
    pub fn apply_batch(&mut self, pod: PodId, batch: &EventBatch) {
        self.stats.batches += 1;
        self.stats.unknown_events += batch.unknown_events as u64;
        for e in &batch.events {
            match e {
                EngineEvent::BlockStored(s) => self.stored(pod, s),
                EngineEvent::BlockRemoved(r) => self.removed(pod, r),
                EngineEvent::AllBlocksCleared => {
                    self.pods.remove(&pod);
                    self.send(CacheEvent::Cleared { pod });
                }
            }
        }
    }

    fn send(&mut self, event: CacheEvent) {
        let applied = self.sink.apply(&event);
        self.count(applied);
    }

    /// Counts what the sink did with an event.
    fn count(&mut self, applied: Result<(), router_core::Error>) {
        match applied {
            Ok(()) => self.stats.events_applied += 1,
            Err(_) => self.stats.sink_refused += 1,
        }
    }

    fn main_group(&mut self, group: Option<u32>, kind: Option<&str>) -> bool {
        let main = matches!(group, None | Some(0)) && matches!(kind, None | Some("full_attention"));
        if !main {
            self.stats.other_group += 1;
        }
        main
    }

    fn stored(&mut self, pod: PodId, s: &BlockStored) {
        if !self.main_group(s.group_idx, s.kv_cache_spec_kind.as_deref()) {
            return;
        }
        let Some(tier) = tier_of(s.medium.as_deref()) else {
            self.stats.unknown_medium += 1;
            return;
        };
        let bs = if s.block_size > 0 {
            s.block_size
        } else {
            self.default_block_size
        } as usize;
        if bs == 0 || s.block_hashes.is_empty() {
            return;
        }
        let state = self.pods.entry(pod).or_default();
        let mut parent = match s.parent_block_hash {
            None => {
                let mut ns = Namespace::default();
                ns.model = self.model.clone();
                ns.lora_name = s.lora_name.clone();
                ns.cache_salt = s.cache_salt.clone();
                self.hasher.root(&ns)
            }
            Some(ph) => match state.blocks.get(&ph) {
                Some(k) => k.router,
                None => {
                    state.needs_resync = true;
                    self.stats.unknown_parent += 1;
                    return;
                }
            },
        };
        // The parent block in router hashes, for the index (`None` for a
        // chain's first blocks, whose parent is the namespace's root).
        let first_parent = s.parent_block_hash.map(|_| parent);
        // Do not assume one full block of tokens per hash (vLLM issue
        // 44451): hash the blocks the tokens cover, count the rest.
        let covered = (s.token_ids.len() / bs).min(s.block_hashes.len());
        if covered < s.block_hashes.len() || s.token_ids.len() % bs != 0 {
            self.stats.token_mismatch += 1;
        }
        let bit = 1u8 << tier as u8;
        self.scratch.clear();
        let mut replaced: Vec<(BlockHash, u8)> = Vec::new();
        for (i, (&engine, tokens)) in s
            .block_hashes
            .iter()
            .zip(s.token_ids.chunks_exact(bs))
            .enumerate()
        {
            let extra: &[u64] = match s.extra_keys.get(i) {
                Some(Some(k)) => std::slice::from_ref(k),
                _ => &[],
            };
            let router = self.hasher.hash_block(parent, tokens, extra);
            let known = state
                .blocks
                .entry(engine)
                .or_insert(Known { router, tiers: 0 });
            if known.router != router {
                // The engine reused a hash for other content (a collision,
                // or hostile input): the old block leaves every tier it was
                // in, so the index never keeps a block nothing maps to.
                replaced.push((known.router, known.tiers));
                known.tiers = 0;
            }
            known.router = router;
            known.tiers |= bit;
            self.scratch.push(router);
            parent = router;
        }
        self.stats.blocks_stored += self.scratch.len() as u64;
        let blocks = std::mem::take(&mut self.scratch);
        let applied = self.sink.apply_stored(pod, tier, first_parent, blocks);
        self.count(applied);
        // After the store: a hash reused within this very chain replaced a
        // block the store just put in.
        for (old, tiers) in replaced {
            self.stats.replaced_hashes += 1;
            for t in Tier::ALL
                .into_iter()
                .filter(|t| tiers & (1 << *t as u8) != 0)
            {
                self.send(CacheEvent::Removed {
                    pod,
                    tier: t,
                    blocks: vec![old],
                });
            }
        }
    }

    fn removed(&mut self, pod: PodId, r: &BlockRemoved) {
        if !self.main_group(r.group_idx, None) {
            return;
        }
        let Some(tier) = tier_of(r.medium.as_deref()) else {
            self.stats.unknown_medium += 1;
            return;
        };
        let bit = 1u8 << tier as u8;
        let Some(state) = self.pods.get_mut(&pod) else {
            self.stats.unknown_removed += r.block_hashes.len() as u64;
            return;
        };
        let mut blocks = Vec::with_capacity(r.block_hashes.len());
        for engine in &r.block_hashes {
            match state.blocks.get_mut(engine) {
                Some(k) => {
                    blocks.push(k.router);
                    k.tiers &= !bit;
                    if k.tiers == 0 {
                        state.blocks.remove(engine);
                    }
                }
                None => self.stats.unknown_removed += 1,
            }
        }
        self.stats.blocks_removed += blocks.len() as u64;
        if !blocks.is_empty() {
            self.send(CacheEvent::Removed { pod, tier, blocks });
        }
    }
}
