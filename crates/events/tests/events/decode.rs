//! The decoder on the design brief's golden bytes and on bad input.

use proptest::prelude::*;
use router_events::{DecodeError, EngineEvent, decode_batch};

use super::{ARRAY_BATCH, MAP_BATCH, bytes};

#[test]
fn the_map_encoded_golden_batch_decodes_exactly() {
    let b = decode_batch(&bytes(MAP_BATCH)).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.dp_rank, Some(0));
    assert_eq!(b.unknown_events, 0);
    assert_eq!(b.events.len(), 1);
    let EngineEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events[0]);
    };
    assert_eq!(s.block_hashes, vec![15_760_518_052_499_183_552]);
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.token_ids, vec![1, 2, 3, 4]);
    assert_eq!(s.block_size, 4);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert_eq!(s.lora_name, None);
    assert_eq!(s.extra_keys, vec![None]);
    assert_eq!(s.group_idx, Some(0));
    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
}

#[test]
fn the_array_encoded_golden_batch_decodes_exactly() {
    let b = decode_batch(&bytes(ARRAY_BATCH)).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (1.5, Some(0), 3));
    let EngineEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events[0]);
    };
    assert_eq!(s.block_hashes, vec![15_760_518_052_499_183_552, 2]);
    assert_eq!(s.parent_block_hash, Some(7));
    assert_eq!(s.token_ids, (1..=8).collect::<Vec<u32>>());
    assert_eq!((s.block_size, s.medium.as_deref()), (4, Some("GPU")));
    let EngineEvent::BlockRemoved(r) = &b.events[1] else {
        panic!("{:?}", b.events[1]);
    };
    assert_eq!(r.block_hashes, vec![(-5i64) as u64]);
    assert_eq!(r.medium.as_deref(), Some("GPU"));
    assert_eq!(b.events[2], EngineEvent::AllBlocksCleared);
}

#[test]
fn older_and_newer_batch_shapes_and_unknowns_are_accepted() {
    // Two elements (older), and trailing extras such as a publisher id (newer).
    let two = bytes(r#"92 cb3ff8000000000000 91 91 b0 "AllBlocksCleared""#);
    assert_eq!(decode_batch(&two).unwrap().dp_rank, None);
    let extra = bytes(r#"94 cb3ff8000000000000 90 01 c410 00112233445566778899aabbccddeeff"#);
    assert_eq!(decode_batch(&extra).unwrap().dp_rank, Some(1));
    // A map-encoded batch, an unknown event tag, unknown map keys.
    let map = bytes(
        r#"83 a2 "ts" cb3ff8000000000000 a6 "events" 92 92 a8 "NewThing" 01 82 a4 "type" ac "BlockRemoved" a7 "mystery" 05 b2 "data_parallel_rank" 03"#,
    );
    let b = decode_batch(&map).unwrap();
    assert_eq!(
        (b.unknown_events, b.events.len(), b.dp_rank),
        (1, 1, Some(3))
    );
    // Hashes as bytes keep their last 8 bytes, big-endian; shorter ones are padded.
    let bin = bytes(r#"92 00 91 92 ac "BlockRemoved" 92 c40a ffff0000000000000102 c402 0304"#);
    let EngineEvent::BlockRemoved(r) = &decode_batch(&bin).unwrap().events[0] else {
        panic!()
    };
    assert_eq!(r.block_hashes, vec![0x0102, 0x0304]);
}

#[test]
fn malformed_batches_are_errors_not_panics() {
    let good = bytes(ARRAY_BATCH);
    // Every truncation.
    for n in 0..good.len() {
        assert!(decode_batch(&good[..n]).is_err(), "truncated at {n}");
    }
    let cases = [
        "c0",                                                          // nil
        "91 00",                                                       // one element
        "92 a1 \"x\" 90",                                              // ts not a number
        "92 00 dd ffffffff",                    // huge array length, no bytes
        "92 00 91 dc ffff",                     // huge event, no bytes
        "92 00 91 97 ab \"BlockStored\" 91 c3", // hash of the wrong type
        "92 00 91 92 ab \"BlockStored\" 92 01", // the array of hashes ends early
        "92 00 90 00",                          // trailing bytes
        "92 00 91 81 a1 \"x\" 01",              // event map without type
        "92 00 91 97 ab \"BlockStored\" 90 c0 91 cf ffffffffffffffff", // token id out of range
        "92 00 91 c1",                          // reserved marker
    ];
    for spec in cases {
        let err = decode_batch(&bytes(spec));
        assert!(err.is_err(), "{spec} decoded: {err:?}");
    }
    // Nesting bombs are bounded.
    let mut deep = bytes("92 00 91 92 a8 \"NewThing\"");
    deep.extend(std::iter::repeat_n(0x91, 100));
    deep.push(0xc0);
    assert!(matches!(
        decode_batch(&deep),
        Err(DecodeError::Malformed { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch(&data);
    }

    #[test]
    fn mutated_golden_batches_never_panic(pos in 0usize..200, byte in any::<u8>(), map in any::<bool>()) {
        let mut b = bytes(if map { MAP_BATCH } else { ARRAY_BATCH });
        let i = pos % b.len();
        b[i] = byte;
        let _ = decode_batch(&b);
    }
}
