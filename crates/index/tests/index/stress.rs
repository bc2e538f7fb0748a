//! Writers, readers and pods joining and leaving at once; invariants checked
//! during the run and against a model at the end.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use router_core::{
    BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodId, PodKey, PrefixIndex, Tier,
};
use router_index::{Index, IndexConfig};

use super::chain;

/// A tiny deterministic generator (no shared RNG state between threads).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn concurrent_writers_readers_and_churn_keep_the_invariants() {
    let index = Index::<4>::new(IndexConfig::default().shard_bits(4));
    let chains: Arc<Vec<Vec<BlockHash>>> = Arc::new((0..16).map(|s| chain(s, 64)).collect());
    let dead: Arc<Mutex<HashSet<PodId>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Forty idle pods first, so the writers' pods take slots 40 to 55:
    // blocks held widely then keep their holders in the cell while every
    // holder's slot is below 46 and in the slab otherwise, and the writers
    // move them between the forms while the reader reads.
    for i in 0..40 {
        index.join(&PodKey::new(format!("idle-{i}"), 0)).unwrap();
    }
    let mut writers = Vec::new();
    // Two writers, each owning 8 stable pods: model = blocks each pod holds.
    // Their pods join here, before any thread starts: joined by the writers
    // themselves, on a loaded machine the churn thread could take every
    // free slot first (its departed pods wait for a sweep), and the join
    // failed with `TooManyPods`.
    for w in 0..2u64 {
        let (index, chains) = (index.clone(), chains.clone());
        let pods: Vec<PodId> = (0..8)
            .map(|i| index.join(&PodKey::new(format!("w{w}-{i}"), 0)).unwrap())
            .collect();
        writers.push(std::thread::spawn(move || {
            let mut rng = Lcg(w + 1);
            let mut model: HashMap<PodId, HashSet<BlockHash>> = HashMap::new();
            for _ in 0..20_000 {
                let pod = pods[rng.next(8) as usize];
                let c = &chains[rng.next(16) as usize];
                let from = rng.next(64) as usize;
                let to = (from + 1 + rng.next(16) as usize).min(64);
                let blocks = c[from..to].to_vec();
                let held = model.entry(pod).or_default();
                if rng.next(3) == 0 {
                    blocks.iter().for_each(|b| {
                        held.remove(b);
                    });
                    index
                        .apply(&CacheEvent::Removed {
                            pod,
                            tier: Tier::Gpu,
                            blocks,
                        })
                        .unwrap();
                } else {
                    held.extend(blocks.iter().copied());
                    index
                        .apply(&CacheEvent::Stored {
                            pod,
                            tier: Tier::Gpu,
                            blocks,
                        })
                        .unwrap();
                }
            }
            model
        }));
    }
    // Churn: pods join, store, leave, and their slots are reused.
    let churn = {
        let (index, chains, dead, stop) =
            (index.clone(), chains.clone(), dead.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Lcg(99);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let Ok(pod) = index.join(&PodKey::new(format!("churn-{n}"), 0)) else {
                    std::thread::yield_now();
                    continue;
                };
                n += 1;
                let c = &chains[rng.next(16) as usize];
                let _ = index.apply(&CacheEvent::Stored {
                    pod,
                    tier: Tier::Gpu,
                    blocks: c.clone(),
                });
                index.shutdown(pod).unwrap();
                dead.lock().unwrap().insert(pod);
                // Late event after shutdown: must be refused, never stick.
                let late = index.apply(&CacheEvent::Stored {
                    pod,
                    tier: Tier::Gpu,
                    blocks: c.clone(),
                });
                assert!(late.is_err());
            }
            n
        })
    };
    // A reader: a pod dead before the query started is never reported, and
    // every result is ranked.
    let reader = {
        let (index, chains, dead, stop) =
            (index.clone(), chains.clone(), dead.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Lcg(7);
            let mut queries = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let before: HashSet<PodId> = dead.lock().unwrap().clone();
                let m = index.match_prefix(&chains[rng.next(16) as usize]);
                for p in m.pods() {
                    assert!(!before.contains(&p.pod), "dead pod {:?} reported", p.pod);
                }
                assert!(m.pods().windows(2).all(|w| w[0].blocks >= w[1].blocks));
                queries += 1;
            }
            queries
        })
    };
    let models: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let churned = churn.join().unwrap();
    let queries = reader.join().unwrap();
    assert!(churned > 0 && queries > 0);
    while index.pending_sweeps() > 0 || index.stats().sweeps_running > 0 {
        index.sweep();
    }
    // End state equals the model exactly: every block of every live pod.
    let mut residencies = 0;
    let mut entries = HashSet::new();
    for model in &models {
        for (pod, held) in model {
            assert_eq!(index.pod_blocks(*pod), Some(held.len() as u64), "{pod:?}");
            residencies += held.len() as u64;
            entries.extend(held.iter().copied());
        }
    }
    let st = index.stats();
    assert!(st.bitmap_entries > 0, "the slab form was exercised");
    assert_eq!(st.residencies, residencies, "swept pods left bits behind");
    assert_eq!(st.entries, entries.len() as u64);
    for c in chains.iter() {
        for b in c {
            let holders = index.match_prefix_linear(&[*b]);
            for p in holders.pods() {
                let owned = models
                    .iter()
                    .any(|m| m.get(&p.pod).is_some_and(|h| h.contains(b)));
                assert!(owned, "{:?} reported for a block it does not hold", p.pod);
            }
        }
    }
}
