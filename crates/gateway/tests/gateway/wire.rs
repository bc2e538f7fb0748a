//! The simulated engines' event bytes: identical to msgspec's (vLLM's own
//! encoder), decoded back by router-events, and the SSE decoder checked
//! against itself fed whole.

use std::process::Command;

use proptest::prelude::*;
use router_events::{EngineEvent, decode_batch};
use router_gateway::{Encoding, SseDecoder, WireEvent, encode_batch};

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
        assert_eq!(batch.events.len(), 4);
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
    }
}

fn sse_text(events: &[String]) -> String {
    events
        .iter()
        .map(|e| {
            let mut s: String = e.split('\n').map(|l| format!("data: {l}\r\n")).collect();
            s.push_str(": keep-alive comment\n\n");
            s
        })
        .collect()
}

proptest! {
    /// Fed in pieces cut anywhere, the decoder yields what it yields fed
    /// the whole stream at once, which is the events written.
    #[test]
    fn sse_pieces_cut_anywhere_decode_like_the_whole(
        events in proptest::collection::vec("[a-z{}:\" ]{0,12}(\n[a-z]{1,4})?", 0..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let text = sse_text(&events);
        let mut whole = Vec::new();
        SseDecoder::default().feed(text.as_bytes(), &mut whole).unwrap();
        prop_assert_eq!(&whole, &events);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
        at.sort_unstable();
        let mut d = SseDecoder::default();
        let mut pieces = Vec::new();
        let mut last = 0;
        for a in at.into_iter().chain([text.len()]) {
            d.feed(&text.as_bytes()[last..a], &mut pieces).unwrap();
            last = a;
        }
        prop_assert_eq!(pieces, events);
    }

    /// Arbitrary bytes never panic: events, a typed error, or nothing.
    #[test]
    fn sse_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut out = Vec::new();
        let _ = SseDecoder::new(256).feed(&bytes, &mut out);
    }
}

#[test]
fn an_endless_line_is_an_error_not_unbounded_memory() {
    let mut d = SseDecoder::new(64);
    let mut out = Vec::new();
    assert!(d.feed(&[b'x'; 65], &mut out).is_err());
    assert!(
        SseDecoder::new(64)
            .feed(b"data: \xff\n\n", &mut out)
            .is_err()
    );
}

#[test]
fn an_endless_event_of_short_lines_is_an_error_not_unbounded_memory() {
    let mut d = SseDecoder::new(64).max_event(1000);
    let mut out = Vec::new();
    let mut fed = 0;
    let err = loop {
        match d.feed(b"data: 0123456789\n", &mut out) {
            Ok(()) => fed += 1,
            Err(e) => break e,
        }
        assert!(fed < 200, "still buffering after {fed} lines");
    };
    assert_eq!(err, router_gateway::SseError::EventTooLong(1000));
    assert!(out.is_empty());
    // An event under the limit still decodes.
    let mut d = SseDecoder::new(64).max_event(1000);
    d.feed(b"data: a\ndata: b\n\n", &mut out).unwrap();
    assert_eq!(out, vec!["a\nb".to_owned()]);
}
