//! vLLM and SGLang KV-cache event batches: MessagePack to typed events.
//!
//! A batch is `[ts, events, data_parallel_rank, ...]` (two or more
//! elements; extras ignored) or a map with `ts`, `events` and
//! `data_parallel_rank`. Each event is `[tag, fields...]` (vLLM up to 0.23)
//! or a map with `type` = tag and named fields (later versions, SGLang).
//! Unknown fields, trailing fields and event tags are ignored (tags are
//! counted). Block hashes arrive as int64, uint64 or bytes; bytes keep
//! their last 8 bytes, big-endian.

use xxhash_rust::xxh3::xxh3_64;

use crate::DecodeError;
use crate::msgpack::{Kind, Reader};

/// One decoded batch.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EventBatch {
    /// The publisher's timestamp, seconds.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<EngineEvent>,
    /// The data-parallel rank that published it, if given.
    pub dp_rank: Option<u32>,
    /// Events of unknown kinds that were skipped.
    pub unknown_events: usize,
}

/// One engine event, in the engine's hashes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// Blocks were stored.
    BlockStored(BlockStored),
    /// Blocks were removed.
    BlockRemoved(BlockRemoved),
    /// Everything was dropped.
    AllBlocksCleared,
}

/// A `BlockStored` event.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct BlockStored {
    /// The engine's hashes of the stored blocks, in chain order.
    pub block_hashes: Vec<u64>,
    /// The engine hash of the block before the first one (none: a chain start).
    pub parent_block_hash: Option<u64>,
    /// The tokens of the stored blocks.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The medium (`GPU`, `CPU`, `STORAGE`; SGLang `CPU_PINNED`, `DISK`, `EXTERNAL`).
    pub medium: Option<String>,
    /// The LoRA adapter, if any.
    pub lora_name: Option<String>,
    /// Per block: a hash of the block's extra keys other than strings
    /// (multimodal content), if any.
    pub extra_keys: Vec<Option<u64>>,
    /// Per block: the strings among its extra keys (vLLM's LoRA name on
    /// every block of an adapter's request, the cache salt on a chain's
    /// first block).
    pub extra_key_strings: Vec<Vec<String>>,
    /// The KV-cache group (hybrid models have several).
    pub group_idx: Option<u32>,
    /// The group's kind (`full_attention`, `sliding_window`, `mamba`, ...).
    pub kv_cache_spec_kind: Option<String>,
    /// A sliding-window group's window, in tokens.
    pub kv_cache_spec_sliding_window: Option<u32>,
    /// The request's cache salt, if the engine reports it.
    pub cache_salt: Option<String>,
}

/// A `BlockRemoved` event.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct BlockRemoved {
    /// The engine's hashes of the removed blocks.
    pub block_hashes: Vec<u64>,
    /// The medium they left.
    pub medium: Option<String>,
    /// The KV-cache group.
    pub group_idx: Option<u32>,
}

/// Decodes one batch payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader::new(payload);
    let mut batch = EventBatch::default();
    match r.peek()? {
        Kind::Array => {
            let n = r.array_len()?;
            if n < 2 {
                return Err(DecodeError::Shape(format!(
                    "a batch array has {n} elements, expected at least 2"
                )));
            }
            batch.ts = r.float()?;
            events(&mut r, &mut batch)?;
            if n >= 3 {
                batch.dp_rank = opt_u32(&mut r)?;
            }
            for _ in 3..n {
                r.skip()?;
            }
        }
        Kind::Map => {
            let n = r.map_len()?;
            let mut saw_events = false;
            for _ in 0..n {
                match r.str()? {
                    "ts" => batch.ts = r.float()?,
                    "events" => {
                        events(&mut r, &mut batch)?;
                        saw_events = true;
                    }
                    "data_parallel_rank" => batch.dp_rank = opt_u32(&mut r)?,
                    _ => {
                        r.skip()?;
                    }
                }
            }
            if !saw_events {
                return Err(DecodeError::Shape("a batch map without `events`".into()));
            }
        }
        _ => {
            return Err(DecodeError::Shape(
                "a batch must be an array or a map".into(),
            ));
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Shape(format!(
            "{} trailing bytes after the batch",
            payload.len() - r.position()
        )));
    }
    Ok(batch)
}

fn events(r: &mut Reader<'_>, batch: &mut EventBatch) -> Result<(), DecodeError> {
    let n = r.array_len()?;
    batch.events.reserve(n);
    for _ in 0..n {
        match event(r)? {
            Some(e) => batch.events.push(e),
            None => batch.unknown_events += 1,
        }
    }
    Ok(())
}

fn opt_u32(r: &mut Reader<'_>) -> Result<Option<u32>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    let v = r.int()?;
    u32::try_from(v)
        .map(Some)
        .map_err(|_| DecodeError::Shape(format!("{v} is not a valid rank or index")))
}

fn opt_str(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    Ok(Some(r.str()?.to_owned()))
}

/// A block hash: int64 (bit pattern kept), uint64, or bytes (last 8, big-endian).
fn hash(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    match r.peek()? {
        Kind::Bin => {
            let b = r.bin()?;
            let tail = &b[b.len().saturating_sub(8)..];
            let mut a = [0u8; 8];
            a[8 - tail.len()..].copy_from_slice(tail);
            Ok(u64::from_be_bytes(a))
        }
        _ => {
            let v = r.int()?;
            if v < 0 {
                Ok(v as i64 as u64)
            } else {
                u64::try_from(v).map_err(|_| DecodeError::Shape("hash out of range".into()))
            }
        }
    }
}

fn opt_hash(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    if r.nil()? {
        Ok(None)
    } else {
        hash(r).map(Some)
    }
}

fn hashes(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    let n = r.array_len()?;
    (0..n).map(|_| hash(r)).collect()
}

fn tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len()?;
    (0..n)
        .map(|_| {
            let v = r.int()?;
            u32::try_from(v).map_err(|_| DecodeError::Shape(format!("token id {v} out of range")))
        })
        .collect()
}

/// Per-block extra keys. vLLM (0.33) publishes each block's as a tuple:
/// the LoRA name (when `lora_name` is set), `(mm_identifier, offset)`
/// pairs, the cache salt (first block only) and prompt-embedding digests.
/// The strings (LoRA name, salt) are kept apart, since the router hashes
/// them into the chain's namespace; the rest is hashed from its raw
/// MessagePack bytes (a multimodal block the request side cannot rebuild).
fn extra_keys(r: &mut Reader<'_>, s: &mut BlockStored) -> Result<(), DecodeError> {
    s.extra_keys.clear();
    s.extra_key_strings.clear();
    if r.nil()? {
        return Ok(());
    }
    let n = r.array_len()?;
    for _ in 0..n {
        if r.nil()? {
            s.extra_keys.push(None);
            s.extra_key_strings.push(Vec::new());
            continue;
        }
        if r.peek()? != Kind::Array {
            s.extra_keys.push(Some(xxh3_64(r.skip()?)));
            s.extra_key_strings.push(Vec::new());
            continue;
        }
        let items = r.array_len()?;
        let mut strings = Vec::new();
        let mut rest: Option<xxhash_rust::xxh3::Xxh3> = None;
        for _ in 0..items {
            if r.peek()? == Kind::Str {
                strings.push(r.str()?.to_owned());
            } else {
                let raw = r.skip()?;
                rest.get_or_insert_with(xxhash_rust::xxh3::Xxh3::new)
                    .update(raw);
            }
        }
        s.extra_keys.push(rest.map(|h| h.digest()));
        s.extra_key_strings.push(strings);
    }
    Ok(())
}

/// One named field of a `BlockStored` (the positional form names them by place).
fn stored_field(r: &mut Reader<'_>, s: &mut BlockStored, name: &str) -> Result<(), DecodeError> {
    match name {
        "block_hashes" => s.block_hashes = hashes(r)?,
        "parent_block_hash" => s.parent_block_hash = opt_hash(r)?,
        "token_ids" => s.token_ids = tokens(r)?,
        "block_size" => s.block_size = opt_u32(r)?.unwrap_or(0),
        "medium" => s.medium = opt_str(r)?,
        "lora_name" => s.lora_name = opt_str(r)?,
        "extra_keys" => extra_keys(r, s)?,
        "group_idx" => s.group_idx = opt_u32(r)?,
        "kv_cache_spec_kind" => s.kv_cache_spec_kind = opt_str(r)?,
        "kv_cache_spec_sliding_window" => s.kv_cache_spec_sliding_window = opt_u32(r)?,
        "cache_salt" => s.cache_salt = opt_str(r)?,
        _ => {
            r.skip()?;
        }
    }
    Ok(())
}

fn removed_field(r: &mut Reader<'_>, s: &mut BlockRemoved, name: &str) -> Result<(), DecodeError> {
    match name {
        "block_hashes" => s.block_hashes = hashes(r)?,
        "medium" => s.medium = opt_str(r)?,
        "group_idx" => s.group_idx = opt_u32(r)?,
        _ => {
            r.skip()?;
        }
    }
    Ok(())
}

const STORED_ORDER: [&str; 11] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_ORDER: [&str; 3] = ["block_hashes", "medium", "group_idx"];

/// Reads `fields` positional fields named by `order` into a `T` with
/// `set`; fields past the known ones (newer versions) are skipped.
fn positional<T: Default>(
    r: &mut Reader<'_>,
    fields: usize,
    order: &[&str],
    set: impl Fn(&mut Reader<'_>, &mut T, &str) -> Result<(), DecodeError>,
) -> Result<T, DecodeError> {
    let mut out = T::default();
    for i in 0..fields {
        match order.get(i) {
            Some(name) => set(r, &mut out, name)?,
            None => {
                r.skip()?;
            }
        }
    }
    Ok(out)
}

/// One event; `None` for an unknown tag (skipped).
fn event(r: &mut Reader<'_>) -> Result<Option<EngineEvent>, DecodeError> {
    match r.peek()? {
        Kind::Array => {
            let n = r.array_len()?;
            if n == 0 {
                return Err(DecodeError::Shape("an empty event".into()));
            }
            let tag = r.str()?;
            let fields = n - 1;
            let out = match tag {
                "BlockStored" => Some(EngineEvent::BlockStored(positional(
                    r,
                    fields,
                    &STORED_ORDER,
                    stored_field,
                )?)),
                "BlockRemoved" => Some(EngineEvent::BlockRemoved(positional(
                    r,
                    fields,
                    &REMOVED_ORDER,
                    removed_field,
                )?)),
                "AllBlocksCleared" => {
                    positional(r, fields, &[], |_, _: &mut (), _| Ok(()))?;
                    Some(EngineEvent::AllBlocksCleared)
                }
                _ => {
                    positional(r, fields, &[], |_, _: &mut (), _| Ok(()))?;
                    None
                }
            };
            Ok(out)
        }
        Kind::Map => {
            let n = r.map_len()?;
            // The tag may come anywhere in the map: read fields into both
            // shapes, then keep the one the tag names.
            let mut tag: Option<&str> = None;
            let mut stored = BlockStored::default();
            let mut removed = BlockRemoved::default();
            for _ in 0..n {
                let key = r.str()?;
                if key == "type" {
                    tag = Some(r.str()?);
                    continue;
                }
                match key {
                    "block_hashes" => {
                        let h = hashes(r)?;
                        removed.block_hashes = h.clone();
                        stored.block_hashes = h;
                    }
                    "medium" => {
                        let m = opt_str(r)?;
                        removed.medium = m.clone();
                        stored.medium = m;
                    }
                    "group_idx" => {
                        let g = opt_u32(r)?;
                        removed.group_idx = g;
                        stored.group_idx = g;
                    }
                    other => stored_field(r, &mut stored, other)?,
                }
            }
            Ok(match tag {
                Some("BlockStored") => Some(EngineEvent::BlockStored(stored)),
                Some("BlockRemoved") => Some(EngineEvent::BlockRemoved(removed)),
                Some("AllBlocksCleared") => Some(EngineEvent::AllBlocksCleared),
                Some(_) => None,
                None => return Err(DecodeError::Shape("an event map without `type`".into())),
            })
        }
        _ => Err(DecodeError::Shape(
            "an event must be an array or a map".into(),
        )),
    }
}
