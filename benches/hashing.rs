//! Tokenization against block hashing, on the same prompts.
//!
//! Varied: the prompt length (1K, 32K and 128K Qwen3 tokens), because routing
//! cost must stay small next to tokenization even for the longest contexts.
//! Measured: Qwen3 `tokenizer.json` encoding of the prompt text, and the
//! cumulative XXH3 chain over its token ids at block size 16 (vLLM's default,
//! the most blocks per token, so the worst case for hashing). The issue's
//! target is hashing under 5% of tokenization; the ratio is read off the
//! `tokenize/N` and `hash_chain/N` lines of one run.

use std::path::Path;

use cache_router::core::Namespace;
use cache_router::hash::{ChainHasher, ModelTokenizer};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Mixed prose, code and non-ASCII text, deterministic.
fn corpus(min_chars: usize) -> String {
    let pieces = [
        "The router sends each request to the pod that already holds the longest cached prefix. ",
        "fn score(pod: &Pod) -> f64 { pod.hits as f64 / (1.0 + pod.load as f64) }\n",
        "缓存命中可以跳过预填充阶段，从而显著降低首字延迟。",
        "Load must stay balanced: one hot system prompt must never pin all traffic to one pod! ",
        "{\"role\": \"user\", \"content\": \"Summarise the attached 40-page report, please.\"}\n",
        "Tokyo 東京, Paris, São Paulo — 42 regions, 3.5 ms p99 🚀. ",
    ];
    let mut s = String::with_capacity(min_chars + 128);
    let mut i = 0usize;
    while s.len() < min_chars {
        s.push_str(pieces[(i * 7 + i / 5) % pieces.len()]);
        i += 1;
    }
    s
}

fn bench(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/tokenizers/qwen3");
    let tok = ModelTokenizer::from_dir(&dir).expect("bundled Qwen3 tokenizer loads");
    let hasher = ChainHasher::new(16).expect("block size 16 is valid");
    let ns = Namespace::model("Qwen/Qwen3-8B");
    let all = tok.encode(&corpus(700_000), false).expect("corpus encodes");

    let mut tg = c.benchmark_group("tokenize");
    tg.sample_size(10);
    for n in [1_024usize, 32_768, 131_072] {
        let text = tok.decode(&all[..n], false).expect("ids decode");
        tg.throughput(Throughput::Elements(n as u64));
        tg.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| tok.encode(text, false).expect("encodes"))
        });
    }
    tg.finish();

    let mut hg = c.benchmark_group("hash_chain");
    for n in [1_024usize, 32_768, 131_072] {
        let ids = &all[..n];
        hg.throughput(Throughput::Elements(n as u64));
        hg.bench_with_input(BenchmarkId::from_parameter(n), ids, |b, ids| {
            b.iter(|| hasher.chain(&ns, ids))
        });
    }
    hg.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
