//! Tier records: presence until the last tier goes; counts for a chosen pod.

use router_core::{CacheEvent, CacheEventSink, PrefixIndex, Tier, TierCounts};

use super::{chain, join_n, manual_index};

#[test]
fn a_block_stays_until_it_leaves_its_last_tier() {
    let index = manual_index();
    let pod = join_n(&index, 1)[0];
    let c = chain(1, 6);
    let ev = |stored: bool, tier, from: usize, to: usize| {
        let blocks = c[from..to].to_vec();
        if stored {
            CacheEvent::Stored { pod, tier, blocks }
        } else {
            CacheEvent::Removed { pod, tier, blocks }
        }
    };
    index.apply(&ev(true, Tier::Gpu, 0, 6)).unwrap();
    index.apply(&ev(true, Tier::Cpu, 2, 6)).unwrap(); // offloaded copies
    index.apply(&ev(true, Tier::Disk, 4, 6)).unwrap();
    assert_eq!(
        index.tier_counts(pod, &c, 6),
        Some(TierCounts([6, 4, 2, 0]))
    );
    index.apply(&ev(false, Tier::Gpu, 2, 6)).unwrap(); // evicted from GPU
    assert_eq!(index.match_prefix(&c).blocks_for(pod), 6, "still on CPU");
    assert_eq!(
        index.tier_counts(pod, &c, 6),
        Some(TierCounts([2, 4, 2, 0]))
    );
    index.apply(&ev(false, Tier::Cpu, 2, 6)).unwrap();
    assert_eq!(
        index.match_prefix(&c).blocks_for(pod),
        6,
        "blocks 4, 5 on disk; 2, 3 gone"
    );
    assert_eq!(index.match_prefix_linear(&c).blocks_for(pod), 2);
    assert_eq!(
        index.tier_counts(pod, &c, 2),
        Some(TierCounts([2, 0, 0, 0]))
    );
    index.apply(&ev(false, Tier::Disk, 4, 6)).unwrap();
    assert_eq!(index.match_prefix(&c).blocks_for(pod), 2);
    // Removing from a tier the block is not in changes nothing.
    index.apply(&ev(false, Tier::Remote, 0, 2)).unwrap();
    assert_eq!(index.match_prefix(&c).blocks_for(pod), 2);
    assert_eq!(index.stats().residencies, 2);
}

#[test]
fn a_single_tier_fleet_keeps_no_records() {
    let index = manual_index();
    let pod = join_n(&index, 1)[0];
    let c = chain(1, 100);
    index
        .apply(&CacheEvent::Stored {
            pod,
            tier: Tier::Gpu,
            blocks: c.clone(),
        })
        .unwrap();
    let bytes_gpu = index.stats().bytes;
    let index2 = manual_index();
    let pod2 = join_n(&index2, 1)[0];
    index2
        .apply(&CacheEvent::Stored {
            pod: pod2,
            tier: Tier::Cpu,
            blocks: c.clone(),
        })
        .unwrap();
    assert!(
        index2.stats().bytes > bytes_gpu,
        "CPU-tier records cost memory; GPU-only none"
    );
    assert_eq!(
        index.tier_counts(pod, &c, 100),
        Some(TierCounts([100, 0, 0, 0]))
    );
    assert_eq!(
        index2.tier_counts(pod2, &c, 100),
        Some(TierCounts([0, 100, 0, 0]))
    );
}
