//! `cargo fuzz run openai_body`: a client's request body, as the gateway
//! reads it: parsed (lax `stream` and `n`), then turned into prompt tokens
//! with the bundled Qwen3 tokenizer, chat messages rendered through its
//! template. The first byte picks the endpoint and whether control tokens
//! are sanitized. Each step returns a value
//! or an OpenAI error; nothing may panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use router_service::{Api, parse_body, prompt_tokens};
use router_hash::ModelTokenizer;

fuzz_target!(|data: &[u8]| {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    let tok = TOK.get_or_init(|| {
        ModelTokenizer::from_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../assets/tokenizers/qwen3"))
            .expect("the bundled tokenizer")
    });
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let api = if pick & 1 == 0 { Api::Chat } else { Api::Completions };
    if let Ok(v) = parse_body(body) {
        if let Ok(tokens) = prompt_tokens(api, &v, tok, pick & 2 != 0) {
            assert!(tokens.iter().all(|&t| t < tok.vocab_size()));
        }
    }
});
