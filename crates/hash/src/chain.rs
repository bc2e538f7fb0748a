//! The router's block-hash algorithm, version 1.
//!
//! See the crate documentation for the byte layout; it is frozen by the
//! golden vectors in `tests/hash/golden.rs`.

use router_core::{BlockHash, BlockHasher, Namespace};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::Error;

/// The XXH3 seed of every hash this crate computes ("cacheRT1" in ASCII).
pub const HASH_SEED: u64 = 0x6361_6368_6552_5431;

/// The domain tag that starts a namespace's root input.
const ROOT_TAG: &[u8] = b"cache-router/root/v1";

/// A key that joins the hash of every block whose tokens it overlaps.
///
/// Multimodal prompts carry placeholder tokens whose ids are the same for
/// every image; the image's content hash, attached to the token range it
/// occupies, keeps two different images from sharing cache. Ranges are
/// half-open token positions counted from the start of the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtraKey {
    /// First token position covered.
    pub start: usize,
    /// One past the last token position covered.
    pub end: usize,
    /// The key, for example a 64-bit hash of the image bytes.
    pub key: u64,
}

impl ExtraKey {
    /// A key covering tokens `start..end`.
    pub fn new(start: usize, end: usize, key: u64) -> Self {
        ExtraKey { start, end, key }
    }

    fn overlaps(&self, start: usize, end: usize) -> bool {
        self.start < end && start < self.end
    }
}

/// Hashes token chains with XXH3-64 in fixed-size blocks.
///
/// Cheap to copy; it holds only the block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainHasher {
    block_size: usize,
}

impl ChainHasher {
    /// A hasher for blocks of `block_size` tokens. Zero is an error.
    pub fn new(block_size: usize) -> Result<Self, Error> {
        if block_size == 0 {
            return Err(Error::ZeroBlockSize);
        }
        Ok(ChainHasher { block_size })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The chain of the full blocks of `tokens` in `namespace`.
    pub fn chain(&self, namespace: &Namespace, tokens: &[u32]) -> Vec<BlockHash> {
        let mut c = self.start(namespace);
        c.push(tokens);
        c.into_hashes()
    }

    /// Like [`ChainHasher::chain`], with extra keys joining the blocks they overlap.
    pub fn chain_with_extras(
        &self,
        namespace: &Namespace,
        tokens: &[u32],
        extras: &[ExtraKey],
    ) -> Vec<BlockHash> {
        let mut c = self.start(namespace);
        c.push_with_extras(tokens, extras);
        c.into_hashes()
    }

    /// An empty chain in `namespace`, to be extended incrementally.
    pub fn start(&self, namespace: &Namespace) -> Chain {
        Chain {
            hasher: *self,
            root: self.root(namespace),
            hashes: Vec::new(),
            tail: Vec::with_capacity(self.block_size),
            tokens: 0,
            extras: Vec::new(),
            scratch: Vec::new(),
            block_extras: Vec::new(),
        }
    }
}

impl BlockHasher for ChainHasher {
    fn root(&self, namespace: &Namespace) -> BlockHash {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(ROOT_TAG);
        for field in [
            &namespace.model,
            &namespace.lora_name,
            &namespace.cache_salt,
        ] {
            match field {
                None => buf.push(0),
                Some(s) => {
                    buf.push(1);
                    push_len(&mut buf, s.len());
                    buf.extend_from_slice(s.as_bytes());
                }
            }
        }
        BlockHash(xxh3_64_with_seed(&buf, HASH_SEED))
    }

    fn hash_block(&self, parent: BlockHash, tokens: &[u32], extra_keys: &[u64]) -> BlockHash {
        // A stack buffer covers blocks up to 240 tokens without allocating;
        // larger ones pay one allocation (still tiny next to tokenization).
        let len = block_input_len(tokens.len(), extra_keys.len());
        if len <= STACK_BYTES {
            let mut buf = [0u8; STACK_BYTES];
            let n = write_block_input(&mut buf, parent, tokens, extra_keys);
            BlockHash(xxh3_64_with_seed(&buf[..n], HASH_SEED))
        } else {
            let mut buf = Vec::new();
            hash_block_with(&mut buf, parent, tokens, extra_keys)
        }
    }
}

const STACK_BYTES: usize = 1024;

fn block_input_len(tokens: usize, extras: usize) -> usize {
    8 + 4 + 4 * tokens + 4 + 8 * extras
}

fn push_len(buf: &mut Vec<u8>, len: usize) {
    // Lengths beyond u32 cannot occur for tokens of one block or for names;
    // saturating keeps the function total.
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// Writes the v1 block input into `buf` (which must be large enough) and
/// returns its length.
fn write_block_input(buf: &mut [u8], parent: BlockHash, tokens: &[u32], extras: &[u64]) -> usize {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&parent.0.to_le_bytes());
    put(&u32::try_from(tokens.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes());
    for t in tokens {
        put(&t.to_le_bytes());
    }
    put(&u32::try_from(extras.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes());
    for k in extras {
        put(&k.to_le_bytes());
    }
    at
}

/// Hashes one block through a reusable heap buffer.
fn hash_block_with(
    scratch: &mut Vec<u8>,
    parent: BlockHash,
    tokens: &[u32],
    extras: &[u64],
) -> BlockHash {
    scratch.clear();
    scratch.resize(block_input_len(tokens.len(), extras.len()), 0);
    let n = write_block_input(scratch, parent, tokens, extras);
    BlockHash(xxh3_64_with_seed(&scratch[..n], HASH_SEED))
}

/// A chain being built incrementally: push tokens as they arrive, and only
/// the blocks they complete are hashed.
///
/// A new chat turn whose rendered prompt extends the previous one pushes just
/// the new tokens; the result equals hashing the whole prompt from scratch.
/// (Many chat templates rewrite earlier turns, for example by dropping
/// reasoning, so check that the new prompt really extends the old one.)
#[derive(Clone, Debug)]
pub struct Chain {
    hasher: ChainHasher,
    root: BlockHash,
    hashes: Vec<BlockHash>,
    tail: Vec<u32>,
    tokens: usize,
    extras: Vec<ExtraKey>,
    scratch: Vec<u8>,
    block_extras: Vec<u64>,
}

impl Chain {
    /// Appends tokens, hashing every block they complete.
    pub fn push(&mut self, tokens: &[u32]) {
        self.push_with_extras(tokens, &[]);
    }

    /// Appends tokens with extra keys. Key positions are absolute (counted
    /// from the first token of the chain) and may cover tokens not pushed
    /// yet; a key is used by every full block it overlaps.
    pub fn push_with_extras(&mut self, tokens: &[u32], extras: &[ExtraKey]) {
        if !extras.is_empty() {
            self.extras.extend_from_slice(extras);
            self.extras.sort_unstable();
            self.extras.dedup();
        }
        let bs = self.hasher.block_size;
        let mut rest = tokens;
        // Complete a partial block left by the previous push.
        if !self.tail.is_empty() {
            let need = bs - self.tail.len();
            let take = need.min(rest.len());
            self.tail.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            self.tokens += take;
            if self.tail.len() < bs {
                return;
            }
            let block = std::mem::take(&mut self.tail);
            self.hash_next(&block);
            self.tail = block;
            self.tail.clear();
        }
        let mut blocks = rest.chunks_exact(bs);
        for block in &mut blocks {
            self.tokens += bs;
            self.hash_next(block);
        }
        let rem = blocks.remainder();
        self.tail.extend_from_slice(rem);
        self.tokens += rem.len();
    }

    /// Hashes the next block; `self.tokens` already counts it.
    fn hash_next(&mut self, block: &[u32]) {
        let end = self.hashes.len() * self.hasher.block_size + block.len();
        let start = end - block.len();
        self.block_extras.clear();
        // Keys are sorted by start, so those that end before this block can
        // be dropped: later blocks start later still.
        self.extras.retain(|k| k.end > start);
        for k in &self.extras {
            if k.start >= end {
                break;
            }
            if k.overlaps(start, end) {
                self.block_extras.push(k.key);
            }
        }
        let parent = self.hashes.last().copied().unwrap_or(self.root);
        let h = hash_block_with(&mut self.scratch, parent, block, &self.block_extras);
        self.hashes.push(h);
    }

    /// The hashes of the full blocks so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// The hashes, consuming the chain.
    pub fn into_hashes(self) -> Vec<BlockHash> {
        self.hashes
    }

    /// The namespace root this chain started from.
    pub fn root(&self) -> BlockHash {
        self.root
    }

    /// Tokens pushed so far, including a trailing partial block.
    pub fn token_count(&self) -> usize {
        self.tokens
    }

    /// Tokens of the trailing partial block (not hashed yet).
    pub fn pending_tokens(&self) -> &[u32] {
        &self.tail
    }
}
