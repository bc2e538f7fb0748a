//! Ingestion into a real index, with router hashes from router-hash.

use std::sync::Arc;

use router_core::{Namespace, PodDirectory, PodKey, PrefixIndex, TierCounts};
use router_events::{BlockRemoved, BlockStored, EngineEvent, EventBatch, Ingestor, decode_batch};
use router_hash::ChainHasher;
use router_index::{Index, IndexConfig};

use super::{ARRAY_BATCH, bytes};

fn setup() -> (
    Arc<Index>,
    Ingestor<ChainHasher, Arc<Index>>,
    router_core::PodId,
) {
    let index = Index::<4>::new(IndexConfig::default());
    let pod = index.join(&PodKey::new("http://engine:8000", 0)).unwrap();
    let ingest = Ingestor::new(
        ChainHasher::new(4).unwrap(),
        index.clone(),
        Some("m".into()),
        4,
    );
    (index, ingest, pod)
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> BlockStored {
    let mut s = BlockStored::default();
    s.block_hashes = hashes.to_vec();
    s.parent_block_hash = parent;
    s.token_ids = tokens.to_vec();
    s.block_size = 4;
    s.medium = Some("GPU".into());
    s
}

fn batch(events: Vec<EngineEvent>) -> EventBatch {
    let mut b = EventBatch::default();
    b.events = events;
    b
}

/// What the request side computes for the same tokens.
fn router_chain(tokens: &[u32]) -> Vec<router_core::BlockHash> {
    ChainHasher::new(4)
        .unwrap()
        .chain(&Namespace::model("m"), tokens)
}

#[test]
fn stored_events_in_engine_hashes_meet_requests_in_router_hashes() {
    let (index, mut ing, pod) = setup();
    let tokens: Vec<u32> = (1..=12).collect();
    // Engine hashes are arbitrary (per-process seeds); a chain in two events.
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[900, 901],
            None,
            &tokens[..8],
        ))]),
    );
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[902],
            Some(901),
            &tokens[8..],
        ))]),
    );
    let chain = router_chain(&tokens);
    assert_eq!(index.match_prefix(&chain).blocks_for(pod), 3);
    // Removal by engine hash finds the router hash.
    let mut r = BlockRemoved::default();
    r.block_hashes = vec![902];
    r.medium = Some("GPU".into());
    ing.apply_batch(pod, &batch(vec![EngineEvent::BlockRemoved(r)]));
    assert_eq!(index.match_prefix(&chain).blocks_for(pod), 2);
    let st = ing.stats();
    assert_eq!(
        (st.blocks_stored, st.blocks_removed, st.events_applied),
        (3, 1, 3)
    );
}

#[test]
fn the_golden_array_batch_ingests() {
    let (index, mut ing, pod) = setup();
    // Its BlockStored names parent 7, which the router never saw: skipped
    // and counted; its removal finds nothing; its clear starts the pod afresh.
    ing.apply_batch(pod, &decode_batch(&bytes(ARRAY_BATCH)).unwrap());
    let st = ing.stats();
    assert_eq!(
        (st.unknown_parent, st.unknown_removed, st.events_applied),
        (1, 1, 1)
    );
    assert!(!ing.needs_resync(pod), "the clear leaves nothing stale");
    assert_eq!(index.pod_blocks(pod), Some(0));
    // The unknown parent alone marks the pod for resynchronisation.
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[3],
            Some(7),
            &[1, 2, 3, 4],
        ))]),
    );
    assert!(ing.needs_resync(pod));
    ing.reset_pod(pod);
    assert!(!ing.needs_resync(pod));
}

#[test]
fn duplicates_tiers_groups_and_mismatches() {
    let (index, mut ing, pod) = setup();
    let tokens: Vec<u32> = (1..=8).collect();
    let s = stored(&[1, 2], None, &tokens);
    // Duplicate stores (vLLM re-announces reused prefixes) change nothing.
    for _ in 0..3 {
        ing.apply_batch(pod, &batch(vec![EngineEvent::BlockStored(s.clone())]));
    }
    let chain = router_chain(&tokens);
    assert_eq!(index.pod_blocks(pod), Some(2));
    // An offloaded copy in CPU: the block stays until it leaves both tiers.
    let mut cpu = s.clone();
    cpu.medium = Some("CPU_PINNED".into());
    ing.apply_batch(pod, &batch(vec![EngineEvent::BlockStored(cpu)]));
    assert_eq!(
        index.tier_counts(pod, &chain, 2),
        Some(TierCounts([2, 2, 0, 0]))
    );
    let remove = |medium: &str| {
        let mut r = BlockRemoved::default();
        r.block_hashes = vec![1, 2];
        r.medium = Some(medium.into());
        batch(vec![EngineEvent::BlockRemoved(r)])
    };
    ing.apply_batch(pod, &remove("GPU"));
    assert_eq!(
        index.match_prefix(&chain).blocks_for(pod),
        2,
        "still on CPU"
    );
    ing.apply_batch(pod, &remove("CPU_PINNED"));
    assert_eq!(index.match_prefix(&chain).blocks_for(pod), 0);
    // Other KV-cache groups and unknown media do not feed routing.
    let mut swa = s.clone();
    swa.group_idx = Some(1);
    swa.kv_cache_spec_kind = Some("sliding_window".into());
    swa.kv_cache_spec_sliding_window = Some(128);
    let mut odd = s.clone();
    odd.medium = Some("TAPE".into());
    // Fewer tokens than blocks: only the covered block is hashed.
    let short = stored(&[5, 6], None, &tokens[..4]);
    ing.apply_batch(
        pod,
        &batch(vec![
            EngineEvent::BlockStored(swa),
            EngineEvent::BlockStored(odd),
            EngineEvent::BlockStored(short),
        ]),
    );
    let st = ing.stats();
    assert_eq!(
        (st.other_group, st.unknown_medium, st.token_mismatch),
        (1, 1, 1)
    );
    assert_eq!(index.match_prefix(&chain).blocks_for(pod), 1);
}

#[test]
fn lora_and_salt_events_hash_in_their_namespace() {
    let (index, mut ing, pod) = setup();
    let tokens: Vec<u32> = (1..=4).collect();
    let mut s = stored(&[1], None, &tokens);
    s.lora_name = Some("sql".into());
    ing.apply_batch(pod, &batch(vec![EngineEvent::BlockStored(s)]));
    let base = router_chain(&tokens);
    let lora = ChainHasher::new(4)
        .unwrap()
        .chain(&Namespace::model("m").with_lora("sql"), &tokens);
    assert_eq!(index.match_prefix(&base).blocks_for(pod), 0);
    assert_eq!(index.match_prefix(&lora).blocks_for(pod), 1);
}

#[test]
fn a_departed_pod_refuses_events_and_they_are_counted() {
    let (index, mut ing, pod) = setup();
    index.shutdown(pod).unwrap();
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[1],
            None,
            &[1, 2, 3, 4],
        ))]),
    );
    assert_eq!(ing.stats().sink_refused, 1);
    ing.forget_pod(pod);
}

#[test]
fn an_engine_hash_reused_for_other_content_leaves_no_stale_block() {
    let (index, mut ing, pod) = setup();
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[7],
            None,
            &[1, 2, 3, 4],
        ))]),
    );
    assert_eq!(
        index
            .match_prefix(&router_chain(&[1, 2, 3, 4]))
            .blocks_for(pod),
        1
    );
    // The same engine hash, other tokens (a collision, or hostile input).
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[7],
            None,
            &[5, 6, 7, 8],
        ))]),
    );
    assert_eq!(
        index
            .match_prefix(&router_chain(&[1, 2, 3, 4]))
            .blocks_for(pod),
        0,
        "the old block went"
    );
    assert_eq!(
        index
            .match_prefix(&router_chain(&[5, 6, 7, 8]))
            .blocks_for(pod),
        1
    );
    assert_eq!(index.pod_blocks(pod), Some(1));
    assert_eq!(ing.stats().replaced_hashes, 1);
    // Removing the engine hash removes what it stands for now.
    let mut r = BlockRemoved::default();
    r.block_hashes = vec![7];
    r.medium = Some("GPU".into());
    ing.apply_batch(pod, &batch(vec![EngineEvent::BlockRemoved(r)]));
    assert_eq!(index.pod_blocks(pod), Some(0));
}

#[test]
fn an_engine_hash_repeated_within_one_chain_leaves_no_stale_block() {
    // Found by `cargo fuzz run event_frames`: hashes [2, 2] for two blocks.
    let (index, mut ing, pod) = setup();
    ing.apply_batch(
        pod,
        &batch(vec![EngineEvent::BlockStored(stored(
            &[2, 2],
            None,
            &[40, 6, 2, 8, 7, 3, 5, 4],
        ))]),
    );
    assert_eq!(
        index.pod_blocks(pod),
        Some(1),
        "only what hash 2 stands for now"
    );
    assert_eq!(ing.export_pod(pod).len(), 1);
}

/// Forwards to a real index, recording the parent each store names.
struct RecordParents {
    index: Arc<Index>,
    parents: std::sync::Mutex<Vec<Option<router_core::BlockHash>>>,
}

impl router_core::CacheEventSink for RecordParents {
    fn apply(&self, event: &router_core::CacheEvent) -> Result<(), router_core::Error> {
        self.index.apply(event)
    }

    fn apply_stored(
        &self,
        pod: router_core::PodId,
        tier: router_core::Tier,
        parent: Option<router_core::BlockHash>,
        blocks: Vec<router_core::BlockHash>,
    ) -> Result<(), router_core::Error> {
        self.parents.lock().unwrap().push(parent);
        self.index.apply_stored(pod, tier, parent, blocks)
    }
}

#[test]
fn a_store_names_its_parent_in_router_hashes() {
    use router_core::CacheEventSink;
    let index = Index::<4>::new(IndexConfig::default());
    let pod = index.join(&PodKey::new("http://engine:8000", 0)).unwrap();
    let sink = Arc::new(RecordParents {
        index: index.clone(),
        parents: Default::default(),
    });
    let mut ing = Ingestor::new(
        ChainHasher::new(4).unwrap(),
        sink.clone(),
        Some("m".into()),
        4,
    );
    let tokens: Vec<u32> = (1..=24).collect();
    // A prefill reported in three events, each naming the last as parent.
    for (i, (hashes, parent)) in [
        (&[900u64, 901][..], None),
        (&[902, 903][..], Some(901)),
        (&[904, 905][..], Some(903)),
    ]
    .into_iter()
    .enumerate()
    {
        let t = &tokens[8 * i..8 * (i + 1)];
        ing.apply_batch(
            pod,
            &batch(vec![EngineEvent::BlockStored(stored(hashes, parent, t))]),
        );
    }
    let chain = router_chain(&tokens);
    assert_eq!(
        *sink.parents.lock().unwrap(),
        vec![None, Some(chain[1]), Some(chain[3])],
        "the engine's parent hash, translated to the router's"
    );
    assert_eq!(index.match_prefix(&chain).blocks_for(pod), 6);
    // A sink that ignores parents gets the plain event (the default).
    struct Plain(Arc<Index>);
    impl router_core::CacheEventSink for Plain {
        fn apply(&self, event: &router_core::CacheEvent) -> Result<(), router_core::Error> {
            self.0.apply(event)
        }
    }
    let other = Index::<4>::new(IndexConfig::default());
    let pod2 = other.join(&PodKey::new("http://engine:8000", 0)).unwrap();
    let plain = Plain(other.clone());
    plain
        .apply_stored(
            pod2,
            router_core::Tier::Gpu,
            Some(chain[1]),
            chain[2..4].to_vec(),
        )
        .unwrap();
    plain
        .apply_stored(pod2, router_core::Tier::Gpu, None, chain[..2].to_vec())
        .unwrap();
    assert_eq!(other.match_prefix(&chain).blocks_for(pod2), 4);
}

/// A vLLM 0.33 batch for a LoRA request with a cache salt, encoded by
/// msgspec with vLLM's structs: every block's extra keys name the adapter,
/// the first block's the salt too, as vLLM publishes them.
fn lora_salt_batch_from_msgspec() -> Vec<u8> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let python = format!("{root}/.venv/bin/python");
    assert!(
        std::path::Path::new(&python).exists(),
        "{python} is missing: run scripts/test.sh (it sets up the venv with msgspec)"
    );
    let script = format!(
        r#"
import sys
sys.path.insert(0, "{root}/scripts")
import msgspec
from kv_publisher import structs
Batch, Stored, Removed, Cleared = structs(False)
events = [
    Stored(block_hashes=[11, 12], parent_block_hash=None, token_ids=list(range(1, 9)), block_size=4,
           lora_id=7, medium="GPU", lora_name="sql", extra_keys=[("sql", "tenant-42"), ("sql",)]),
    Stored(block_hashes=[13], parent_block_hash=12, token_ids=list(range(9, 13)), block_size=4,
           lora_id=7, medium="GPU", lora_name="sql", extra_keys=[("sql",)]),
    # A multimodal block of another request: its key is not a string.
    Stored(block_hashes=[21], parent_block_hash=None, token_ids=list(range(1, 5)), block_size=4,
           lora_id=None, medium="GPU", extra_keys=[(("img-hash", 0),)]),
]
sys.stdout.write(msgspec.msgpack.encode(Batch(ts=1.0, events=events)).hex())
"#
    );
    let out = std::process::Command::new(python)
        .args(["-c", &script])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = String::from_utf8(out.stdout).unwrap();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn vllm_lora_and_salt_extra_keys_meet_requests_in_their_namespace() {
    let (index, mut ing, pod) = setup();
    let batch = decode_batch(&lora_salt_batch_from_msgspec()).unwrap();
    match &batch.events[0] {
        EngineEvent::BlockStored(s) => {
            assert_eq!(s.extra_key_strings[0], ["sql", "tenant-42"]);
            assert_eq!(
                s.extra_keys,
                [None, None],
                "strings only: nothing else to hash"
            );
        }
        other => panic!("{other:?}"),
    }
    ing.apply_batch(pod, &batch);
    let tokens: Vec<u32> = (1..=12).collect();
    let hasher = ChainHasher::new(4).unwrap();
    let ns = Namespace::model("m");
    let salted = hasher.chain(
        &ns.clone().with_lora("sql").with_cache_salt("tenant-42"),
        &tokens,
    );
    assert_eq!(index.match_prefix(&salted).blocks_for(pod), 3);
    // Without the salt, or without the adapter, or as the base model: no hit.
    let unsalted = hasher.chain(&ns.clone().with_lora("sql"), &tokens);
    let other = hasher.chain(&ns.clone().with_cache_salt("tenant-42"), &tokens);
    for chain in [unsalted, other, router_chain(&tokens)] {
        assert_eq!(index.match_prefix(&chain).blocks_for(pod), 0);
    }
    // The multimodal block hashes its content: the text-only chain of the
    // same tokens does not meet it.
    assert_eq!(ing.stats().blocks_stored, 4);
    assert_eq!(
        index
            .match_prefix(&router_chain(&tokens[..4]))
            .blocks_for(pod),
        0
    );
}
