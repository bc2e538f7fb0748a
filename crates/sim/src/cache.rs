//! A pod's block-level prefix cache: fixed capacity, LRU eviction of
//! unreferenced blocks, an optional second (CPU) tier, and the cache events
//! an engine would publish.
//!
//! This follows vLLM's block pool: blocks in use by running requests are
//! pinned (reference counted); a finished request's blocks join the free
//! queue, deepest first, so a sequence's tail is evicted before its head;
//! a new block takes the least recently freed slot. With a CPU tier, an
//! evicted GPU block is offloaded to host memory (its own LRU) instead of
//! dropped, and a later hit loads it back.

use std::collections::{BTreeMap, HashMap};

use router_core::Tier;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tier: Tier,
    refs: u32,
    /// LRU stamp while free in its tier (0 while pinned).
    stamp: u64,
}

/// One change an engine would announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheChange {
    /// The block id.
    pub block: u64,
    /// The tier it entered or left.
    pub tier: Tier,
    /// Stored (true) or removed (false).
    pub stored: bool,
}

/// What admitting a request did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// Leading blocks already cached on the GPU.
    pub gpu_hits: usize,
    /// Leading blocks after those found in the CPU tier and loaded back.
    pub cpu_hits: usize,
    /// Blocks the request will compute (announced once its prefill is done).
    pub computed: Vec<u64>,
}

/// A pod's prefix cache.
#[derive(Clone, Debug)]
pub struct BlockCache {
    gpu_capacity: usize,
    cpu_capacity: usize,
    entries: HashMap<u64, Entry>,
    gpu_used: usize,
    gpu_free: BTreeMap<u64, u64>,
    cpu_lru: BTreeMap<u64, u64>,
    clock: u64,
    changes: Vec<CacheChange>,
}

impl BlockCache {
    /// A cache of `gpu_capacity` blocks, with a CPU tier of `cpu_capacity`
    /// blocks (0: none).
    pub fn new(gpu_capacity: usize, cpu_capacity: usize) -> Self {
        BlockCache {
            gpu_capacity,
            cpu_capacity,
            entries: HashMap::new(),
            gpu_used: 0,
            gpu_free: BTreeMap::new(),
            cpu_lru: BTreeMap::new(),
            clock: 0,
            changes: Vec::new(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The tier holding `block`, if any.
    pub fn tier_of(&self, block: u64) -> Option<Tier> {
        self.entries.get(&block).map(|e| e.tier)
    }

    /// Blocks held in any tier.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Blocks pinned by running requests.
    pub fn pinned(&self) -> usize {
        self.gpu_used - self.gpu_free.len()
    }

    /// Every cached block with its tier.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, Tier)> + '_ {
        self.entries.iter().map(|(b, e)| (*b, e.tier))
    }

    /// Leading blocks of `blocks` cached in any tier.
    pub fn cached_prefix(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|b| self.entries.contains_key(b))
            .count()
    }

    /// Takes the changes since the last call.
    pub fn drain_changes(&mut self) -> Vec<CacheChange> {
        std::mem::take(&mut self.changes)
    }

    /// Pins every block of a request on the GPU, evicting free blocks as
    /// needed. `None` when the GPU cannot hold them now (too many pinned):
    /// nothing changes and the request waits.
    pub fn admit(&mut self, blocks: &[u64]) -> Option<Admission> {
        let mut seen = std::collections::HashSet::with_capacity(blocks.len());
        let mut need = 0usize;
        let mut own_free = 0usize;
        for b in blocks {
            if !seen.insert(*b) {
                continue;
            }
            match self.entries.get(b) {
                Some(e) if e.tier == Tier::Gpu => {
                    if e.refs == 0 {
                        own_free += 1;
                    }
                }
                _ => need += 1,
            }
        }
        let evictable = self.gpu_free.len() - own_free;
        if self.gpu_used + need > self.gpu_capacity + evictable {
            return None;
        }
        let prefix = self.cached_prefix(blocks);
        let mut adm = Admission::default();
        for (i, b) in blocks.iter().enumerate() {
            match self.entries.get(b).copied() {
                Some(e) if e.tier == Tier::Gpu => {
                    if e.refs == 0 {
                        self.gpu_free.remove(&e.stamp);
                    }
                    self.entries.insert(
                        *b,
                        Entry {
                            refs: e.refs + 1,
                            stamp: 0,
                            ..e
                        },
                    );
                    if i < prefix {
                        adm.gpu_hits += 1;
                    }
                }
                Some(e) => {
                    // In the CPU tier: load it back into a GPU slot.
                    self.cpu_lru.remove(&e.stamp);
                    self.pin_in_new_gpu_slot(*b);
                    self.changes.push(CacheChange {
                        block: *b,
                        tier: Tier::Cpu,
                        stored: false,
                    });
                    self.changes.push(CacheChange {
                        block: *b,
                        tier: Tier::Gpu,
                        stored: true,
                    });
                    if i < prefix {
                        adm.cpu_hits += 1;
                    } else {
                        adm.computed.push(*b);
                    }
                }
                None => {
                    self.pin_in_new_gpu_slot(*b);
                    adm.computed.push(*b);
                }
            }
        }
        Some(adm)
    }

    /// Puts `block` in a GPU slot (evicting if full), pinned once.
    fn pin_in_new_gpu_slot(&mut self, block: u64) {
        self.make_gpu_room();
        self.entries.insert(
            block,
            Entry {
                tier: Tier::Gpu,
                refs: 1,
                stamp: 0,
            },
        );
        self.gpu_used += 1;
    }

    /// Announces the blocks a request computed (its prefill finished).
    pub fn computed(&mut self, blocks: &[u64]) {
        for b in blocks {
            if self.entries.get(b).is_some_and(|e| e.tier == Tier::Gpu) {
                self.changes.push(CacheChange {
                    block: *b,
                    tier: Tier::Gpu,
                    stored: true,
                });
            }
        }
    }

    /// Unpins a finished request's blocks; the deepest becomes the least
    /// recently used.
    pub fn release(&mut self, blocks: &[u64]) {
        for b in blocks.iter().rev() {
            let Some(mut e) = self.entries.get(b).copied() else {
                continue;
            };
            if e.refs == 0 {
                continue; // a duplicate id in one request
            }
            e.refs -= 1;
            if e.refs == 0 {
                e.stamp = self.tick();
                self.gpu_free.insert(e.stamp, *b);
            }
            self.entries.insert(*b, e);
        }
    }

    /// Frees one GPU slot if the GPU is full, by evicting the least recently
    /// used free block (to the CPU tier if there is one).
    fn make_gpu_room(&mut self) {
        if self.gpu_used < self.gpu_capacity {
            return;
        }
        let Some((_, victim)) = self.gpu_free.pop_first() else {
            return; // admit() checked there is room
        };
        self.gpu_used -= 1;
        self.changes.push(CacheChange {
            block: victim,
            tier: Tier::Gpu,
            stored: false,
        });
        if self.cpu_capacity == 0 {
            self.entries.remove(&victim);
            return;
        }
        if self.cpu_lru.len() >= self.cpu_capacity {
            if let Some((_, old)) = self.cpu_lru.pop_first() {
                self.entries.remove(&old);
                self.changes.push(CacheChange {
                    block: old,
                    tier: Tier::Cpu,
                    stored: false,
                });
            }
        }
        let stamp = self.tick();
        self.cpu_lru.insert(stamp, victim);
        self.entries.insert(
            victim,
            Entry {
                tier: Tier::Cpu,
                refs: 0,
                stamp,
            },
        );
        self.changes.push(CacheChange {
            block: victim,
            tier: Tier::Cpu,
            stored: true,
        });
    }
}
