//! Engine events to router cache events: router hashes, tiers, groups.

use std::collections::HashMap;

use router_core::{
    BlockHash, BlockHasher, CacheEvent, CacheEventSink, Error, GroupChange, GroupKind, GroupSpec,
    Namespace, PodId, Tier,
};

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
    /// Events of a hybrid model's other KV-cache groups (sliding window,
    /// Mamba, ...) that did not feed routing because the sink keeps one
    /// group per pod (a plain index: predictions are then the
    /// full-attention upper bound).
    pub other_group: u64,
    /// Blocks stored in other KV-cache groups and applied.
    pub group_blocks_stored: u64,
    /// Blocks removed from other KV-cache groups and applied.
    pub group_blocks_removed: u64,
    /// Events of groups the router cannot model (an unknown kind, a
    /// window missing, chunked local attention without a configured chunk
    /// size, a block size other than the full-attention group's): skipped,
    /// so that pod's predictions are an upper bound.
    pub unsupported_group: u64,
    /// Blocks of other groups whose router hash could not be found (their
    /// full-attention block unknown and the event too sparse to hash).
    pub unresolved_group_blocks: u64,
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
    /// The full-attention group's blocks.
    blocks: FastMap<u64, Known>,
    needs_resync: bool,
    /// The group index of the full-attention group routing follows (the
    /// first seen; `None` until then).
    main_group: Option<u32>,
    /// Its block size, once seen.
    main_block_size: Option<u32>,
    /// A hybrid model's other groups, by group index.
    groups: FastMap<u32, GroupState>,
}

/// One of a pod's other KV-cache groups: what it is and its blocks.
#[derive(Debug)]
struct GroupState {
    spec: GroupSpec,
    blocks: FastMap<u64, Known>,
}

/// Whether a kind names a full-attention group (absent: the default).
fn is_full(kind: Option<&str>) -> bool {
    matches!(
        kind,
        None | Some("full_attention") | Some("mla_attention") | Some("sink_full_attention")
    )
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
    /// Chunked local attention's chunk, which vLLM's events do not carry.
    chunk_size: Option<u32>,
    /// The sink refused a group's event as unsupported: other groups are
    /// counted in `other_group` and not kept.
    groups_off: bool,
    /// Blocks of other groups stored in this batch before their
    /// full-attention block (an engine publishes its groups in group
    /// order, and a sliding window is often group 0): resolved when that
    /// block is stored later in the batch, counted unresolved at its end.
    pending: Vec<Pending>,
}

/// A block of another group waiting for its router hash.
#[derive(Clone, Copy, Debug)]
struct Pending {
    group: u32,
    spec: GroupSpec,
    tier: Tier,
    engine: u64,
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
            chunk_size: None,
            groups_off: false,
            pending: Vec::new(),
        }
    }

    /// Sets chunked local attention's chunk size in tokens (Llama 4's
    /// `attention_chunk_size`), which vLLM's events do not carry: without
    /// it, such groups' events are counted in `unsupported_group`.
    pub fn with_chunk_size(mut self, tokens: Option<u32>) -> Self {
        self.chunk_size = tokens;
        self
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
                    self.pending.clear();
                    self.send(CacheEvent::Cleared { pod });
                }
            }
        }
        // Other groups' blocks whose full-attention block never came.
        self.stats.unresolved_group_blocks += self.pending.len() as u64;
        self.pending.clear();
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

    /// Whether a store of `group` (of `kind`) belongs to `pod`'s main
    /// group (the first full-attention group seen), learning it.
    fn is_main_store(&mut self, pod: PodId, group: u32, kind: Option<&str>) -> bool {
        let state = self.pods.entry(pod).or_default();
        match state.main_group {
            Some(g) => g == group,
            None if is_full(kind) => {
                state.main_group = Some(group);
                true
            }
            None => false,
        }
    }

    fn stored(&mut self, pod: PodId, s: &BlockStored) {
        let group = s.group_idx.unwrap_or(0);
        if !self.is_main_store(pod, group, s.kv_cache_spec_kind.as_deref()) {
            self.group_stored(pod, group, s);
            return;
        }
        let Some(tier) = self.tier_counted(s.medium.as_deref()) else {
            return;
        };
        let bs = self.block_size_of(s) as usize;
        if bs == 0 || s.block_hashes.is_empty() {
            return;
        }
        let root = s.parent_block_hash.is_none().then(|| self.root_of(s));
        let state = self.pods.entry(pod).or_default();
        state.main_block_size = Some(bs as u32);
        let mut parent = match (s.parent_block_hash, root) {
            (None, Some(root)) => root,
            (None, None) => return, // not reached: a chain start has its root
            (Some(ph), _) => match state.blocks.get(&ph) {
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
            let extra = block_extra(s, i);
            let extra: &[u64] = extra.as_slice();
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
        if !self.pending.is_empty() {
            self.resolve_pending(pod);
        }
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
        let group = r.group_idx.unwrap_or(0);
        // Another group's: not the main group once that is known, or one
        // of the other groups stored before it was.
        let other = self.pods.get(&pod).is_some_and(|p| match p.main_group {
            Some(m) => m != group,
            None => p.groups.contains_key(&group),
        });
        if other {
            self.group_removed(pod, group, r);
            return;
        }
        let Some(tier) = self.tier_counted(r.medium.as_deref()) else {
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

    /// The tier a medium names; an unknown one is counted.
    fn tier_counted(&mut self, medium: Option<&str>) -> Option<Tier> {
        let tier = tier_of(medium);
        if tier.is_none() {
            self.stats.unknown_medium += 1;
        }
        tier
    }

    /// A store's block size: its own, or the configured one.
    fn block_size_of(&self, s: &BlockStored) -> u32 {
        if s.block_size > 0 {
            s.block_size
        } else {
            self.default_block_size
        }
    }

    /// The namespace root of a store's chain.
    fn root_of(&self, s: &BlockStored) -> BlockHash {
        let mut ns = Namespace::default();
        ns.model = self.model.clone();
        ns.lora_name = s.lora_name.clone();
        ns.cache_salt = s
            .cache_salt
            .clone()
            .or_else(|| block_strings(s, 0).0.map(str::to_owned));
        self.hasher.root(&ns)
    }

    /// A store in one of a hybrid model's other groups. Groups with the
    /// full-attention group's block size publish the same engine hashes
    /// for the same token prefix, so each block's router hash is found
    /// through the group's own map, then the full-attention group's; a
    /// dense event (tokens for exactly its blocks) is hashed from its
    /// parent otherwise. Sparse events (a window or Mamba keeping some
    /// blocks of a range) are never mapped to positions through their
    /// tokens (vLLM issue 44451).
    fn group_stored(&mut self, pod: PodId, group: u32, s: &BlockStored) {
        if self.groups_off {
            self.stats.other_group += 1;
            return;
        }
        let Some(tier) = self.tier_counted(s.medium.as_deref()) else {
            return;
        };
        let bs = self.block_size_of(s);
        let kind = s.kv_cache_spec_kind.as_deref().unwrap_or("full_attention");
        let spec = GroupKind::from_vllm(kind, s.kv_cache_spec_sliding_window, self.chunk_size)
            .and_then(|k| GroupSpec::new(group, k, bs));
        let main_bs = self
            .pods
            .get(&pod)
            .and_then(|p| p.main_block_size)
            .unwrap_or(self.default_block_size);
        let spec = match spec {
            Ok(spec) if spec.block_size == main_bs => spec,
            _ => {
                self.stats.unsupported_group += 1;
                return;
            }
        };
        if s.block_hashes.is_empty() {
            return;
        }
        let dense_root = (s.parent_block_hash.is_none()).then(|| self.root_of(s));
        let state = self.pods.entry(pod).or_default();
        let gs = state.groups.entry(group).or_insert_with(|| GroupState {
            spec,
            blocks: FastMap::default(),
        });
        if gs.spec != spec {
            // The group changed (a restarted engine): the sink voids it too.
            gs.spec = spec;
            gs.blocks.clear();
        }
        let lookup = |gs: &GroupState, main: &FastMap<u64, Known>, h: u64| {
            gs.blocks.get(&h).or_else(|| main.get(&h)).map(|k| k.router)
        };
        let mut routers: Vec<Option<BlockHash>> = s
            .block_hashes
            .iter()
            .map(|&h| lookup(gs, &state.blocks, h))
            .collect();
        let bsz = bs as usize;
        if routers.iter().any(Option::is_none) && s.token_ids.len() == s.block_hashes.len() * bsz {
            let parent = match s.parent_block_hash {
                None => dense_root,
                Some(ph) => lookup(gs, &state.blocks, ph),
            };
            if let Some(mut parent) = parent {
                for (i, tokens) in s.token_ids.chunks_exact(bsz).enumerate() {
                    let extra = block_extra(s, i);
                    let extra: &[u64] = extra.as_slice();
                    parent = self.hasher.hash_block(parent, tokens, extra);
                    routers[i].get_or_insert(parent);
                }
            }
        }
        let bit = 1u8 << tier as u8;
        let mut blocks = Vec::with_capacity(routers.len());
        let mut replaced: Vec<(BlockHash, u8)> = Vec::new();
        for (&engine, router) in s.block_hashes.iter().zip(&routers) {
            let Some(router) = *router else {
                // Bounded by the batch: resolved or counted at its end.
                self.pending.push(Pending {
                    group,
                    spec,
                    tier,
                    engine,
                });
                continue;
            };
            let known = gs
                .blocks
                .entry(engine)
                .or_insert(Known { router, tiers: 0 });
            if known.router != router {
                replaced.push((known.router, known.tiers));
                known.tiers = 0;
                known.router = router;
            }
            known.tiers |= bit;
            blocks.push(router);
        }
        for (old, tiers) in replaced {
            self.stats.replaced_hashes += 1;
            for t in Tier::ALL
                .into_iter()
                .filter(|t| tiers & (1 << *t as u8) != 0)
            {
                let r = self
                    .sink
                    .apply_group(pod, &spec, t, GroupChange::Removed, &[old]);
                self.group_applied(r, 0, false);
            }
        }
        if blocks.is_empty() {
            return;
        }
        let r = self
            .sink
            .apply_group(pod, &spec, tier, GroupChange::Stored, &blocks);
        self.group_applied(r, blocks.len(), true);
    }

    /// Resolves the pending blocks whose full-attention block is now
    /// known, and applies them.
    fn resolve_pending(&mut self, pod: PodId) {
        let Some(state) = self.pods.get_mut(&pod) else {
            return;
        };
        let mut ready: Vec<(GroupSpec, Tier, BlockHash)> = Vec::new();
        self.pending.retain(|p| {
            let Some(router) = state.blocks.get(&p.engine).map(|k| k.router) else {
                return true;
            };
            let Some(gs) = state.groups.get_mut(&p.group) else {
                return false;
            };
            if gs.spec != p.spec {
                return false;
            }
            let known = gs
                .blocks
                .entry(p.engine)
                .or_insert(Known { router, tiers: 0 });
            known.router = router;
            known.tiers |= 1 << p.tier as u8;
            ready.push((p.spec, p.tier, router));
            false
        });
        for (spec, tier, router) in ready {
            let r = self
                .sink
                .apply_group(pod, &spec, tier, GroupChange::Stored, &[router]);
            self.group_applied(r, 1, true);
        }
    }

    /// A removal from one of a hybrid model's other groups.
    fn group_removed(&mut self, pod: PodId, group: u32, r: &BlockRemoved) {
        if self.groups_off {
            self.stats.other_group += 1;
            return;
        }
        let Some(tier) = self.tier_counted(r.medium.as_deref()) else {
            return;
        };
        let bit = 1u8 << tier as u8;
        // A block stored earlier in this batch and not resolved yet.
        self.pending.retain(|p| {
            !(p.group == group && p.tier == tier && r.block_hashes.contains(&p.engine))
        });
        let Some(gs) = self
            .pods
            .get_mut(&pod)
            .and_then(|p| p.groups.get_mut(&group))
        else {
            self.stats.unknown_removed += r.block_hashes.len() as u64;
            return;
        };
        let spec = gs.spec;
        let mut blocks = Vec::with_capacity(r.block_hashes.len());
        let mut unknown = 0;
        for engine in &r.block_hashes {
            match gs.blocks.get_mut(engine) {
                Some(k) => {
                    blocks.push(k.router);
                    k.tiers &= !bit;
                    if k.tiers == 0 {
                        gs.blocks.remove(engine);
                    }
                }
                None => unknown += 1,
            }
        }
        self.stats.unknown_removed += unknown;
        if blocks.is_empty() {
            return;
        }
        let res = self
            .sink
            .apply_group(pod, &spec, tier, GroupChange::Removed, &blocks);
        self.group_applied(res, blocks.len(), false);
    }

    /// Counts what the sink did with a group's event; a sink that keeps
    /// one group per pod switches groups off (and their maps go).
    fn group_applied(&mut self, r: Result<(), Error>, blocks: usize, stored: bool) {
        match r {
            Ok(()) => {
                self.stats.events_applied += 1;
                if stored {
                    self.stats.group_blocks_stored += blocks as u64;
                } else {
                    self.stats.group_blocks_removed += blocks as u64;
                }
            }
            Err(Error::GroupsUnsupported) => {
                self.stats.other_group += 1;
                self.groups_off = true;
                for p in self.pods.values_mut() {
                    p.groups = FastMap::default();
                }
            }
            Err(_) => self.stats.sink_refused += 1,
        }
    }
}

/// Block `i`'s strings among its extra keys, less the LoRA name (which the
/// namespace carries): the cache salt, when the block starts a chain and
/// one string is left, and a hash of any strings left unexplained.
fn block_strings(s: &BlockStored, i: usize) -> (Option<&str>, Option<u64>) {
    let Some(strings) = s.extra_key_strings.get(i) else {
        return (None, None);
    };
    let mut rest: Vec<&str> = strings.iter().map(String::as_str).collect();
    if let Some(lora) = s.lora_name.as_deref()
        && let Some(at) = rest.iter().position(|x| *x == lora)
    {
        rest.remove(at);
    }
    if i == 0 && s.parent_block_hash.is_none() && s.cache_salt.is_none() && rest.len() == 1 {
        return (rest.pop(), None);
    }
    if rest.is_empty() {
        return (None, None);
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for r in rest {
        h.update(r.as_bytes());
        h.update(&[0]);
    }
    (None, Some(h.digest()))
}

/// Block `i`'s extra key for the router's hash: its non-string extra keys
/// (multimodal content) and any unexplained strings, none for a block
/// whose extra keys are only its LoRA name and salt.
fn block_extra(s: &BlockStored, i: usize) -> Option<u64> {
    let other = s.extra_keys.get(i).copied().flatten();
    match (other, block_strings(s, i).1) {
        (Some(a), Some(b)) => Some(router_core::mix64(a ^ b.rotate_left(17))),
        (a, b) => a.or(b),
    }
}
