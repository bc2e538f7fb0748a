//! What the router itself sent where: provisional (speculative) chain
//! registrations, and the approximate index of engines that publish no
//! cache events.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodId, Tier};

use crate::context::{Context, KeyId};
use crate::keys::{CACHE_HITS, CHAIN, CacheHits, NOW_MS};
use crate::plugin::{Plugin, Prepare};
use crate::pod::PodState;

/// Milliseconds on a process-wide monotonic clock: the time plugins with
/// memory use when the caller sets no [`NOW_MS`].
pub fn wall_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The request's time: [`NOW_MS`] if the caller set it (a simulator's
/// clock), else [`wall_ms`].
pub(crate) fn now_ms(ctx: &Context) -> u64 {
    ctx.get(NOW_MS).copied().unwrap_or_else(wall_ms)
}

/// Block hashes are mixed already, but a simulator's may be structured
/// (small sequential ids): ahash spreads both, as the ingestor's maps do.
type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// How long a pod's routed blocks count and how many it may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Memory {
    /// A registration counts for this long after its last routing, ms.
    pub ttl_ms: u64,
    /// Blocks remembered per pod; the least recently routed leave first
    /// (the engine's own LRU, approximately).
    pub capacity_blocks: usize,
}

impl Memory {
    /// Speculative registrations: a routed chain counts until the engine
    /// reports its blocks evicted ([`RoutedChains::observe`]), until the
    /// pod's capacity pushes it out in LRU order (65,536 blocks per pod
    /// until [`Speculative`] learns the pod's own `kv_blocks_total`), or
    /// for 60 s at most.
    ///
    /// Why not a short TTL (2 s is Dynamo's, llm-d's and vllm-router's):
    /// under KV-cache pressure a request waits in its engine's queue for
    /// seconds before its prefill stores anything, and siblings arriving
    /// after the TTL but before the events scatter over other pods.
    pub const SPECULATIVE: Memory = Memory {
        ttl_ms: 60_000,
        capacity_blocks: 65_536,
    };

    /// The old speculative memory: 2 s, 65,536 blocks per pod (the peers'
    /// TTL, for comparisons).
    pub const SHORT_TTL: Memory = Memory {
        ttl_ms: 2_000,
        capacity_blocks: 65_536,
    };

    /// Registrations that never expire, at most `capacity_blocks` per pod
    /// (an approximate tree that evicts by size only, as SMG's does).
    pub fn forever(capacity_blocks: usize) -> Self {
        Memory::new(u64::MAX / 4, capacity_blocks)
    }

    /// A registration that lasts `ttl_ms` and at most `capacity_blocks` per pod.
    pub fn new(ttl_ms: u64, capacity_blocks: usize) -> Self {
        Memory {
            ttl_ms,
            capacity_blocks: capacity_blocks.max(1),
        }
    }
}

struct PodLog {
    memory: Memory,
    live: usize,
    /// `(expiry, insertion, block)` in routing order; entries whose
    /// insertion no longer matches the block's holder record are stale
    /// (the block was routed again since) and skipped.
    order: VecDeque<(u64, u64, BlockHash)>,
}

impl PodLog {
    fn new(memory: Memory) -> Self {
        PodLog {
            memory,
            live: 0,
            order: VecDeque::new(),
        }
    }
}

struct Inner {
    /// How pods not given their own memory remember.
    default: Memory,
    /// Block -> the pods it was routed to, with each registration's expiry
    /// and the insertion that made it.
    blocks: FastMap<BlockHash, Vec<Holder>>,
    pods: FastMap<PodId, PodLog>,
    /// Insertions so far (tells a registration from a later one of the
    /// same block at the same time).
    insertions: u64,
    /// Every pod with a log, in the order the background sweep visits them.
    sweep: Vec<PodId>,
    /// The next position of the sweep in `sweep`.
    cursor: usize,
    /// Per query, each candidate's position in `found`, by slot, and the
    /// answer being built (kept between queries, reset after each, so a
    /// query allocates nothing).
    at: Vec<u32>,
    found: Vec<(PodId, u32)>,
}

/// Other pods trimmed of expired registrations on each insertion.
const SWEEP_PER_INSERT: usize = 2;

#[derive(Clone, Copy)]
struct Holder {
    pod: PodId,
    expiry: u64,
    insertion: u64,
}

impl Inner {
    /// `pod`'s log, created with the default memory on first use.
    fn log(&mut self, pod: PodId) -> &mut PodLog {
        let default = self.default;
        let sweep = &mut self.sweep;
        self.pods.entry(pod).or_insert_with(|| {
            sweep.push(pod);
            PodLog::new(default)
        })
    }

    fn drop_holder(&mut self, block: BlockHash, pod: PodId, insertion: u64) -> bool {
        let Some(holders) = self.blocks.get_mut(&block) else {
            return false;
        };
        let Some(i) = holders
            .iter()
            .position(|h| h.pod == pod && h.insertion == insertion)
        else {
            return false;
        };
        holders.swap_remove(i);
        if holders.is_empty() {
            self.blocks.remove(&block);
        }
        true
    }

    /// Drops `pod`'s expired registrations and its oldest beyond capacity.
    fn trim(&mut self, pod: PodId, now: u64) {
        loop {
            let Some(log) = self.pods.get_mut(&pod) else {
                return;
            };
            let Some(&(expiry, insertion, block)) = log.order.front() else {
                return;
            };
            let expired = expiry <= now;
            if !expired && log.live <= log.memory.capacity_blocks {
                break;
            }
            log.order.pop_front();
            if self.drop_holder(block, pod, insertion)
                && let Some(log) = self.pods.get_mut(&pod)
            {
                log.live -= 1;
            }
        }
        // Stale queue entries (blocks routed again later) are bounded: when
        // they outnumber the live ones, rebuild the queue.
        let blocks = &self.blocks;
        if let Some(log) = self.pods.get_mut(&pod)
            && log.order.len() > 2 * log.live + 1024
        {
            log.order.retain(|&(_, insertion, block)| {
                blocks
                    .get(&block)
                    .is_some_and(|hs| hs.iter().any(|h| h.pod == pod && h.insertion == insertion))
            });
        }
    }
}

/// Chains the router sent to each pod, each block remembered until its
/// registration expires or its pod runs out of remembered capacity.
///
/// Two uses: **speculative registration** (a routed chain counts as cached
/// on its pod at once, so siblings arriving before the engine's events
/// follow it; until the engine reports the blocks evicted, the pod's capacity
/// pushes them out, or 60 s pass), and the
/// **approximate mode** of pods that publish no events (a long TTL and a
/// capacity like the engine's cache: what SMG's radix tree and vLLM's
/// router do without events).
///
/// **Invariant:** memory is bounded: each pod holds at most its
/// `capacity_blocks` live registrations, and stale bookkeeping is
/// compacted once it outgrows them.
pub struct RoutedChains {
    inner: Mutex<Inner>,
    observer: parking_lot::RwLock<Option<RoutedObserver>>,
}

/// Told of every registration made through [`RoutedChains::insert`] (not
/// [`RoutedChains::insert_remote`]): how router replicas share them.
pub type RoutedObserver = Arc<dyn Fn(PodId, &[BlockHash]) + Send + Sync>;

impl fmt::Debug for RoutedChains {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("RoutedChains")
            .field("default", &inner.default)
            .field("blocks", &inner.blocks.len())
            .field("pods", &inner.pods.len())
            .finish()
    }
}

impl RoutedChains {
    /// A table whose pods remember by `default` unless [`RoutedChains::set_memory`]
    /// says otherwise for a pod.
    pub fn new(default: Memory) -> Self {
        RoutedChains {
            inner: Mutex::new(Inner {
                default,
                blocks: FastMap::default(),
                pods: FastMap::default(),
                insertions: 0,
                sweep: Vec::new(),
                cursor: 0,
                at: Vec::new(),
                found: Vec::new(),
            }),
            observer: parking_lot::RwLock::new(None),
        }
    }

    /// Calls `observer` after every local registration (`None`: no one).
    pub fn set_observer(&self, observer: Option<RoutedObserver>) {
        *self.observer.write() = observer;
    }

    /// Registers `chain` as routed to `pod` by another router replica
    /// (the observer is not told).
    pub fn insert_remote(&self, pod: PodId, chain: &[BlockHash], now: u64) {
        self.register(pod, chain, now);
    }

    /// Changes how pods without their own memory remember from now on
    /// (pods seen already keep theirs).
    pub fn set_default(&self, memory: Memory) {
        self.inner.lock().default = memory;
    }

    /// Sets how `pod` remembers (for example a long TTL for a pod without
    /// events). Registrations made before keep their expiry.
    pub fn set_memory(&self, pod: PodId, memory: Memory) {
        self.inner.lock().log(pod).memory = memory;
    }

    /// Registers `chain` as routed to `pod` at `now` (ms), and tells the
    /// observer, if any.
    pub fn insert(&self, pod: PodId, chain: &[BlockHash], now: u64) {
        self.register(pod, chain, now);
        if let Some(observer) = self.observer.read().as_ref() {
            observer(pod, chain);
        }
    }

    fn register(&self, pod: PodId, chain: &[BlockHash], now: u64) {
        let mut inner = self.inner.lock();
        let memory = inner.log(pod).memory;
        let expiry = now.saturating_add(memory.ttl_ms);
        inner.insertions += 1;
        let insertion = inner.insertions;
        let held = Holder {
            pod,
            expiry,
            insertion,
        };
        // Beyond capacity only the chain's head can be kept.
        let keep = chain.len().min(memory.capacity_blocks);
        let mut added = 0usize;
        for &block in &chain[..keep] {
            let holders = inner.blocks.entry(block).or_default();
            match holders.iter_mut().find(|h| h.pod == pod) {
                Some(h) => *h = held,
                None => {
                    holders.push(held);
                    added += 1;
                }
            }
        }
        let log = inner.log(pod);
        log.live += added;
        // Deepest first, as vLLM frees a finished request's blocks: past
        // capacity a chain loses its tail before its head, as in the engine.
        log.order
            .extend(chain[..keep].iter().rev().map(|&b| (expiry, insertion, b)));
        inner.trim(pod, now);
        // Pods not routed to for a while expire too: a few per insertion,
        // in turn, keeps the sweep's cost flat in the number of pods.
        for _ in 0..SWEEP_PER_INSERT.min(inner.sweep.len()) {
            inner.cursor = (inner.cursor + 1) % inner.sweep.len();
            let p = inner.sweep[inner.cursor];
            inner.trim(p, now);
        }
    }

    /// Forgets everything routed to `pod` (it left, or restarted).
    pub fn remove_pod(&self, pod: PodId) {
        let mut inner = self.inner.lock();
        inner.sweep.retain(|&p| p != pod);
        if let Some(log) = inner.pods.remove(&pod) {
            for (_, insertion, block) in log.order {
                inner.drop_holder(block, pod, insertion);
            }
        }
    }

    /// Forgets `pod`'s registrations of `blocks` (its engine reported them
    /// evicted: the registration has nothing left to predict).
    pub fn forget(&self, pod: PodId, blocks: &[BlockHash]) {
        let mut inner = self.inner.lock();
        let mut dropped = 0;
        for b in blocks {
            let Some(holders) = inner.blocks.get_mut(b) else {
                continue;
            };
            let Some(i) = holders.iter().position(|h| h.pod == pod) else {
                continue;
            };
            holders.swap_remove(i);
            if holders.is_empty() {
                inner.blocks.remove(b);
            }
            dropped += 1;
        }
        // Their queue entries are stale now: `trim` skips and compacts them.
        if let Some(log) = inner.pods.get_mut(&pod) {
            log.live = log.live.saturating_sub(dropped);
        }
    }

    /// Learns from an engine's cache event: a GPU removal forgets the
    /// pod's registrations of those blocks, a reset or a shutdown all of
    /// the pod's. Stores change nothing (the index holds them now).
    pub fn observe(&self, event: &CacheEvent) {
        match event {
            CacheEvent::Removed {
                pod,
                tier: Tier::Gpu,
                blocks,
            } => self.forget(*pod, blocks),
            CacheEvent::Cleared { pod } | CacheEvent::PodShutdown { pod } => self.remove_pod(*pod),
            _ => {}
        }
    }

    /// Sets how many blocks `pod`'s registrations may hold (its engine's
    /// KV capacity), keeping its TTL.
    pub fn set_capacity(&self, pod: PodId, blocks: usize) {
        let mut inner = self.inner.lock();
        let log = inner.log(pod);
        if log.memory.capacity_blocks != blocks.max(1) {
            log.memory = Memory::new(log.memory.ttl_ms, blocks);
        }
    }

    /// `pod`'s memory.
    pub fn memory(&self, pod: PodId) -> Memory {
        let mut inner = self.inner.lock();
        inner.log(pod).memory
    }

    /// Live registered blocks of `pod` (SMG's "tree size").
    pub fn pod_blocks(&self, pod: PodId) -> usize {
        self.inner.lock().pods.get(&pod).map_or(0, |l| l.live)
    }

    /// Every pod's leading blocks of `chain` registered and live at `now`,
    /// into `out` (cleared first) as `(pod, blocks)`: unordered, no zero
    /// entries.
    pub fn match_into(&self, chain: &[BlockHash], now: u64, out: &mut Vec<(PodId, u32)>) {
        out.clear();
        self.for_each_match(chain, now, |pod, blocks| out.push((pod, blocks)));
    }

    /// Calls `f(pod, blocks)` for every pod holding a live registered
    /// prefix of `chain` at `now`, under the table's lock (keep `f` short).
    /// Allocates nothing once the table has answered a query as wide.
    pub fn for_each_match(&self, chain: &[BlockHash], now: u64, mut f: impl FnMut(PodId, u32)) {
        let mut guard = self.inner.lock();
        let Inner {
            blocks, at, found, ..
        } = &mut *guard;
        found.clear();
        // Each candidate's position in `found`, by slot: one visit per holder.
        for (depth, block) in chain.iter().enumerate() {
            let Some(holders) = blocks.get(block) else {
                break;
            };
            let mut open = false;
            for h in holders.iter().filter(|h| h.expiry > now) {
                let slot = h.pod.slot() as usize;
                if depth == 0 {
                    if at.len() <= slot {
                        at.resize(slot + 1, u32::MAX);
                    }
                    at[slot] = found.len() as u32;
                    found.push((h.pod, 1));
                    open = true;
                } else if let Some(m) = at
                    .get(slot)
                    .and_then(|&k| found.get_mut(k as usize))
                    .filter(|m| m.0 == h.pod && m.1 as usize == depth)
                {
                    m.1 += 1;
                    open = true;
                }
            }
            if !open {
                break;
            }
        }
        for &(pod, blocks) in found.iter() {
            at[pod.slot() as usize] = u32::MAX;
            f(pod, blocks);
        }
    }

    /// The slow, obviously right twin of [`RoutedChains::match_into`]: each
    /// pod's blocks checked one by one.
    #[doc(hidden)]
    pub fn match_linear(&self, chain: &[BlockHash], now: u64, pod: PodId) -> u32 {
        let inner = self.inner.lock();
        chain
            .iter()
            .take_while(|b| {
                inner
                    .blocks
                    .get(b)
                    .is_some_and(|hs| hs.iter().any(|h| h.pod == pod && h.expiry > now))
            })
            .count() as u32
    }
}

/// `speculative`: counts what the router itself routed as cached.
///
/// After `prefix-match` it raises each pod's matched blocks in
/// [`CACHE_HITS`] to what was routed there and is still live; alone (no
/// index, engines without events) it produces [`CACHE_HITS`] from the
/// routed chains only. After every decision the request's chain is
/// registered for the chosen pod.
pub struct Speculative {
    table: Arc<RoutedChains>,
    /// Cuts a registration's raise to the hit the pod's engine accepts (a
    /// hybrid model's other groups, [`router_core::PrefixIndex::accepted_hit`]).
    index: Option<Arc<dyn router_core::PrefixIndex>>,
}

impl Speculative {
    /// Registers into and reads from `table` (share one table between the
    /// profiles of a gateway so every step sees every routing).
    pub fn new(table: Arc<RoutedChains>) -> Self {
        Speculative { table, index: None }
    }

    /// Raises hits only as far as `index` says the pod's engine accepts
    /// them (for hybrid models: a registered chain's full-attention blocks
    /// are not a hit where the other groups cannot serve it).
    pub fn with_index(mut self, index: Arc<dyn router_core::PrefixIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// The table.
    pub fn table(&self) -> &Arc<RoutedChains> {
        &self.table
    }
}

impl fmt::Debug for Speculative {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Speculative")
            .field("table", &self.table)
            .finish()
    }
}

impl Plugin for Speculative {
    fn name(&self) -> &str {
        "speculative"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CHAIN.id()]
    }
    fn produces(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id()]
    }
    fn on_pick(&self, ctx: &Context, pod: &PodState) {
        if pod.kv_blocks_total > 0 {
            // A registration cannot outlive the pod's capacity.
            self.table.set_capacity(
                pod.id,
                usize::try_from(pod.kv_blocks_total).unwrap_or(usize::MAX),
            );
        }
        if let Some(chain) = ctx.get(CHAIN) {
            self.table.insert(pod.id, chain, now_ms(ctx));
        }
    }
}

/// An event sink that applies every event to `sink` (the index) and then
/// tells a [`RoutedChains`] table what the engines evicted
/// ([`RoutedChains::observe`]), so speculative registrations end when
/// their blocks leave the engine, not on a timer.
pub struct Evictions<S> {
    sink: S,
    table: Arc<RoutedChains>,
}

impl<S> Evictions<S> {
    /// Feeds `sink`, and `table` with what `sink` accepted.
    pub fn new(sink: S, table: Arc<RoutedChains>) -> Self {
        Evictions { sink, table }
    }
}

impl<S> fmt::Debug for Evictions<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictions")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<S: CacheEventSink> CacheEventSink for Evictions<S> {
    fn apply(&self, event: &CacheEvent) -> Result<(), router_core::Error> {
        self.sink.apply(event)?;
        self.table.observe(event);
        Ok(())
    }

    fn apply_stored(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: Vec<BlockHash>,
    ) -> Result<(), router_core::Error> {
        self.sink.apply_stored(pod, tier, parent, blocks)
    }

    fn apply_group(
        &self,
        pod: PodId,
        spec: &router_core::GroupSpec,
        tier: Tier,
        change: router_core::GroupChange,
        blocks: &[BlockHash],
    ) -> Result<(), router_core::Error> {
        self.sink.apply_group(pod, spec, tier, change, blocks)
    }
}

impl Prepare for Speculative {
    fn prepare(&self, ctx: &mut Context, _pods: &[PodState]) {
        let now = now_ms(ctx);
        let chain_len = ctx.get(CHAIN).map_or(0, Vec::len);
        // Taken out while the chain is borrowed, put back raised (into the
        // same slot: no allocation when `prefix-match` made it).
        let had = ctx.get_mut(CACHE_HITS).map(std::mem::take);
        let mut hits = had.unwrap_or_else(|| CacheHits::empty(chain_len));
        if let Some(chain) = ctx.get(CHAIN) {
            let index = self.index.as_deref();
            self.table.for_each_match(chain, now, |pod, blocks| {
                let blocks = match index {
                    Some(i) => i.accepted_hit(pod, chain, blocks as usize) as u32,
                    None => blocks,
                };
                hits.raise(pod, blocks)
            });
        }
        match ctx.get_mut(CACHE_HITS) {
            Some(slot) => *slot = hits,
            None => ctx.insert(CACHE_HITS, hits),
        }
    }
}
