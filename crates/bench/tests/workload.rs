//! W3's count of the (block, pod) pairs its events leave, which `compare`
//! divides each index's memory by: against a plain set replaying the same
//! events, and against router-index's own count after applying them.

use std::collections::HashSet;
use std::sync::Mutex;

use router_bench::subject::{Ours, Subject};
use router_bench::workload::{self, Chain};

/// The (pod, block) pairs held, as a set: the obviously right replay.
#[derive(Default)]
struct Pairs {
    held: Mutex<HashSet<(u32, u64)>>,
    evicted: Mutex<usize>,
}

impl Subject for Pairs {
    fn name(&self) -> &'static str {
        "a set of pairs"
    }
    fn store(&self, pod: u32, chain: &Chain, from: usize, to: usize) {
        let mut held = self.held.lock().unwrap();
        held.extend(chain.raw[from..to].iter().map(|&h| (pod, h)));
    }
    fn remove(&self, pod: u32, chain: &Chain, positions: &[u32]) {
        let mut held = self.held.lock().unwrap();
        let gone = positions
            .iter()
            .filter(|&&p| held.remove(&(pod, chain.raw[p as usize])))
            .count();
        *self.evicted.lock().unwrap() += gone;
    }
    fn query(&self, _: &Chain, _: &mut Vec<(u32, u32)>) {}
}

#[test]
fn w3_counts_the_pairs_its_stores_and_evictions_leave() {
    let text = std::fs::read_to_string(workload::TRACE_PATH).expect("the bundled trace");
    let (requests, _) = workload::read_trace(&text);
    // Small caches, so evictions run all along.
    let w = workload::w3(&requests[..1500], 8, 256);
    let ours = Ours::new(w.pods);
    let set = Pairs::default();
    for op in &w.run {
        workload::apply(&ours, &w, op);
        workload::apply(&set, &w, op);
    }
    let evicted = *set.evicted.lock().unwrap();
    assert!(evicted > 10_000, "the caches evicted: {evicted}");
    let left = set.held.lock().unwrap().len() as u64;
    assert_eq!(w.end_residencies, Some(left));
    assert_eq!(ours.index().stats().residencies, left);
    // W1 and W2 only query in their run: their memory is counted after the
    // setup, over what it stored.
    assert_eq!(workload::w1(1, 10).end_residencies, None);
}
