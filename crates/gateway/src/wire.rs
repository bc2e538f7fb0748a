//! vLLM's KV-cache event batches, encoded as vLLM's publisher encodes them
//! (msgspec structs): the batch an array `[ts, events, data_parallel_rank]`;
//! each event either a tagged map (`{"type": "BlockStored", ...}`, every
//! field present) or a tagged array (`["BlockStored", ...]`, every field
//! in order). msgspec writes integers, strings and arrays in their
//! shortest MessagePack form and floats as float64; so does this encoder
//! (a test compares its bytes with msgspec's).

use serde::Deserialize;

/// Which of msgspec's struct encodings the events use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Tagged maps (vLLM's default).
    #[default]
    Map,
    /// Tagged arrays (`array_like=True`).
    Array,
}

/// One event, in the engine's own block hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireEvent {
    /// Blocks entered the cache: `hashes[i]` covers
    /// `tokens[i * block_size..(i + 1) * block_size]`.
    Stored {
        /// The blocks' hashes, in chain order.
        hashes: Vec<u64>,
        /// The hash of the block before the first, if any.
        parent: Option<u64>,
        /// The blocks' tokens.
        tokens: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Where the blocks live (`"GPU"`, `"CPU"`).
        medium: &'static str,
    },
    /// Blocks left the cache.
    Removed {
        /// Their hashes.
        hashes: Vec<u64>,
        /// The tier they left.
        medium: &'static str,
    },
    /// The whole cache was cleared.
    Cleared,
}

// Writing to a `Vec` cannot fail; rmp's `Write`-generic signatures return
// a `Result` anyway, which these helpers discharge in one place.
fn arr(out: &mut Vec<u8>, n: u32) {
    rmp::encode::write_array_len(out, n).expect("Vec write");
}
fn map(out: &mut Vec<u8>, n: u32) {
    rmp::encode::write_map_len(out, n).expect("Vec write");
}
fn string(out: &mut Vec<u8>, s: &str) {
    rmp::encode::write_str(out, s).expect("Vec write");
}
fn uint(out: &mut Vec<u8>, v: u64) {
    rmp::encode::write_uint(out, v).expect("Vec write");
}
fn nil(out: &mut Vec<u8>) {
    rmp::encode::write_nil(out).expect("Vec write");
}
fn uints(out: &mut Vec<u8>, vs: impl ExactSizeIterator<Item = u64>) {
    arr(out, vs.len() as u32);
    for v in vs {
        uint(out, v);
    }
}
fn opt_uint(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => uint(out, v),
        None => nil(out),
    }
}

/// Encodes one batch.
pub fn encode_batch(ts: f64, events: &[WireEvent], dp_rank: Option<u32>, enc: Encoding) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 32);
    // `data_parallel_rank` defaults to None and is omitted when it is.
    arr(&mut out, if dp_rank.is_some() { 3 } else { 2 });
    rmp::encode::write_f64(&mut out, ts).expect("Vec write");
    arr(&mut out, events.len() as u32);
    for e in events {
        match enc {
            Encoding::Map => event_map(&mut out, e),
            Encoding::Array => event_array(&mut out, e),
        }
    }
    if let Some(r) = dp_rank {
        uint(&mut out, u64::from(r));
    }
    out
}

fn event_array(out: &mut Vec<u8>, e: &WireEvent) {
    match e {
        WireEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
        } => {
            // Tag and every field: msgspec writes the defaulted trailing
            // ones too (lora_name, extra_keys, group_idx, kv_cache_spec_*).
            arr(out, 12);
            string(out, "BlockStored");
            uints(out, hashes.iter().copied());
            opt_uint(out, *parent);
            uints(out, tokens.iter().map(|&t| u64::from(t)));
            uint(out, u64::from(*block_size));
            nil(out); // lora_id
            string(out, medium);
            for _ in 0..5 {
                nil(out);
            }
        }
        WireEvent::Removed { hashes, medium } => {
            arr(out, 4);
            string(out, "BlockRemoved");
            uints(out, hashes.iter().copied());
            string(out, medium);
            nil(out); // group_idx
        }
        WireEvent::Cleared => {
            arr(out, 1);
            string(out, "AllBlocksCleared");
        }
    }
}

fn event_map(out: &mut Vec<u8>, e: &WireEvent) {
    match e {
        WireEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
        } => {
            map(out, 12);
            string(out, "type");
            string(out, "BlockStored");
            string(out, "block_hashes");
            uints(out, hashes.iter().copied());
            string(out, "parent_block_hash");
            opt_uint(out, *parent);
            string(out, "token_ids");
            uints(out, tokens.iter().map(|&t| u64::from(t)));
            string(out, "block_size");
            uint(out, u64::from(*block_size));
            string(out, "lora_id");
            nil(out);
            string(out, "medium");
            string(out, medium);
            for k in [
                "lora_name",
                "extra_keys",
                "group_idx",
                "kv_cache_spec_kind",
                "kv_cache_spec_sliding_window",
            ] {
                string(out, k);
                nil(out);
            }
        }
        WireEvent::Removed { hashes, medium } => {
            map(out, 4);
            string(out, "type");
            string(out, "BlockRemoved");
            string(out, "block_hashes");
            uints(out, hashes.iter().copied());
            string(out, "medium");
            string(out, medium);
            string(out, "group_idx");
            nil(out);
        }
        WireEvent::Cleared => {
            map(out, 1);
            string(out, "type");
            string(out, "AllBlocksCleared");
        }
    }
}
