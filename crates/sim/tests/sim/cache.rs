//! The LRU prefix cache against an obviously-right model.

use std::collections::HashMap;

use proptest::prelude::*;
use router_core::Tier;
use router_sim::BlockCache;

/// The slow twin: a list of (block, refs, last release time), evicting the
/// unreferenced block released longest ago by a linear scan.
#[derive(Default)]
struct Model {
    cap: usize,
    blocks: HashMap<u64, (u32, u64)>,
    clock: u64,
}

impl Model {
    fn admit(&mut self, req: &[u64]) -> Option<usize> {
        let need = req.iter().filter(|b| !self.blocks.contains_key(b)).count();
        let own_free = req
            .iter()
            .filter(|b| self.blocks.get(b).is_some_and(|e| e.0 == 0))
            .count();
        let free = self.blocks.values().filter(|e| e.0 == 0).count() - own_free;
        if self.blocks.len() + need > self.cap + free {
            return None;
        }
        let hits = req
            .iter()
            .take_while(|b| self.blocks.contains_key(b))
            .count();
        for b in req {
            if let Some(e) = self.blocks.get_mut(b) {
                e.0 += 1;
                continue;
            }
            if self.blocks.len() >= self.cap {
                let victim = *self
                    .blocks
                    .iter()
                    .filter(|(_, e)| e.0 == 0)
                    .min_by_key(|(_, e)| e.1)
                    .map(|(b, _)| b)
                    .unwrap();
                self.blocks.remove(&victim);
            }
            self.blocks.insert(*b, (1, 0));
        }
        Some(hits)
    }

    fn release(&mut self, req: &[u64]) {
        for b in req.iter().rev() {
            let e = self.blocks.get_mut(b).unwrap();
            e.0 -= 1;
            if e.0 == 0 {
                self.clock += 1;
                e.1 = self.clock;
            }
        }
    }
}

/// Requests as prefix-chained ids: request `(root, len)` is blocks
/// `root*100 .. root*100+len`.
fn request(root: u64, len: u64) -> Vec<u64> {
    (0..len).map(|i| root * 100 + i).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lru_cache_matches_the_model(
        cap in 4usize..40,
        ops in prop::collection::vec((0u64..6, 1u64..12, any::<bool>()), 1..80),
    ) {
        let mut cache = BlockCache::new(cap, 0);
        let mut model = Model { cap, ..Model::default() };
        let mut running: Vec<Vec<u64>> = Vec::new();
        for (root, len, finish) in ops {
            if finish && !running.is_empty() {
                let r = running.remove(0);
                cache.release(&r);
                model.release(&r);
            } else {
                let r = request(root, len);
                let got = cache.admit(&r).map(|a| a.gpu_hits);
                let want = model.admit(&r);
                prop_assert_eq!(got, want);
                if got.is_some() {
                    running.push(r);
                }
            }
            let mut have: Vec<u64> = cache.blocks().map(|(b, _)| b).collect();
            let mut want: Vec<u64> = model.blocks.keys().copied().collect();
            have.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(have, want);
        }
    }
}

#[test]
fn a_tail_is_evicted_before_its_head_and_offloads_to_cpu() {
    let mut c = BlockCache::new(4, 2);
    let a = [1, 2, 3];
    c.admit(&a).unwrap();
    c.release(&a);
    c.drain_changes();
    // Two new blocks need room: the tail of `a` goes first, to the CPU tier.
    c.admit(&[7, 8]).unwrap();
    assert_eq!(c.tier_of(3), Some(Tier::Cpu));
    assert_eq!(c.tier_of(1), Some(Tier::Gpu));
    let changes = c.drain_changes();
    assert!(
        changes
            .iter()
            .any(|ch| ch.block == 3 && ch.tier == Tier::Gpu && !ch.stored)
    );
    assert!(
        changes
            .iter()
            .any(|ch| ch.block == 3 && ch.tier == Tier::Cpu && ch.stored)
    );
    c.release(&[7, 8]);
    // A hit on a CPU block loads it back.
    let adm = c.admit(&a).unwrap();
    assert_eq!((adm.gpu_hits, adm.cpu_hits), (2, 1));
    assert_eq!(c.tier_of(3), Some(Tier::Gpu));
    // Pinned blocks cannot be evicted: a request needing more room waits.
    assert!(c.admit(&[20, 21, 22, 23]).is_none());
}
