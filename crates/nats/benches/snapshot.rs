//! Snapshot cost for 1M blocks across 64 pods: encode, decode, and
//! import into `router-index` (what a starting replica does before it
//! replays the stream). With `NATS_URL` set (a server with JetStream on),
//! also the object-store round trip: put, and get with decode.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use router_core::{BlockHash, CacheEventSink, PodDirectory, PodKey};
use router_events::{Ingestor, KnownBlock};
use router_index::{Index, IndexConfig};
use router_nats::{PodSnapshot, Snapshot};

const PODS: usize = 64;
const BLOCKS: usize = 1 << 20;

use router_core::mix64 as mix;

fn snapshot() -> Snapshot {
    let per = BLOCKS / PODS;
    Snapshot {
        stream_seq: 123_456,
        pods: (0..PODS)
            .map(|p| PodSnapshot {
                name: format!("pod-{p}"),
                expected: Some(10_000),
                last_ts: 1.7e9,
                blocks: (0..per)
                    .map(|i| {
                        let k = (p * per + i) as u64;
                        KnownBlock {
                            engine: mix(k),
                            // Pods share half their blocks, as a fleet
                            // serving common prefixes does.
                            router: BlockHash(mix(if i % 2 == 0 { i as u64 } else { k } ^ 0x9e37)),
                            tiers: 1,
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let snap = snapshot();
    let bytes = snap.encode();
    eprintln!(
        "snapshot: {} blocks across {PODS} pods, {} bytes ({:.1} per block)",
        snap.blocks(),
        bytes.len(),
        bytes.len() as f64 / snap.blocks() as f64
    );
    let mut g = c.benchmark_group("snapshot_1m_blocks_64_pods");
    g.sample_size(10);
    g.bench_function("encode", |b| b.iter(|| black_box(snap.encode())));
    g.bench_function("decode", |b| {
        b.iter(|| black_box(Snapshot::decode(&bytes).unwrap()))
    });
    g.bench_function("decode_and_import_into_index", |b| {
        b.iter(|| {
            let index = Index::<4>::new(IndexConfig::default());
            let sink: Arc<dyn CacheEventSink> = index.clone();
            let hasher: Arc<dyn router_core::BlockHasher> =
                Arc::new(router_hash::ChainHasher::new(16).unwrap());
            let mut ingest = Ingestor::new(hasher, sink, None, 16);
            let s = Snapshot::decode(&bytes).unwrap();
            for p in &s.pods {
                let id = index.join(&PodKey::new(p.name.as_str(), 0)).unwrap();
                ingest.import_pod(id, &p.blocks);
            }
            black_box(index.stats().entries)
        })
    });
    if let Ok(url) = std::env::var("NATS_URL") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = rt.block_on(async {
            let client = async_nats::connect(url.as_str())
                .await
                .expect("NATS_URL answers");
            let js = async_nats::jetstream::new(client);
            let _ = js.delete_object_store("bench-snapshots").await;
            js.create_object_store(async_nats::jetstream::object_store::Config {
                bucket: "bench-snapshots".into(),
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .unwrap()
        });
        g.bench_function("put_to_object_store", |b| {
            b.iter(|| {
                rt.block_on(async {
                    store.put("snap", &mut bytes.as_slice()).await.unwrap();
                })
            })
        });
        g.bench_function("get_from_object_store_and_decode", |b| {
            b.iter(|| {
                rt.block_on(async {
                    use tokio::io::AsyncReadExt;
                    let mut out = Vec::with_capacity(bytes.len());
                    store
                        .get("snap")
                        .await
                        .unwrap()
                        .read_to_end(&mut out)
                        .await
                        .unwrap();
                    black_box(Snapshot::decode(&out).unwrap().blocks())
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
