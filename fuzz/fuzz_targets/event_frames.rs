//! `cargo fuzz run event_frames`: what a subscriber does with an engine's
//! ZeroMQ messages, on arbitrary bytes. The input is cut into messages at
//! each `0xFF 0xFE`, a message into frames (each a 2-byte little-endian
//! length then that many bytes), and read both as a live message and
//! as a replay reply; a payload found is decoded, sequenced and ingested
//! into a real index. Nothing may panic, and the index must stay
//! consistent: every pod's block count equals what a full scan finds.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use router_core::{PodDirectory, PodId, PodKey};
use router_events::{Ingestor, Sequencer, decode_batch, live_frame, replay_frame};
use router_index::{Index, IndexConfig};

fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
        out.push(&data[2..2 + n]);
        data = &data[2 + n..];
    }
    out
}

fn messages(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.windows(2).position(|w| w == [0xFF, 0xFE]) {
            Some(i) => {
                let m = &rest[..i];
                rest = &rest[i + 2..];
                Some(m)
            }
            None => Some(std::mem::take(&mut rest)),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    static HASHER: OnceLock<Arc<router_hash::ChainHasher>> = OnceLock::new();
    let hasher = HASHER.get_or_init(|| Arc::new(router_hash::ChainHasher::new(4).unwrap()));
    let index = Index::<4>::new(IndexConfig::default());
    let pod: PodId = index.join(&PodKey::new("fuzz", 0)).unwrap();
    let mut ingest = Ingestor::new(hasher.clone(), index.clone(), Some("m".into()), 4);
    let mut seq = Sequencer::new();
    for message in messages(data) {
        let fs = frames(message);
        let _ = replay_frame(&fs);
        if let Some((s, payload)) = live_frame(&fs) {
            let decoded = decode_batch(payload);
            let _ = seq.check(s, decoded.as_ref().ok().map(|b| b.ts));
            if let Ok(b) = &decoded {
                ingest.apply_batch(pod, b);
            }
            seq.applied(s, decoded.as_ref().ok().map(|b| b.ts));
        }
    }
    // The index never holds a block the ingestor does not map to: its
    // count is at most the distinct router hashes the ingestor knows.
    let counted = index.pod_blocks(pod).unwrap_or(0);
    let known: std::collections::HashSet<_> = ingest
        .export_pod(pod)
        .iter()
        .filter(|b| b.tiers != 0)
        .map(|b| b.router)
        .collect();
    assert!(
        counted <= known.len() as u64,
        "the index holds {counted} blocks, the ingestor knows {}",
        known.len()
    );
});
