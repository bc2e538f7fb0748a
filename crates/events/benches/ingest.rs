//! Engine events to index, end to end on one core: decode the MessagePack
//! batch, compute router hashes, apply to `router-index`.
//!
//! Varied: nothing but the encoding (map, vLLM >= 0.24 and SGLang; array,
//! vLLM <= 0.23). Each iteration decodes and applies one batch of 64
//! `BlockStored` events of 16 blocks of 16 tokens (1024 blocks, the
//! vLLM-default block size, so the most hashing per token), then one batch
//! of removals of the same blocks, so the index stays the same size.
//! Throughput counts blocks stored plus blocks removed. The publisher is out
//! of the measurement (the bytes are built once). Target: 3M blocks/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use router_core::{PodDirectory, PodKey};
use router_events::{Ingestor, decode_batch};
use router_hash::ChainHasher;
use router_index::{Index, IndexConfig};

struct Enc(Vec<u8>);

impl Enc {
    fn arr(&mut self, n: usize) {
        self.0.push(0xdc);
        self.0.extend((n as u16).to_be_bytes());
    }
    fn map(&mut self, n: usize) {
        self.0.push(0xde);
        self.0.extend((n as u16).to_be_bytes());
    }
    fn str(&mut self, s: &str) {
        self.0.push(0xd9);
        self.0.push(s.len() as u8);
        self.0.extend(s.as_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.push(0xcf);
        self.0.extend(v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.push(0xce);
        self.0.extend(v.to_be_bytes());
    }
    fn nil(&mut self) {
        self.0.push(0xc0);
    }
    fn f64(&mut self, v: f64) {
        self.0.push(0xcb);
        self.0.extend(v.to_be_bytes());
    }
}

/// A field name and how to write its value.
type Field<'a> = (&'a str, &'a dyn Fn(&mut Enc));

const EVENTS: usize = 64;
const BLOCKS: usize = 16;
const BS: usize = 16;

fn engine_hash(e: usize, b: usize) -> u64 {
    ((e as u64) << 32 | b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn stores(map: bool) -> Vec<u8> {
    let mut w = Enc(Vec::new());
    w.arr(3);
    w.f64(1.5);
    w.arr(EVENTS);
    for e in 0..EVENTS {
        let fields: [Field<'_>; 7] = [
            ("block_hashes", &|w: &mut Enc| {
                w.arr(BLOCKS);
                for b in 0..BLOCKS {
                    w.u64(engine_hash(e, b));
                }
            }),
            ("parent_block_hash", &|w: &mut Enc| w.nil()),
            ("token_ids", &|w: &mut Enc| {
                w.arr(BLOCKS * BS);
                for t in 0..BLOCKS * BS {
                    w.u32((e * 7919 + t) as u32 % 151_000);
                }
            }),
            ("block_size", &|w: &mut Enc| w.u32(BS as u32)),
            ("lora_id", &|w: &mut Enc| w.nil()),
            ("medium", &|w: &mut Enc| w.str("GPU")),
            ("lora_name", &|w: &mut Enc| w.nil()),
        ];
        if map {
            w.map(fields.len() + 1);
            w.str("type");
            w.str("BlockStored");
            for (k, f) in fields {
                w.str(k);
                f(&mut w);
            }
        } else {
            w.arr(fields.len() + 1);
            w.str("BlockStored");
            for (_, f) in fields {
                f(&mut w);
            }
        }
    }
    w.u32(0);
    w.0
}

fn removals() -> Vec<u8> {
    let mut w = Enc(Vec::new());
    w.arr(3);
    w.f64(1.5);
    w.arr(EVENTS);
    for e in 0..EVENTS {
        w.arr(3);
        w.str("BlockRemoved");
        w.arr(BLOCKS);
        for b in 0..BLOCKS {
            w.u64(engine_hash(e, b));
        }
        w.str("GPU");
    }
    w.u32(0);
    w.0
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements((2 * EVENTS * BLOCKS) as u64));
    let remove = removals();
    for (name, map) in [("map-encoded", true), ("array-encoded", false)] {
        let store = stores(map);
        let index = Index::<4>::new(IndexConfig::default());
        let pod = index.join(&PodKey::new("engine", 0)).expect("slot");
        let mut ing = Ingestor::new(
            ChainHasher::new(BS).expect("bs"),
            index.clone(),
            None,
            BS as u32,
        );
        g.bench_function(name, |b| {
            b.iter(|| {
                ing.apply_batch(pod, &decode_batch(&store).expect("valid"));
                ing.apply_batch(pod, &decode_batch(&remove).expect("valid"));
            })
        });
        assert_eq!(ing.stats().sink_refused, 0);
        assert_eq!(index.pod_blocks(pod), Some(0));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
