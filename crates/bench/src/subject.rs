//! The indexes under test behind one small interface.

use std::sync::Arc;

use router_core::{BlockHash, PodDirectory, PodId, PodKey, Tier};
use router_index::{Index, IndexConfig};

use crate::workload::Chain;

/// An index driven by the workloads. Everything takes `&self` so a reader
/// and a writer thread can share one subject (W4).
pub trait Subject: Send + Sync {
    /// The name in the tables.
    fn name(&self) -> &'static str;
    /// `pod` stores blocks `from..to` of `chain` in one event.
    fn store(&self, pod: u32, chain: &Chain, from: usize, to: usize);
    /// `pod` evicts these blocks of `chain` in one event.
    fn remove(&self, pod: u32, chain: &Chain, positions: &[u32]);
    /// Waits until every event sent so far is applied.
    fn flush(&self) {}
    /// Appends `(pod, matched blocks)` for every pod holding a prefix.
    fn query(&self, chain: &Chain, out: &mut Vec<(u32, u32)>);
    /// Index probes spent by this thread's queries so far, for subjects
    /// that count them.
    fn probes(&self) -> Option<u64> {
        None
    }
}

/// `router-index` with its default configuration (256 shards, 256 pods).
#[derive(Debug)]
pub struct Ours {
    index: Arc<Index>,
    pods: Vec<PodId>,
    slot_to_pod: Vec<u32>,
}

impl Ours {
    /// An index with `pods` pods joined.
    pub fn new(pods: usize) -> Self {
        Self::with_config(pods, IndexConfig::default())
    }

    /// An index with `pods` pods joined, configured.
    pub fn with_config(pods: usize, config: IndexConfig) -> Self {
        let index = Index::new(config);
        let ids: Vec<PodId> = (0..pods)
            .map(|i| {
                index
                    .join(&PodKey::new(format!("http://pod-{i}"), 0))
                    .expect("the default width holds 256 pods")
            })
            .collect();
        let mut slot_to_pod = vec![u32::MAX; index.capacity()];
        for (i, id) in ids.iter().enumerate() {
            slot_to_pod[id.slot() as usize] = i as u32;
        }
        Ours {
            index,
            pods: ids,
            slot_to_pod,
        }
    }

    /// The index.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }
}

thread_local! {
    static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Subject for Ours {
    fn name(&self) -> &'static str {
        "router-index"
    }

    fn store(&self, pod: u32, chain: &Chain, from: usize, to: usize) {
        // Every pod of a workload is live: an error would be a harness bug.
        let parent = from.checked_sub(1).map(|p| chain.seq[p]);
        let _ = self.index.store_after(
            self.pods[pod as usize],
            Tier::Gpu,
            parent,
            &chain.seq[from..to],
        );
    }

    fn remove(&self, pod: u32, chain: &Chain, positions: &[u32]) {
        let blocks: Vec<BlockHash> = positions.iter().map(|&p| chain.seq[p as usize]).collect();
        let _ = self
            .index
            .remove(self.pods[pod as usize], Tier::Gpu, &blocks);
    }

    fn query(&self, chain: &Chain, out: &mut Vec<(u32, u32)>) {
        // The allocation-free call, as kv-index's `score_into` is called
        // below: each (pod, blocks) goes straight into `out`.
        let probes = self.index.score_into(&chain.raw, |pod, blocks| {
            out.push((self.slot_to_pod[pod.slot() as usize], blocks));
        });
        PROBES.with(|p| p.set(p.get() + probes as u64));
    }

    fn probes(&self) -> Option<u64> {
        Some(PROBES.with(|p| p.get()))
    }
}

#[cfg(feature = "peers")]
pub use peers::{Dynamo, KvIndex};

#[cfg(feature = "peers")]
mod peers {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use dynamo_kv_router::concurrent_radix_tree_compressed::ConcurrentRadixTreeCompressed;
    use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
    use dynamo_kv_router::protocols::{
        ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
        KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
    };
    use kv_index::{ChainBlockMap, ChainIndex, ContentHash, SequenceHash, StoredBlock};

    use super::Subject;
    use crate::workload::Chain;

    /// SGLang Model Gateway's `ChainIndex` (kv-index 2.0.0), read through
    /// its allocation-free `score_into`.
    pub struct KvIndex {
        index: ChainIndex,
        workers: Vec<u32>,
        maps: Vec<Mutex<ChainBlockMap>>,
        worker_to_pod: Vec<u32>,
    }

    impl std::fmt::Debug for KvIndex {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("KvIndex").finish_non_exhaustive()
        }
    }

    impl KvIndex {
        /// An index with `pods` workers interned.
        pub fn new(pods: usize) -> Self {
            let index = ChainIndex::with_max_workers(pods.max(64));
            let workers: Vec<u32> = (0..pods)
                .map(|i| {
                    index
                        .intern_worker(&format!("pod-{i}"))
                        .expect("within max_workers")
                })
                .collect();
            let mut worker_to_pod = vec![u32::MAX; 1024];
            for (i, w) in workers.iter().enumerate() {
                worker_to_pod[*w as usize] = i as u32;
            }
            KvIndex {
                index,
                maps: (0..pods)
                    .map(|_| Mutex::new(ChainBlockMap::default()))
                    .collect(),
                workers,
                worker_to_pod,
            }
        }
    }

    impl Subject for KvIndex {
        fn name(&self) -> &'static str {
            "kv-index ChainIndex"
        }

        fn store(&self, pod: u32, chain: &Chain, from: usize, to: usize) {
            let blocks: Vec<StoredBlock> = (from..to)
                .map(|i| StoredBlock {
                    seq_hash: SequenceHash(chain.seq[i].0),
                    content_hash: ContentHash(chain.content[i]),
                })
                .collect();
            let parent = (from > 0).then(|| SequenceHash(chain.seq[from - 1].0));
            let mut map = self.maps[pod as usize].lock().expect("not poisoned");
            // A refused store (unknown parent) is what the engine stream
            // would have produced too; the agreement check reports it.
            let _ = self
                .index
                .apply_stored(self.workers[pod as usize], &blocks, parent, &mut map);
        }

        fn remove(&self, pod: u32, chain: &Chain, positions: &[u32]) {
            let hashes: Vec<SequenceHash> = positions
                .iter()
                .map(|&p| SequenceHash(chain.seq[p as usize].0))
                .collect();
            let mut map = self.maps[pod as usize].lock().expect("not poisoned");
            self.index
                .apply_removed(self.workers[pod as usize], &hashes, &mut map);
        }

        fn query(&self, chain: &Chain, out: &mut Vec<(u32, u32)>) {
            self.index.score_into(
                &chain.content,
                |c| *c,
                false,
                |w, s| out.push((self.worker_to_pod[w as usize], s)),
            );
        }
    }

    /// NVIDIA Dynamo's `ConcurrentRadixTreeCompressed` (dynamo-kv-router
    /// 1.6.1) behind its `ThreadPoolIndexer`, as Dynamo deploys it: events go
    /// to a worker thread, lookups run on the caller's thread.
    pub struct Dynamo {
        indexer: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
        event_id: AtomicU64,
    }

    thread_local! {
        // Lookups take content hashes in Dynamo's own type; the copy into a
        // reused buffer costs a few ns, next to microseconds of lookup.
        static LOCAL: std::cell::RefCell<Vec<LocalBlockHash>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    impl std::fmt::Debug for Dynamo {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Dynamo").finish_non_exhaustive()
        }
    }

    impl Dynamo {
        /// An indexer with one event thread (the machine has two cores).
        pub fn new(_pods: usize) -> Self {
            Dynamo {
                indexer: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, 16),
                event_id: AtomicU64::new(0),
            }
        }

        fn send(&self, pod: u32, data: KvCacheEventData) {
            let event = RouterEvent::new(
                pod as u64,
                KvCacheEvent {
                    event_id: self.event_id.fetch_add(1, Ordering::Relaxed),
                    data,
                    dp_rank: 0,
                },
            );
            // The queue is unbounded; a failure means the indexer shut down.
            let _ = self.indexer.enqueue_event(event);
        }
    }

    impl Subject for Dynamo {
        fn name(&self) -> &'static str {
            "Dynamo CRTC"
        }

        fn store(&self, pod: u32, chain: &Chain, from: usize, to: usize) {
            let blocks = (from..to)
                .map(|i| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(chain.seq[i].0),
                    tokens_hash: LocalBlockHash(chain.content[i]),
                    mm_extra_info: None,
                })
                .collect();
            let parent_hash = (from > 0).then(|| ExternalSequenceBlockHash(chain.seq[from - 1].0));
            self.send(
                pod,
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash,
                    start_position: None,
                    blocks,
                }),
            );
        }

        fn remove(&self, pod: u32, chain: &Chain, positions: &[u32]) {
            let block_hashes = positions
                .iter()
                .map(|&p| ExternalSequenceBlockHash(chain.seq[p as usize].0))
                .collect();
            self.send(
                pod,
                KvCacheEventData::Removed(KvCacheRemoveData { block_hashes }),
            );
        }

        fn flush(&self) {
            futures::executor::block_on(self.indexer.flush());
        }

        fn query(&self, chain: &Chain, out: &mut Vec<(u32, u32)>) {
            let scores = LOCAL.with(|local| {
                let mut local = local.borrow_mut();
                local.clear();
                local.extend(chain.content.iter().map(|&c| LocalBlockHash(c)));
                self.indexer.backend().find_matches(&local, false)
            });
            out.extend(scores.scores.iter().map(|(w, s)| (w.worker_id as u32, *s)));
        }
    }
}
