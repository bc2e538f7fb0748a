//! Search: the longest cached prefix per pod by hint-guided binary
//! partition of the chain (exact on prefix-closed state against the linear
//! oracle), probes, rounds of reads and the sinks of results.

use super::*;

impl<const W: usize> Index<W> {
    /// The pods among `candidates` holding `hash`.
    #[inline]
    pub(super) fn probe(&self, g: &Guard, hash: u64, candidates: &HostBitmap<W>) -> HostBitmap<W> {
        self.probe_hint(g, hash, candidates).0
    }

    /// [`Index::probe`], with the block's run hint.
    #[inline]
    pub(super) fn probe_hint(
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
    pub(super) fn probe_into<'g>(
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
    pub(super) fn probe_pair(
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
    pub(super) fn emit(&self, pods: &HostBitmap<W>, depth: usize, out: &mut impl MatchSink) {
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
    pub(super) fn scan<C: HashChain + ?Sized>(
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

    pub(super) fn match_binary<C: HashChain + ?Sized>(&self, chain: &C, out: &mut impl MatchSink) {
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
    pub(super) fn prefetch_block(&self, hash: u64) {
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
    pub(super) fn descend_one<C: HashChain + ?Sized>(
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
    pub(super) fn partition<C: HashChain + ?Sized>(
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
}
