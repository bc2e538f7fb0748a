//! W3's count of the (block, pod) pairs its events leave, which `compare`
//! divides each index's memory by: against a plain set replaying the same
//! events, and against router-index's own count after applying them.

use std::collections::HashSet;

use router_bench::subject::{Ours, Subject};
use router_bench::workload::{self, Op};

#[test]
fn w3_counts_the_pairs_its_stores_and_evictions_leave() {
    let text = std::fs::read_to_string(workload::TRACE_PATH).expect("the bundled trace");
    let (requests, _) = workload::read_trace(&text);
    // Small caches, so evictions run all along.
    let w = workload::w3(&requests[..1500], 8, 256);
    let ours = Ours::new(w.pods);
    let mut held: HashSet<(u32, u64)> = HashSet::new();
    let mut evicted = 0;
    for op in &w.run {
        match op {
            Op::Store {
                pod,
                chain,
                from,
                to,
            } => {
                let c = &w.chains[*chain as usize];
                held.extend(
                    c.raw[*from as usize..*to as usize]
                        .iter()
                        .map(|&h| (*pod, h)),
                );
                ours.store(*pod, c, *from as usize, *to as usize);
            }
            Op::Remove {
                pod,
                chain,
                positions,
            } => {
                let c = &w.chains[*chain as usize];
                for &p in positions {
                    evicted += usize::from(held.remove(&(*pod, c.raw[p as usize])));
                }
                ours.remove(*pod, c, positions);
            }
            Op::Query { .. } => {}
        }
    }
    assert!(evicted > 10_000, "the caches evicted: {evicted}");
    assert_eq!(w.end_residencies, Some(held.len() as u64));
    assert_eq!(ours.index().stats().residencies, held.len() as u64);
    // W1 and W2 only query in their run: their memory is counted after the
    // setup, over what it stored.
    assert_eq!(workload::w1(1, 10).end_residencies, None);
}
