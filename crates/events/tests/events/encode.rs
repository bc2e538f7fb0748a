//! The encoder of vLLM's event batches: its bytes identical to msgspec's
//! (vLLM's own encoder), decoded back by this crate's decoder, exactly,
//! for any batch.

use std::process::Command;

use proptest::prelude::*;
use router_events::{Encoding, EngineEvent, WireEvent, decode_batch, encode_batch};

fn sample() -> Vec<WireEvent> {
    vec![
        WireEvent::Stored {
            hashes: vec![7, 1 << 40, u64::MAX],
            parent: None,
            tokens: (0..48).map(|t| t * 1000).collect(),
            block_size: 16,
            medium: "GPU",
        },
        WireEvent::Stored {
            hashes: vec![300],
            parent: Some(u64::MAX),
            tokens: (0..16).collect(),
            block_size: 16,
            medium: "GPU",
        },
        WireEvent::Removed {
            hashes: vec![7, 70_000],
            medium: "GPU",
        },
        WireEvent::Cleared,
        // A sparse sliding-window group: two hashes over three blocks' tokens.
        WireEvent::GroupStored {
            hashes: vec![7, u64::MAX],
            parent: None,
            tokens: (0..48).collect(),
            block_size: 16,
            medium: "GPU",
            group: 1,
            kind: "sliding_window",
            window: Some(128),
        },
        WireEvent::GroupRemoved {
            hashes: vec![7],
            medium: "GPU",
            group: 1,
        },
        // Under a LoRA adapter, the first block salted.
        WireEvent::Keyed {
            event: Box::new(WireEvent::Stored {
                hashes: vec![9, 10],
                parent: None,
                tokens: (0..32).collect(),
                block_size: 16,
                medium: "GPU",
            }),
            lora_id: Some(3),
            lora_name: Some("sql-lora".into()),
            extra_keys: vec![
                vec!["sql-lora".into(), "tenant".into()],
                vec!["sql-lora".into()],
            ],
        },
    ]
}

/// The same batch encoded by msgspec with vLLM 0.33's structs
/// (scripts/kv_publisher.py), as hex.
fn msgspec_hex(array_like: bool) -> String {
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
Batch, Stored, Removed, Cleared = structs({array_like})
events = [
    Stored(block_hashes=[7, 1 << 40, 2**64 - 1], parent_block_hash=None,
           token_ids=[t * 1000 for t in range(48)], block_size=16, lora_id=None, medium="GPU"),
    Stored(block_hashes=[300], parent_block_hash=2**64 - 1,
           token_ids=list(range(16)), block_size=16, lora_id=None, medium="GPU"),
    Removed(block_hashes=[7, 70000], medium="GPU"),
    Cleared(),
    Stored(block_hashes=[7, 2**64 - 1], parent_block_hash=None, token_ids=list(range(48)), block_size=16,
           lora_id=None, medium="GPU", group_idx=1, kv_cache_spec_kind="sliding_window",
           kv_cache_spec_sliding_window=128),
    Removed(block_hashes=[7], medium="GPU", group_idx=1),
    Stored(block_hashes=[9, 10], parent_block_hash=None, token_ids=list(range(32)), block_size=16,
           lora_id=3, medium="GPU", lora_name="sql-lora",
           extra_keys=[("sql-lora", "tenant"), ("sql-lora",)]),
]
print(msgspec.msgpack.encode(Batch(ts=1.5, events=events, data_parallel_rank=0)).hex())
"#,
        array_like = if array_like { "True" } else { "False" }
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn batches_are_byte_identical_to_msgspec_in_both_encodings() {
    for (enc, array_like) in [(Encoding::Map, false), (Encoding::Array, true)] {
        let ours = hex(&encode_batch(1.5, &sample(), Some(0), enc));
        assert_eq!(ours, msgspec_hex(array_like), "{enc:?}");
    }
}

#[test]
fn batches_decode_back_to_the_same_events() {
    for enc in [Encoding::Map, Encoding::Array] {
        let batch = decode_batch(&encode_batch(2.25, &sample(), None, enc)).unwrap();
        assert_eq!(batch.ts, 2.25);
        assert_eq!(batch.dp_rank, None);
        assert_eq!(batch.events.len(), 7);
        match &batch.events[0] {
            EngineEvent::BlockStored(s) => {
                assert_eq!(s.block_hashes, [7, 1 << 40, u64::MAX]);
                assert_eq!(s.parent_block_hash, None);
                assert_eq!(s.token_ids.len(), 48);
                assert_eq!(s.token_ids[47], 47_000);
                assert_eq!(s.medium.as_deref(), Some("GPU"));
            }
            other => panic!("{other:?}"),
        }
        match &batch.events[1] {
            EngineEvent::BlockStored(s) => assert_eq!(s.parent_block_hash, Some(u64::MAX)),
            other => panic!("{other:?}"),
        }
        match &batch.events[2] {
            EngineEvent::BlockRemoved(r) => assert_eq!(r.block_hashes, [7, 70_000]),
            other => panic!("{other:?}"),
        }
        assert_eq!(batch.events[3], EngineEvent::AllBlocksCleared);
        match (&batch.events[4], &batch.events[5]) {
            (EngineEvent::BlockStored(s), EngineEvent::BlockRemoved(r)) => {
                assert_eq!(
                    (
                        s.group_idx,
                        s.kv_cache_spec_kind.as_deref(),
                        s.kv_cache_spec_sliding_window
                    ),
                    (Some(1), Some("sliding_window"), Some(128))
                );
                assert_eq!((s.block_hashes.len(), s.token_ids.len()), (2, 48));
                assert_eq!((r.group_idx, &r.block_hashes[..]), (Some(1), &[7][..]));
            }
            other => panic!("{other:?}"),
        }
        match &batch.events[6] {
            EngineEvent::BlockStored(s) => {
                assert_eq!(s.lora_name.as_deref(), Some("sql-lora"));
                assert_eq!(
                    s.extra_key_strings,
                    [vec!["sql-lora", "tenant"], vec!["sql-lora"]]
                );
                assert_eq!(s.extra_keys, [None, None]);
            }
            other => panic!("{other:?}"),
        }
    }
}

fn event() -> impl Strategy<Value = WireEvent> {
    let medium = prop_oneof![Just("GPU"), Just("CPU")];
    prop_oneof![
        (
            proptest::collection::vec(any::<u64>(), 1..6),
            proptest::option::of(any::<u64>()),
            1u32..5,
            medium.clone(),
        )
            .prop_map(|(hashes, parent, block_size, medium)| {
                let tokens = (0..hashes.len() as u32 * block_size)
                    .map(|t| t * 7)
                    .collect();
                WireEvent::Stored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    medium,
                }
            }),
        (
            proptest::collection::vec(any::<u64>(), 0..6),
            medium.clone()
        )
            .prop_map(|(hashes, medium)| WireEvent::Removed { hashes, medium }),
        Just(WireEvent::Cleared),
        (
            proptest::collection::vec(any::<u64>(), 0..6),
            proptest::option::of(any::<u64>()),
            (1u32..5, 0u32..4),
            medium.clone(),
            (0u32..8, prop_oneof![Just("sliding_window"), Just("mamba")]),
            proptest::option::of(2u32..4096),
        )
            .prop_map(
                |(hashes, parent, (block_size, spare), medium, (group, kind), window)| {
                    // A sparse group: the tokens cover more blocks than hashed.
                    let tokens = (0..(hashes.len() as u32 + spare) * block_size).collect();
                    WireEvent::GroupStored {
                        hashes,
                        parent,
                        tokens,
                        block_size,
                        medium,
                        group,
                        kind,
                        window,
                    }
                }
            ),
        (
            proptest::collection::vec(any::<u64>(), 0..6),
            medium,
            0u32..8
        )
            .prop_map(|(hashes, medium, group)| WireEvent::GroupRemoved {
                hashes,
                medium,
                group
            }),
    ]
}

proptest! {
    /// Any batch, in either encoding, decodes to the events encoded.
    #[test]
    fn any_batch_decodes_back_to_what_was_encoded(
        events in proptest::collection::vec(event(), 0..8),
        ts in -1e9f64..1e9,
        rank in proptest::option::of(0u32..64),
        array in any::<bool>(),
    ) {
        let enc = if array { Encoding::Array } else { Encoding::Map };
        let batch = decode_batch(&encode_batch(ts, &events, rank, enc)).unwrap();
        prop_assert_eq!(batch.ts, ts);
        prop_assert_eq!(batch.dp_rank, rank);
        prop_assert_eq!(batch.events.len(), events.len());
        for (got, sent) in batch.events.iter().zip(&events) {
            match (got, sent) {
                (
                    EngineEvent::BlockStored(s),
                    WireEvent::Stored { hashes, parent, tokens, block_size, medium },
                ) => {
                    prop_assert_eq!(&s.block_hashes, hashes);
                    prop_assert_eq!(s.parent_block_hash, *parent);
                    prop_assert_eq!(&s.token_ids, tokens);
                    prop_assert_eq!(s.block_size, *block_size);
                    prop_assert_eq!(s.medium.as_deref(), Some(*medium));
                }
                (EngineEvent::BlockRemoved(r), WireEvent::Removed { hashes, medium }) => {
                    prop_assert_eq!(&r.block_hashes, hashes);
                    prop_assert_eq!(r.medium.as_deref(), Some(*medium));
                }
                (
                    EngineEvent::BlockStored(s),
                    WireEvent::GroupStored { hashes, parent, tokens, block_size, medium, group, kind, window },
                ) => {
                    prop_assert_eq!(&s.block_hashes, hashes);
                    prop_assert_eq!(s.parent_block_hash, *parent);
                    prop_assert_eq!(&s.token_ids, tokens);
                    prop_assert_eq!(s.block_size, *block_size);
                    prop_assert_eq!(s.medium.as_deref(), Some(*medium));
                    prop_assert_eq!(s.group_idx, Some(*group));
                    prop_assert_eq!(s.kv_cache_spec_kind.as_deref(), Some(*kind));
                    prop_assert_eq!(s.kv_cache_spec_sliding_window, *window);
                }
                (EngineEvent::BlockRemoved(r), WireEvent::GroupRemoved { hashes, medium, group }) => {
                    prop_assert_eq!(&r.block_hashes, hashes);
                    prop_assert_eq!(r.medium.as_deref(), Some(*medium));
                    prop_assert_eq!(r.group_idx, Some(*group));
                }
                (EngineEvent::AllBlocksCleared, WireEvent::Cleared) => {}
                (got, sent) => prop_assert!(false, "{:?} decoded from {:?}", got, sent),
            }
        }
    }
}

#[test]
fn encodings_parse_by_their_configuration_names() {
    assert_eq!("map".parse::<Encoding>(), Ok(Encoding::Map));
    assert_eq!("array".parse::<Encoding>(), Ok(Encoding::Array));
    assert!(
        "Map"
            .parse::<Encoding>()
            .unwrap_err()
            .contains("`map` or `array`")
    );
}
