//! The index: its layout, slots and counters; the registry, writes, search
//! and sweeps are the submodules, each an `impl` of [`Index`] along one
//! invariant.

mod registry;
mod search;
mod sweep;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use router_core::{
    BlockHash, CacheEvent, CacheEventSink, Error, PodDirectory, PodId, PodKey, PrefixIndex,
    PrefixMatch, Tier, TierCounts, mix64,
};
use smallvec::SmallVec;

use crate::bitmap::HostBitmap;
use crate::holders::Holders;
use crate::shard::{Shard, ShardCore, ShardWrite, Staged, shard_of};
use crate::sync::{AtomicU64, Guard, Mutex, Ordering, pin};

/// How an [`Index`] is laid out and run.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct IndexConfig {
    /// log2 of the shard count (8 = 256 shards). At most 12.
    pub shard_bits: u32,
    /// Sweep departed pods on background threads. When false, call
    /// [`Index::sweep`] yourself (tests and loom models do).
    pub background_sweep: bool,
    /// The most sweeper threads running at once (at least 1). Each sweep
    /// pass takes every pod waiting at that moment, so one is usually enough.
    pub sweep_threads: usize,
    /// Below this many blocks a search interval is scanned block by block
    /// instead of halved: a short scan beats the bookkeeping of a partition.
    pub(crate) linear_span: usize,
    /// Refuse a store whose named parent ([`Index::store_after`]) the pod
    /// does not hold, with [`Error::UnknownParent`], counted in
    /// [`IndexStats::skipped_unknown_parent`] (as kv-index and Dynamo
    /// refuse an orphan store). Off by default: `router-events` already
    /// checks parents in engine hashes and asks for a replay.
    pub validate_parents: bool,
    /// Chains at least this long open their search with block 0 and the
    /// deepest block read as one pair (their misses overlap); shorter ones
    /// read block 0 alone first, since on a trace most short requests
    /// share nothing and a miss there ends the search in one probe.
    pub(crate) paired_opening_from: usize,
    /// Chains of at most this many blocks that are not settled by their
    /// opening probes (block 0 and the deepest), and whose pods left to
    /// place outnumber the blocks between, are searched by one scan of
    /// those blocks, read in batches whose misses overlap, where a
    /// partition's probes wait for each other. 0 turns it off.
    pub(crate) short_scan: usize,
    /// Distinct blocks the index is expected to hold (0: no guess), as
    /// `HashMap::with_capacity` takes one: every shard's table is made at
    /// once as large as that many blocks spread over the shards would grow
    /// it, so stores up to there never stop to double a table and re-place
    /// its keys (about a quarter of a new block's store, measured on W1).
    /// A fleet's KV capacity in blocks (pods x blocks per pod) is the
    /// natural figure; each block reserved costs about 20 to 40 bytes up
    /// front. At most [`IndexConfig::MAX_CAPACITY`].
    pub capacity: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            shard_bits: 8,
            background_sweep: true,
            sweep_threads: 1,
            linear_span: 4,
            validate_parents: false,
            paired_opening_from: 64,
            short_scan: 32,
            capacity: 0,
        }
    }
}

impl IndexConfig {
    /// Sets [`IndexConfig::shard_bits`].
    pub fn shard_bits(mut self, bits: u32) -> Self {
        self.shard_bits = bits.min(12);
        self
    }

    /// Sets [`IndexConfig::background_sweep`].
    pub fn background_sweep(mut self, yes: bool) -> Self {
        self.background_sweep = yes;
        self
    }

    /// Sets [`IndexConfig::sweep_threads`].
    pub fn sweep_threads(mut self, n: usize) -> Self {
        self.sweep_threads = n.max(1);
        self
    }

    /// Sets the `linear_span` search knob (feature `tuning`: for the index's own
    /// tests and measurements; the default is the measured best, and the
    /// knob may change or go).
    #[cfg(any(test, router_loom, feature = "tuning"))]
    pub fn linear_span(mut self, n: usize) -> Self {
        self.linear_span = n;
        self
    }

    /// Sets the `paired_opening_from` search knob (feature `tuning`: for the index's own
    /// tests and measurements; the default is the measured best, and the
    /// knob may change or go).
    #[cfg(any(test, router_loom, feature = "tuning"))]
    pub fn paired_opening_from(mut self, blocks: usize) -> Self {
        self.paired_opening_from = blocks;
        self
    }

    /// Sets the `short_scan` search knob (feature `tuning`: for the index's own
    /// tests and measurements; the default is the measured best, and the
    /// knob may change or go).
    #[cfg(any(test, router_loom, feature = "tuning"))]
    pub fn short_scan(mut self, blocks: usize) -> Self {
        self.short_scan = blocks;
        self
    }

    /// Sets [`IndexConfig::validate_parents`].
    pub fn validate_parents(mut self, yes: bool) -> Self {
        self.validate_parents = yes;
        self
    }

    /// The largest [`IndexConfig::capacity`] taken (2^30 blocks, tens of
    /// GiB reserved); a larger one is cut to it.
    pub const MAX_CAPACITY: usize = 1 << 30;

    /// Sets [`IndexConfig::capacity`], cut to
    /// [`IndexConfig::MAX_CAPACITY`].
    pub fn capacity(mut self, blocks: usize) -> Self {
        self.capacity = blocks.min(Self::MAX_CAPACITY);
        self
    }
}

/// A snapshot of the index's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexStats {
    /// Distinct blocks held by at least one pod.
    pub entries: u64,
    /// (block, pod) pairs: the sum over blocks of the pods holding them.
    pub residencies: u64,
    /// Blocks whose holders are kept as a full bitmap in the slab: more
    /// than 4 pods, one of them at slot 46 or above (blocks of a smaller
    /// fleet keep up to 46 pods in their cell).
    pub bitmap_entries: u64,
    /// Bytes allocated by the block maps, bitmaps and tier records.
    pub bytes: u64,
    /// Live pods.
    pub pods_live: u64,
    /// Events applied.
    pub events_applied: u64,
    /// Events refused because the pod id names no registered pod.
    pub skipped_unknown_pod: u64,
    /// Events refused because the pod was shut down (including writes that
    /// found the pod gone while holding a shard lock).
    pub skipped_dead_pod: u64,
    /// Stores refused because the pod does not hold the parent they named
    /// (with [`IndexConfig::validate_parents`]).
    pub skipped_unknown_parent: u64,
    /// Sweeps running now.
    pub sweeps_running: u64,
    /// Sweep passes completed.
    pub sweeps_completed: u64,
    /// (block, pod) pairs cleared by sweeps.
    pub blocks_swept: u64,
}

// Slot states: epoch in the high bits, phase in the low two.
const FREE: u64 = 0;
const LIVE: u64 = 1;
const DRAINING: u64 = 2;

const fn state(epoch: u32, phase: u64) -> u64 {
    (epoch as u64) << 2 | phase
}

const fn epoch_of(state: u64) -> u32 {
    (state >> 2) as u32
}

const TIER_BITS_GPU: u8 = 1 << Tier::Gpu as u8;

/// Per-slot state, apart from the slot's phase and epoch (kept in a dense
/// array of their own, so a query reporting 256 pods reads 2 KiB, not 256
/// scattered lines).
#[derive(Debug)]
struct Slot {
    /// Blocks the pod holds.
    blocks: AtomicU64,
    /// Serialises one pod's events; holds its tier records.
    pod: Mutex<PodState>,
}

/// Cold-path state of one pod.
#[derive(Debug, Default)]
struct PodState {
    /// Tier masks of the blocks not held in exactly {GPU}. A block with its
    /// bit set and no record here is on the GPU only, so a single-tier fleet
    /// keeps this empty and pays nothing for tiers.
    tiers: HashMap<u64, u8>,
}

#[derive(Debug, Default)]
struct Registry {
    by_key: HashMap<PodKey, PodId>,
    keys: Vec<Option<PodKey>>,
}

#[derive(Debug, Default)]
struct Counters {
    events_applied: AtomicU64,
    skipped_unknown: AtomicU64,
    skipped_dead: AtomicU64,
    skipped_parent: AtomicU64,
    sweeps_running: AtomicU64,
    sweeps_completed: AtomicU64,
    blocks_swept: AtomicU64,
}

/// Candidate pods of one search interval: blocks `lo..hi` still undecided.
type Interval<const W: usize> = (u32, u32, HostBitmap<W>);

/// A block's run hint, as the write path leaves it in the block's entry:
/// `run` in the low 14 bits, an `OPEN` or a `FAR` flag above, 0 for none.
///
/// `run = r` says that when the block was last written, the `r - 1` blocks
/// after it in the writing event had the same holders. Without `OPEN`, the
/// `r`-th had other holders: a change seen, predicting that some pods stop
/// at exactly that depth. With `OPEN`, the run reached the event's end and
/// what follows is unknown.
///
/// A run's last block (its successor had other holders) would say `r = 1`,
/// which a search reading it beside its successor (a probe pair) already
/// knows. Such a block says more instead, flagged `FAR`: the distance to
/// the end of the run *after next* (the change after the one its
/// successor's hint names, or the event's end that run reached). A pair
/// then names two changes ahead, and the next step reads both at once
/// ([`Index::probe_into`]): two groups per wait instead of one.
///
/// Hints are guesses for the search's next split, never trusted: any hint,
/// stale or wrong, still gives the exact answer, and a wrong one costs
/// probes only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Hint(u16);

impl Hint {
    const OPEN: u16 = 1 << 15;
    const FAR: u16 = 1 << 14;
    const RUN_MAX: u16 = Self::FAR - 1;
    /// A run's last block, with nothing more known.
    const CHANGE_NEXT: Hint = Hint(1);

    /// The run to the next change: 1 for a `FAR` hint.
    fn run(self) -> u32 {
        if self.0 & Self::FAR != 0 {
            1
        } else {
            (self.0 & Self::RUN_MAX) as u32
        }
    }

    fn is_open(self) -> bool {
        self.0 & Self::OPEN != 0
    }

    /// For a `FAR` hint: the distance to the end of the run after next.
    fn far(self) -> u32 {
        if self.0 & Self::FAR != 0 {
            (self.0 & Self::RUN_MAX) as u32
        } else {
            0
        }
    }

    /// For a `FAR` hint read at block `at`: the block where the run after
    /// next ends (a span's `far`); 0 for any other hint.
    fn far_from(self, at: u32) -> u32 {
        match self.far() {
            0 => 0,
            d => at.saturating_add(d),
        }
    }
}

/// What the write path knows of a block's run as it walks an event's
/// blocks backwards, handed from each block to the one before it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Run {
    /// The block's own hint (never `FAR`).
    hint: Hint,
    /// The hint of the block where that run ends (the next change), when
    /// the walk saw it; `Hint(0)` when not.
    after: Hint,
    /// What the block's entry keeps: `hint`, or a `FAR` hint for a run's
    /// last block.
    stored: Hint,
}

impl Run {
    /// The run of a block whose holders are `set`, followed by `next` (its
    /// successor's holders and run; `None` when the successor has no holder
    /// left), or by the end of the event.
    #[inline(always)]
    fn before<const W: usize>(
        next: Option<&(HostBitmap<W>, Run)>,
        set: &HostBitmap<W>,
        event_end: bool,
    ) -> Run {
        let plain = |hint: Hint, after: Hint| Run {
            hint,
            after,
            stored: hint,
        };
        if event_end {
            return plain(Hint(Hint::OPEN | 1), Hint(0));
        }
        match next {
            Some((same, r)) if same == set => {
                let run = r.hint.0 & Hint::RUN_MAX;
                if run >= Hint::RUN_MAX {
                    // Saturated: no longer knows where it ends.
                    plain(Hint(Hint::OPEN | Hint::RUN_MAX), Hint(0))
                } else {
                    plain(Hint(r.hint.0 & Hint::OPEN | (run + 1)), r.after)
                }
            }
            Some((_, r)) => {
                // The successor starts a run of `r.hint` ending at a change
                // whose own run is `r.after`: this block names where that
                // run ends, `1 + run + after` blocks on.
                let far = 1 + r.hint.run() + r.after.run();
                let known = !r.hint.is_open() && r.hint.run() > 0 && r.after.run() > 0;
                Run {
                    hint: Hint::CHANGE_NEXT,
                    after: r.hint,
                    stored: if known && far <= Hint::RUN_MAX as u32 {
                        Hint(Hint::FAR | far as u16)
                    } else {
                        Hint::CHANGE_NEXT
                    },
                }
            }
            None => plain(Hint::CHANGE_NEXT, Hint(0)),
        }
    }
}

/// Which blocks of an event the write path may check without the lock and
/// leave alone ([`Index::write_blocks`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Skip {
    /// None: every block is written under its shard lock.
    Nothing,
    /// Blocks the pod holds (a GPU store).
    Held,
    /// Blocks the pod does not hold (a remove).
    NotHeld,
}

#[cfg(test)]
thread_local! {
    /// Rounds of reads a search waited for on this thread (a probe, a pair,
    /// three or four together, a scan batch), for tests.
    static WAITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Counts one round of reads (tests only; nothing otherwise).
#[inline(always)]
fn waited() {
    #[cfg(test)]
    WAITS.with(|w| w.set(w.get() + 1));
}

/// Blocks a scan reads in one batch ([`Index::scan`]).
const SCAN_BATCH: usize = 16;

/// How a search interval picks its next probe.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// The middle block.
    Halve,
    /// A hint saw a change at depth `g`: probe block `g` (or block `g - 1`
    /// when `g` is the interval's end), expecting some pods to stop there.
    At(u32),
    /// A hint says the run goes on through block `e - 1` and then it does
    /// not know: probe block `e - 1`, whose hint may know more.
    Through(u32, u32),
}

/// A search interval: its pods hold block `lo - 1` and not block `hi`, so
/// their depths lie in `lo..=hi`; `idle` counts the probes in a row that
/// split nothing (a wrong guess), which bounds what bad hints can cost.
#[derive(Clone, Copy, Debug)]
struct Span<const W: usize> {
    lo: u32,
    hi: u32,
    cand: HostBitmap<W>,
    plan: Plan,
    idle: u8,
    /// A change predicted past the one `plan` aims at, from a `FAR` hint (0:
    /// none), read in the same step as `plan`'s pair. Only a guess, like
    /// every hint: the step's reads decide.
    far: u32,
}

/// Probes in a row that split nothing, after which a span stops following
/// hints and halves.
const MAX_IDLE: u8 = 4;

/// The plan for pods known to hold block `at` (probed, with hint `h`), in
/// a span ending at `hi`.
#[inline]
fn plan_after(at: u32, h: Hint, hi: u32) -> Plan {
    let run = h.run();
    if run == 0 {
        return Plan::Halve;
    }
    let end = at.saturating_add(run);
    if !h.is_open() || run == 1 {
        // A change seen, or an event that ended here with nothing stored
        // after it: most likely pods stop right there.
        Plan::At(end.min(hi))
    } else if end < hi {
        Plan::Through(end, run)
    } else {
        Plan::Halve
    }
}

/// Event ends a search crossing an open run reads in one round at most
/// ([`Step::Pairs`]): a pair each.
const GALLOP: u32 = 4;
/// The shortest run taken for an event's length when galloping: shorter
/// ones are as likely a partial event, and reading ahead by them wastes
/// probes.
const GALLOP_MIN_RUN: u32 = 8;

/// The pairs a step crossing an open run reads (from the event end `at`,
/// runs of `run` blocks, in a span ending at `hi`, after `idle` rounds
/// that split nothing): how many, how far apart, and whether they are
/// spread over the ends left rather than the next ones.
#[inline(always)]
fn gallop(at: u32, run: u32, hi: u32, idle: u8) -> (u32, u32, bool) {
    let ends = (hi - 1 - at) / run + 1;
    let sparse = run >= GALLOP_MIN_RUN && ends > GALLOP && idle > 0;
    if run < GALLOP_MIN_RUN {
        (1, run, false)
    } else if !sparse {
        (ends.min(GALLOP), run, false)
    } else {
        // Evenly over the ends left, still on event ends.
        (GALLOP, run * ((ends - 1) / (GALLOP - 1)), true)
    }
}

/// The parts a lone pod's search cuts a span into when no hint leads it
/// (spans shorter than twice this are halved).
const SPLIT: usize = 4;

/// Spans whose steps one round of a partition reads together.
const ROUND_SPANS: usize = 4;
/// Blocks one round of a partition reads at most.
const ROUND_READS: usize = 16;
/// Blocks one span's step reads at most: [`GALLOP`] pairs.
const STEP_READS: usize = 2 * GALLOP as usize;

/// The buffers of a partition round that reads several spans' blocks.
struct Round<'g, const W: usize> {
    spans: [Span<W>; ROUND_SPANS],
    steps: [Step; ROUND_SPANS],
    hashes: [u64; ROUND_READS],
    staged: [Staged<'g>; ROUND_READS],
    found: [(HostBitmap<W>, Hint); ROUND_READS],
}

impl<const W: usize> Round<'_, W> {
    fn new(span: Span<W>) -> Self {
        Round {
            spans: [span; ROUND_SPANS],
            steps: [Step::Mid { mid: 0 }; ROUND_SPANS],
            hashes: [0; ROUND_READS],
            staged: [Staged::NONE; ROUND_READS],
            found: [(HostBitmap::EMPTY, Hint(0)); ROUND_READS],
        }
    }
}

/// A span's next step in a partition: which blocks it reads (all in one
/// round), and how it splits the span's pods by what they hold.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Block `hi - 1`, expecting the pods to hold it: depth `hi`.
    End { hi: u32 },
    /// Blocks `g - 1` and `g`, and `c - 1` and `c` (`c - 1` alone when
    /// `c` ends the span): the change a hint saw and the one after it.
    Far { g: u32, c: u32, hi: u32 },
    /// Blocks `g - 1` and `g`, and as many pairs again `stride` blocks
    /// apart each: the pods holding every block before a pair's second
    /// and not that one stop there. `sparse`: pairs spread over many
    /// event ends after a round that found no change.
    Pairs {
        g: u32,
        stride: u32,
        pairs: u32,
        sparse: bool,
    },
    /// Block `p`: `at` says whether the pods left short of it are
    /// predicted to stop at depth `p` (an `At` plan) or not (`Through`).
    One { p: u32, at: bool },
    /// The middle block `mid`.
    Mid { mid: u32 },
}

impl Step {
    /// The step of a span (`lo < hi`) by its plan; `None` when the span is
    /// short enough to scan (the `linear_span` knob).
    #[inline(always)]
    fn of<const W: usize>(s: &Span<W>, linear: u32) -> Option<Step> {
        let plan = if s.idle >= MAX_IDLE {
            Plan::Halve
        } else {
            s.plan
        };
        Some(match plan {
            Plan::At(g) if g == s.hi => Step::End { hi: s.hi },
            Plan::At(g) if g > s.lo && s.idle == 0 && s.far >= g + 2 && s.far <= s.hi => {
                Step::Far {
                    g,
                    c: s.far,
                    hi: s.hi,
                }
            }
            Plan::At(g) if g > s.lo => Step::Pairs {
                g,
                stride: 0,
                pairs: 1,
                sparse: false,
            },
            Plan::At(at) => Step::One { p: at, at: true },
            // A run open at an event's end (`at - 1`): block `at` is read
            // with it, so a change there is settled in the same round, and
            // its hint, from the next event, plans the step after.
            Plan::Through(at, run) if at > s.lo && at < s.hi => {
                // The run that reached an event's end was most likely an
                // event long, and so are the events after it: their ends
                // are read in the same round (a pair each, as far as the
                // span goes), so a search crossing many events waits once
                // per [`GALLOP`] of them, not once each. Once a round of
                // such pairs found no change, the next spreads its pairs
                // over all the ends left: a few changes among many events
                // cost a search over the events, not a walk along them.
                let (pairs, stride, sparse) = gallop(at, run, s.hi, s.idle);
                Step::Pairs {
                    g: at,
                    stride,
                    pairs,
                    sparse,
                }
            }
            Plan::Through(at, _) => Step::One {
                p: at - 1,
                at: false,
            },
            Plan::Halve if s.hi - s.lo <= linear => return None,
            Plan::Halve => Step::Mid {
                mid: s.lo + (s.hi - s.lo) / 2,
            },
        })
    }

    /// How many blocks the step reads.
    #[inline(always)]
    fn count(self) -> usize {
        match self {
            Step::Far { c, hi, .. } if c == hi => 3,
            Step::Far { .. } => 4,
            Step::Pairs { pairs, .. } => 2 * pairs as usize,
            Step::End { .. } | Step::One { .. } | Step::Mid { .. } => 1,
        }
    }

    /// The blocks read, and how many ([`Step::count`]).
    #[inline]
    fn reads(self) -> ([u32; STEP_READS], usize) {
        let mut b = [0; STEP_READS];
        match self {
            Step::End { hi } => b[0] = hi - 1,
            Step::Far { g, c, .. } => b[..4].copy_from_slice(&[g - 1, g, c - 1, c]),
            Step::Pairs {
                g, stride, pairs, ..
            } => {
                for j in 0..pairs as usize {
                    let at = g + j as u32 * stride;
                    b[2 * j] = at - 1;
                    b[2 * j + 1] = at;
                }
            }
            Step::One { p, .. } => b[0] = p,
            Step::Mid { mid } => b[0] = mid,
        }
        (b, self.count())
    }

    /// Splits `s`'s pods by `found` (what each read block's holders among
    /// them are, and its hint), pushing the parts, shallowest first.
    #[inline(always)]
    fn apply<const W: usize>(
        self,
        s: &Span<W>,
        found: &[(HostBitmap<W>, Hint)],
        stack: &mut SmallVec<[Span<W>; 80]>,
    ) {
        let Span {
            lo,
            hi,
            cand,
            idle,
            far,
            ..
        } = *s;
        let mut push = |lo, hi, cand: HostBitmap<W>, plan, idle, far| {
            if !cand.is_empty() {
                stack.push(Span {
                    lo,
                    hi,
                    cand,
                    plan,
                    idle,
                    far,
                });
            }
        };
        match self {
            Step::End { hi } => {
                // The pods holding block hi - 1 stop at depth hi: a span of
                // its own, emitted when it comes off the stack, after the
                // deeper spans of this round.
                let held = found[0].0;
                let idle = if held.is_empty() { idle + 1 } else { 0 };
                push(lo, hi - 1, cand.and_not(&held), Plan::Halve, idle, 0);
                push(hi, hi, held, Plan::Halve, idle, 0);
            }
            Step::Far { g, c, .. } => {
                let [(before, _), (at, h), (before_c, hc1)] = [found[0], found[1], found[2]];
                // Each read splits the pods still holding every block
                // before it; past the span's end no pod holds block c.
                let (at_c, hc) = found
                    .get(3)
                    .copied()
                    .unwrap_or((HostBitmap::EMPTY, Hint(0)));
                let held_g1 = cand.and(&before);
                let held_g = held_g1.and(&at);
                let held_c1 = held_g.and(&before_c);
                let held_c = held_c1.and(&at_c);
                let stop_g = held_g1.and_not(&at);
                let stop_c = held_c1.and_not(&at_c);
                let idle = if stop_g.is_empty() && stop_c.is_empty() {
                    idle + 1
                } else {
                    0
                };
                push(lo, g - 1, cand.and_not(&before), Plan::Halve, idle, 0);
                push(g, g, stop_g, Plan::Halve, idle, 0);
                let between = held_g.and_not(&before_c);
                push(g + 1, c - 1, between, plan_after(g, h, c - 1), idle, 0);
                push(c, c, stop_c, Plan::Halve, idle, 0);
                let far = hc1.far_from(c - 1);
                push(c + 1, hi, held_c, plan_after(c, hc, hi), idle, far);
            }
            Step::Pairs {
                g,
                stride,
                pairs,
                sparse,
            } => {
                // Each pair splits the pods still holding every block
                // before it, deepest last: its parts go on the stack as
                // they come. A stretch left behind between two pairs
                // follows the hint read at the earlier pair; the span
                // after the last pair follows its hint, and its idle count
                // needs every pair's.
                let mut held = cand;
                let mut from = lo;
                let mut split = false;
                let mut last = (g, Hint(0), Hint(0));
                for (j, pair) in found[..2 * pairs as usize].chunks_exact(2).enumerate() {
                    let at = g + j as u32 * stride;
                    let [(before, hb), (now, h)] = [pair[0], pair[1]];
                    let kept = held.and(&before);
                    let stop = kept.and_not(&now);
                    split |= !stop.is_empty();
                    let part = held.and_not(&before);
                    if !part.is_empty() {
                        // The stretch since the previous pair follows that
                        // pair's hint (the first one has none); between
                        // sparse pairs it spreads its own pairs at once
                        // (it counts as one idle round).
                        let (plan, quiet) = match j {
                            0 => (Plan::Halve, 0),
                            _ => (plan_after(last.0, last.2, at - 1), u8::from(sparse)),
                        };
                        push(from, at - 1, part, plan, quiet, 0);
                    }
                    push(at, at, stop, Plan::Halve, 0, 0);
                    held = kept.and(&now);
                    from = at + 1;
                    last = (at, hb, h);
                }
                let idle = if split { 0 } else { idle + 1 };
                let (at, hb, h) = last;
                let far = hb.far_from(at - 1);
                push(at + 1, hi, held, plan_after(at, h, hi), idle, far);
            }
            Step::One { p, at } => {
                let (held, h) = found[0];
                let missing = cand.and_not(&held);
                let split = !held.is_empty() && !missing.is_empty();
                let idle = if split { 0 } else { idle + 1 };
                let plan = if at { Plan::At(p) } else { Plan::Halve };
                push(lo, p, missing, plan, idle, 0);
                // Through: block p's hint, when it ends a run, names where
                // the run after next ends. At: a Through step's far, two
                // runs past its read, is one run past this read's plan.
                let far = if at { far } else { h.far_from(p) };
                push(p + 1, hi, held, plan_after(p, h, hi), idle, far);
            }
            Step::Mid { mid } => {
                let (held, h) = found[0];
                push(lo, mid, cand.and_not(&held), Plan::Halve, 0, 0);
                push(mid + 1, hi, held, plan_after(mid, h, hi), 0, 0);
            }
        }
    }
}

/// The sharded bitmap index: which live pods hold the longest prefix of a
/// block-hash chain.
///
/// `W` is the bitmap width in 64-bit words: `W * 64` pod slots (4 = 256 pods
/// by default; 1 to 16 words, so 64 to 1024 pods). See the crate docs for
/// the design and its invariants.
#[derive(Debug)]
pub struct Index<const W: usize = 4> {
    shards: Box<[Shard<W>]>,
    shard_bits: u32,
    alive: Box<[AtomicU64]>,
    /// Per slot: `epoch << 2 | phase`.
    states: Box<[AtomicU64]>,
    slots: Box<[Slot]>,
    registry: Mutex<Registry>,
    pending: Mutex<Vec<u16>>,
    sweepers: std::sync::Mutex<Vec<std::thread::Thread>>,
    counters: Counters,
    config: IndexConfig,
    me: Weak<Index<W>>,
}

impl<const W: usize> Index<W> {
    const WIDTH_OK: () = assert!(W >= 1 && W <= 16, "HostBitmap width must be 1 to 16 words");

    /// An empty index.
    pub fn new(config: IndexConfig) -> Arc<Self> {
        let () = Self::WIDTH_OK;
        let config = IndexConfig {
            shard_bits: config.shard_bits.min(12),
            sweep_threads: config.sweep_threads.max(1),
            capacity: config.capacity.min(IndexConfig::MAX_CAPACITY),
            ..config
        };
        // A shard's share, with room for the spread of a random split
        // (four standard deviations), so no shard grows short of it.
        let mean = config.capacity.div_ceil(1 << config.shard_bits);
        let per_shard = if mean == 0 {
            0
        } else {
            mean + 4 * mean.isqrt()
        };
        let shards = (0..1usize << config.shard_bits)
            .map(|_| {
                let shard = Shard::new(ShardCore::default());
                if per_shard > 0 {
                    shard.write().reserve(per_shard);
                }
                shard
            })
            .collect();
        let slots = (0..HostBitmap::<W>::CAPACITY)
            .map(|_| Slot {
                blocks: AtomicU64::new(0),
                pod: Mutex::new(PodState::default()),
            })
            .collect();
        Arc::new_cyclic(|me| Index {
            shards,
            shard_bits: config.shard_bits,
            alive: (0..W).map(|_| AtomicU64::new(0)).collect(),
            states: (0..HostBitmap::<W>::CAPACITY)
                .map(|_| AtomicU64::new(state(0, FREE)))
                .collect(),
            slots,
            registry: Mutex::new(Registry {
                by_key: HashMap::new(),
                keys: vec![None; HostBitmap::<W>::CAPACITY],
            }),
            pending: Mutex::new(Vec::new()),
            sweepers: std::sync::Mutex::new(Vec::new()),
            counters: Counters::default(),
            config,
            me: me.clone(),
        })
    }

    /// The live pods, as of now.
    pub fn alive(&self) -> HostBitmap<W> {
        let mut words = [0u64; W];
        for (w, a) in words.iter_mut().zip(self.alive.iter()) {
            *w = a.load(Ordering::Acquire);
        }
        HostBitmap::from_words(words)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<W> {
        &self.shards[shard_of(hash, self.shard_bits)]
    }

    /// The slot of a live pod, or why the pod cannot take events.
    fn live_slot(&self, pod: PodId) -> Result<(&Slot, &AtomicU64), Error> {
        let i = pod.slot() as usize;
        let (Some(slot), Some(st)) = (self.slots.get(i), self.states.get(i)) else {
            self.counters
                .skipped_unknown
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::UnknownPod(pod));
        };
        let s = st.load(Ordering::Acquire);
        if s == state(pod.epoch(), LIVE) {
            Ok((slot, st))
        } else if s == state(pod.epoch(), DRAINING) || epoch_of(s) > pod.epoch() {
            self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
            Err(Error::PodShutDown(pod))
        } else {
            self.counters
                .skipped_unknown
                .fetch_add(1, Ordering::Relaxed);
            Err(Error::UnknownPod(pod))
        }
    }

    /// Blocks held by a live pod.
    pub fn pod_blocks(&self, pod: PodId) -> Option<u64> {
        let i = pod.slot() as usize;
        let (slot, st) = (self.slots.get(i)?, self.states.get(i)?);
        (st.load(Ordering::Acquire) == state(pod.epoch(), LIVE))
            .then(|| slot.blocks.load(Ordering::Relaxed))
    }

    /// The counters, with sizes summed over the shards (locks each briefly).
    pub fn stats(&self) -> IndexStats {
        let mut st = IndexStats::default();
        for shard in self.shards.iter() {
            let mut sh = shard.write();
            st.entries += sh.entries() as u64;
            st.residencies += sh.residencies();
            st.bitmap_entries += sh.bitmaps_live() as u64;
            st.bytes += sh.bytes() as u64;
        }
        for slot in self.slots.iter() {
            let ps = slot.pod.lock();
            st.bytes += (ps.tiers.capacity() * (std::mem::size_of::<(u64, u8)>() + 1)) as u64;
        }
        st.pods_live = self.alive().count() as u64;
        let c = &self.counters;
        st.events_applied = c.events_applied.load(Ordering::Relaxed);
        st.skipped_unknown_pod = c.skipped_unknown.load(Ordering::Relaxed);
        st.skipped_dead_pod = c.skipped_dead.load(Ordering::Relaxed);
        st.skipped_unknown_parent = c.skipped_parent.load(Ordering::Relaxed);
        st.sweeps_running = c.sweeps_running.load(Ordering::Relaxed);
        st.sweeps_completed = c.sweeps_completed.load(Ordering::Relaxed);
        st.blocks_swept = c.blocks_swept.load(Ordering::Relaxed);
        st
    }
}

/// A chain of block hashes as the index reads it: the router's
/// [`BlockHash`]es, or the raw `u64` values an embedder already has.
pub trait HashChain {
    /// The number of blocks.
    fn len(&self) -> usize;
    /// Whether the chain has no blocks.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The hash of block `i` (`i < len`).
    fn hash_at(&self, i: usize) -> u64;
}

impl HashChain for [BlockHash] {
    #[inline]
    fn len(&self) -> usize {
        <[BlockHash]>::len(self)
    }
    #[inline]
    fn hash_at(&self, i: usize) -> u64 {
        self[i].0
    }
}

impl HashChain for [u64] {
    #[inline]
    fn len(&self) -> usize {
        <[u64]>::len(self)
    }
    #[inline]
    fn hash_at(&self, i: usize) -> u64 {
        self[i]
    }
}

/// Where a search puts the pods it finds, a group of one depth at a time.
trait MatchSink {
    fn found_group(&mut self, blocks: u32, pods: impl ExactSizeIterator<Item = PodId>);
    fn add_probes(&mut self, n: u32);

    /// The pods of one bitmap word of a group: slot `base + i` for each bit
    /// `i` set in `word`, with its epoch from `epoch`. By default through a
    /// counted range, so a `Vec`'s `extend` writes the pods without a
    /// length update per pod.
    #[inline]
    fn found_word(&mut self, blocks: u32, base: usize, word: u64, epoch: impl Fn(usize) -> u32) {
        let mut w = word;
        let ids = (0..word.count_ones()).map(|_| {
            let s = base + w.trailing_zeros() as usize;
            w &= w.wrapping_sub(1);
            PodId::new(s as u16, epoch(s))
        });
        self.found_group(blocks, ids);
    }
}

impl MatchSink for PrefixMatch {
    #[inline]
    fn found_group(&mut self, blocks: u32, pods: impl ExactSizeIterator<Item = PodId>) {
        self.push_group(blocks, pods);
    }
    #[inline]
    fn add_probes(&mut self, n: u32) {
        PrefixMatch::add_probes(self, n);
    }
}

struct FnSink<F> {
    f: F,
    probes: u32,
}

impl<F: FnMut(PodId, u32)> MatchSink for FnSink<F> {
    #[inline]
    fn found_group(&mut self, blocks: u32, pods: impl ExactSizeIterator<Item = PodId>) {
        if blocks > 0 {
            for pod in pods {
                (self.f)(pod, blocks);
            }
        }
    }
    #[inline]
    fn add_probes(&mut self, n: u32) {
        self.probes += n;
    }

    /// Bit by bit: a closure per pod needs no count first (a population
    /// count is a loop of its own where the target has no instruction for
    /// it, as x86-64's baseline has not).
    #[inline]
    fn found_word(&mut self, blocks: u32, base: usize, word: u64, epoch: impl Fn(usize) -> u32) {
        if blocks == 0 {
            return;
        }
        let mut w = word;
        while w != 0 {
            let s = base + w.trailing_zeros() as usize;
            w &= w.wrapping_sub(1);
            (self.f)(PodId::new(s as u16, epoch(s)), blocks);
        }
    }
}

/// Removes `mask`'s pods from every entry of a shard, dropping emptied
/// entries. Returns the (block, pod) pairs removed.
fn strip<const W: usize>(w: &mut ShardWrite<'_, W>, mask: &HostBitmap<W>) -> u64 {
    let (mut map, mut slab, residencies) = w.parts();
    let mut removed = 0u64;
    map.retain(|_, h| {
        removed += h.remove_mask(&mut slab, mask) as u64;
        !h.is_empty()
    });
    *residencies -= removed;
    removed
}

fn sweeper_loop<const W: usize>(me: Weak<Index<W>>) {
    loop {
        match me.upgrade() {
            Some(index) => while index.sweep() > 0 {},
            None => return,
        }
        std::thread::park_timeout(std::time::Duration::from_millis(100));
    }
}

impl<const W: usize> PrefixIndex for Index<W> {
    fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
        Index::match_prefix_into(self, chain, out);
    }

    fn tier_counts(&self, pod: PodId, chain: &[BlockHash], depth: usize) -> Option<TierCounts> {
        let i = pod.slot() as usize;
        let (slot, st) = (self.slots.get(i)?, self.states.get(i)?);
        let ps = slot.pod.lock();
        if st.load(Ordering::Acquire) != state(pod.epoch(), LIVE) {
            return None;
        }
        let mut counts = TierCounts::default();
        for h in chain.iter().take(depth) {
            let mask = ps.tiers.get(&h.0).copied().unwrap_or(TIER_BITS_GPU);
            for t in Tier::ALL {
                if mask & (1 << t as u8) != 0 {
                    counts[t] += 1;
                }
            }
        }
        Some(counts)
    }
}

impl<const W: usize> CacheEventSink for Index<W> {
    fn apply(&self, event: &CacheEvent) -> Result<(), Error> {
        self.apply_event(event)
    }

    fn apply_stored(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: Vec<BlockHash>,
    ) -> Result<(), Error> {
        self.store_after(pod, tier, parent, &blocks)
    }
}

impl<const W: usize> PodDirectory for Index<W> {
    fn join(&self, key: &PodKey) -> Result<PodId, Error> {
        Index::join(self, key)
    }

    fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        Index::pod_id(self, key)
    }

    fn pod_key(&self, id: PodId) -> Option<PodKey> {
        Index::pod_key(self, id)
    }

    fn shutdown(&self, id: PodId) -> Result<(), Error> {
        Index::shutdown(self, id)
    }
}

#[cfg(all(test, not(router_loom)))]
mod tests {
    use super::*;

    /// 64 pods stopping every 16 blocks of a 1024-block chain, each pod's
    /// blocks stored in events of 64 naming their parents (as engines
    /// report a long prefill): the hints see every change.
    fn staircase() -> (Arc<Index>, Vec<BlockHash>, Vec<PodId>) {
        let index = Index::<4>::new(IndexConfig::default().background_sweep(false));
        let pods: Vec<PodId> = (0..64)
            .map(|i| {
                index
                    .join(&PodKey::new(format!("http://pod-{i}"), 0))
                    .unwrap()
            })
            .collect();
        let c: Vec<BlockHash> = (0..1024u64).map(|i| BlockHash(5 << 32 | i)).collect();
        for (i, pod) in pods.iter().enumerate() {
            let d = 16 * (i + 1);
            for at in (0..d).step_by(64) {
                let parent = at.checked_sub(1).map(|p| c[p]);
                index
                    .store_after(*pod, Tier::Gpu, parent, &c[at..(at + 64).min(d)])
                    .unwrap();
            }
        }
        (index, c, pods)
    }

    fn hint_of(index: &Index, b: BlockHash) -> Hint {
        Hint(index.shard(b.0).entry_unchecked(&pin(), b.0).1)
    }

    #[test]
    fn a_runs_last_block_names_the_change_after_next() {
        let (index, c, _) = staircase();
        // Block 15 ends a run: block 16 starts one that changes at 32, and
        // the run from 32 changes at 48, 33 blocks on from block 15.
        assert_eq!(hint_of(&index, c[15]).far(), 33);
        assert_eq!(
            hint_of(&index, c[15]).run(),
            1,
            "and its own run still ends next"
        );
        // Block 16 starts a run: a plain hint, 16 blocks to the change.
        assert_eq!(hint_of(&index, c[16]), Hint(16));
        // Block 47's successor ran to its event's end (block 63): the run
        // after next is unknown, so the plain change hint stays.
        assert_eq!(hint_of(&index, c[47]), Hint::CHANGE_NEXT);
    }

    /// Pods stopping every `every` blocks of a `len`-block chain, stored
    /// in events of 64 naming their parents; the search's rounds of reads
    /// and probes, its answer checked against the block-by-block
    /// reference.
    fn search_for(len: usize, every: usize, pods: usize) -> (u32, u32) {
        let index = Index::<4>::new(IndexConfig::default().background_sweep(false));
        let c: Vec<BlockHash> = (0..len as u64).map(|i| BlockHash(7 << 32 | i)).collect();
        let ids: Vec<PodId> = (0..pods)
            .map(|i| {
                let pod = index
                    .join(&PodKey::new(format!("http://pod-{i}"), 0))
                    .unwrap();
                let d = (every * (i % (len / every) + 1)).min(len);
                for at in (0..d).step_by(64) {
                    let parent = at.checked_sub(1).map(|p| c[p]);
                    index
                        .store_after(pod, Tier::Gpu, parent, &c[at..(at + 64).min(d)])
                        .unwrap();
                }
                pod
            })
            .collect();
        WAITS.with(|w| w.set(0));
        let m = index.match_prefix(&c);
        let waits = WAITS.with(|w| w.get());
        assert_eq!(m.pods(), index.match_prefix_linear(&c).pods());
        assert_eq!(m.pods().len(), ids.len());
        (waits, m.probes())
    }

    fn rounds_for(len: usize, every: usize, pods: usize) -> u32 {
        search_for(len, every, pods).0
    }

    #[test]
    fn a_lone_pod_without_a_useful_hint_waits_once_per_two_levels() {
        // The pod stored the query's first `d` blocks as the start of a
        // longer chain that goes on elsewhere (a conversation that
        // branched), so every hint it reads says the run goes past the
        // query's end: no hint leads, and the search cuts. Quartering waits
        // one round per two levels (a halving would wait one per level:
        // 12 rounds on 2048 blocks).
        for (n, d) in [
            (2048usize, 700usize),
            (2048, 1),
            (2048, 2046),
            (300, 123),
            (40, 17),
        ] {
            let index = Index::<4>::new(IndexConfig::default().background_sweep(false));
            let pod = index.join(&PodKey::new("http://pod", 0)).unwrap();
            let c: Vec<BlockHash> = (0..n as u64).map(|i| BlockHash(9 << 32 | i)).collect();
            let mut branch = c[..d].to_vec();
            branch.extend((0..3000u64).map(|i| BlockHash(11 << 32 | i)));
            index.store(pod, Tier::Gpu, &branch).unwrap();
            WAITS.with(|w| w.set(0));
            let m = index.match_prefix(&c);
            let waits = WAITS.with(|w| w.get());
            assert_eq!(m.pods().len(), 1);
            assert_eq!(m.pods()[0].blocks as usize, d);
            let levels = usize::BITS - n.leading_zeros();
            let bound = 2 + levels.div_ceil(2) + 1;
            assert!(
                waits <= bound,
                "{n} blocks, depth {d}: {waits} rounds, bound {bound}"
            );
            assert!(m.probes() <= 2 + 2 * levels, "{} probes", m.probes());
        }
    }

    #[test]
    fn sparse_changes_are_searched_over_events() {
        // A few groups among many events: a walk along the events read a
        // pair per event crossed (114 probes in 15 rounds for 8 groups on
        // 64 events, 98 in 13 for 4); pairs spread over the events left
        // once a round found no change take 74 in 8 and 58 in 6.
        let (waits, probes) = search_for(4096, 512, 64);
        assert!(
            waits <= 10 && probes <= 80,
            "{waits} rounds, {probes} probes"
        );
        let (waits, probes) = search_for(4096, 1024, 64);
        assert!(
            waits <= 8 && probes <= 64,
            "{waits} rounds, {probes} probes"
        );
        // Changes every four events: the walk was already right (the
        // first round finds a change), and stays as it was.
        let (waits, probes) = search_for(2048, 256, 64);
        assert!(
            waits <= 8 && probes <= 58,
            "{waits} rounds, {probes} probes"
        );
    }

    #[test]
    fn open_runs_are_crossed_several_events_per_round() {
        // 8 groups 512 blocks apart on a 4096-block chain: 64 events, each
        // run open at its event's end. One round per event crossed is at
        // least 64 rounds; reading four events' ends per round (and the
        // spans left behind together) took 15, spreading the pairs over
        // the ends left once a round found no change takes 8.
        let waits = rounds_for(4096, 512, 64);
        assert!(waits <= 10, "{waits} rounds of reads (8 groups)");
        // A group every event (64 of them): as many changes as events, 17
        // rounds.
        let waits = rounds_for(4096, 64, 256);
        assert!(waits <= 24, "{waits} rounds of reads");
        // Runs shorter than an event (the staircase below): the plain
        // steps, several spans' per round, 18 rounds.
        let waits = rounds_for(1024, 16, 64);
        assert!(waits <= 24, "{waits} rounds of reads");
    }

    #[test]
    fn far_hints_settle_two_groups_per_round() {
        let (index, c, pods) = staircase();
        WAITS.with(|w| w.set(0));
        let m = index.match_prefix(&c);
        let waits = WAITS.with(|w| w.get());
        assert_eq!(m.pods(), index.match_prefix_linear(&c).pods());
        for (i, pod) in pods.iter().enumerate() {
            assert_eq!(m.blocks_for(*pod), 16 * (i as u32 + 1));
        }
        assert!(m.probes() <= 2 * 64 + 16 + 2, "{} probes", m.probes());
        // A round per group and one per event crossed took 79 rounds;
        // reading the change after next with each pair took 35, and
        // several spans' steps per round take 18.
        assert!(waits <= 48, "{waits} rounds of reads");
    }
}
