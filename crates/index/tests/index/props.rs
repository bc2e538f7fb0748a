//! The binary partition against the linear oracle and the boundary property.

use std::collections::HashMap;

use proptest::prelude::*;
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PrefixIndex, Tier};
use router_index::{Index, IndexConfig};

use super::{chain, join_n, key, manual_index, store};

fn config(linear_span: usize, shard_bits: u32, short_scan: usize) -> IndexConfig {
    IndexConfig::default()
        .background_sweep(false)
        .linear_span(linear_span)
        .shard_bits(shard_bits)
        .short_scan(short_scan)
}

/// Short-chain scan thresholds: off, within the chains drawn, and past
/// all of them.
/// `n` pods; with `wide`, after 46 idle ones, so their slots are past the
/// cell's small bitmap and a block on five or more of them is kept in the
/// slab. Without, every form the cell has: lanes and the small bitmap.
fn join_past_idle(index: &Index, n: usize, wide: bool) -> Vec<router_core::PodId> {
    if wide {
        join_n(index, 46);
        (46..46 + n).map(|i| index.join(&key(i)).unwrap()).collect()
    } else {
        join_n(index, n)
    }
}

fn short_scan() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![0usize, 2, 8, 32, 1000])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Prefix-closed state: binary equals linear equals the depths stored.
    #[test]
    fn binary_equals_linear_on_prefix_closed_state(
        n in 1usize..80,
        depths in prop::collection::vec(0usize..=80, 1..40),
        noise in prop::collection::vec((0usize..20, 1usize..40), 0..10),
        span in 0usize..6, bits in 0u32..9, short in short_scan(),
        wide in any::<bool>(),
    ) {
        let index = Index::<4>::new(config(span, bits, short));
        let pods = join_past_idle(&index, depths.len(), wide);
        let c = chain(1, n);
        let mut want = HashMap::new();
        for (pod, &d) in pods.iter().zip(&depths) {
            let d = d.min(n);
            store(&index, *pod, &c[..d]);
            if d > 0 {
                want.insert(*pod, d as u32);
            }
        }
        // Unrelated chains on random pods must not disturb the answer.
        for (p, len) in noise {
            store(&index, pods[p % pods.len()], &chain(2 + p as u64, len));
        }
        let bin = index.match_prefix(&c);
        let lin = index.match_prefix_linear(&c);
        prop_assert_eq!(bin.pods(), lin.pods());
        let got: HashMap<_, _> = bin.pods().iter().map(|m| (m.pod, m.blocks)).collect();
        prop_assert_eq!(&got, &want);
        let ranked: Vec<u32> = bin.pods().iter().map(|m| m.blocks).collect();
        prop_assert!(ranked.windows(2).all(|w| w[0] >= w[1]), "ranked longest first");
        // The raw-u64 query, the closure and the O(1) lookup agree with it.
        let raw: Vec<u64> = c.iter().map(|h| h.0).collect();
        let mut by_hashes = router_index::PrefixMatch::default();
        index.match_hashes_into(&raw, &mut by_hashes);
        prop_assert_eq!(by_hashes.pods(), bin.pods());
        let mut scored = Vec::new();
        let probes = index.score_into(&raw, |pod, blocks| scored.push((pod, blocks)));
        let listed: Vec<_> = bin.pods().iter().map(|m| (m.pod, m.blocks)).collect();
        prop_assert_eq!(scored, listed);
        prop_assert_eq!(probes, bin.probes());
        let mut indexed = bin.clone();
        indexed.index_slots();
        for pod in &pods {
            let expected = want.get(pod).copied().unwrap_or(0);
            prop_assert_eq!(bin.blocks_for(*pod), expected);
            prop_assert_eq!(indexed.blocks_for(*pod), expected);
        }
    }

    /// Arbitrary state: every reported depth is a true boundary, every pod
    /// holding block 0 is reported, and dead pods never are.
    #[test]
    fn reported_depths_are_boundaries_and_dead_pods_are_never_reported(
        n in 1usize..60,
        held in prop::collection::vec(prop::collection::vec(any::<bool>(), 60), 1..12),
        dead in prop::collection::vec(any::<bool>(), 12),
        span in 0usize..6,
        short in short_scan(),
        wide in any::<bool>(),
    ) {
        let index = Index::<4>::new(config(span, 8, short));
        let pods = join_past_idle(&index, held.len(), wide);
        let c = chain(7, n);
        for (pod, mask) in pods.iter().zip(&held) {
            let blocks: Vec<BlockHash> =
                c.iter().zip(mask).filter(|(_, h)| **h).map(|(b, _)| *b).collect();
            store(&index, *pod, &blocks);
        }
        for (pod, &d) in pods.iter().zip(&dead) {
            if d {
                index.shutdown(*pod).unwrap();
            }
        }
        for m in [index.match_prefix(&c), index.match_prefix_linear(&c)] {
            for pm in m.pods() {
                let p = pods.iter().position(|x| *x == pm.pod).expect("a known pod");
                prop_assert!(!dead[p], "dead pod {:?} reported", pm.pod);
                let d = pm.blocks as usize;
                prop_assert!(d >= 1 && held[p][d - 1], "block {} not held by {:?}", d - 1, pm.pod);
                prop_assert!(d == n || !held[p][d], "block {} held by {:?}: not a boundary", d, pm.pod);
            }
            for (p, pod) in pods.iter().enumerate() {
                let reported = m.blocks_for(*pod) > 0;
                prop_assert_eq!(reported, !dead[p] && held[p][0]);
            }
        }
    }

    /// Applying a stream twice, or with duplicates, gives the same index.
    #[test]
    fn events_are_idempotent(
        ops in prop::collection::vec((0usize..4, any::<bool>(), 0u64..3, 0usize..20, 1usize..12), 1..40),
    ) {
        let once = manual_index();
        let twice = manual_index();
        let pods = join_n(&once, 4);
        let pods2 = join_n(&twice, 4);
        prop_assert_eq!(&pods, &pods2);
        let events: Vec<CacheEvent> = ops
            .iter()
            .map(|&(p, stored, seed, from, len)| {
                let blocks = chain(seed, from + len)[from..].to_vec();
                if stored {
                    CacheEvent::Stored { pod: pods[p], tier: Tier::Gpu, blocks }
                } else {
                    CacheEvent::Removed { pod: pods[p], tier: Tier::Gpu, blocks }
                }
            })
            .collect();
        for e in &events {
            once.apply(e).unwrap();
        }
        for e in events.iter().chain(&events) {
            twice.apply(e).unwrap();
            twice.apply(e).unwrap();
        }
        let (a, b) = (once.stats(), twice.stats());
        prop_assert_eq!((a.entries, a.residencies), (b.entries, b.residencies));
        for seed in 0..3 {
            let c = chain(seed, 32);
            prop_assert_eq!(once.match_prefix_linear(&c), twice.match_prefix_linear(&c));
        }
    }
}

/// How a history's store names its parent block.
#[derive(Clone, Copy, Debug)]
enum Parent {
    /// The chain's block before the event, as engines send it.
    True,
    /// None given.
    Unknown,
    /// Some other block of the chain: the hints it leaves are wrong.
    Wrong(usize),
}

fn parent_mode() -> impl Strategy<Value = Parent> {
    prop_oneof![
        3 => Just(Parent::True),
        1 => Just(Parent::Unknown),
        1 => (0usize..1000).prop_map(Parent::Wrong),
    ]
}

/// One step of a history on one pod: store up to a depth in events of
/// `chunk` blocks from where the pod already is (or from block 0), or drop
/// the chain's tail from a depth, as an engine evicting leaves does.
#[derive(Clone, Copy, Debug)]
enum Step {
    Store {
        pod: usize,
        depth: usize,
        chunk: usize,
        from_zero: bool,
        parent: Parent,
    },
    Evict {
        pod: usize,
        from: usize,
    },
    Noise {
        pod: usize,
        len: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..12, 0usize..=600, 1usize..80, any::<bool>(), parent_mode()).prop_map(
            |(pod, depth, chunk, from_zero, parent)| Step::Store { pod, depth, chunk, from_zero, parent }
        ),
        2 => (0usize..12, 0usize..=600).prop_map(|(pod, from)| Step::Evict { pod, from }),
        1 => (0usize..12, 1usize..40).prop_map(|(pod, len)| Step::Noise { pod, len }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Run hints are left by a history of stores in many events (with true,
    /// missing and wrong parents), tail evictions and unrelated chains, so
    /// they are partly stale and partly wrong when the query comes: the
    /// answer is still the oracle's, and bad hints cost probes only within
    /// a bound.
    #[test]
    fn hints_from_any_history_never_change_the_answer(
        n in 1usize..600,
        steps in prop::collection::vec(step(), 1..40),
        span in 0usize..6,
        short in short_scan(),
        wide in any::<bool>(),
    ) {
        let index = Index::<4>::new(config(span, 8, short));
        let pods = join_past_idle(&index, 12, wide);
        let c = chain(1, n);
        let mut depth = [0usize; 12];
        for st in steps {
            match st {
                Step::Store { pod, depth: d, chunk, from_zero, parent } => {
                    let d = d.min(n);
                    let mut at = if from_zero { 0 } else { depth[pod].min(d) };
                    while at < d {
                        let to = (at + chunk).min(d);
                        let parent = match parent {
                            Parent::True => at.checked_sub(1).map(|i| c[i]),
                            Parent::Unknown => None,
                            Parent::Wrong(i) => Some(c[i % n]),
                        };
                        index.store_after(pods[pod], Tier::Gpu, parent, &c[at..to]).unwrap();
                        at = to;
                    }
                    depth[pod] = depth[pod].max(d);
                }
                Step::Evict { pod, from } => {
                    let from = from.min(n);
                    index.remove(pods[pod], Tier::Gpu, &c[from..]).unwrap();
                    depth[pod] = depth[pod].min(from);
                }
                Step::Noise { pod, len } => {
                    store(&index, pods[pod], &chain(2 + pod as u64, len));
                }
            }
        }
        let bin = index.match_prefix(&c);
        let lin = index.match_prefix_linear(&c);
        prop_assert_eq!(bin.pods(), lin.pods());
        let want: HashMap<_, _> = pods
            .iter()
            .zip(depth)
            .filter(|(_, d)| *d > 0)
            .map(|(p, d)| (*p, d as u32))
            .collect();
        let got: HashMap<_, _> = bin.pods().iter().map(|m| (m.pod, m.blocks)).collect();
        prop_assert_eq!(&got, &want);
        // Bad hints are bounded: a few wasted probes per halving step of
        // each group, never a walk over the chain.
        let mut groups: Vec<u32> = want.values().copied().collect();
        groups.sort_unstable();
        groups.dedup();
        let log = usize::BITS - n.leading_zeros();
        // A chain within the short-scan length may be scanned instead: at
        // most one probe per block.
        let partition = 2 + groups.len() as u32 * 6 * (log + 1);
        let bound = if n <= short {
            partition.max(n as u32)
        } else {
            partition
        };
        prop_assert!(bin.probes() <= bound, "{} probes for {} groups over {} blocks", bin.probes(), groups.len(), n);
    }
}

#[test]
fn a_short_chain_with_more_pods_than_blocks_is_scanned_exactly() {
    // 48 pods on a 24-block chain, six at each of the depths 1, 4, ..., 22:
    // after the opening, more pods are left than blocks between, so the
    // search scans them (in batches of 16: the 22 blocks take two), one
    // probe per block up to the deepest drop-off; with the scan off, the
    // hinted partition gives the same answer in about two probes per
    // depth.
    let n = 24;
    let c = chain(9, n);
    let depth = |i: usize| i / 6 * 3 + 1;
    for short in [32, 0] {
        let index = Index::<4>::new(config(4, 8, short));
        let pods = join_n(&index, 48);
        for (i, pod) in pods.iter().enumerate() {
            store(&index, *pod, &c[..depth(i)]);
        }
        let bin = index.match_prefix(&c);
        assert_eq!(bin.pods(), index.match_prefix_linear(&c).pods());
        for (i, pod) in pods.iter().enumerate() {
            assert_eq!(bin.blocks_for(*pod), depth(i) as u32, "pod {i}");
        }
        if short > 0 {
            // Block 0 alone, the deepest block, then blocks 1..=22.
            assert_eq!(bin.probes(), 2 + 22, "the scan reads each block once");
        } else {
            assert!(bin.probes() < 2 + 22, "{} probes", bin.probes());
        }
    }
}

#[test]
fn hints_settle_a_run_per_group_in_about_two_probes() {
    // 64 pods, drop-offs every 16 blocks of a 1024-block chain, each pod's
    // blocks stored in events of 64 with their parents named, as engines
    // report a long prefill: the hints see each change, and the search
    // spends about two probes per group instead of a halving each.
    let index = Index::<4>::new(config(4, 8, 32));
    let pods = join_n(&index, 64);
    let c = chain(5, 1024);
    for (i, pod) in pods.iter().enumerate() {
        let d = 16 * (i + 1);
        for at in (0..d).step_by(64) {
            let to = (at + 64).min(d);
            let parent = at.checked_sub(1).map(|p| c[p]);
            index
                .store_after(*pod, Tier::Gpu, parent, &c[at..to])
                .unwrap();
        }
    }
    let bin = index.match_prefix(&c);
    assert_eq!(bin.pods(), index.match_prefix_linear(&c).pods());
    assert_eq!(bin.pods().len(), 64);
    assert!(bin.probes() <= 2 * 64 + 2, "{} probes", bin.probes());
    // Without parents the runs stop at every event's end: still exact.
    let plain = Index::<4>::new(config(4, 8, 32));
    let pods = join_n(&plain, 64);
    for (i, pod) in pods.iter().enumerate() {
        for ev in c[..16 * (i + 1)].chunks(64) {
            store(&plain, *pod, ev);
        }
    }
    assert_eq!(
        plain.match_prefix(&c).pods(),
        plain.match_prefix_linear(&c).pods()
    );
}

#[test]
fn a_lone_pods_hint_places_it_in_one_pair() {
    // A conversation's pod holds its earlier turns (one event each, parents
    // named) and is asked for a longer prompt: block 0's hint names the
    // first turn's end, and the turns after it are crossed a round of
    // event ends at a time, read in order until one settles it. Four
    // probes for one turn (the opening's two, then the pair at its end);
    // with more turns of one length, a pair per turn.
    for (n, turns) in [
        (40, vec![17]),
        (300, vec![64]),
        (300, vec![100, 37, 52]),
        (2000, vec![64; 9]),
    ] {
        let index = Index::<4>::new(config(4, 8, 32));
        let pod = join_n(&index, 1)[0];
        let c = chain(9, n);
        let mut at = 0usize;
        for len in &turns {
            let parent = at.checked_sub(1).map(|p| c[p]);
            index
                .store_after(pod, Tier::Gpu, parent, &c[at..at + len])
                .unwrap();
            at += len;
        }
        let m = index.match_prefix(&c);
        assert_eq!(m.pods(), index.match_prefix_linear(&c).pods());
        assert_eq!(m.pods()[0].blocks as usize, at);
        // Turns of unequal lengths make the reads ahead at event ends
        // guess wrong: then a halving's worth more.
        let equal = turns.iter().all(|&t| t == turns[0]);
        let bound = 2
            + 2 * turns.len() as u32
            + if equal {
                0
            } else {
                2 * (usize::BITS - n.leading_zeros())
            };
        assert!(
            m.probes() <= bound,
            "{n} blocks, turns {turns:?}: {} probes, bound {bound}",
            m.probes()
        );
    }
}

#[test]
fn probes_grow_with_distinct_depths_not_with_pods() {
    let index = Index::<4>::new(config(4, 8, 32));
    let pods = join_n(&index, 256);
    let c = chain(3, 1024);
    // 256 pods, 4 distinct depths.
    for (i, pod) in pods.iter().enumerate() {
        store(&index, *pod, &c[..[100, 400, 700, 1000][i % 4]]);
    }
    let bin = index.match_prefix(&c);
    let lin = index.match_prefix_linear(&c);
    assert_eq!(bin.pods(), lin.pods());
    assert_eq!(bin.pods().len(), 256);
    assert!(
        bin.probes() <= 4 * 12,
        "binary used {} probes",
        bin.probes()
    );
    assert_eq!(lin.probes(), 1001, "linear walks to the deepest drop-off");
    // A full hit costs two probes: first and last block.
    let full = index.match_prefix(&c[..100]);
    assert_eq!((full.probes(), full.pods().len()), (2, 256));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Long chains stored in many events, with a few drop-off depths among
    /// them: the searches that cross open runs read event ends in pairs,
    /// and spread them over the ends left once a round finds no change.
    /// Events of one length (the pairs land on event ends) or of a length
    /// per pod (they land anywhere), true or missing parents, and tails
    /// evicted afterwards (hints left stale): always the oracle's answer.
    #[test]
    fn sparse_drop_offs_over_many_events_match_the_oracle(
        n in 256usize..4096,
        depths in prop::collection::vec(0usize..=4096, 1..10),
        chunk in 8usize..130,
        uneven in any::<bool>(),
        parents in any::<bool>(),
        evictions in prop::collection::vec((0usize..10, 0usize..=4096), 0..4),
        wide in any::<bool>(),
    ) {
        let index = Index::<4>::new(config(4, 8, 32));
        let pods = join_past_idle(&index, depths.len(), wide);
        let c = chain(3, n);
        let mut want: Vec<usize> = depths.iter().map(|&d| d.min(n)).collect();
        for (p, &d) in want.iter().enumerate() {
            let len = if uneven { chunk + 7 * p } else { chunk };
            let mut at = 0;
            while at < d {
                let to = (at + len).min(d);
                let parent = at.checked_sub(1).filter(|_| parents).map(|i| c[i]);
                index.store_after(pods[p], Tier::Gpu, parent, &c[at..to]).unwrap();
                at = to;
            }
        }
        for (p, from) in evictions {
            let p = p % pods.len();
            let from = from.min(n);
            index.remove(pods[p], Tier::Gpu, &c[from..]).unwrap();
            want[p] = want[p].min(from);
        }
        let bin = index.match_prefix(&c);
        let lin = index.match_prefix_linear(&c);
        prop_assert_eq!(bin.pods(), lin.pods());
        let got: HashMap<_, _> = bin.pods().iter().map(|m| (m.pod, m.blocks as usize)).collect();
        let want: HashMap<_, _> = pods
            .iter()
            .zip(want)
            .filter(|(_, d)| *d > 0)
            .map(|(p, d)| (*p, d))
            .collect();
        prop_assert_eq!(got, want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// One pod left after the opening (it holds block 0, not the last;
    /// the others hold the whole chain or none of it), as most of a trace's
    /// partial hits are: its own search, led by hints from its events
    /// (true, missing or wrong parents), from branches that share a prefix
    /// with the query and go on elsewhere, and from evicted tails, gives
    /// the oracle's depth.
    #[test]
    fn a_lone_pod_is_placed_as_the_oracle_places_it(
        n in 2usize..3000,
        depth in 1usize..3000,
        events in prop::collection::vec(1usize..300, 1..12),
        parents in any::<bool>(),
        branches in prop::collection::vec((0usize..3000, 1usize..400, 1usize..200), 0..4),
        evict in prop::option::of(1usize..3000),
        others in 0usize..3,
        wide in any::<bool>(),
    ) {
        let index = Index::<4>::new(config(4, 8, 32));
        let pods = join_past_idle(&index, 1 + others, wide);
        let c = chain(3, n);
        let mut want = depth.min(n - 1);
        // The lone pod's blocks, in events of the drawn lengths (the last
        // one repeated).
        let mut at = 0;
        let mut e = 0;
        while at < want {
            let to = (at + events[e.min(events.len() - 1)]).min(want);
            let parent = at.checked_sub(1).filter(|_| parents).map(|i| c[i]);
            index.store_after(pods[0], Tier::Gpu, parent, &c[at..to]).unwrap();
            at = to;
            e += 1;
        }
        // Branches: the query's first k blocks, then blocks of another chain.
        for (b, (k, len, chunk)) in branches.into_iter().enumerate() {
            let k = k.min(want);
            let mut other: Vec<BlockHash> = c[..k].to_vec();
            other.extend(chain(100 + b as u64, len));
            let mut at = k;
            while at < other.len() {
                let to = (at + chunk).min(other.len());
                let parent = at.checked_sub(1).map(|i| other[i]);
                index.store_after(pods[0], Tier::Gpu, parent, &other[at..to]).unwrap();
                at = to;
            }
        }
        if let Some(from) = evict {
            let from = from.clamp(1, n);
            index.remove(pods[0], Tier::Gpu, &c[from..]).unwrap();
            want = want.min(from);
        }
        for &p in &pods[1..] {
            index.store(p, Tier::Gpu, &c).unwrap();
        }
        let bin = index.match_prefix(&c);
        let lin = index.match_prefix_linear(&c);
        prop_assert_eq!(bin.pods(), lin.pods());
        let got = bin.pods().iter().find(|m| m.pod == pods[0]).map(|m| m.blocks as usize);
        prop_assert_eq!(got, Some(want));
        // A search, not a walk, whatever the hints said: the partition's
        // bound for one group (a few wasted probes per halving step).
        let bound = 2 + 6 * (usize::BITS - n.leading_zeros() + 1) as usize;
        prop_assert!(bin.probes() as usize <= bound, "{} probes, bound {}", bin.probes(), bound);
    }
}
