//! Hybrid models: a simulated vLLM engine with several KV-cache groups
//! publishes its events; ingestion into a `HybridIndex` must predict the
//! hit the engine itself would accept, on every prompt, after every batch.
//!
//! The oracle is the engine's own state (which blocks each group holds,
//! in the engine's hashes) and the hit rule stated declaratively: the
//! longest `h` every group accepts (full attention: blocks `[0, h)`; a
//! window of `n` blocks: the `n` blocks before `h`, or all of them when
//! `h < n`; chunked local attention: the blocks from `h`'s chunk start;
//! Mamba: block `h - 1`). The router's side computes it differently: from
//! router hashes recovered from sparse events, per group, through vLLM's
//! scan-and-shrink loop.

use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;
use router_core::{GroupKind, Namespace, PodDirectory, PodId, PodKey, PrefixIndex, mix64};
use router_events::{BlockRemoved, BlockStored, EngineEvent, EventBatch, Ingestor};
use router_hash::ChainHasher;
use router_index::{HybridIndex, Index, IndexConfig};

const BS: usize = 4;

/// One group of the simulated engine.
#[derive(Clone, Debug)]
struct Group {
    idx: u32,
    kind: GroupKind,
    /// Engine hashes it holds.
    held: HashSet<u64>,
}

impl Group {
    fn vllm_kind(&self) -> (&'static str, Option<u32>) {
        match self.kind {
            GroupKind::Full => ("full_attention", None),
            GroupKind::SlidingWindow { window } => ("sliding_window", Some(window)),
            GroupKind::ChunkedLocal { .. } => ("chunked_local_attention", None),
            GroupKind::Mamba => ("mamba", None),
            _ => unreachable!(),
        }
    }

    /// Whether this group accepts a hit of `h` blocks of `chain`.
    fn accepts(&self, chain: &[u64], h: usize) -> bool {
        let held = |i: usize| self.held.contains(&chain[i]);
        match self.kind {
            GroupKind::Full => (0..h).all(held),
            GroupKind::SlidingWindow { window } => {
                let n = (window as usize - 1).div_ceil(BS);
                (h.saturating_sub(n)..h).all(held)
            }
            GroupKind::ChunkedLocal { chunk } => {
                let per = chunk as usize / BS;
                (h / per * per..h).all(held)
            }
            GroupKind::Mamba => h == 0 || held(h - 1),
            _ => unreachable!(),
        }
    }
}

/// A vLLM-like engine: groups in group-index order, events published in
/// that order, full-attention stores dense and other groups' sparse.
struct Engine {
    groups: Vec<Group>,
    full: usize,
}

fn engine_chain(blocks: &[u8]) -> Vec<u64> {
    let mut h = 0x5eed_u64;
    blocks
        .iter()
        .map(|&b| {
            h = mix64(h ^ (u64::from(b) + 1).wrapping_mul(0x9e37_79b9));
            h
        })
        .collect()
}

fn tokens_of(blocks: &[u8]) -> Vec<u32> {
    blocks
        .iter()
        .flat_map(|&b| (0..BS as u32).map(move |t| u32::from(b) * 10 + t))
        .collect()
}

impl Engine {
    /// The hit the engine accepts for `blocks`: the longest every group
    /// accepts.
    fn hit(&self, blocks: &[u8]) -> usize {
        let chain = engine_chain(blocks);
        (0..=chain.len())
            .rev()
            .find(|&h| self.groups.iter().all(|g| g.accepts(&chain, h)))
            .unwrap_or(0)
    }

    /// Serves a prompt: full attention stores what it lacks, every other
    /// group the positions `keep` picks (a sparse event over the range).
    fn serve(&mut self, blocks: &[u8], keep: &[u64]) -> Vec<EngineEvent> {
        let chain = engine_chain(blocks);
        let tokens = tokens_of(blocks);
        let mut out = Vec::new();
        for (gi, g) in self.groups.iter_mut().enumerate() {
            let (kind, window) = g.vllm_kind();
            let mut s = BlockStored::default();
            s.block_size = BS as u32;
            s.medium = Some("GPU".into());
            s.group_idx = Some(g.idx);
            s.kv_cache_spec_kind = Some(kind.into());
            s.kv_cache_spec_sliding_window = window;
            if gi == self.full {
                let from = (0..chain.len())
                    .find(|&i| !g.held.contains(&chain[i]))
                    .unwrap_or(chain.len());
                if from == chain.len() {
                    continue;
                }
                s.block_hashes = chain[from..].to_vec();
                s.parent_block_hash = from.checked_sub(1).map(|i| chain[i]);
                s.token_ids = tokens[from * BS..].to_vec();
            } else {
                // The last block always (vLLM keeps a window's or Mamba's
                // blocks at the prompt's last block boundary), others as
                // `keep` picks.
                let bits = keep[gi % keep.len()];
                let last = chain.len() - 1;
                let picked: Vec<usize> = (0..chain.len())
                    .filter(|&i| {
                        (i == last || bits >> (i % 64) & 1 == 1) && !g.held.contains(&chain[i])
                    })
                    .collect();
                let Some(&first) = picked.first() else {
                    continue;
                };
                s.block_hashes = picked.iter().map(|&i| chain[i]).collect();
                s.parent_block_hash = first.checked_sub(1).map(|i| chain[i]);
                // The tokens of the whole range, as vLLM sends them.
                s.token_ids = tokens[first * BS..].to_vec();
            }
            g.held.extend(s.block_hashes.iter().copied());
            out.push(EngineEvent::BlockStored(s));
        }
        out
    }

    /// Evicts from group `gi`: any blocks `pick` selects of another
    /// group; of full attention only blocks no held block extends (its
    /// state stays prefix-closed per chain, as LRU eviction of chain
    /// tails keeps it).
    fn evict(&mut self, gi: usize, pick: u64, prompts: &[Vec<u8>]) -> Option<EngineEvent> {
        let gi = gi % self.groups.len();
        let g = &self.groups[gi];
        let mut held: Vec<u64> = g.held.iter().copied().collect();
        held.sort_unstable();
        let victims: Vec<u64> = if gi == self.full {
            let mut parents = HashSet::new();
            for p in prompts {
                let c = engine_chain(p);
                for w in c.windows(2) {
                    if g.held.contains(&w[1]) {
                        parents.insert(w[0]);
                    }
                }
            }
            held.into_iter()
                .filter(|h| !parents.contains(h))
                .enumerate()
                .filter(|(i, _)| pick >> (i % 64) & 1 == 1)
                .map(|(_, h)| h)
                .collect()
        } else {
            held.into_iter()
                .enumerate()
                .filter(|(i, _)| pick >> (i % 64) & 1 == 1)
                .map(|(_, h)| h)
                .collect()
        };
        if victims.is_empty() {
            return None;
        }
        let g = &mut self.groups[gi];
        for v in &victims {
            g.held.remove(v);
        }
        let mut r = BlockRemoved::default();
        r.block_hashes = victims;
        r.medium = Some("GPU".into());
        // Group 0's index left out sometimes, as a default on the wire.
        r.group_idx = (g.idx != 0 || pick & 1 == 0).then_some(g.idx);
        Some(EngineEvent::BlockRemoved(r))
    }
}

fn batch(events: Vec<EngineEvent>) -> EventBatch {
    let mut b = EventBatch::default();
    b.events = events;
    b
}

#[derive(Clone, Debug)]
enum Op {
    Serve(usize, Vec<u64>),
    Evict(usize, u64),
}

fn kind() -> impl Strategy<Value = GroupKind> {
    prop_oneof![
        (2u32..24).prop_map(|window| GroupKind::SlidingWindow { window }),
        Just(GroupKind::Mamba),
        Just(GroupKind::ChunkedLocal { chunk: 8 }),
        Just(GroupKind::ChunkedLocal { chunk: 12 }),
    ]
}

/// Prompts over 3 block values: lots of shared prefixes.
fn prompts() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(proptest::collection::vec(0u8..3, 1..14), 2..7)
}

fn op(prompts: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..prompts, proptest::collection::vec(any::<u64>(), 1..4))
            .prop_map(|(p, keep)| Op::Serve(p, keep)),
        2 => (0usize..4, any::<u64>()).prop_map(|(g, pick)| Op::Evict(g, pick)),
    ]
}

fn case() -> impl Strategy<Value = (Vec<GroupKind>, usize, Vec<Vec<u8>>, Vec<Op>, bool)> {
    (
        proptest::collection::vec(kind(), 1..4),
        0usize..4,
        prompts(),
    )
        .prop_flat_map(|(kinds, full_at, prompts)| {
            let n = prompts.len();
            (
                Just(kinds),
                Just(full_at),
                Just(prompts),
                proptest::collection::vec(op(n), 1..24),
                any::<bool>(),
            )
        })
}

fn check(
    index: &Arc<HybridIndex>,
    pods: &[(PodId, &Engine)],
    prompts: &[Vec<u8>],
) -> Result<(), TestCaseError> {
    let hasher = ChainHasher::new(BS).unwrap();
    for p in prompts {
        let chain = hasher.chain(&Namespace::model("m"), &tokens_of(p));
        let m = index.match_prefix(&chain);
        for (pod, engine) in pods {
            prop_assert_eq!(
                m.blocks_for(*pod) as usize,
                engine.hit(p),
                "prompt {:?} on {:?}",
                p,
                pod
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After every batch, for every prompt: the index's prediction is the
    /// engine's hit, on a hybrid engine with random groups (their order,
    /// windows and chunk sizes), random sparse retention and random
    /// evictions, and on a plain engine beside it.
    #[test]
    fn predictions_equal_the_engines_hit(
        (kinds, full_at, prompts, ops, chunk_12) in case(),
    ) {
        let chunk = if chunk_12 { 12 } else { 8 };
        let kinds: Vec<GroupKind> = kinds
            .into_iter()
            .map(|k| match k {
                GroupKind::ChunkedLocal { .. } => GroupKind::ChunkedLocal { chunk },
                k => k,
            })
            .collect();
        let full_at = full_at % (kinds.len() + 1);
        let mut layout = kinds;
        layout.insert(full_at, GroupKind::Full);
        let groups = layout
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Group { idx: i as u32, kind, held: HashSet::new() })
            .collect();
        let mut hybrid = Engine { groups, full: full_at };
        let mut plain = Engine {
            groups: vec![Group { idx: 0, kind: GroupKind::Full, held: HashSet::new() }],
            full: 0,
        };

        let index = HybridIndex::new(Index::new(IndexConfig::default()));
        let a = index.join(&PodKey::new("http://hybrid", 0)).unwrap();
        let b = index.join(&PodKey::new("http://plain", 0)).unwrap();
        let mut ing = Ingestor::new(ChainHasher::new(BS).unwrap(), index.clone(), Some("m".into()), BS as u32)
            .with_chunk_size(Some(chunk));
        for op in &ops {
            match op {
                Op::Serve(p, keep) => {
                    let e = hybrid.serve(&prompts[*p], keep);
                    ing.apply_batch(a, &batch(e));
                    let e = plain.serve(&prompts[*p], keep);
                    ing.apply_batch(b, &batch(e));
                }
                Op::Evict(g, pick) => {
                    if let Some(e) = hybrid.evict(*g, *pick, &prompts) {
                        ing.apply_batch(a, &batch(vec![e]));
                    }
                    if let Some(e) = plain.evict(*g, *pick, &prompts) {
                        ing.apply_batch(b, &batch(vec![e]));
                    }
                }
            }
            check(&index, &[(a, &hybrid), (b, &plain)], &prompts)?;
        }
        let st = ing.stats();
        prop_assert_eq!(
            (st.unresolved_group_blocks, st.unsupported_group, st.other_group, st.unknown_removed),
            (0, 0, 0, 0)
        );
    }
}
