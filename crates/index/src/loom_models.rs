//! loom models of the index's two races. Run with
//! `RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p router-index --release --lib loom`.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering};
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodKey, PrefixIndex, Tier};

use crate::{Index, IndexConfig};

fn small_index() -> Arc<Index<1>> {
    Index::<1>::new(IndexConfig::default().shard_bits(0).background_sweep(false))
}

fn key(name: &str) -> PodKey {
    PodKey::new(name, 0)
}

/// After `shutdown` returns, no query that starts later reports the pod;
/// other pods are unaffected throughout.
#[test]
fn loom_shutdown_racing_a_query() {
    loom::model(|| {
        let index = small_index();
        let a = index.join(&key("a")).unwrap();
        let b = index.join(&key("b")).unwrap();
        let chain = [BlockHash(1)];
        for pod in [a, b] {
            index
                .apply(&CacheEvent::Stored {
                    pod,
                    tier: Tier::Gpu,
                    blocks: chain.to_vec(),
                })
                .unwrap();
        }
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (index, done) = (index.clone(), done.clone());
            loom::thread::spawn(move || {
                index.shutdown(a).unwrap();
                done.store(true, Ordering::Release);
            })
        };
        let started_after = done.load(Ordering::Acquire);
        let m = index.match_prefix(&chain);
        if started_after {
            assert_eq!(
                m.blocks_for(a),
                0,
                "a query started after shutdown saw the pod"
            );
        }
        assert_eq!(m.blocks_for(b), 1);
        t.join().unwrap();
    });
}

/// A store for a pod racing its shutdown, sweep and the slot's reuse never
/// leaves a bit that the slot's next owner inherits.
#[test]
fn loom_late_store_racing_shutdown_sweep_and_reuse() {
    loom::model(|| {
        let index = small_index();
        let a = index.join(&key("a")).unwrap();
        let chain = [BlockHash(7), BlockHash(8)];
        let writer = {
            let index = index.clone();
            loom::thread::spawn(move || {
                // May land before the shutdown (and be swept) or be refused.
                let _ = index.apply(&CacheEvent::Stored {
                    pod: a,
                    tier: Tier::Gpu,
                    blocks: chain.to_vec(),
                });
            })
        };
        index.shutdown(a).unwrap();
        index.sweep();
        let b = index.join(&key("b")).unwrap();
        assert_eq!(b.slot(), a.slot(), "the model reuses the slot");
        writer.join().unwrap();
        index.sweep();
        assert_eq!(
            index.match_prefix(&chain).blocks_for(b),
            0,
            "new owner inherited a bit"
        );
        assert_eq!(index.stats().residencies, 0);
        assert_eq!(index.pod_blocks(b), Some(0));
    });
}

/// Two blocks in different shards of a 2-shard index, so a model
/// exercises two shard locks.
fn two_shard_chain() -> [BlockHash; 2] {
    let bits = 1;
    let first = crate::shard::shard_of(1, bits);
    let other = (2..)
        .find(|h| crate::shard::shard_of(*h, bits) != first)
        .expect("some hash falls in the other shard");
    [BlockHash(1), BlockHash(other)]
}

/// A query racing a store of a whole run over two shards sees the run
/// whole or not at all: the writer puts block 0 in last, and the query
/// reads block 0 no later than the deepest block, either alone first or
/// both together (both shard locks held, taken in shard order). A second
/// query racing a writer of the other pod, in the other lock order of the
/// chain, cannot deadlock.
#[test]
fn loom_a_query_sees_a_racing_store_whole_or_not_at_all() {
    for paired in [0, usize::MAX] {
        racing_store_model(paired);
    }
}

fn racing_store_model(paired_opening_from: usize) {
    loom::model(move || {
        let index = Index::<1>::new(
            IndexConfig::default()
                .shard_bits(1)
                .background_sweep(false)
                .paired_opening_from(paired_opening_from),
        );
        let a = index.join(&key("a")).unwrap();
        let b = index.join(&key("b")).unwrap();
        let chain = two_shard_chain();
        let reversed = [chain[1], chain[0]];
        let writer = {
            let index = index.clone();
            loom::thread::spawn(move || {
                index.store(a, Tier::Gpu, &chain).unwrap();
                // The other order of shards, for the lock-order check.
                index.store(b, Tier::Gpu, &reversed).unwrap();
            })
        };
        let m = index.match_prefix(&chain);
        let seen = m.blocks_for(a);
        assert!(
            seen == 0 || seen == 2,
            "saw {seen} blocks of a 2-block store"
        );
        let r = index.match_prefix(&reversed);
        assert!(matches!(r.blocks_for(b), 0 | 2));
        writer.join().unwrap();
        assert_eq!(index.match_prefix(&chain).blocks_for(a), 2);
        assert_eq!(index.match_prefix(&reversed).blocks_for(b), 2);
    });
}

/// A query racing a store that moves block `chain[at]` from inline lanes
/// into a bitmap, then removals that move it back. With `idle` pods joined
/// first so that the five racing pods take slots from 46 on, the bitmap is
/// the slab's (allocating and publishing the slab's first array; the
/// bitmap is released before the entry names its lanes again); with none,
/// it is the cell's own small bitmap (one word changes). Five pods hold
/// the blocks before it; four hold it; the writer adds the fifth, then
/// takes it from the first three. The query, reading without a lock, sees
/// the block's holders as they were between two of these events, never a
/// mix: each pod at depth `at + 1` or `at`.
fn promotion_race(chain: &'static [BlockHash], at: usize, idle: usize) {
    // The idle pods' joins run before any thread is spawned, so they add
    // loads to each execution, not interleavings: room for them.
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(move || {
        let index = small_index();
        for i in 0..idle {
            index.join(&key(&format!("idle-{i}"))).unwrap();
        }
        let pods: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| index.join(&key(n)).unwrap())
            .collect();
        let slab = pods
            .iter()
            .all(|p| p.slot() as usize >= crate::holders::SMALL_SLOTS);
        assert_eq!(slab, idle >= crate::holders::SMALL_SLOTS);
        let block = &chain[at..=at];
        for &p in &pods {
            if at > 0 {
                index.store(p, Tier::Gpu, &chain[..at]).unwrap();
            }
        }
        for &p in &pods[..4] {
            index.store(p, Tier::Gpu, block).unwrap();
        }
        let writer = {
            let (index, pods) = (index.clone(), pods.clone());
            loom::thread::spawn(move || {
                index.store(pods[4], Tier::Gpu, block).unwrap();
                for &p in &pods[..3] {
                    index.remove(p, Tier::Gpu, block).unwrap();
                }
            })
        };
        let m = index.match_prefix(chain);
        let held: Vec<bool> = pods
            .iter()
            .map(|&p| m.blocks_for(p) == at as u32 + 1)
            .collect();
        let placed = pods.iter().all(|&p| m.blocks_for(p) >= at as u32);
        assert!(placed, "a pod lost the blocks before the raced one");
        // The states between events: e joins, then a, b and c leave.
        let allowed = [
            [true, true, true, true, false],
            [true, true, true, true, true],
            [false, true, true, true, true],
            [false, false, true, true, true],
            [false, false, false, true, true],
        ];
        assert!(allowed.iter().any(|s| s[..] == held[..]), "saw {held:?}");
        writer.join().unwrap();
        let m = index.match_prefix(chain);
        let end: Vec<u32> = pods.iter().map(|&p| m.blocks_for(p)).collect();
        let (out, held) = (at as u32, at as u32 + 1);
        assert_eq!(end, [out, out, out, held, held]);
    });
}

/// The race met by a one-block query's probe.
#[test]
fn loom_a_lock_free_read_racing_slab_promotion_sees_before_or_after() {
    promotion_race(&[BlockHash(5)], 0, crate::holders::SMALL_SLOTS);
}

/// The same race where the five pods' slots fit the cell's small bitmap.
#[test]
fn loom_a_lock_free_read_racing_promotion_in_the_cell_sees_before_or_after() {
    promotion_race(&[BlockHash(5)], 0, 0);
}

/// The race met by a short chain's scan, whose read of the middle block
/// is split in two (`ShardCore::stage`, then `finish` after the other
/// blocks' reads are begun).
#[test]
fn loom_a_staged_scan_read_racing_slab_promotion_sees_before_or_after() {
    promotion_race(
        &[BlockHash(11), BlockHash(12), BlockHash(13)],
        1,
        crate::holders::SMALL_SLOTS,
    );
}

/// A query racing the store that grows a shard's table (the 13th entry of
/// 16 cells: a new array is filled, published and the old one retired)
/// still finds a block stored before, and sees the new block whole or not.
#[test]
fn loom_a_lock_free_read_racing_table_growth_finds_old_entries() {
    loom::model(|| {
        let index = small_index();
        let a = index.join(&key("a")).unwrap();
        let old: Vec<BlockHash> = (100..112).map(BlockHash).collect();
        index.store(a, Tier::Gpu, &old).unwrap();
        let writer = {
            let index = index.clone();
            loom::thread::spawn(move || {
                index.store(a, Tier::Gpu, &[BlockHash(7)]).unwrap();
            })
        };
        let m = index.match_prefix(&old[..1]);
        assert_eq!(
            m.blocks_for(a),
            1,
            "a block stored before the growth was lost"
        );
        let n = index.match_prefix(&[BlockHash(7)]).blocks_for(a);
        assert!(n <= 1);
        writer.join().unwrap();
        assert_eq!(index.match_prefix(&[BlockHash(7)]).blocks_for(a), 1);
    });
}

/// A lone pod's own search (the opening leaves one pod holding block 0 and
/// not the last block) racing a store, then a removal, of the block
/// between: it sees the pod's depth from before or after the write, never
/// another, and the answer once the writer is done is exact.
#[test]
fn loom_a_lone_pods_search_racing_a_write_sees_before_or_after() {
    for store in [true, false] {
        loom::model(move || {
            // No short-chain scan: the opening hands the pod to its search.
            let config = IndexConfig::default()
                .shard_bits(1)
                .background_sweep(false)
                .short_scan(0);
            let index = Index::<1>::new(config);
            let a = index.join(&key("a")).unwrap();
            let [c0, c1] = two_shard_chain();
            let chain = [c0, c1, BlockHash(99)];
            let before = if store {
                index.store(a, Tier::Gpu, &[c0]).unwrap();
                1
            } else {
                index.store(a, Tier::Gpu, &[c0, c1]).unwrap();
                2
            };
            let after = 3 - before;
            let writer = {
                let index = index.clone();
                loom::thread::spawn(move || {
                    if store {
                        index.store_after(a, Tier::Gpu, Some(c0), &[c1]).unwrap();
                    } else {
                        index.remove(a, Tier::Gpu, &[c1]).unwrap();
                    }
                })
            };
            let seen = index.match_prefix(&chain).blocks_for(a);
            assert!(
                seen == before || seen == after,
                "saw {seen} blocks, before {before}, after {after}"
            );
            writer.join().unwrap();
            assert_eq!(index.match_prefix(&chain).blocks_for(a), after);
        });
    }
}
