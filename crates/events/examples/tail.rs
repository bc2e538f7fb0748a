//! Watch live engines' KV-event streams: an operator's check in a minute.
//!
//! ```sh
//! cargo run -p router-events --example tail -- [--model NAME] [--block-size 16] [--topic T] \
//!     tcp://10.0.0.7:5557[,tcp://10.0.0.7:5558] ...
//! ```
//!
//! Each argument is an engine publisher endpoint, optionally followed by
//! `,` and its replay endpoint. Once a second it prints one JSON line: per
//! pod, the blocks it holds by tier and its ingestion counts (applied,
//! skipped by reason), and the stream counts (batches, gaps, replayed,
//! resets, bad frames, decode errors).

use std::sync::Arc;
use std::time::Duration;

use router_core::{PodDirectory, PodKey, Tier};
use router_events::{PodStream, Subscriber};
use router_hash::ChainHasher;
use router_index::{Index, IndexConfig};

fn main() {
    let mut model = None;
    let mut block_size = 16u32;
    let mut topic = String::new();
    let mut endpoints = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model = args.next(),
            "--block-size" => block_size = args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--topic" => topic = args.next().unwrap_or_default(),
            "-h" | "--help" => {
                println!("usage: tail [--model NAME] [--block-size N] [--topic T] PUB[,REPLAY]...");
                return;
            }
            _ => endpoints.push(a),
        }
    }
    if endpoints.is_empty() || block_size == 0 {
        eprintln!("usage: tail [--model NAME] [--block-size N] [--topic T] PUB[,REPLAY]...");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let hasher = match ChainHasher::new(block_size as usize) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        };
        let index = Index::<4>::new(IndexConfig::default());
        let sub = Subscriber::new(Arc::new(hasher), index.clone(), index.clone(), model, block_size);
        let mut pods = Vec::new();
        for (i, ep) in endpoints.iter().enumerate() {
            let (publisher, replay) = match ep.split_once(',') {
                Some((p, r)) => (p.to_owned(), Some(r.to_owned())),
                None => (ep.clone(), None),
            };
            let Ok(pod) = index.join(&PodKey::new(publisher.clone(), i as u32)) else {
                eprintln!("too many endpoints");
                std::process::exit(2);
            };
            let mut stream = PodStream::new(pod, publisher.clone()).topic(topic.clone());
            if let Some(r) = replay {
                stream = stream.replay(r);
            }
            sub.add(stream);
            pods.push((pod, publisher));
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let per_pod: Vec<serde_json::Value> = pods
                .iter()
                .map(|(pod, endpoint)| {
                    let tiers = sub.tier_counts(*pod).unwrap_or_default();
                    let st = sub.ingest_stats(*pod).unwrap_or_default();
                    serde_json::json!({
                        "endpoint": endpoint,
                        "blocks": index.pod_blocks(*pod).unwrap_or(0),
                        "tiers": Tier::ALL.iter().map(|t| (t.as_str(), tiers[*t])).collect::<std::collections::BTreeMap<_, _>>(),
                        "applied": st.events_applied,
                        "skipped": {
                            "unknown_parent": st.unknown_parent, "other_group": st.other_group,
                            "unknown_medium": st.unknown_medium, "token_mismatch": st.token_mismatch,
                            "unknown_removed": st.unknown_removed, "sink_refused": st.sink_refused,
                            "unknown_events": st.unknown_events,
                        },
                        "needs_resync": sub.needs_resync(*pod),
                    })
                })
                .collect();
            let s = sub.stream_stats();
            println!(
                "{}",
                serde_json::json!({
                    "pods": per_pod,
                    "stream": {"batches": s.batches, "gaps": s.gaps, "replayed": s.replayed, "resets": s.resets,
                               "stale": s.stale, "bad_frames": s.bad_frames, "decode_errors": s.decode_errors},
                })
            );
        }
    });
}
