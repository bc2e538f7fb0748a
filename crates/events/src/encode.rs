//! vLLM's KV-cache event batches, encoded as vLLM's publisher encodes them
//! (msgspec structs): the batch an array `[ts, events, data_parallel_rank]`;
//! each event either a tagged map (`{"type": "BlockStored", ...}`, every
//! field present) or a tagged array (`["BlockStored", ...]`, every field
//! in order). msgspec writes integers, strings and arrays in their
//! shortest MessagePack form and floats as float64; so does this encoder
//! (a test compares its bytes with msgspec's, another decodes them back
//! with [`decode_batch`](crate::decode_batch)).
//!
//! The router only decodes; this is for publishers: the simulated engines,
//! test peers, and anyone bridging another engine onto vLLM's format.

/// Which of msgspec's struct encodings the events use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Tagged maps (vLLM's default).
    #[default]
    Map,
    /// Tagged arrays (`array_like=True`).
    Array,
}

impl std::str::FromStr for Encoding {
    type Err = String;

    /// `"map"` or `"array"`, as configuration files name them.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "map" => Ok(Encoding::Map),
            "array" => Ok(Encoding::Array),
            other => Err(format!(
                "unknown event encoding `{other}`, expected `map` or `array`"
            )),
        }
    }
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
    /// Blocks entered one KV-cache group of a hybrid model, as vLLM
    /// publishes them: `hashes` may skip blocks that `tokens` cover (a
    /// sliding window or Mamba group keeps only some), and the group's
    /// kind and window ride along.
    GroupStored {
        /// The blocks' hashes (the same hashes the full-attention group
        /// gives the same token prefix).
        hashes: Vec<u64>,
        /// The hash of the block before the first, if any.
        parent: Option<u64>,
        /// The tokens of the range the blocks lie in.
        tokens: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Where the blocks live.
        medium: &'static str,
        /// The group's index.
        group: u32,
        /// vLLM's `kv_cache_spec_kind` (`sliding_window`, `mamba`, ...).
        kind: &'static str,
        /// A sliding window's size in tokens.
        window: Option<u32>,
    },
    /// Blocks left one KV-cache group.
    GroupRemoved {
        /// Their hashes.
        hashes: Vec<u64>,
        /// The tier they left.
        medium: &'static str,
        /// The group's index.
        group: u32,
    },
    /// A store ([`WireEvent::Stored`] or [`WireEvent::GroupStored`]) whose
    /// blocks hash more than their tokens, as vLLM publishes a request's
    /// under a LoRA adapter or with a cache salt: the adapter's id and
    /// name, and each block's extra keys (vLLM's: the adapter's name on
    /// every block, the salt on the first of a chain).
    Keyed {
        /// The store.
        event: Box<WireEvent>,
        /// The adapter's id (vLLM's `lora_int_id`).
        lora_id: Option<u64>,
        /// The adapter's name.
        lora_name: Option<String>,
        /// Per block, its extra keys (empty: none); all empty: none at all.
        extra_keys: Vec<Vec<String>>,
    },
}

/// One field's value.
enum Field<'a> {
    Nil,
    Uint(u64),
    OptUint(Option<u64>),
    Uints(&'a [u64]),
    Tokens(&'a [u32]),
    Str(&'a str),
    OptStr(Option<&'a str>),
    /// Per block: an array of strings, or nil for none.
    ExtraKeys(&'a [Vec<String>]),
}

/// An event as msgspec sees it: its tag and its fields in declaration
/// order (vLLM 0.33's `BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
/// Both encodings write this one list, so they cannot disagree.
fn fields(e: &WireEvent) -> (&'static str, Vec<(&'static str, Field<'_>)>) {
    match e {
        WireEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
        } => (
            "BlockStored",
            vec![
                ("block_hashes", Field::Uints(hashes)),
                ("parent_block_hash", Field::OptUint(*parent)),
                ("token_ids", Field::Tokens(tokens)),
                ("block_size", Field::Uint(u64::from(*block_size))),
                ("lora_id", Field::Nil),
                ("medium", Field::Str(medium)),
                ("lora_name", Field::Nil),
                ("extra_keys", Field::Nil),
                ("group_idx", Field::Nil),
                ("kv_cache_spec_kind", Field::Nil),
                ("kv_cache_spec_sliding_window", Field::Nil),
            ],
        ),
        WireEvent::Removed { hashes, medium } => (
            "BlockRemoved",
            vec![
                ("block_hashes", Field::Uints(hashes)),
                ("medium", Field::Str(medium)),
                ("group_idx", Field::Nil),
            ],
        ),
        WireEvent::GroupStored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
            group,
            kind,
            window,
        } => (
            "BlockStored",
            vec![
                ("block_hashes", Field::Uints(hashes)),
                ("parent_block_hash", Field::OptUint(*parent)),
                ("token_ids", Field::Tokens(tokens)),
                ("block_size", Field::Uint(u64::from(*block_size))),
                ("lora_id", Field::Nil),
                ("medium", Field::Str(medium)),
                ("lora_name", Field::Nil),
                ("extra_keys", Field::Nil),
                ("group_idx", Field::Uint(u64::from(*group))),
                ("kv_cache_spec_kind", Field::Str(kind)),
                (
                    "kv_cache_spec_sliding_window",
                    Field::OptUint(window.map(u64::from)),
                ),
            ],
        ),
        WireEvent::GroupRemoved {
            hashes,
            medium,
            group,
        } => (
            "BlockRemoved",
            vec![
                ("block_hashes", Field::Uints(hashes)),
                ("medium", Field::Str(medium)),
                ("group_idx", Field::Uint(u64::from(*group))),
            ],
        ),
        WireEvent::Cleared => ("AllBlocksCleared", Vec::new()),
        WireEvent::Keyed {
            event,
            lora_id,
            lora_name,
            extra_keys,
        } => {
            let (tag, mut fields) = fields(event);
            for (name, f) in &mut fields {
                match *name {
                    "lora_id" => *f = Field::OptUint(*lora_id),
                    "lora_name" => *f = Field::OptStr(lora_name.as_deref()),
                    "extra_keys" if extra_keys.iter().any(|k| !k.is_empty()) => {
                        *f = Field::ExtraKeys(extra_keys);
                    }
                    _ => {}
                }
            }
            (tag, fields)
        }
    }
}

// Writing to a `Vec` cannot fail; rmp's `Write`-generic signatures return
// a `Result` anyway, which this function discharges in one place.
fn write(out: &mut Vec<u8>, f: &Field<'_>) {
    let ok = match f {
        Field::Nil | Field::OptUint(None) => rmp::encode::write_nil(out).is_ok(),
        Field::Uint(v) | Field::OptUint(Some(v)) => rmp::encode::write_uint(out, *v).is_ok(),
        Field::Uints(vs) => {
            rmp::encode::write_array_len(out, vs.len() as u32).is_ok()
                && vs.iter().all(|v| rmp::encode::write_uint(out, *v).is_ok())
        }
        Field::Tokens(ts) => {
            rmp::encode::write_array_len(out, ts.len() as u32).is_ok()
                && ts
                    .iter()
                    .all(|t| rmp::encode::write_uint(out, u64::from(*t)).is_ok())
        }
        Field::Str(v) | Field::OptStr(Some(v)) => rmp::encode::write_str(out, v).is_ok(),
        Field::OptStr(None) => rmp::encode::write_nil(out).is_ok(),
        Field::ExtraKeys(blocks) => {
            rmp::encode::write_array_len(out, blocks.len() as u32).is_ok()
                && blocks.iter().all(|keys| {
                    if keys.is_empty() {
                        rmp::encode::write_nil(out).is_ok()
                    } else {
                        rmp::encode::write_array_len(out, keys.len() as u32).is_ok()
                            && keys.iter().all(|k| rmp::encode::write_str(out, k).is_ok())
                    }
                })
        }
    };
    debug_assert!(ok, "writing to a Vec cannot fail");
}

/// Encodes one batch.
pub fn encode_batch(ts: f64, events: &[WireEvent], dp_rank: Option<u32>, enc: Encoding) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 32);
    // `data_parallel_rank` defaults to None and is omitted when it is.
    let _ = rmp::encode::write_array_len(&mut out, if dp_rank.is_some() { 3 } else { 2 });
    let _ = rmp::encode::write_f64(&mut out, ts);
    let _ = rmp::encode::write_array_len(&mut out, events.len() as u32);
    for e in events {
        let (tag, fields) = fields(e);
        let n = fields.len() as u32 + 1;
        match enc {
            // `["BlockStored", field, ...]`: every field, in order.
            Encoding::Array => {
                let _ = rmp::encode::write_array_len(&mut out, n);
                write(&mut out, &Field::Str(tag));
                for (_, f) in &fields {
                    write(&mut out, f);
                }
            }
            // `{"type": "BlockStored", "field": value, ...}`.
            Encoding::Map => {
                let _ = rmp::encode::write_map_len(&mut out, n);
                write(&mut out, &Field::Str("type"));
                write(&mut out, &Field::Str(tag));
                for (k, f) in &fields {
                    write(&mut out, &Field::Str(k));
                    write(&mut out, f);
                }
            }
        }
    }
    if let Some(r) = dp_rank {
        write(&mut out, &Field::Uint(u64::from(r)));
    }
    out
}
