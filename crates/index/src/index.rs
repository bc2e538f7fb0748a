//! The index: registry, events, queries and sweeps.

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

    /// The most pods the index can hold at once.
    pub const fn capacity(&self) -> usize {
        HostBitmap::<W>::CAPACITY
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

    /// The write path shared by stores and removes: checks the pod, takes
    /// its event lock, then walks the blocks **last to first**, locking each
    /// block's shard, re-checking liveness and calling `f` on the block.
    ///
    /// The same pass sets each remaining block's run hint ([`Hint`]):
    /// blocks are in chain order, so walking backwards a block's holders
    /// can be compared with its successor's, which were just written. Then
    /// `parent` (the block before the first, when the caller knows it) gets
    /// its hint extended over this event. Backwards also means a concurrent
    /// query, which starts from block 0, sees a stored run only once it is
    /// whole.
    ///
    /// `skip` names blocks a validated lock-free read may leave alone, when
    /// their hint would not change either: for a GPU store, blocks the pod
    /// already holds (engines repeat most of what they store: a prompt's
    /// shared prefix is stored again with every request that extends it);
    /// for a remove, blocks the pod does not hold. The read costs no lock
    /// and writes no line. A store with tier records takes the locked path,
    /// which keeps them.
    fn write_blocks(
        &self,
        pod: PodId,
        parent: Option<BlockHash>,
        skip: Skip,
        blocks: &[BlockHash],
        mut f: impl FnMut(
            &mut ShardWrite<'_, W>,
            &mut i64,
            &mut PodState,
            u64,
        ) -> Option<(usize, Holders)>,
    ) -> Result<(), Error> {
        let (slot, st) = self.live_slot(pod)?;
        let live = state(pod.epoch(), LIVE);
        let mut ps = slot.pod.lock();
        if let Some(BlockHash(p)) = parent.filter(|_| self.config.validate_parents) {
            // Under the pod's event lock, so no event of this pod can take
            // the parent away between the check and the store.
            let me = HostBitmap::<W>::single(pod.slot() as usize);
            let (held, _) = self.shard(p).look(&pin(), p, &me);
            if held.is_empty() {
                self.counters.skipped_parent.fetch_add(1, Ordering::Relaxed);
                return Err(Error::UnknownParent {
                    pod,
                    parent: BlockHash(p),
                });
            }
        }
        // The holders of the block after the current one, and its run;
        // `None` past the event's end or after a block left with no pod.
        let mut next: Option<(HostBitmap<W>, Run)> = None;
        let mut after_end = true;
        // Blocks the pod gained (or lost), added to its count once, still
        // under its event lock (a sweep takes that lock before zeroing it).
        let mut added = 0i64;
        let count = |added: i64| {
            if added >= 0 {
                slot.blocks.fetch_add(added as u64, Ordering::Relaxed);
            } else {
                slot.blocks
                    .fetch_sub(added.unsigned_abs(), Ordering::Relaxed);
            }
        };
        let skip = match skip {
            Skip::Held if !ps.tiers.is_empty() => Skip::Nothing,
            other => other,
        };
        // Whether to try the lock-free check on this block: from the start
        // for a remove, and after a locked write that changed nothing,
        // until a check fails. A store's new blocks (an event's tail,
        // typically) thus go straight to the locked path, where the check
        // would be a wasted lookup.
        let mut try_skip = skip == Skip::NotHeld;
        // Pinned on first use: most events never check a block without the
        // lock, and a pin costs a locked instruction.
        let mut guard: Option<Guard> = None;
        let me = pod.slot() as usize;
        // Each block's shard and cell are cold in a large index, and the
        // write of one block does not depend on the next one's memory: the
        // shard header `2 * AHEAD` blocks on and the cell line `AHEAD` on
        // are prefetched, so their misses overlap this block's work.
        const AHEAD: usize = 4;
        let n = blocks.len();
        for &BlockHash(b) in &blocks[n.saturating_sub(2 * AHEAD)..] {
            self.shard(b).prefetch_header();
        }
        for &BlockHash(b) in &blocks[n.saturating_sub(AHEAD)..] {
            self.shard(b).prefetch_entry(mix64(b));
        }
        for (j, &BlockHash(h)) in blocks.iter().enumerate().rev() {
            if let Some(&BlockHash(far)) = j.checked_sub(2 * AHEAD).map(|k| &blocks[k]) {
                self.shard(far).prefetch_header();
            }
            if let Some(&BlockHash(near)) = j.checked_sub(AHEAD).map(|k| &blocks[k]) {
                self.shard(near).prefetch_entry(mix64(near));
            }
            if try_skip {
                let g = guard.get_or_insert_with(pin);
                let held = skip == Skip::Held;
                if let Some(seen) = self.unchanged(g, h, me, held, next.as_ref(), after_end) {
                    // Nothing is written, so no bit can outlive the pod;
                    // the check keeps the result the locked path gives.
                    if st.load(Ordering::Acquire) != live {
                        count(added);
                        self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::PodShutDown(pod));
                    }
                    next = seen;
                    after_end = false;
                    continue;
                }
            }
            let mut w = self.shard(h).write();
            // Invariant: a write checks liveness under the shard lock. A
            // sweep locks every shard after the pod left, so either it sees
            // this write's bits, or this write sees the pod gone.
            if st.load(Ordering::Acquire) != live {
                count(added);
                self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                return Err(Error::PodShutDown(pod));
            }
            // `f` hands back the position of the block's entry if one is
            // left, and its new holders, stored here with their hint.
            let gained = added;
            next = f(&mut w, &mut added, &mut ps, h).map(|(at, mut e)| {
                let (mut map, slab, _) = w.parts();
                let set = e.to_bitmap(&slab);
                let run = Run::before(next.as_ref(), &set, after_end);
                e.set_hint(run.stored.0);
                map.set(at, e);
                (set, run)
            });
            try_skip = skip != Skip::Nothing && added == gained;
            after_end = false;
        }
        if let (Some(BlockHash(p)), Some(first)) = (parent, next)
            && !self.parent_hint_holds(guard.get_or_insert_with(pin), p, &first)
        {
            let mut w = self.shard(p).write();
            let (mut map, slab, _) = w.parts();
            if let Some(at) = map.find(p) {
                let mut e = map.get(at);
                let mine = e.to_bitmap(&slab);
                e.set_hint(Run::before(Some(&first), &mine, false).stored.0);
                map.set(at, e);
            }
        }
        count(added);
        self.counters.events_applied.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A validated lock-free read of block `h`, when writing it would
    /// change nothing: `slot` holds it (`held`) or does not, and the hint a
    /// write would give it (after `next`) is the one it has. Gives what the
    /// write path would have passed on as the block's holders and hint:
    /// `None` for a block no pod holds.
    #[allow(clippy::option_option)] // outer: skippable; inner: the entry, as the write path has it
    #[inline(always)]
    fn unchanged(
        &self,
        guard: &Guard,
        h: u64,
        slot: usize,
        held: bool,
        next: Option<&(HostBitmap<W>, Run)>,
        event_end: bool,
    ) -> Option<Option<(HostBitmap<W>, Run)>> {
        let sh = self.shard(h);
        let s = sh.lock.begin_check()?;
        let (set, raw) = sh.entry_unchecked(guard, h);
        let seen = if set.is_empty() {
            // No entry: a remove has nothing to do, a store must insert.
            (!held).then_some(None)
        } else {
            let run = Run::before(next, &set, event_end);
            (set.contains(slot) == held && run.stored.0 == raw).then_some(Some((set, run)))
        };
        seen.filter(|_| sh.lock.still_check(s))
    }

    /// Whether the parent `p` already has the hint a store after it would
    /// give it (so its shard need not be locked).
    fn parent_hint_holds(&self, guard: &Guard, p: u64, next: &(HostBitmap<W>, Run)) -> bool {
        let sh = self.shard(p);
        let Some(s) = sh.lock.begin_check() else {
            return false;
        };
        let (mine, raw) = sh.entry_unchecked(guard, p);
        !mine.is_empty()
            && Run::before(Some(next), &mine, false).stored.0 == raw
            && sh.lock.still_check(s)
    }

    /// Records that `pod` holds `blocks` in `tier` (a `CacheEvent::Stored`
    /// without building the event). Idempotent; one shard lock per block.
    pub fn store(&self, pod: PodId, tier: Tier, blocks: &[BlockHash]) -> Result<(), Error> {
        self.store_after(pod, tier, None, blocks)
    }

    /// [`Index::store`] of blocks that extend `parent` (the chain's block
    /// before `blocks[0]`, as engines' events name it). The answer is the
    /// same; naming the parent lets the index carry its run hint across
    /// events, so later searches of a long run stored in many events take
    /// fewer probes. With [`IndexConfig::validate_parents`], a store whose
    /// parent the pod does not hold is refused ([`Error::UnknownParent`])
    /// and counted.
    pub fn store_after(
        &self,
        pod: PodId,
        tier: Tier,
        parent: Option<BlockHash>,
        blocks: &[BlockHash],
    ) -> Result<(), Error> {
        let s = pod.slot();
        let tier_bit = 1u8 << tier as u8;
        let skip = if tier == Tier::Gpu {
            Skip::Held
        } else {
            Skip::Nothing
        };
        self.write_blocks(pod, parent, skip, blocks, |w, added, ps, h| {
            let (mut map, mut slab, residencies) = w.parts();
            let at = map.insert(h);
            let mut entry = map.get(at);
            let newly = entry.insert(&mut slab, s);
            if newly {
                *residencies += 1;
                *added += 1;
            }
            // A fleet with one tier keeps no records and skips this.
            if tier != Tier::Gpu || !ps.tiers.is_empty() {
                let current = if newly {
                    0
                } else {
                    ps.tiers.get(&h).copied().unwrap_or(TIER_BITS_GPU)
                };
                let mask = current | tier_bit;
                if mask == TIER_BITS_GPU {
                    ps.tiers.remove(&h);
                } else {
                    ps.tiers.insert(h, mask);
                }
            }
            Some((at, entry))
        })
    }

    /// Records that `pod` dropped `blocks` from `tier` (a
    /// `CacheEvent::Removed`). Absent blocks are ignored.
    pub fn remove(&self, pod: PodId, tier: Tier, blocks: &[BlockHash]) -> Result<(), Error> {
        let s = pod.slot();
        let tier_bit = 1u8 << tier as u8;
        self.write_blocks(pod, None, Skip::NotHeld, blocks, |w, added, ps, h| {
            let (mut map, mut slab, residencies) = w.parts();
            let at = map.find(h)?;
            let mut holders = map.get(at);
            let current = ps.tiers.get(&h).copied().unwrap_or(TIER_BITS_GPU);
            let mask = current & !tier_bit;
            if !holders.contains(&slab, s) || mask == current {
                // Not held, or not in that tier: nothing to do.
            } else if mask == 0 {
                holders.remove(&mut slab, s);
                *residencies -= 1;
                *added -= 1;
                ps.tiers.remove(&h);
                if holders.is_empty() {
                    map.remove_at(at);
                    return None;
                }
            } else if mask == TIER_BITS_GPU {
                ps.tiers.remove(&h);
            } else {
                ps.tiers.insert(h, mask);
            }
            Some((at, holders))
        })
    }

    /// Drops every block of a live pod (an engine's `AllBlocksCleared`)
    /// while it stays live. Scans every shard: engines reset rarely.
    pub fn clear(&self, pod: PodId) -> Result<(), Error> {
        let (slot, st) = self.live_slot(pod)?;
        let live = state(pod.epoch(), LIVE);
        let mut ps = slot.pod.lock();
        let mask = HostBitmap::<W>::single(pod.slot() as usize);
        for shard in self.shards.iter() {
            let mut sh = shard.write();
            if st.load(Ordering::Acquire) != live {
                self.counters.skipped_dead.fetch_add(1, Ordering::Relaxed);
                return Err(Error::PodShutDown(pod));
            }
            let removed = strip(&mut sh, &mask);
            slot.blocks.fetch_sub(removed, Ordering::Relaxed);
        }
        ps.tiers.clear();
        self.counters.events_applied.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Clears the bits of every pod waiting for a sweep, drops emptied
    /// entries, then frees their slots for reuse. Returns the pods swept.
    ///
    /// With [`IndexConfig::background_sweep`] this runs on its own; call it
    /// directly to sweep synchronously.
    pub fn sweep(&self) -> usize {
        let batch: Vec<u16> = std::mem::take(&mut *self.pending.lock());
        if batch.is_empty() {
            return 0;
        }
        self.counters.sweeps_running.fetch_add(1, Ordering::Relaxed);
        let mask: HostBitmap<W> = batch.iter().map(|&s| s as usize).collect();
        let mut swept = 0;
        for shard in self.shards.iter() {
            swept += strip(&mut shard.write(), &mask);
        }
        for &s in &batch {
            let slot = &self.slots[s as usize];
            // Taking the pod lock waits out any event still running for it.
            let mut ps = slot.pod.lock();
            ps.tiers = HashMap::new();
            slot.blocks.store(0, Ordering::Relaxed);
            let st = &self.states[s as usize];
            let old = st.load(Ordering::Acquire);
            // Invariant: a slot is reusable only after its sweep, and its
            // next owner gets a new epoch.
            st.store(
                state(epoch_of(old).wrapping_add(1), FREE),
                Ordering::Release,
            );
        }
        self.counters
            .blocks_swept
            .fetch_add(swept, Ordering::Relaxed);
        self.counters.sweeps_running.fetch_sub(1, Ordering::Relaxed);
        self.counters
            .sweeps_completed
            .fetch_add(1, Ordering::Relaxed);
        batch.len()
    }

    /// Pods shut down and not yet swept.
    pub fn pending_sweeps(&self) -> usize {
        self.pending.lock().len()
    }

    fn wake_sweeper(&self) {
        if !self.config.background_sweep {
            return;
        }
        let mut threads = self.sweepers.lock().unwrap_or_else(|e| e.into_inner());
        if threads.len() < self.config.sweep_threads {
            let me = self.me.clone();
            let spawned = std::thread::Builder::new()
                .name("router-index-sweep".into())
                .spawn(move || sweeper_loop(me));
            if let Ok(handle) = spawned {
                threads.push(handle.thread().clone());
            }
        }
        for t in threads.iter() {
            t.unpark();
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

    /// The pods among `candidates` holding `hash`.
    #[inline]
    fn probe(&self, g: &Guard, hash: u64, candidates: &HostBitmap<W>) -> HostBitmap<W> {
        self.probe_hint(g, hash, candidates).0
    }

    /// [`Index::probe`], with the block's run hint.
    #[inline]
    fn probe_hint(
        &self,
        g: &Guard,
        hash: u64,
        candidates: &HostBitmap<W>,
    ) -> (HostBitmap<W>, Hint) {
        waited();
        let (held, h) = self.shard(hash).look(g, hash, candidates);
        (held, Hint(h))
    }

    /// Probes issued together, read `i` of block `hashes[i]` for the pods
    /// among `cands[i]` (the reads of one partition round serve several
    /// spans), its answer into `found[i]`: every read is begun (its
    /// sequence number and cell read, its slab bitmap prefetched) into
    /// `staged` before any is finished, so the cell misses overlap and then
    /// the bitmap misses do. The set is a snapshot: each read is validated,
    /// so each held over an interval overlapping every other's (each began
    /// before any ended). A raced set is read again once the writer is out.
    /// The buffers are the caller's, so a round sets up no arrays.
    #[inline]
    fn probe_into<'g>(
        &self,
        g: &'g Guard,
        hashes: &[u64],
        cands: &[&HostBitmap<W>],
        staged: &mut [Staged<'g>],
        found: &mut [(HostBitmap<W>, Hint)],
    ) {
        waited();
        debug_assert!(
            hashes.len() <= ROUND_READS,
            "a round reads at most ROUND_READS blocks"
        );
        // Each block's shard found once, for both halves of its read.
        let mut shards = [&self.shards[0]; ROUND_READS];
        for (sh, &h) in shards.iter_mut().zip(hashes) {
            *sh = self.shard(h);
        }
        let mut round = 0;
        loop {
            for ((st, sh), &h) in staged.iter_mut().zip(&shards).zip(hashes) {
                *st = sh.stage(g, h, mix64(h));
            }
            let mut raced = None;
            for (i, (sh, (st, out))) in shards
                .iter()
                .zip(staged.iter().zip(&mut *found))
                .enumerate()
            {
                match sh.finish(*st, cands[i]) {
                    Some((held, hint)) => *out = (held, Hint(hint)),
                    None => {
                        raced = Some(*sh);
                        break;
                    }
                }
            }
            match raced {
                None => return,
                Some(sh) => sh.lock.wait_for_writer(&mut round),
            }
        }
    }

    /// Two probes issued together, as [`Index::probe_into`] issues them,
    /// in arrays the compiler unrolls: the opening pair and a span's pair
    /// read alone (through the slices of `probe_into` these cost about
    /// 160 instructions more per W1 query, counted by callgrind).
    #[inline]
    fn probe_pair(
        &self,
        g: &Guard,
        a: u64,
        b: u64,
        cand: &HostBitmap<W>,
    ) -> [(HostBitmap<W>, Hint); 2] {
        waited();
        let shards = [self.shard(a), self.shard(b)];
        let mut round = 0;
        loop {
            let staged = [
                shards[0].stage(g, a, mix64(a)),
                shards[1].stage(g, b, mix64(b)),
            ];
            let mut out = [(HostBitmap::EMPTY, Hint(0)); 2];
            let mut raced = None;
            for i in 0..2 {
                match shards[i].finish(staged[i], cand) {
                    Some((held, hint)) => out[i] = (held, Hint(hint)),
                    None => {
                        raced = Some(i);
                        break;
                    }
                }
            }
            match raced {
                None => return out,
                Some(i) => shards[i].lock.wait_for_writer(&mut round),
            }
        }
    }

    #[inline]
    fn emit(&self, pods: &HostBitmap<W>, depth: usize, out: &mut impl MatchSink) {
        if pods.is_empty() {
            return;
        }
        for (i, &word) in pods.words().iter().enumerate().filter(|(_, w)| **w != 0) {
            // The word's 64 slot states, bounds-checked once: a pod's slot
            // modulo 64 then indexes them with no check per pod.
            let Some(states) = self.states.get(i * 64..(i + 1) * 64) else {
                continue;
            };
            let epoch = |s: usize| epoch_of(states[s % 64].load(Ordering::Acquire));
            out.found_word(depth as u32, i * 64, word, epoch);
        }
    }

    /// The reference answer (feature `tuning`: the oracle of the index's
    /// own tests): every block probed in order. O(P) per block
    /// instead of O(K log N) per chain; exact, and for chains that are not
    /// prefix-closed it reports each pod's *first* missing block.
    #[cfg(any(test, router_loom, feature = "tuning"))]
    pub fn match_prefix_linear_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
        out.reset(chain.len());
        let g = pin();
        let mut cand = self.alive();
        let mut probes = 0;
        for (i, &h) in chain.iter().enumerate() {
            if cand.is_empty() {
                break;
            }
            let held = self.probe(&g, h.0, &cand);
            probes += 1;
            self.emit(&cand.and_not(&held), i, out);
            cand = held;
        }
        self.emit(&cand, chain.len(), out);
        out.add_probes(probes);
        out.rank();
    }

    /// `match_prefix_linear_into` into a fresh result (feature `tuning`).
    #[cfg(any(test, router_loom, feature = "tuning"))]
    pub fn match_prefix_linear(&self, chain: &[BlockHash]) -> PrefixMatch {
        let mut out = PrefixMatch::new(chain.len());
        self.match_prefix_linear_into(chain, &mut out);
        out
    }

    /// Scans `lo..hi` block by block for pods known to hold `lo - 1` and not
    /// `hi`, emitting the deepest group first (results stay ranked).
    ///
    /// The blocks' reads do not depend on each other, so they go in
    /// batches of [`SCAN_BATCH`], in stages that let their misses overlap:
    /// the shard headers are prefetched, then the cell lines, then each
    /// read is begun ([`ShardCore::stage`], which prefetches the block's
    /// slab bitmap), and only then is each finished and validated, in
    /// chain order. A raced read is done again on its own.
    fn scan<C: HashChain + ?Sized>(
        &self,
        g: &Guard,
        chain: &C,
        (lo, hi, mut cand): Interval<W>,
        out: &mut impl MatchSink,
    ) -> u32 {
        let mut groups: SmallVec<[(HostBitmap<W>, u32); 16]> = SmallVec::new();
        let mut probes = 0;
        let hash = |i: u32| chain.hash_at(i as usize);
        let mut at = lo;
        while at < hi && !cand.is_empty() {
            let end = hi.min(at + SCAN_BATCH as u32);
            let k = (end - at) as usize;
            waited();
            // Each block's hash and shard found once, for the four passes.
            let mut hashes = [0u64; SCAN_BATCH];
            let mut shards = [&self.shards[0]; SCAN_BATCH];
            for j in 0..k {
                let h = hash(at + j as u32);
                hashes[j] = h;
                shards[j] = self.shard(h);
                shards[j].prefetch_header();
            }
            // Each hash mixed once, for its cell's prefetch and its read.
            let mut mixed = [0u64; SCAN_BATCH];
            for j in 0..k {
                mixed[j] = mix64(hashes[j]);
                shards[j].prefetch_entry(mixed[j]);
            }
            let mut staged = [Staged::NONE; SCAN_BATCH];
            for j in 0..k {
                staged[j] = shards[j].stage(g, hashes[j], mixed[j]);
            }
            for j in 0..k {
                let held = match shards[j].finish(staged[j], &cand) {
                    Some((held, _)) => held,
                    None => self.probe(g, hashes[j], &cand),
                };
                probes += 1;
                let gone = cand.and_not(&held);
                if !gone.is_empty() {
                    groups.push((gone, at + j as u32));
                }
                cand = held;
                if cand.is_empty() {
                    break;
                }
            }
            at = end;
        }
        self.emit(&cand, hi as usize, out);
        for (pods, d) in groups.iter().rev() {
            self.emit(pods, *d as usize, out);
        }
        probes
    }

    fn match_binary<C: HashChain + ?Sized>(&self, chain: &C, out: &mut impl MatchSink) {
        let n = chain.len();
        if n == 0 {
            return;
        }
        // One pinned epoch for the whole search: its probes read the
        // shards' arrays without a lock (`shard.rs`).
        let guard = pin();
        let alive = self.alive();
        if n == 1 {
            let first = self.probe(&guard, chain.hash_at(0), &alive);
            self.emit(&first, 1, out);
            out.add_probes(1);
            return;
        }
        // Block 0, then the deepest block: full hits (the common case with
        // shared prompts) are settled by these two. On long chains both go
        // as one pair, their misses overlapping; a short chain probes block
        // 0 alone first, since a miss there ends the search, and on a
        // trace most short requests share nothing (56% of W3's queries; see
        // docs/BENCHMARKS.md for what each choice costs). Block 0 is read no
        // later than the deepest block either way, which is what makes a
        // store written last to first appear whole or not at all.
        let (first, hint0, full) = if n >= self.config.paired_opening_from {
            let [(first, hint0), (last, _)] =
                self.probe_pair(&guard, chain.hash_at(0), chain.hash_at(n - 1), &alive);
            (first, hint0, last.and(&first))
        } else {
            let (first, hint0) = self.probe_hint(&guard, chain.hash_at(0), &alive);
            if first.is_empty() {
                out.add_probes(1);
                return;
            }
            (
                first,
                hint0,
                self.probe(&guard, chain.hash_at(n - 1), &first),
            )
        };
        let mut probes = 2;
        if first.is_empty() {
            out.add_probes(probes);
            return;
        }
        self.emit(&full, n, out);
        let rest = first.and_not(&full);
        if !rest.is_empty() && n <= self.config.short_scan && n - 2 <= rest.count() as usize {
            // The pods of `rest` hold block 0 and not block n - 1. They
            // outnumber the blocks between, so they may stop at as many
            // depths, each costing a partition about two probes: the scan
            // costs at most one per block, and its misses overlap.
            probes += self.scan(&guard, chain, (1, (n - 1) as u32, rest), out);
            out.add_probes(probes);
            return;
        }
        if let Some(slot) = rest.only() {
            // One pod left to place (every partial hit of W3's trace): a
            // search of its own, without the partition's spans.
            let hi = (n - 1) as u32;
            let (depth, spent) =
                self.descend_one(&guard, chain, slot as u16, hi, plan_after(0, hint0, hi));
            self.emit(&rest, depth as usize, out);
            probes += spent;
        } else if !rest.is_empty() {
            let hi = (n - 1) as u32;
            let span = Span {
                lo: 1,
                hi,
                cand: rest,
                plan: plan_after(0, hint0, hi),
                idle: 0,
                far: 0,
            };
            probes += self.partition(&guard, chain, span, out);
        }
        out.add_probes(probes);
    }

    /// Prefetches the shard header and cell line of block `hash`, for a
    /// read that will follow.
    #[inline(always)]
    fn prefetch_block(&self, hash: u64) {
        let sh = self.shard(hash);
        sh.prefetch_header();
        sh.prefetch_entry(mix64(hash));
    }

    /// The depth of the one pod `slot` that holds block 0 and not block
    /// `hi`, searched from `plan` (block 0's): the partition of a lone pod,
    /// with a flag and two bounds for a span, so a probe costs a lookup
    /// and a bit test, not the bitmaps and stack of [`Index::partition`].
    /// It follows the hints as a span would (pairs at a predicted change,
    /// gallops over event ends, and after [`MAX_IDLE`] wrong guesses or
    /// without a hint, cuts into [`SPLIT`] parts). A round's blocks are
    /// prefetched together, so their misses overlap, and read in order
    /// until one settles it. The depth and the probes spent.
    #[inline(never)]
    fn descend_one<C: HashChain + ?Sized>(
        &self,
        g: &Guard,
        chain: &C,
        slot: u16,
        hi: u32,
        plan: Plan,
    ) -> (u32, u32) {
        // Inlined at each use: called, its prologue and epilogue cost a
        // third of a probe on a table in cache.
        #[inline(always)]
        fn read<const W: usize, C: HashChain + ?Sized>(
            index: &Index<W>,
            g: &Guard,
            chain: &C,
            slot: u16,
            i: u32,
        ) -> (bool, Hint) {
            let hash = chain.hash_at(i as usize);
            let (held, h) = index.shard(hash).holds(g, hash, slot);
            (held, Hint(h))
        }
        let read = |i: u32| read(self, g, chain, slot, i);
        // The pod holds block lo - 1 and not block hi.
        let (mut lo, mut hi, mut plan) = (1, hi, plan);
        let mut idle = 0u8;
        let mut probes = 0;
        while lo < hi {
            waited();
            let plan_now = if idle >= MAX_IDLE { Plan::Halve } else { plan };
            match plan_now {
                Plan::At(end) | Plan::Through(end, _) if end == hi => {
                    // The run goes on to the end: the pod stops at hi, or
                    // before hi - 1.
                    probes += 1;
                    if read(hi - 1).0 {
                        return (hi, probes);
                    }
                    (hi, plan, idle) = (hi - 1, Plan::Halve, idle + 1);
                }
                Plan::At(at) | Plan::Through(at, _) if at <= lo => {
                    // Block lo itself: held, or the pod stops at lo.
                    probes += 1;
                    let (held, h) = read(lo);
                    if !held {
                        return (lo, probes);
                    }
                    (lo, plan, idle) = (lo + 1, plan_after(lo, h, hi), idle + 1);
                }
                Plan::At(at) | Plan::Through(at, _) if at < hi => {
                    let (pairs, stride, sparse) = match plan_now {
                        Plan::Through(_, run) => gallop(at, run, hi, idle),
                        _ => (1, 0, false),
                    };
                    // Every pair's lines are fetched at once, so a cold
                    // table's misses overlap; the reads then go in order
                    // and stop at the pair that settles the search (each
                    // judged only if the pod held every block before it).
                    if pairs > 1 {
                        for j in 0..pairs {
                            let b = at + j * stride;
                            self.prefetch_block(chain.hash_at(b as usize - 1));
                            self.prefetch_block(chain.hash_at(b as usize));
                        }
                    }
                    let mut last: Option<(u32, Hint)> = None;
                    for j in 0..pairs {
                        let b = at + j * stride;
                        probes += 1;
                        if !read(b - 1).0 {
                            // Between the previous pair and this one.
                            hi = b - 1;
                            (plan, idle) = match last {
                                Some((p, hp)) => (plan_after(p, hp, hi), u8::from(sparse)),
                                None => (Plan::Halve, idle + 1),
                            };
                            break;
                        }
                        probes += 1;
                        let (now, h) = read(b);
                        if !now {
                            return (b, probes);
                        }
                        lo = b + 1;
                        last = Some((b, h));
                        if j + 1 == pairs {
                            // Every pair held: on past the last one.
                            (plan, idle) = (plan_after(b, h, hi), idle + 1);
                        }
                    }
                }
                _ => {
                    // Quarters, not halves, on a span long enough: the
                    // three blocks' lines are fetched at once and the
                    // blocks read in order until one is not held, so a
                    // cold table waits once per two levels of the search
                    // (the reads a halving would skip cost less than the
                    // waits saved: W3's partial hits, docs/BENCHMARKS.md).
                    let span = hi - lo;
                    let parts = if span >= 2 * SPLIT as u32 {
                        SPLIT as u32
                    } else {
                        2
                    };
                    let mut cuts = [0u32; SPLIT - 1];
                    for (k, c) in cuts.iter_mut().enumerate().take(parts as usize - 1) {
                        // In u64: no overflow whatever the chain's length.
                        *c = lo + (u64::from(span) * (k as u64 + 1) / u64::from(parts)) as u32;
                    }
                    let cuts = &cuts[..parts as usize - 1];
                    if parts > 2 {
                        for &c in cuts {
                            self.prefetch_block(chain.hash_at(c as usize));
                        }
                    }
                    for &c in cuts {
                        probes += 1;
                        let (held, h) = read(c);
                        if held {
                            (lo, plan, idle) = (c + 1, plan_after(c, h, hi), 0);
                        } else {
                            (hi, plan) = (c, Plan::Halve);
                            break;
                        }
                    }
                }
            }
        }
        (lo, probes)
    }

    /// The binary partition of `first`'s pods, guided by the run hints:
    /// the probes it spent. Out of line, so that the queries the opening
    /// settles (a miss at block 0, a full hit) do not set up its stack.
    ///
    /// Each round takes the deepest span's step and, while the reads fit
    /// ([`ROUND_READS`]), the steps of the spans under it: their pods are
    /// disjoint and their depth ranges do not overlap, so their reads do
    /// not depend on each other and go out together
    /// ([`Index::probe_into`]), and a search of many drop-offs waits for
    /// about one round per level of the partition, not one per probe.
    #[inline(never)]
    fn partition<C: HashChain + ?Sized>(
        &self,
        guard: &Guard,
        chain: &C,
        first: Span<W>,
        out: &mut impl MatchSink,
    ) -> u32 {
        let mut probes = 0;
        // Found groups wait on the stack until every deeper one is out, so
        // a chain of many drop-offs holds about one entry per depth: room
        // for 80 before it spills to the heap.
        let mut stack: SmallVec<[Span<W>; 80]> = SmallVec::new();
        stack.push(first);
        let linear = self.config.linear_span as u32;
        // A round's buffers, set up at the first round that needs them:
        // most searches (a trace's, W1's) are one span at a time.
        let mut bufs: Option<Round<W>> = None;
        // The step of the span under the top, if it reads blocks.
        let step_under = |stack: &SmallVec<[Span<W>; 80]>| match stack.last() {
            Some(s) if s.lo != s.hi => Step::of(s, linear),
            _ => None,
        };
        // Spans come off the stack deepest first, and each pushes its
        // shallower part first: groups come out deepest first and the
        // result needs no sort.
        while let Some(top) = stack.pop() {
            if top.lo == top.hi {
                self.emit(&top.cand, top.lo as usize, out);
                continue;
            }
            let Some(step) = Step::of(&top, linear) else {
                probes += self.scan(guard, chain, (top.lo, top.hi, top.cand), out);
                continue;
            };
            let (blocks, mut reads) = step.reads();
            let next = step_under(&stack);
            if reads <= 2 && next.is_none() {
                // One span alone, one or two reads.
                let hash = |i: usize| chain.hash_at(blocks[i] as usize);
                let found = if reads == 1 {
                    [
                        self.probe_hint(guard, hash(0), &top.cand),
                        (HostBitmap::EMPTY, Hint(0)),
                    ]
                } else {
                    self.probe_pair(guard, hash(0), hash(1), &top.cand)
                };
                probes += reads as u32;
                step.apply(&top, &found[..reads], &mut stack);
                continue;
            }
            // The round: `top`'s step, then those of the spans under it
            // (shallower each), as far as their reads fit.
            let r = bufs.get_or_insert_with(|| Round::new(top));
            r.spans[0] = top;
            r.steps[0] = step;
            let mut taken = 1;
            let mut next = next;
            while let Some(s) =
                next.filter(|s| taken < ROUND_SPANS && reads + s.count() <= ROUND_READS)
            {
                let Some(span) = stack.pop() else { break };
                reads += s.count();
                r.steps[taken] = s;
                r.spans[taken] = span;
                taken += 1;
                next = step_under(&stack);
            }
            let Round {
                spans,
                steps,
                hashes,
                staged,
                found,
            } = r;
            let mut cands = [&spans[0].cand; ROUND_READS];
            let mut at = 0;
            for (span, step) in spans.iter().zip(steps.iter()).take(taken) {
                let (blocks, n) = step.reads();
                for &b in &blocks[..n] {
                    hashes[at] = chain.hash_at(b as usize);
                    cands[at] = &span.cand;
                    at += 1;
                }
            }
            self.probe_into(
                guard,
                &hashes[..reads],
                &cands[..reads],
                &mut staged[..reads],
                &mut found[..reads],
            );
            probes += reads as u32;
            // The shallowest span's parts go on the stack first.
            let mut end = reads;
            for i in (0..taken).rev() {
                let n = steps[i].count();
                end -= n;
                steps[i].apply(&spans[i], &found[end..end + n], &mut stack);
            }
        }
        probes
    }

    /// The pods holding a prefix of `chain`, longest first, into `out`
    /// (reused: no allocation once it has grown). The same as
    /// [`PrefixIndex::match_prefix_into`], without the trait in scope.
    pub fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
        out.reset(chain.len());
        self.match_binary(chain, out);
        debug_assert!(
            out.pods()
                .windows(2)
                .all(|w| (w[0].blocks, w[1].pod) > (w[1].blocks, w[0].pod)),
            "binary partition emits ranked results"
        );
    }

    /// [`Index::match_prefix_into`] into a fresh result.
    pub fn match_prefix(&self, chain: &[BlockHash]) -> PrefixMatch {
        let mut out = PrefixMatch::new(chain.len());
        self.match_prefix_into(chain, &mut out);
        out
    }

    /// [`Index::match_prefix_into`] over raw hash values, without copying
    /// them into `BlockHash`es (`BlockHash` is `repr(transparent)` over the
    /// same `u64`).
    pub fn match_hashes_into(&self, chain: &[u64], out: &mut PrefixMatch) {
        out.reset(chain.len());
        self.match_binary(chain, out);
    }

    /// Calls `f(pod, blocks)` for every live pod holding a prefix of
    /// `chain`, longest first (ties by slot), with nothing allocated or
    /// stored: for embedders that score pods as they come. Returns the
    /// probes spent.
    pub fn score_into(&self, chain: &[u64], f: impl FnMut(PodId, u32)) -> u32 {
        let mut sink = FnSink { f, probes: 0 };
        self.match_binary(chain, &mut sink);
        sink.probes
    }

    /// Applies one event (the same as [`CacheEventSink::apply`], without
    /// the trait in scope).
    pub fn apply_event(&self, event: &CacheEvent) -> Result<(), Error> {
        match event {
            CacheEvent::Stored { pod, tier, blocks } => self.store(*pod, *tier, blocks),
            CacheEvent::Removed { pod, tier, blocks } => self.remove(*pod, *tier, blocks),
            CacheEvent::Cleared { pod } => self.clear(*pod),
            CacheEvent::PodShutdown { pod } => self.shutdown(*pod),
            // `CacheEvent` is non-exhaustive: a kind this index does not
            // know is refused, not guessed at.
            _ => Err(Error::UnknownPod(event.pod())),
        }
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

/// The pod lifecycle (what [`PodDirectory`] calls), usable without the
/// trait in scope.
impl<const W: usize> Index<W> {
    /// Gives `key` a slot (the same id again if it already has one).
    pub fn join(&self, key: &PodKey) -> Result<PodId, Error> {
        let mut reg = self.registry.lock();
        if let Some(&id) = reg.by_key.get(key) {
            return Ok(id);
        }
        let free = self
            .states
            .iter()
            .position(|s| s.load(Ordering::Acquire) & 3 == FREE);
        let Some(s) = free else {
            return Err(Error::TooManyPods {
                limit: self.capacity(),
            });
        };
        let st = &self.states[s];
        let epoch = epoch_of(st.load(Ordering::Acquire));
        st.store(state(epoch, LIVE), Ordering::Release);
        self.alive[s / 64].fetch_or(1 << (s % 64), Ordering::AcqRel);
        let id = PodId::new(s as u16, epoch);
        reg.by_key.insert(key.clone(), id);
        reg.keys[s] = Some(key.clone());
        Ok(id)
    }

    /// The id of a joined pod.
    pub fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        self.registry.lock().by_key.get(key).copied()
    }

    /// The key of a live pod's id (`None` for a departed id).
    pub fn pod_key(&self, id: PodId) -> Option<PodKey> {
        let reg = self.registry.lock();
        let key = reg.keys.get(id.slot() as usize)?.as_ref()?;
        (reg.by_key.get(key) == Some(&id)).then(|| key.clone())
    }

    /// Takes a pod out: gone from every query that starts after this
    /// returns; its blocks are swept afterwards.
    pub fn shutdown(&self, id: PodId) -> Result<(), Error> {
        let mut reg = self.registry.lock();
        let s = id.slot() as usize;
        let Some(st) = self.states.get(s) else {
            return Err(Error::UnknownPod(id));
        };
        let live = state(id.epoch(), LIVE);
        if st
            .compare_exchange(
                live,
                state(id.epoch(), DRAINING),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(Error::UnknownPod(id));
        }
        // Invariant: once this returns, no query that starts later sees the pod.
        self.alive[s / 64].fetch_and(!(1 << (s % 64)), Ordering::AcqRel);
        if let Some(key) = reg.keys[s].take() {
            reg.by_key.remove(&key);
        }
        drop(reg);
        self.pending.lock().push(id.slot());
        self.wake_sweeper();
        Ok(())
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
