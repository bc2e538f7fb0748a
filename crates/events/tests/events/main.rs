//! Integration tests of router-events: golden bytes, malformed input,
//! ingestion into a real index.

mod decode;
mod encode;
mod hybrid;
mod ingest;
mod metrics;
mod zmq;

/// Bytes from a spec of hex tokens and `"text"` tokens, space separated
/// (the notation of the design brief's examples).
pub(crate) fn bytes(spec: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for tok in spec.split_whitespace() {
        if let Some(text) = tok.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            out.extend_from_slice(text.as_bytes());
        } else {
            assert!(tok.len() % 2 == 0, "odd hex token {tok}");
            for i in (0..tok.len()).step_by(2) {
                out.push(u8::from_str_radix(&tok[i..i + 2], 16).unwrap());
            }
        }
    }
    out
}

/// The design brief's map-encoded `BlockStored` batch.
pub(crate) const MAP_BATCH: &str = r#"93 cb3ff8000000000000 91 de000b a4 "type" ab "BlockStored" ac "block_hashes" 91 cf dab89baa7b5857c0 b1 "parent_block_hash" c0 a9 "token_ids" 94 01020304 aa "block_size" 04 a7 "lora_id" c0 a6 "medium" a3 "GPU" a9 "lora_name" c0 aa "extra_keys" 91 c0 a9 "group_idx" 00 b2 "kv_cache_spec_kind" ae "full_attention" 00"#;

/// The design brief's array-encoded batch: BlockStored, BlockRemoved([-5]),
/// AllBlocksCleared. The brief prints `ab` before "BlockRemoved", a fixstr
/// of 11 bytes for a 12-byte string; msgspec writes `ac`, as here.
pub(crate) const ARRAY_BATCH: &str = r#"93 cb3ff8000000000000 93 97 ab "BlockStored" 92 cfdab89baa7b5857c0 02 07 98 0102030405060708 04 c0 a3 "GPU" 93 ac "BlockRemoved" 91 fb a3 "GPU" 91 b0 "AllBlocksCleared" 00"#;
