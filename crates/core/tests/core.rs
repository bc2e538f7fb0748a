//! router-core's vocabulary: ranking, pod identity, tiers, trait defaults.

use router_core::{
    BlockHash, BlockHasher, CacheEvent, Namespace, PodId, PodKey, PodMatch, PrefixIndex,
    PrefixMatch, Tier, TierCounts,
};

#[test]
fn prefix_match_ranks_longest_first_ties_by_slot_and_drops_zero() {
    let mut m = PrefixMatch::new(8);
    m.push(PodMatch {
        pod: PodId::new(5, 0),
        blocks: 3,
    });
    m.push(PodMatch {
        pod: PodId::new(2, 1),
        blocks: 3,
    });
    m.push(PodMatch {
        pod: PodId::new(9, 0),
        blocks: 0,
    });
    m.push(PodMatch {
        pod: PodId::new(7, 0),
        blocks: 8,
    });
    m.add_probes(4);
    m.rank();
    let order: Vec<u16> = m.pods().iter().map(|p| p.pod.slot()).collect();
    assert_eq!(order, [7, 2, 5]);
    assert_eq!(m.blocks_for(PodId::new(9, 0)), 0);
    assert_eq!(m.blocks_for(PodId::new(2, 1)), 3);
    assert_eq!(
        m.blocks_for(PodId::new(2, 0)),
        0,
        "another epoch is another pod"
    );
    assert_eq!(m.probes(), 4);
    m.reset(3);
    assert!(m.is_empty());
    assert_eq!((m.chain_len(), m.probes()), (3, 0));
}

#[test]
fn pod_identity_and_tiers() {
    let k = PodKey::new("http://10.0.0.7:8000", 1);
    assert_eq!(k.to_string(), "http://10.0.0.7:8000#1");
    assert_ne!(k, PodKey::new("http://10.0.0.7:8000", 0));
    assert_ne!(PodId::new(3, 0), PodId::new(3, 1));
    assert_eq!(Tier::ALL.map(Tier::index), [0, 1, 2, 3]);
    let mut c = TierCounts::default();
    c[Tier::Gpu] += 3;
    c[Tier::Disk] += 2;
    assert_eq!((c[Tier::Gpu], c[Tier::Cpu], c.total()), (3, 0, 5));
    let e = CacheEvent::Cleared {
        pod: PodId::new(4, 2),
    };
    assert_eq!(e.pod(), PodId::new(4, 2));
}

/// A deliberately naive hasher to exercise the trait's provided method.
struct SumHasher;

impl BlockHasher for SumHasher {
    fn root(&self, _: &Namespace) -> BlockHash {
        BlockHash(1)
    }
    fn hash_block(&self, parent: BlockHash, tokens: &[u32], _: &[u64]) -> BlockHash {
        BlockHash(parent.0 * 31 + tokens.iter().map(|&t| t as u64).sum::<u64>())
    }
}

#[test]
fn extend_chain_hashes_full_blocks_from_the_parent() {
    let mut out = Vec::new();
    SumHasher.extend_chain(BlockHash(1), &[1, 2, 3, 4, 5], 2, &mut out);
    assert_eq!(out, [BlockHash(31 + 3), BlockHash((31 + 3) * 31 + 7)]);
    SumHasher.extend_chain(BlockHash(1), &[1, 2, 3], 0, &mut out);
    assert_eq!(out.len(), 2, "block size 0 appends nothing");
}

/// An index that knows one chain on one pod, to exercise the defaults.
struct OnePod;

impl PrefixIndex for OnePod {
    fn match_prefix_into(&self, chain: &[BlockHash], out: &mut PrefixMatch) {
        out.reset(chain.len());
        let held = chain.iter().take_while(|h| h.0 < 10).count() as u32;
        out.push(PodMatch {
            pod: PodId::new(0, 0),
            blocks: held,
        });
        out.rank();
    }
}

#[test]
fn prefix_index_defaults() {
    let m = OnePod.match_prefix(&[BlockHash(1), BlockHash(2), BlockHash(11)]);
    assert_eq!(
        m.best(),
        Some(PodMatch {
            pod: PodId::new(0, 0),
            blocks: 2
        })
    );
    assert_eq!(m.chain_len(), 3);
    assert_eq!(OnePod.tier_counts(PodId::new(0, 0), &[], 0), None);
}
