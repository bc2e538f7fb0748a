//! The token ids of text between added tokens, kept across requests.
//!
//! A Hugging Face tokenizer splits its input at its added tokens (the
//! control tokens of a chat template among them) before it normalizes,
//! pre-tokenizes and runs the model, and each piece between them is
//! encoded on its own. So the ids of a text are the ids of its pieces and
//! of the added tokens between them, in order, and a piece's ids do not
//! depend on what surrounds it. A chat rendered by its template is such a
//! text: each message sits between control tokens, and the next turn of a
//! conversation repeats every earlier message. Encoding the pieces through
//! a cache tokenizes a conversation's history once, not at every turn.
//!
//! The rule holds only where added tokens do not reach into their
//! neighbours: the cache is off for a tokenizer with an added token that
//! strips whitespace, must be a single word, or is matched after
//! normalization. A property test compares it with the whole-text encoding
//! on both bundled tokenizers.

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use parking_lot::Mutex;

/// Pieces shorter than this many bytes are encoded directly (cheap, and
/// not worth a slot).
const MIN_CACHED: usize = 256;

/// The cache: how to split a text at added tokens, and two generations of
/// pieces' ids (the current one fills; when it passes half the budget it
/// becomes the previous one, and the previous one is dropped; a piece
/// found in the previous one moves back to the current one).
pub(crate) struct Segments {
    split: AhoCorasick,
    ids: Vec<u32>,
    budget: usize,
    state: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<u128, Arc<[u32]>>,
    previous: HashMap<u128, Arc<[u32]>>,
    bytes: usize,
}

/// One part of a split text.
pub(crate) enum Part<'a> {
    Text(&'a str),
    Added(u32),
}

impl Segments {
    /// The cache for `tokenizer`, holding up to about `budget` bytes of ids;
    /// `None` when its added tokens do not split text cleanly (see the
    /// module's notes) or `budget` is 0.
    pub(crate) fn new(tokenizer: &tokenizers::Tokenizer, budget: usize) -> Option<Segments> {
        if budget == 0 {
            return None;
        }
        let added = tokenizer.get_added_tokens_decoder();
        if added
            .values()
            .any(|t| t.single_word || t.lstrip || t.rstrip || t.normalized || t.content.is_empty())
        {
            return None;
        }
        let mut tokens: Vec<(u32, String)> =
            added.into_iter().map(|(id, t)| (id, t.content)).collect();
        tokens.sort();
        let split = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|t| t.1.as_str()))
            .ok()?;
        Some(Segments {
            split,
            ids: tokens.iter().map(|t| t.0).collect(),
            budget,
            state: Mutex::new(Generations::default()),
        })
    }

    /// `text` split at its added tokens, as the tokenizer splits it
    /// (leftmost-longest matches).
    pub(crate) fn parts<'a>(&self, text: &'a str) -> Vec<Part<'a>> {
        let mut out = Vec::new();
        let mut at = 0;
        for m in self.split.find_iter(text) {
            if m.start() > at {
                out.push(Part::Text(&text[at..m.start()]));
            }
            out.push(Part::Added(self.ids[m.pattern().as_usize()]));
            at = m.end();
        }
        if at < text.len() {
            out.push(Part::Text(&text[at..]));
        }
        out
    }

    /// The ids of `piece` (no added token in it): kept ones, or `encode`'s,
    /// then kept.
    pub(crate) fn ids_of<E>(
        &self,
        piece: &str,
        encode: impl FnOnce(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Arc<[u32]>, E> {
        if piece.len() < MIN_CACHED {
            return encode(piece).map(Arc::from);
        }
        let key = xxhash_rust::xxh3::xxh3_128(piece.as_bytes());
        {
            let mut g = self.state.lock();
            if let Some(ids) = g.current.get(&key) {
                return Ok(ids.clone());
            }
            if let Some(ids) = g.previous.remove(&key) {
                g.bytes += ids.len() * 4;
                g.current.insert(key, ids.clone());
                return Ok(ids);
            }
        }
        // Encoded without the lock: another thread may encode the same
        // piece meanwhile, and both get the same ids.
        let ids: Arc<[u32]> = encode(piece)?.into();
        let mut g = self.state.lock();
        if g.bytes + ids.len() * 4 > self.budget / 2 {
            g.previous = std::mem::take(&mut g.current);
            g.bytes = 0;
        }
        if ids.len() * 4 <= self.budget / 2 {
            g.bytes += ids.len() * 4;
            g.current.insert(key, ids.clone());
        }
        Ok(ids)
    }

    /// Pieces kept, and the bytes of ids the current generation holds.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let g = self.state.lock();
        (g.current.len() + g.previous.len(), g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_ids_stay_within_the_budget() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tokenizers/gpt2/tokenizer.json"
        );
        let tok = tokenizers::Tokenizer::from_file(dir).unwrap();
        let budget = 8 << 10;
        let seg = Segments::new(&tok, budget).unwrap();
        let encode = |p: &str| -> Result<Vec<u32>, ()> {
            Ok(tok.encode_fast(p, false).unwrap().get_ids().to_vec())
        };
        for i in 0..500 {
            let piece = format!("piece {i} of many, long enough to be kept. ").repeat(8);
            let ids = seg.ids_of(&piece, encode).unwrap();
            assert_eq!(&ids[..], &encode(&piece).unwrap()[..]);
            let (_, bytes) = seg.held();
            assert!(bytes <= budget / 2, "{bytes}");
        }
        let (pieces, _) = seg.held();
        assert!(pieces > 0 && pieces < 500, "{pieces} kept of 500");
        assert!(Segments::new(&tok, 0).is_none());
    }
}
