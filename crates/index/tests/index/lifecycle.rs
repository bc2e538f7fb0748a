//! Pod lifecycle and bad input: defined results, counted skips, no panics.

use router_core::{CacheEvent, CacheEventSink, Error, PodDirectory, PodId, PrefixIndex, Tier};
use router_index::{Index, IndexConfig};

use super::{chain, join_n, key, manual_index, store};

#[test]
fn shutdown_hides_at_once_and_sweep_frees_the_slot() {
    let index = manual_index();
    let pods = join_n(&index, 2);
    let c = chain(1, 16);
    store(&index, pods[0], &c);
    store(&index, pods[1], &c[..4]);
    index.shutdown(pods[0]).unwrap();
    let m = index.match_prefix(&c);
    assert_eq!(m.pods().len(), 1);
    assert_eq!(m.blocks_for(pods[1]), 4);
    // Bits remain until the sweep; the slot is not reusable yet.
    assert_eq!(index.stats().residencies, 20);
    assert_eq!(index.pending_sweeps(), 1);
    assert_eq!(index.pod_id(&key(0)), None);
    assert_eq!(index.sweep(), 1);
    let st = index.stats();
    assert_eq!((st.residencies, st.entries, st.blocks_swept), (4, 4, 16));
    assert_eq!(st.sweeps_completed, 1);
    // Re-join: the freed slot comes back with a new epoch.
    let again = index.join(&key(0)).unwrap();
    assert_eq!(again.slot(), pods[0].slot());
    assert_ne!(again.epoch(), pods[0].epoch());
    assert_eq!(
        index.match_prefix(&c).blocks_for(again),
        0,
        "nothing inherited"
    );
}

#[test]
fn events_for_dead_unknown_or_stale_pods_are_refused_and_counted() {
    let index = manual_index();
    let pods = join_n(&index, 1);
    let c = chain(1, 4);
    index.shutdown(pods[0]).unwrap();
    let late = CacheEvent::Stored {
        pod: pods[0],
        tier: Tier::Gpu,
        blocks: c.clone(),
    };
    assert_eq!(index.apply(&late), Err(Error::PodShutDown(pods[0])));
    index.sweep();
    // After the sweep the old id is stale, even once the slot has a new owner.
    let new = index.join(&key(9)).unwrap();
    assert_eq!(new.slot(), pods[0].slot());
    assert_eq!(index.apply(&late), Err(Error::PodShutDown(pods[0])));
    assert_eq!(index.match_prefix(&c).blocks_for(new), 0);
    let never = PodId::new(77, 0);
    assert_eq!(
        index.apply(&CacheEvent::Cleared { pod: never }),
        Err(Error::UnknownPod(never))
    );
    let out_of_range = PodId::new(5000, 0);
    assert!(
        index
            .apply(&CacheEvent::Removed {
                pod: out_of_range,
                tier: Tier::Gpu,
                blocks: c
            })
            .is_err()
    );
    assert_eq!(index.shutdown(never), Err(Error::UnknownPod(never)));
    assert_eq!(
        index.shutdown(pods[0]),
        Err(Error::UnknownPod(pods[0])),
        "shut down twice"
    );
    let st = index.stats();
    assert_eq!(st.skipped_dead_pod, 2);
    assert_eq!(st.skipped_unknown_pod, 2);
    assert_eq!(st.residencies, 0);
}

#[test]
fn registering_beyond_the_width_is_a_typed_error() {
    let index = Index::<1>::new(IndexConfig::default().background_sweep(false));
    let pods = join_n(&*index, 64);
    assert_eq!(index.join(&key(64)), Err(Error::TooManyPods { limit: 64 }));
    assert_eq!(
        index.join(&key(3)),
        Ok(pods[3]),
        "joining twice returns the same id"
    );
    index.shutdown(pods[5]).unwrap();
    assert_eq!(
        index.join(&key(64)),
        Err(Error::TooManyPods { limit: 64 }),
        "not before the sweep"
    );
    index.sweep();
    assert_eq!(index.join(&key(64)).unwrap().slot(), pods[5].slot());
}

#[test]
fn wide_bitmaps_hold_1024_pods() {
    let index = Index::<16>::new(IndexConfig::default().background_sweep(false));
    let pods = join_n(&*index, 1024);
    let c = chain(5, 40);
    for (i, p) in pods.iter().enumerate() {
        store(&*index, *p, &c[..1 + i % 40]);
    }
    let m = index.match_prefix(&c);
    assert_eq!(m.pods().len(), 1024);
    assert_eq!(m.pods(), index.match_prefix_linear(&c).pods());
    assert_eq!(m.blocks_for(pods[1023]), 1 + 1023 % 40);
}

#[test]
fn clear_drops_only_that_pod() {
    let index = manual_index();
    let pods = join_n(&index, 2);
    let c = chain(1, 8);
    store(&index, pods[0], &c);
    store(&index, pods[1], &c);
    index.apply(&CacheEvent::Cleared { pod: pods[0] }).unwrap();
    let m = index.match_prefix(&c);
    assert_eq!((m.blocks_for(pods[0]), m.blocks_for(pods[1])), (0, 8));
    assert_eq!(index.pod_blocks(pods[0]), Some(0));
    assert_eq!(index.pod_blocks(pods[1]), Some(8));
    store(&index, pods[0], &c[..2]);
    assert_eq!(
        index.match_prefix(&c).blocks_for(pods[0]),
        2,
        "still live after a clear"
    );
}

#[test]
fn empty_and_overlong_chains_and_absent_removes() {
    let index = manual_index();
    let pods = join_n(&index, 1);
    let c = chain(1, 8);
    assert!(index.match_prefix(&[]).is_empty());
    assert!(index.match_prefix(&c).is_empty());
    store(&index, pods[0], &c[..3]);
    let long = chain(1, 5000);
    assert_eq!(index.match_prefix(&long).blocks_for(pods[0]), 3);
    index
        .apply(&CacheEvent::Removed {
            pod: pods[0],
            tier: Tier::Gpu,
            blocks: chain(9, 4),
        })
        .unwrap();
    index
        .apply(&CacheEvent::Stored {
            pod: pods[0],
            tier: Tier::Gpu,
            blocks: vec![],
        })
        .unwrap();
    assert_eq!(index.stats().residencies, 3);
}

#[test]
fn background_sweep_runs_on_its_own() {
    let index = Index::<4>::new(IndexConfig::default());
    let pods = join_n(&index, 3);
    let c = chain(1, 1000);
    for p in &pods {
        store(&index, *p, &c);
    }
    index
        .apply(&CacheEvent::PodShutdown { pod: pods[1] })
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while index.stats().residencies != 2000 {
        assert!(std::time::Instant::now() < deadline, "the sweep never ran");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(index.stats().sweeps_running, 0);
    assert_eq!(index.pod_key(pods[0]), Some(key(0)));
    assert_eq!(index.pod_key(pods[1]), None);
}

#[test]
fn stats_count_entries_residencies_and_bitmaps() {
    let index = manual_index();
    let pods = join_n(&index, 48);
    let c = chain(1, 10);
    for p in &pods[..8] {
        store(&index, *p, &c[..5]);
    }
    store(&index, pods[0], &c[5..]);
    let st = index.stats();
    assert_eq!(
        (st.entries, st.residencies, st.bitmap_entries, st.pods_live),
        (10, 45, 0, 48),
        "eight pods below slot 46 stay in the cell"
    );
    let small = st.bytes;
    assert!(small > 0);
    assert_eq!(pods[47].slot(), 47);
    store(&index, pods[47], &c[..5]);
    let st = index.stats();
    assert_eq!(
        (st.entries, st.residencies, st.bitmap_entries),
        (10, 50, 5),
        "a ninth pod past slot 45 moves the five blocks to slab bitmaps"
    );
    assert!(st.bytes > small);
    assert_eq!(st.events_applied, 10);
    let m = index.match_prefix(&c);
    assert_eq!(m.blocks_for(pods[0]), 10);
    assert_eq!(m.blocks_for(pods[7]), 5);
    assert_eq!(m.blocks_for(pods[47]), 5);
}

#[test]
fn a_capacity_hint_allocates_up_front_and_stores_to_it_never_grow() {
    let blocks = 20_000;
    let sized = Index::new(
        IndexConfig::default()
            .background_sweep(false)
            .capacity(blocks),
    );
    let plain = manual_index();
    let reserved = sized.stats().bytes;
    assert!(
        reserved >= 16 * blocks as u64,
        "a 16-byte cell per block reserved: {reserved}"
    );
    assert!(reserved > 10 * plain.stats().bytes);
    for index in [&sized, &plain] {
        let pod = join_n(index, 1)[0];
        for c in 0..blocks / 100 {
            store(index, pod, &chain(c as u64 + 1, 100));
        }
    }
    let (s, p) = (sized.stats(), plain.stats());
    assert_eq!((s.entries, p.entries), (blocks as u64, blocks as u64));
    assert_eq!(s.bytes, reserved, "no table grew");
    assert!(p.bytes > 16 * blocks as u64, "the plain index grew to fit");
    let (a, b) = (
        sized.match_prefix(&chain(7, 100)),
        plain.match_prefix(&chain(7, 100)),
    );
    assert_eq!(a.best().map(|m| m.blocks), Some(100));
    assert_eq!(b.best().map(|m| m.blocks), Some(100));
    // An absurd hint is cut, not honoured.
    assert_eq!(
        IndexConfig::default().capacity(usize::MAX).capacity,
        IndexConfig::MAX_CAPACITY
    );
}

#[test]
fn an_orphan_store_is_refused_and_counted_when_parents_are_checked() {
    let index = Index::<4>::new(
        IndexConfig::default()
            .background_sweep(false)
            .validate_parents(true),
    );
    let pods = join_n(&*index, 2);
    let c = chain(9, 8);
    index
        .store_after(pods[0], Tier::Gpu, None, &c[..4])
        .unwrap();
    // Extends a block it holds: applied.
    index
        .store_after(pods[0], Tier::Gpu, Some(c[3]), &c[4..6])
        .unwrap();
    // Pod 1 holds nothing: its store after block 3 is an orphan.
    assert_eq!(
        index.store_after(pods[1], Tier::Gpu, Some(c[3]), &c[4..6]),
        Err(Error::UnknownParent {
            pod: pods[1],
            parent: c[3]
        })
    );
    // A parent evicted in the meantime is refused too.
    index.remove(pods[0], Tier::Gpu, &c[5..6]).unwrap();
    assert!(matches!(
        index.store_after(pods[0], Tier::Gpu, Some(c[5]), &c[6..8]),
        Err(Error::UnknownParent { .. })
    ));
    let m = index.match_prefix(&c);
    assert_eq!((m.blocks_for(pods[0]), m.blocks_for(pods[1])), (5, 0));
    let st = index.stats();
    assert_eq!(st.skipped_unknown_parent, 2);
    assert_eq!(st.residencies, 5, "nothing of the refused stores landed");
    // Unchecked (the default), the same orphan store applies.
    let lax = Index::<4>::new(IndexConfig::default().background_sweep(false));
    let p = join_n(&*lax, 1)[0];
    lax.store_after(p, Tier::Gpu, Some(c[3]), &c[4..6]).unwrap();
    assert_eq!(lax.stats().skipped_unknown_parent, 0);
}

/// A store repeating blocks the pod holds takes the lock-free check for
/// them; the blocks it does not hold (a hole left by a removal, a new
/// tail) are still written, in any position of the event.
#[test]
fn a_repeated_store_fills_holes_and_counts_nothing_twice() {
    let index = manual_index();
    let pods = join_n(&index, 2);
    let c = chain(3, 12);
    store(&index, pods[0], &c[..8]);
    store(&index, pods[1], &c[..4]);
    index.remove(pods[0], Tier::Gpu, &c[2..3]).unwrap();
    index.remove(pods[0], Tier::Gpu, &c[6..7]).unwrap();
    // Holes: the linear reference reports the first one.
    assert_eq!(index.match_prefix_linear(&c).blocks_for(pods[0]), 2);
    assert_eq!(index.pod_blocks(pods[0]), Some(6));
    store(&index, pods[0], &c);
    assert_eq!(index.match_prefix_linear(&c).blocks_for(pods[0]), 12);
    assert_eq!(index.match_prefix(&c).blocks_for(pods[0]), 12);
    assert_eq!(index.pod_blocks(pods[0]), Some(12));
    store(&index, pods[0], &c);
    let st = index.stats();
    assert_eq!((st.residencies, st.entries), (16, 12));
    assert_eq!(index.pod_blocks(pods[0]), Some(12));
    // Another tier is recorded even where the GPU copy was already held,
    // and the GPU repeat that follows keeps that record.
    index.store(pods[0], Tier::Cpu, &c[..2]).unwrap();
    store(&index, pods[0], &c);
    let tiers = index.tier_counts(pods[0], &c, 12).unwrap();
    assert_eq!((tiers[Tier::Gpu], tiers[Tier::Cpu]), (12, 2));
}
