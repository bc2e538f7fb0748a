//! router-index alone, under criterion.
//!
//! - `match/{binary,linear}/N/K`: one query of an N-block chain that 256
//!   pods hold to K distinct depths, by binary partition and by the linear
//!   oracle in the same run. K is what binary partition pays for (O(K log N)
//!   probes); the linear scan pays for N.
//! - `shutdown_1m/*`: a pod holding 1M blocks (and a second pod holding a
//!   128-block chain) leaves. `shutdown` is the time until queries stop
//!   seeing it (the call's duration: queries started after it returns never
//!   report the pod); `sweep` is the background clean-up of its 1M bits;
//!   `query_during_sweep` is the other pod's query latency while a sweep
//!   runs on another thread, against `query_idle`.
//! - `hybrid/{index,plain,declared,groups}/N/K`: the same query through
//!   router-index's `Index` and through `HybridIndex` over it: with no
//!   hybrid pod (`plain`, what a non-hybrid fleet pays), with a declared
//!   sliding-window layout that no event has described yet (`declared`),
//!   and with every pod's sliding-window group holding its prefix
//!   (`groups`, the hit rule run per pod).
//! - `store/{new,again}_128`: one store event of a whole 128-block chain
//!   for one of 16 pods, as W1 and W4 of `compare` send them: `new` stores
//!   chains the index has never seen (a fresh index every 4000 chains, the
//!   rebuild untimed), `again` re-stores chains the pod already holds,
//!   picked at random from 4000 (cold).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_bench::subject::Ours;
use router_bench::workload::{self, Op};
use router_core::{
    BlockHash, CacheEventSink, GroupChange, GroupKind, GroupSpec, PodDirectory, PodId, PodKey,
    PrefixIndex, PrefixMatch, Tier,
};
use router_index::{HybridIndex, Index, IndexConfig};

fn bench_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("match");
    for n in [1024usize, 4096] {
        for k in [1usize, 8, 64] {
            let w = workload::w2(3, n, k, 1, 0);
            let ours = Ours::new(w.pods);
            for op in &w.setup {
                if let Op::Store { pod, from, to, .. } = op {
                    use router_bench::subject::Subject;
                    ours.store(*pod, &w.chains[0], *from as usize, *to as usize);
                }
            }
            let chain = &w.chains[0].seq;
            let index = ours.index().clone();
            let mut out = PrefixMatch::new(0);
            g.bench_with_input(
                BenchmarkId::new("binary", format!("{n}/{k}")),
                chain,
                |b, ch| {
                    b.iter(|| {
                        index.match_prefix_into(ch, &mut out);
                        out.pods().len()
                    })
                },
            );
            g.bench_with_input(
                BenchmarkId::new("linear", format!("{n}/{k}")),
                chain,
                |b, ch| {
                    b.iter(|| {
                        index.match_prefix_linear_into(ch, &mut out);
                        out.pods().len()
                    })
                },
            );
        }
    }
    g.finish();
}

/// What `HybridIndex` adds to a query (see the module's notes).
fn bench_hybrid(c: &mut Criterion) {
    let mut g = c.benchmark_group("hybrid");
    let window =
        GroupSpec::new(0, GroupKind::SlidingWindow { window: 128 }, 16).expect("a valid group");
    for (n, k) in [(1024usize, 8usize), (4096, 8), (4096, 64)] {
        let w = workload::w2(3, n, k, 1, 0);
        let ours = Ours::new(w.pods);
        for op in &w.setup {
            if let Op::Store { pod, from, to, .. } = op {
                use router_bench::subject::Subject;
                ours.store(*pod, &w.chains[0], *from as usize, *to as usize);
            }
        }
        let chain = w.chains[0].seq.clone();
        let index = ours.index().clone();
        let plain = HybridIndex::new(index.clone());
        let declared = HybridIndex::with_layout(index.clone(), vec![window]);
        let groups = HybridIndex::new(index.clone());
        for m in index.match_prefix(&chain).pods() {
            let held = &chain[..m.blocks as usize];
            groups
                .apply_group(m.pod, &window, Tier::Gpu, GroupChange::Stored, held)
                .expect("a live pod");
        }
        let subjects: [(&str, Arc<dyn PrefixIndex>); 4] = [
            ("index", index),
            ("plain", plain),
            ("declared", declared),
            ("groups", groups),
        ];
        let mut out = PrefixMatch::new(0);
        for (name, subject) in subjects {
            g.bench_with_input(
                BenchmarkId::new(name, format!("{n}/{k}")),
                &chain,
                |b, ch| {
                    b.iter(|| {
                        subject.match_prefix_into(ch, &mut out);
                        out.pods().len()
                    })
                },
            );
        }
    }
    g.finish();
}

/// An index whose pod 0 holds 1M blocks and pod 1 a 128-block chain.
fn big_pod() -> (Arc<Index>, PodId, Vec<BlockHash>) {
    let index = Index::new(IndexConfig::default().background_sweep(false));
    let big = index.join(&PodKey::new("big", 0)).expect("slot");
    let small = index.join(&PodKey::new("small", 0)).expect("slot");
    let blocks: Vec<BlockHash> = (0..1_000_000u64)
        .map(|i| BlockHash(workload::mix(i)))
        .collect();
    for chunk in blocks.chunks(4096) {
        index.store(big, Tier::Gpu, chunk).expect("live");
    }
    let chain: Vec<BlockHash> = (0..128u64)
        .map(|i| BlockHash(workload::mix(i ^ 1 << 50)))
        .collect();
    index.store(small, Tier::Gpu, &chain).expect("live");
    (index, big, chain)
}

fn bench_shutdown(c: &mut Criterion) {
    let mut g = c.benchmark_group("shutdown_1m");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("shutdown", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (index, big, _) = big_pod();
                let t = Instant::now();
                index.shutdown(big).expect("live");
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("sweep", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (index, big, _) = big_pod();
                index.shutdown(big).expect("live");
                let t = Instant::now();
                index.sweep();
                total += t.elapsed();
            }
            total
        })
    });
    let (index, _, chain) = big_pod();
    let mut out = PrefixMatch::new(0);
    g.bench_function("query_idle", |b| {
        b.iter(|| {
            index.match_prefix_into(&chain, &mut out);
            out.pods().len()
        })
    });
    g.bench_function("query_during_sweep", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            let mut out = PrefixMatch::new(0);
            while done < iters {
                let (index, big, chain) = big_pod();
                index.shutdown(big).expect("live");
                let sweeper = {
                    let index = index.clone();
                    std::thread::spawn(move || index.sweep())
                };
                while done < iters && !sweeper.is_finished() {
                    let t = Instant::now();
                    index.match_prefix_into(&chain, &mut out);
                    total += t.elapsed();
                    assert_eq!(out.pods().len(), 1, "only the small pod");
                    done += 1;
                }
                sweeper.join().expect("sweep thread");
            }
            total
        })
    });
    g.finish();
}

fn bench_store(c: &mut Criterion) {
    const CHAINS: usize = 4000;
    let chains: Vec<Vec<BlockHash>> = (0..CHAINS as u64)
        .map(|c| {
            (0..128u64)
                .map(|i| BlockHash(workload::mix(c << 20 | i)))
                .collect()
        })
        .collect();
    let fresh = || {
        let index = Index::<4>::new(IndexConfig::default().background_sweep(false));
        let pods: Vec<PodId> = (0..16)
            .map(|i| {
                index
                    .join(&PodKey::new(format!("http://pod-{i}"), 0))
                    .expect("room for 16 pods")
            })
            .collect();
        (index, pods)
    };
    let mut g = c.benchmark_group("store");
    g.bench_function("new_128", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0u64;
            while done < iters {
                let (index, pods) = fresh();
                let t = Instant::now();
                for (i, chain) in chains.iter().enumerate() {
                    if done == iters {
                        break;
                    }
                    index.store(pods[i % 16], Tier::Gpu, chain).expect("live");
                    done += 1;
                }
                total += t.elapsed();
            }
            total
        })
    });
    let (index, pods) = fresh();
    for (i, chain) in chains.iter().enumerate() {
        index.store(pods[i % 16], Tier::Gpu, chain).expect("live");
    }
    let mut rng = workload::Rng::new(7);
    g.bench_function("again_128", |b| {
        b.iter(|| {
            let i = rng.below(CHAINS as u64) as usize;
            index
                .store(pods[i % 16], Tier::Gpu, &chains[i])
                .expect("live");
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_match,
    bench_hybrid,
    bench_shutdown,
    bench_store
);
criterion_main!(benches);
