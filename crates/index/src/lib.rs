//! The sharded bitmap index: "which live pods hold the longest prefix of
//! this block chain?", answered in about a microsecond while cache events
//! pour in and pods come and go.
//!
//! # The design choice
//!
//! Chains are cumulative (see `router-hash`), so a pod holding block `i`
//! normally holds every block before it, and "longest cached prefix per pod"
//! is a per-pod binary search. Doing one search per pod costs `P log N`
//! probes. [`Index`] instead keeps, for every block hash, the *set* of pods
//! holding it (a [`HostBitmap`]) and searches all pods at once by **binary
//! partition**: probe the middle block, split the candidate pods into those
//! that hold it (recurse right) and those that do not (recurse left). A set
//! of pods dropping off at `K` distinct depths costs `O(K log N)` probes,
//! whatever `P` is. Each probe reads one of 256 cache-padded shards
//! without a lock (a validated seqlock read of one flat-table lookup), so
//! readers write no shared memory and never wait for each other.
//!
//! Each entry also keeps a 16-bit **run hint**: how far its holder set ran
//! unchanged along the chain of the event that last wrote it (carried
//! across events when a store names its parent, [`Index::store_after`]).
//! The search uses it to guess where the next change is and probes that
//! block and the one before it together, so a group of pods usually costs
//! two probes rather than a halving. A run's last block keeps where the
//! run after next ends instead (its own "change next" the pair already
//! tells), so once a pair confirms its change, the next step reads two
//! changes' pairs at once. Hints only choose split points: the answer
//! never depends on them. When one pod is left to place (a conversation
//! that stays on its pod, as every partial hit of a trace does), its
//! search needs no pod sets: two bounds, and a lookup and a bit test per
//! probe.
//!
//! On cold state a probe's cost is its cache misses, so reads are issued
//! to overlap them: a pair's two reads are begun before either is
//! finished, a short chain whose pods outnumber its blocks is scanned in
//! batches of reads all begun at once (the `short_scan` knob), and a
//! write prefetches the shards and cells of the blocks ahead of it. A
//! block's holders live in its 16-byte cell (up to four slots, or a 46-bit
//! bitmap while every holder's slot is below 46), so only a block held by
//! more than four pods of a larger fleet costs a second line. An embedder
//! that knows how many blocks its fleet caches can size the tables up
//! front ([`IndexConfig::capacity`]), so stores never wait for a table to
//! double.
//!
//! # Invariants
//!
//! - **Exact on prefix-closed state**: when each pod's blocks form a prefix
//!   of the chain, the binary match equals the linear oracle
//!   (`Index::match_prefix_linear`, feature `tuning`). Otherwise every reported depth `d` is
//!   still a real boundary: block `d-1` held, block `d` not.
//! - **Shutdown is immediate**: [`Index::shutdown`] clears the pod's
//!   bit in the alive bitmap with one atomic operation; every query started
//!   after it returns ANDs with that bitmap and cannot report the pod.
//! - **No inherited bits**: a write checks its slot's liveness and epoch
//!   while holding the shard lock, and the sweep of a departed pod locks
//!   every shard after the pod left, so a late event can never leave bits
//!   for the slot's next owner. A slot is reused only after its sweep, with
//!   a new epoch.
//! - **Idempotent events**: storing a held block or removing an absent one
//!   changes no holders; a stream applied twice gives the same answers.
//! - **Hints are never trusted**: any hint, stale or wrong, gives the same
//!   answer; a bound keeps bad hints from costing more than a few probes
//!   per halving step.
//! - **A store is seen whole or not at all** by a query that reads its first
//!   and last blocks: blocks are written last to first, and a query reads
//!   block 0 no later than the deepest block.
//! - **Lock-free reads are exact**: a lookup counts only if its shard's
//!   sequence number was even before it and unchanged after it, and a
//!   replaced array is freed only once no reader that could hold it is
//!   left (crossbeam-epoch); the loom models check both.
//! - **Tiers off the hot path**: shards hold presence only; per-pod tier
//!   records exist only for blocks not held in exactly {GPU}, and a pod's
//!   bit clears when a block leaves its last tier.
//!
//! # Items
//!
//! - [`Index`]: inherent methods for everything (`join`, `store`, `remove`,
//!   `clear`, `shutdown`, `apply_event`, `match_prefix_into`,
//!   `match_hashes_into` over raw `u64`s, `score_into` with a closure), and
//!   `PrefixIndex`, `CacheEventSink` and `PodDirectory` from `router-core`;
//!   [`IndexConfig`], [`IndexStats`], [`HashChain`].
//! - Re-exported from `router-core`: [`BlockHash`], [`PodId`], [`PodKey`],
//!   [`Tier`], [`CacheEvent`], [`PrefixMatch`] and the rest of what an
//!   embedder names.
//! - [`HostBitmap`]: the fixed-width pod set.
//! - [`HybridIndex`]: the index plus a hybrid model's other KV-cache
//!   groups per pod (sliding window, Mamba, chunked local attention),
//!   answering with the hit every group accepts, as vLLM's engine does.
//!
//! # Example: embedding it
//!
//! One dependency; every call below is an inherent method, so no trait
//! needs importing (the traits are implemented too, for code generic over
//! them).
//!
//! ```
//! use router_index::{BlockHash, Index, IndexConfig, PodKey, PrefixMatch, Tier};
//!
//! let index: std::sync::Arc<Index> = Index::new(IndexConfig::default());
//! let a = index.join(&PodKey::new("http://pod-a:8000", 0))?;
//! let b = index.join(&PodKey::new("http://pod-b:8000", 0))?;
//! let chain: Vec<u64> = (1..=8).collect(); // your block hashes, as they are
//! let blocks: Vec<BlockHash> = chain.iter().map(|&h| BlockHash(h)).collect();
//! index.store(a, Tier::Gpu, &blocks[..6])?; // from your engine's events
//! index.store(b, Tier::Gpu, &blocks[..2])?;
//! let mut m = PrefixMatch::default(); // reused: no allocation per query
//! index.match_hashes_into(&chain, &mut m); // no copy of the chain
//! assert_eq!(m.best().map(|p| (p.pod, p.blocks)), Some((a, 6)));
//! m.index_slots(); // for many lookups: blocks_for is then O(1)
//! assert_eq!(m.blocks_for(b), 2);
//! let mut best = (None, 0);
//! index.score_into(&chain, |pod, held| if held > best.1 { best = (Some(pod), held) });
//! assert_eq!(best, (Some(a), 6));
//! index.shutdown(a)?; // gone from every later query at once
//! assert_eq!(index.match_prefix(&blocks).best().map(|p| p.pod), Some(b));
//! # Ok::<(), router_index::Error>(())
//! ```
#![deny(unsafe_code)]

mod array;
mod bitmap;
mod holders;
mod hybrid;
mod index;
mod seqlock;
mod shard;
mod sync;
mod table;

pub use bitmap::{HostBitmap, Ones};
pub use hybrid::HybridIndex;
pub use index::{HashChain, Index, IndexConfig, IndexStats};
/// The vocabulary an embedder needs, from `router-core`, so one dependency
/// is enough.
pub use router_core::{
    BlockHash, CacheEvent, CacheEventSink, Error, GroupChange, GroupKind, GroupSpec, PodDirectory,
    PodId, PodKey, PodMatch, PrefixIndex, PrefixMatch, Tier, TierCounts,
};

#[cfg(all(test, router_loom))]
mod loom_models;

/// The README's example, compiled and run with the doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
