//! Where a request's time goes in the router before it is proxied
//! (issue 30, item 3), stage by stage, on the bundled Qwen3 tokenizer:
//!
//! - `parse`: the body's bytes to a checked [`Request`] (JSON, OpenAI's
//!   normalisation).
//! - `tokenize_text`: the prompt's text alone through the tokenizer (a
//!   completion's path), and `template_tokenize`: the chat rendered
//!   through the model's template, then tokenized (a chat's path); the
//!   difference is the template's cost.
//! - `hash`: the token ids into the chain of 16-token block hashes.
//! - `template_tokenize_next_turn`: the same with the segment cache
//!   (`tokenize_cache_mb`), each call a conversation's next turn (its
//!   history as the turn before sent it, one new message).
//! - `pick`: [`Router::pick_blocking`], the whole decision on the calling
//!   thread (tokenizing and hashing included, then the profile's filters,
//!   prefix match, scorers and the lease with its accounting), over eight
//!   pods, each call a conversation's next turn; what is left after the
//!   stages above is the decision. `pick_whole_tokenize` is the same
//!   router with `tokenize_cache_mb = 0`.
//! - `metrics_text`: one Prometheus scrape (per scrape, not per request).
//!
//! Two prompts: a one-word chat, and a multi-turn chat of about 8k tokens
//! (a long system prompt, a document, three earlier turns), each pick a
//! new conversation sharing the system prompt so that the index holds
//! what earlier picks registered. Proxying (the HTTP hop) is not here: it
//! is the difference between `scripts/overhead.sh`'s gateway and engine
//! rows.
//!
//! ```sh
//! cargo bench -p router-service --bench stages
//! ```

use std::path::Path;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_core::Namespace;
use router_hash::{ChainHasher, ModelTokenizer};
use router_service::{Api, Config, PodConfig, Request, Router, openai};
use serde_json::{Value, json};

const MODEL: &str = "Qwen/Qwen3-0.6B";

fn tokenizer_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/qwen3")
}

/// About `words` words of varied text, different for each `seed`.
fn text(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 16] = [
        "cache", "prefix", "router", "block", "engine", "token", "latency", "pod", "shard",
        "bitmap", "event", "profile", "window", "request", "prefill", "decode",
    ];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..words)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = VOCAB[(x % VOCAB.len() as u64) as usize];
            if i % 12 == 11 {
                format!("{w}.")
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A chat body: the one-word prompt, or about 8k tokens over several turns
/// (conversation `conversation`), ending with user message `last`.
fn chat(long: bool, conversation: u64, last: u64) -> Value {
    if !long {
        return json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16});
    }
    let mut messages = vec![
        json!({"role": "system", "content": text(1, 1500)}),
        json!({"role": "user", "content": text(100 + conversation, 3500)}),
    ];
    for turn in 0..3 {
        messages.push(json!({"role": "assistant", "content": text(200 + turn, 300)}));
        messages.push(json!({"role": "user", "content": text(300 + conversation * 7 + turn, 150)}));
    }
    messages.push(json!({"role": "user", "content": text(1_000_000 + last, 150)}));
    json!({"model": MODEL, "messages": messages, "max_tokens": 16})
}

/// A router over eight pods without events (approximate mode; nothing
/// listens there and nothing is sent), tokenizing with `cache_mb` MiB of
/// kept pieces.
fn router(rt: &tokio::runtime::Runtime, cache_mb: usize) -> Router {
    let cfg = format!(
        "[gateway]\nmodel = \"{MODEL}\"\ntokenizer = \"{}\"\n\
         health_interval_ms = 3600000\nunhealthy_after = 1000\ntokenize_cache_mb = {cache_mb}\n",
        tokenizer_dir().display()
    );
    let mut config = Config::parse(&cfg, Path::new(".")).unwrap();
    for i in 0..8 {
        config.pods.push(PodConfig::new(
            format!("pod-{i}"),
            format!("http://127.0.0.1:{}", 9 + i),
        ));
    }
    rt.block_on(Router::start(config)).unwrap()
}

fn stages(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tokenizer = ModelTokenizer::from_dir(tokenizer_dir()).unwrap();
    let mut whole = ModelTokenizer::from_dir(tokenizer_dir()).unwrap();
    whole.set_segment_cache(0);
    let hasher = ChainHasher::new(16).unwrap();
    let namespace = Namespace::model(MODEL);
    let kept = router(&rt, 64);
    let unkept = router(&rt, 0);

    let mut g = c.benchmark_group("stages");
    for (name, long) in [("one_word", false), ("long_8k", true)] {
        let body = chat(long, 0, 0);
        let raw = serde_json::to_vec(&body).unwrap();
        let parsed = Request::from_openai(Api::Chat, &raw).unwrap();
        let tokens = openai::prompt_tokens(Api::Chat, parsed.body(), &whole, false).unwrap();
        let flat: String = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        eprintln!(
            "{name}: {} prompt tokens, {} body bytes",
            tokens.len(),
            raw.len()
        );
        g.bench_with_input(BenchmarkId::new("parse", name), &raw, |b, raw| {
            b.iter(|| Request::from_openai(Api::Chat, raw).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("tokenize_text", name), &flat, |b, t| {
            b.iter(|| whole.encode(t, false).unwrap().len())
        });
        g.bench_with_input(
            BenchmarkId::new("template_tokenize", name),
            &parsed,
            |b, r| {
                b.iter(|| {
                    openai::prompt_tokens(Api::Chat, r.body(), &whole, false)
                        .unwrap()
                        .len()
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("hash", name), &tokens, |b, t| {
            b.iter(|| hasher.chain(&namespace, t).len())
        });
        // Each call a conversation's next turn: one of 64 conversations,
        // its history as before, its last message never seen (built in
        // the call, whose time includes it).
        let bases: Vec<Value> = (0..64).map(|i| chat(long, i, 0)).collect();
        let mut next = 0u64;
        let mut turn = || {
            next += 1;
            let mut body = bases[(next % 64) as usize].clone();
            if long {
                let messages = body["messages"].as_array_mut().unwrap();
                if let Some(last) = messages.last_mut() {
                    last["content"] = json!(text(2_000_000 + next, 150));
                }
            }
            Request::from_json(Api::Chat, body).unwrap()
        };
        if long {
            g.bench_function(BenchmarkId::new("template_tokenize_next_turn", name), |b| {
                b.iter(|| {
                    let r = turn();
                    openai::prompt_tokens(Api::Chat, r.body(), &tokenizer, false)
                        .unwrap()
                        .len()
                })
            });
        }
        for (label, router) in [("pick", &kept), ("pick_whole_tokenize", &unkept)] {
            if label != "pick" && !long {
                continue;
            }
            g.bench_function(BenchmarkId::new(label, name), |b| {
                b.iter(|| {
                    let pick = router.pick_blocking(turn()).unwrap();
                    let tokens = pick.prompt_tokens;
                    pick.finish(true);
                    tokens
                })
            });
        }
    }
    g.bench_function("metrics_text", |b| b.iter(|| kept.metrics_text().len()));
    g.finish();
    drop((kept, unkept));
    drop(rt);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = stages
}
criterion_main!(benches);
