//! End to end over real sockets: a Python publisher (pyzmq + msgspec,
//! libzmq underneath) speaking vLLM's protocol, the Rust subscriber (a
//! pure-Rust ZeroMQ) applying to `router-index`. Stores, removals, clears
//! and duplicates for two pods; a lost batch healed by replay; a gap beyond
//! the replay buffer that clears the pod; malformed frames and payloads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use router_core::{BlockHash, Namespace, PodDirectory, PodKey, PrefixIndex, TierCounts};
use router_events::{PodHealth, PodStream, Subscriber};
use router_hash::ChainHasher;
use router_index::{Index, IndexConfig};
use router_test_support::KvPublisher as Publisher;
use serde_json::{Value, json};

fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>) -> Value {
    json!({"kind": "stored", "hashes": hashes, "parent": parent, "tokens": tokens.collect::<Vec<_>>(), "block_size": 4})
}

fn chain(tokens: std::ops::Range<u32>) -> Vec<BlockHash> {
    ChainHasher::new(4)
        .unwrap()
        .chain(&Namespace::model("m"), &tokens.collect::<Vec<_>>())
}

/// Waits until the subscriber has seen `n` batches in all.
async fn until_batches(sub: &Subscriber, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sub.stream_stats().batches < n {
        assert!(
            Instant::now() < deadline,
            "only {:?} after 10 s, expected {n} batches",
            sub.stream_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the last one apply.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// `cpu_medium`: vLLM says `CPU`, SGLang `CPU_PINNED`.
async fn scenario(encoding: &str, layout: &str, cpu_medium: &str) {
    let mut publisher = Publisher::start(&[
        "--pods",
        "2",
        "--encoding",
        encoding,
        "--replay-layout",
        layout,
        "--buffer",
        "4",
    ]);
    let index = Index::<4>::new(IndexConfig::default());
    let a = index.join(&PodKey::new("engine-a", 0)).unwrap();
    let b = index.join(&PodKey::new("engine-b", 0)).unwrap();
    let sub = Subscriber::new(
        Arc::new(ChainHasher::new(4).unwrap()),
        index.clone(),
        index.clone(),
        Some("m".into()),
        4,
    );
    for (pod, (ep, replay)) in [a, b].into_iter().zip(publisher.endpoints.clone()) {
        sub.add(PodStream::new(pod, ep).replay(replay).topic("kv-events"));
    }
    // The slow joiner: wait until a probe batch arrives on both streams.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sub.stream_stats().batches < 2 {
        assert!(Instant::now() < deadline, "the subscriber never connected");
        for pod in 0..2 {
            publisher.send(json!({"op": "batch", "pod": pod, "events": []}));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Probes sent before the subscription took effect were lost before any
    // sequence number was expected: not gaps. Settle on a clean count.
    let base = sub.stream_stats().batches;
    let gaps0 = sub.stream_stats().gaps;

    // Phase 1: stores, duplicates, a CPU copy, removals, a clear.
    let p = |pod: usize, events: Vec<Value>| json!({"op": "batch", "pod": pod, "events": events});
    publisher.send(p(0, vec![stored(&[101, 102], None, 1..9)]));
    publisher.send(p(
        0,
        vec![
            stored(&[103], Some(102), 9..13),
            stored(&[101, 102], None, 1..9),
        ],
    ));
    publisher.send(p(
        1,
        vec![
            stored(&[201, 202], None, 1..9),
            json!({"kind": "removed", "hashes": [202]}),
        ],
    ));
    publisher.send(p(0, vec![json!({"kind": "stored", "hashes": [101], "parent": null, "tokens": [1, 2, 3, 4], "block_size": 4, "medium": cpu_medium})]));
    publisher.send(p(
        1,
        vec![json!({"kind": "cleared"}), stored(&[211], None, 100..104)],
    ));
    publisher.sync();
    until_batches(&sub, base + 5).await;
    let c1 = chain(1..13);
    assert_eq!(index.match_prefix(&c1).blocks_for(a), 3);
    assert_eq!(
        index.match_prefix(&c1).blocks_for(b),
        0,
        "b's blocks were removed, then cleared"
    );
    assert_eq!(index.match_prefix(&chain(100..104)).blocks_for(b), 1);
    assert_eq!(
        (index.pod_blocks(a), index.pod_blocks(b)),
        (Some(3), Some(1))
    );
    assert_eq!(sub.tier_counts(a), Some(TierCounts([3, 1, 0, 0])));

    // Phase 2: a lost batch, healed by replay.
    publisher.send(json!({"op": "batch", "pod": 0, "events": [stored(&[104], Some(103), 13..17)], "drop": true}));
    publisher.send(p(0, vec![stored(&[105], Some(104), 17..21)]));
    publisher.sync();
    until_batches(&sub, base + 6).await;
    let s = sub.stream_stats();
    assert_eq!((s.gaps - gaps0, s.replayed, s.resets), (1, 1, 0), "{s:?}");
    assert_eq!(index.match_prefix(&chain(1..21)).blocks_for(a), 5);

    // Phase 3: a gap longer than the replay buffer (4): the pod is cleared,
    // then rebuilds from new events.
    for i in 0..6u64 {
        publisher.send(json!({"op": "batch", "pod": 1, "events": [stored(&[300 + i], None, 300..304)], "drop": true}));
    }
    publisher.send(p(1, vec![stored(&[311], None, 200..204)]));
    publisher.sync();
    until_batches(&sub, base + 7).await;
    let s = sub.stream_stats();
    assert_eq!(s.resets, 1, "{s:?}");
    assert_eq!(
        index.match_prefix(&chain(100..104)).blocks_for(b),
        0,
        "stale state was dropped"
    );
    assert_eq!(index.match_prefix(&chain(200..204)).blocks_for(b), 1);
    assert_eq!(index.pod_blocks(b), Some(1));

    // Phase 4: garbage payloads and frame counts are counted; the stream stays up.
    publisher.send(json!({"op": "raw", "pod": 0, "payload_hex": "93cb3ff8000000000000dd7fffffff"}));
    publisher.send(json!({"op": "frames", "pod": 0, "frames_hex": ["6b762d6576656e7473", "00"]}));
    publisher.send(p(0, vec![stored(&[106], Some(105), 21..25)]));
    publisher.sync();
    until_batches(&sub, base + 9).await;
    let s = sub.stream_stats();
    assert_eq!((s.decode_errors, s.bad_frames), (1, 1), "{s:?}");
    assert_eq!(index.match_prefix(&chain(1..25)).blocks_for(a), 6);

    // The gateway reports pod a down: it leaves the index.
    sub.pod_down(a);
    assert_eq!(index.match_prefix(&chain(1..25)).blocks_for(a), 0);
    assert_eq!(sub.pods(), vec![b]);
}

#[tokio::test]
async fn vllm_map_encoding_with_the_newer_replay_layout() {
    scenario("map", "new", "CPU").await;
}

#[tokio::test]
async fn vllm_array_encoding_with_the_older_replay_layout() {
    scenario("array", "old", "CPU").await;
}

#[tokio::test]
async fn sglang_map_encoding_with_its_medium_names() {
    scenario("map", "new", "CPU_PINNED").await;
}

/// Waits until `f` holds (10 s at most), sending `nudge` meanwhile.
async fn until(what: &str, mut f: impl FnMut() -> bool, mut nudge: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "after 10 s: {what}");
        nudge();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_warm_engine_is_learned_at_start_and_a_restarted_one_is_cleared() {
    let mut publisher = Publisher::start(&["--pods", "1"]);
    let (ep, replay) = publisher.endpoints[0].clone();
    // A warm engine: it cached a chain before the router started (the live
    // batches reached nobody; its replay buffer holds them).
    let p = |events: Vec<Value>| json!({"op": "batch", "pod": 0, "events": events});
    publisher.send(p(vec![stored(&[101, 102], None, 1..9)]));
    publisher.send(p(vec![stored(&[103], Some(102), 9..13)]));
    publisher.sync();

    let index = Index::<4>::new(IndexConfig::default());
    let a = index.join(&PodKey::new("engine-a", 0)).unwrap();
    let sub = Subscriber::new(
        Arc::new(ChainHasher::new(4).unwrap()),
        index.clone(),
        index.clone(),
        Some("m".into()),
        4,
    );
    sub.add(PodStream::new(a, ep).replay(replay).topic("kv-events"));
    until(
        "the start-up replay",
        || index.pod_blocks(a) == Some(3),
        || {},
    )
    .await;
    assert_eq!(index.match_prefix(&chain(1..13)).blocks_for(a), 3);
    assert_eq!(sub.stream_stats().recovered, 2, "{:?}", sub.stream_stats());

    // Live batches continue the sequence.
    publisher.send(p(vec![stored(&[104], Some(103), 13..17)]));
    publisher.sync();
    until("a live batch", || index.pod_blocks(a) == Some(4), || {}).await;

    // The pod was unhealthy and answers again: the same engine, whose
    // buffer still holds the last batch applied. Nothing is cleared.
    assert!(sub.recheck(a));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = sub.stream_stats();
    assert_eq!((s.restarts, s.resets, s.stale), (0, 0, 0), "{s:?}");
    assert_eq!(index.pod_blocks(a), Some(4));

    // The engine restarts (new publisher, sequence from 0, empty cache) and
    // stores a new chain: the old record goes when the connection is made
    // again (the new buffer lacks the last batch applied) or at its first
    // batch (the sequence went backwards on a newer batch), whichever
    // comes first.
    publisher.send(json!({"op": "restart", "pod": 0}));
    publisher.sync();
    until(
        "the restart is seen",
        || sub.stream_stats().restarts == 1,
        || {
            publisher.send(p(vec![stored(&[501], None, 500..504)]));
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        index.match_prefix(&chain(1..17)).blocks_for(a),
        0,
        "nothing of the old engine's cache is routed on"
    );
    assert_eq!(index.match_prefix(&chain(500..504)).blocks_for(a), 1);
    assert_eq!(index.pod_blocks(a), Some(1));

    // It restarts again while unhealthy and caches a chain no live batch
    // carried: on its return, the recheck finds a different engine, clears
    // the pod and refills it from the new engine's buffer.
    publisher.send(json!({"op": "restart", "pod": 0}));
    publisher.send(
        json!({"op": "batch", "pod": 0, "events": [stored(&[601], None, 600..604)], "drop": true}),
    );
    publisher.sync();
    assert!(sub.recheck(a));
    until(
        "the recheck sees the second restart",
        || sub.stream_stats().restarts == 2,
        || {},
    )
    .await;
    until(
        "the new engine's buffer is applied",
        || index.match_prefix(&chain(600..604)).blocks_for(a) == 1,
        || {},
    )
    .await;
    assert_eq!(index.match_prefix(&chain(500..504)).blocks_for(a), 0);
    assert_eq!(index.pod_blocks(a), Some(1));
}
