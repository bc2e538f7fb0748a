//! Text becomes tokens, tokens become full blocks, blocks become a cumulative
//! hash chain: the first layer a request meets, shared by the index, the
//! event ingestion and the simulator.
//!
//! # The design choice
//!
//! A KV-cache block is reusable only if every token before it is the same, so
//! a block's identity is its tokens *and* its whole prefix. Hashing each block
//! together with its parent's hash (a cumulative chain) makes "same prefix"
//! an equality of one 64-bit value, which is what lets the index answer prefix
//! queries with a binary search. The hash must be the router's own and stable
//! everywhere: engines seed theirs per process, and a router fleet must agree
//! with itself across machines and releases. So the algorithm below is fixed,
//! documented byte for byte and pinned by golden vectors.
//!
//! # Algorithm (version 1)
//!
//! All integers are little-endian. Every hash is XXH3-64 with seed
//! [`HASH_SEED`] (`0x6361_6368_6552_5431`) over the bytes listed.
//!
//! - **Root** of a namespace, the parent of block 0: the ASCII tag
//!   `cache-router/root/v1`, then for each of `model`, `lora_name`,
//!   `cache_salt` in that order: one byte `0` if absent, or one byte `1`, the
//!   UTF-8 length as `u32` and the UTF-8 bytes.
//! - **Block** `i` (tokens `i*B .. (i+1)*B`): the parent hash as `u64` (the root
//!   for block 0, else block `i-1`), the token count as `u32`, each token id as
//!   `u32`, the number of extra keys as `u32`, each extra key as `u64`.
//!
//! Only full blocks are hashed; a trailing partial block is not cacheable.
//! The extra keys of a block are the [`ExtraKey`]s whose token range
//! overlaps the block, sorted by `(start, end, key)`.
//!
//! # Items
//!
//! - [`ChainHasher`]: the algorithm; implements [`router_core::BlockHasher`].
//! - [`Chain`]: incremental extension (a new chat turn hashes only its new blocks).
//! - [`ExtraKey`]: per-block extra keys such as multimodal content hashes.
//! - [`ModelTokenizer`]: Hugging Face `tokenizer.json` plus chat template.
//! - [`ChatTemplate`], [`ChatInput`]: templates rendered as `transformers` does.
//! - [`Error`]: every failure, typed.
//!
//! # Example
//!
//! ```
//! use router_core::{BlockHasher, Namespace};
//! use router_hash::ChainHasher;
//!
//! let hasher = ChainHasher::new(4)?;
//! let ns = Namespace::model("Qwen/Qwen3-8B");
//! let turn1 = [10, 11, 12, 13, 14, 15];
//! let mut chain = hasher.start(&ns);
//! chain.push(&turn1);
//! assert_eq!(chain.hashes().len(), 1); // tokens 14, 15 wait for a full block
//! chain.push(&[16, 17, 18, 19, 20]); // the next turn hashes only new blocks
//! let from_scratch = hasher.chain(&ns, &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]);
//! assert_eq!(chain.hashes(), &from_scratch[..]);
//! // The same tokens under another adapter share nothing.
//! let lora = hasher.chain(&ns.clone().with_lora("sql-adapter"), &turn1);
//! assert_ne!(lora[0], from_scratch[0]);
//! # Ok::<(), router_hash::Error>(())
//! ```
#![forbid(unsafe_code)]

mod chain;
mod control;
mod error;
mod pyjson;
mod segments;
mod template;
mod tokenizer;

pub use chain::{Chain, ChainHasher, ExtraKey, HASH_SEED};
pub use error::Error;
pub use template::{ChatInput, ChatTemplate};
pub use tokenizer::{ModelTokenizer, SEGMENT_CACHE_BYTES};
