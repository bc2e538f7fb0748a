//! The segment cache: a tokenizer that keeps the ids of the text between
//! its added tokens encodes exactly as one that encodes every text whole,
//! on both bundled tokenizers, cold and with every piece already kept.

use proptest::prelude::*;
use router_hash::{ChatInput, ModelTokenizer};
use serde_json::json;

use crate::repo_root;

/// Each bundled tokenizer twice, loaded once (a load takes most of a
/// second): with the cache (its pieces kept from case to case, so later
/// cases meet kept pieces) and without.
static PAIRS: std::sync::LazyLock<Vec<(&str, ModelTokenizer, ModelTokenizer)>> =
    std::sync::LazyLock::new(|| {
        ["qwen3", "gpt2"]
            .into_iter()
            .map(|n| {
                let (c, w) = load(n);
                (n, c, w)
            })
            .collect()
    });

fn load(name: &str) -> (ModelTokenizer, ModelTokenizer) {
    let dir = repo_root().join("assets/tokenizers").join(name);
    let cached = ModelTokenizer::from_dir(&dir).unwrap();
    let mut whole = ModelTokenizer::from_dir(&dir).unwrap();
    whole.set_segment_cache(0);
    assert!(cached.segment_cache(), "{name}: the cache applies");
    assert!(!whole.segment_cache());
    (cached, whole)
}

/// Text pieces that stress the split: words, spaces and newlines at
/// piece edges, non-ASCII, added tokens whole and cut short, and runs long
/// enough to be kept.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}",
        Just(" ".to_owned()),
        Just("  \n".to_owned()),
        Just("\n\n".to_owned()),
        Just("héllo wörld ".to_owned()),
        Just("数据".to_owned()),
        Just("<|im_start|>".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("<|endoftext|>".to_owned()),
        Just("<think>".to_owned()),
        Just("<|im_sta".to_owned()),
        Just("|>".to_owned()),
        (0u32..50).prop_map(|s| format!(" the cache router keeps prefix {s} warm").repeat(12)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn kept_pieces_encode_as_the_whole_text(pieces in prop::collection::vec(piece(), 1..60)) {
        let text: String = pieces.concat();
        for (name, cached, whole) in PAIRS.iter() {
            let want = whole.encode(&text, false).unwrap();
            prop_assert_eq!(&cached.encode(&text, false).unwrap(), &want, "{} cold", name);
            prop_assert_eq!(&cached.encode(&text, false).unwrap(), &want, "{} warm", name);
        }
    }
}

#[test]
fn a_conversations_turns_encode_as_whole_texts() {
    let (_, cached, whole) = &PAIRS[0];
    let mut messages =
        vec![json!({"role": "system", "content": "You route requests. ".repeat(80)})];
    for turn in 0..6 {
        messages.push(json!({"role": "user", "content": format!("Question {turn}: ").repeat(60)}));
        let input = ChatInput::new(messages.clone());
        assert_eq!(
            cached.encode_chat(&input).unwrap(),
            whole.encode_chat(&input).unwrap(),
            "turn {turn}"
        );
        messages
            .push(json!({"role": "assistant", "content": format!("Answer {turn}. ").repeat(50)}));
    }
}
