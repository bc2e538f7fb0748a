//! State that survives: an engine restarted under the gateway, and a
//! gateway restarted over warm engines.

use std::time::Duration;

use router_gateway::{Config, Gateway, PodConfig};
use router_sim_engine::{EngineConfig, SimEngine, SimGateway};
use serde_json::{Value, json};

use crate::{MODEL, chat, eventually, post, post_settled, qwen3, scrape, system_prompt, value};

fn blocks_of(gw: &Gateway, name: &str) -> u64 {
    gw.pods()
        .iter()
        .find(|p| p.config.name == name)
        .map_or(0, |p| p.blocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_is_seen_empty_and_nothing_stale_is_routed_on() {
    let mut gw = crate::gateway(2, "", "").await;
    let messages = [
        json!({"role": "system", "content": system_prompt(41, 300)}),
        json!({"role": "user", "content": "What is in the cache?"}),
    ];
    let first = post_settled(&gw, "/v1/chat/completions", &chat(&messages)).await;
    assert_eq!(first.status, 200);
    let home = first.pod.clone().unwrap();
    eventually(Duration::from_secs(5), "the home pod's blocks", || async {
        blocks_of(&gw, &home) > 0
    })
    .await;
    let id_before = gw
        .pods()
        .into_iter()
        .find(|p| p.config.name == home)
        .unwrap()
        .id;

    // The engine restarts on the same addresses, faster than the probes
    // (100 ms interval, two failures to filter it).
    let slot: usize = home.trim_start_matches("sim-").parse().unwrap();
    gw.engines_mut()[slot].restart().unwrap();
    eventually(
        Duration::from_secs(5),
        "the restarted pod is seen empty",
        || async { blocks_of(&gw, &home) == 0 },
    )
    .await;
    let s = scrape(&gw).await;
    assert!(value(&s, "cache_router_engine_restarts_total", &[]) >= 1.0);
    assert_eq!(
        value(
            &s,
            "cache_router_events_skipped_total",
            &[("reason", "stale_batch")]
        ),
        0.0,
        "a restart is not read as stale traffic"
    );

    // The same conversation again: whatever it is routed to, the prediction
    // is what the engine reports (nothing stale is routed on).
    let again = post(&gw, "/v1/chat/completions", &chat(&messages)).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(
        again.predicted, again.cached,
        "predicted {} against {} cached",
        again.predicted, again.cached
    );
    // The pod kept its id: the restart cleared its record, not its place.
    let view = gw
        .pods()
        .into_iter()
        .find(|p| p.config.name == home)
        .unwrap();
    assert_eq!(view.id, id_before);
    assert!(view.healthy && view.in_index);
}

/// A gateway's configuration over `engines` started by the test, with
/// `extra` TOML after the `[gateway]` table (for example a `[nats]` one).
pub(crate) fn config_over(engines: &[SimEngine], extra: &str) -> Config {
    let mut config = crate::config(extra);
    for (i, e) in engines.iter().enumerate() {
        let mut pod = PodConfig::new(format!("e{i}"), e.url())
            .with_events(e.events_endpoint(), Some(e.replay_endpoint().to_owned()));
        pod.topic = "kv-events".into();
        config.pods.push(pod);
    }
    config
}

/// `n` simulated engines publishing on topic `kv-events`.
pub(crate) fn engines(n: usize) -> Vec<SimEngine> {
    (0..n)
        .map(|_| {
            let mut c = EngineConfig::new(MODEL, qwen3());
            c.topic = "kv-events".into();
            SimEngine::start(c).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_knows_what_warm_engines_hold() {
    let engines = engines(2);
    let conversations: Vec<Vec<Value>> = (0..4)
        .map(|i| {
            vec![
                json!({"role": "system", "content": system_prompt(60 + i, 200)}),
                json!({"role": "user", "content": "Hello?"}),
            ]
        })
        .collect();
    let first = SimGateway::start(config_over(&engines, "")).await.unwrap();
    for c in &conversations {
        assert_eq!(
            post_settled(&first, "/v1/chat/completions", &chat(c))
                .await
                .status,
            200
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held: Vec<u64> = (0..2)
        .map(|i| blocks_of(&first, &format!("e{i}")))
        .collect();
    assert!(held.iter().sum::<u64>() > 0, "{held:?}");
    drop(first);

    // A new gateway over the same warm engines knows their caches before
    // any request (the start-up replay), and predicts them exactly.
    let second = SimGateway::start(config_over(&engines, "")).await.unwrap();
    eventually(
        Duration::from_secs(5),
        "the warm caches are known",
        || async {
            (0..2)
                .map(|i| blocks_of(&second, &format!("e{i}")))
                .collect::<Vec<_>>()
                == held
        },
    )
    .await;
    for c in &conversations {
        let a = post(&second, "/v1/chat/completions", &chat(c)).await;
        assert_eq!(a.status, 200);
        assert!(
            a.cached > 0,
            "the conversation's prefix is cached somewhere"
        );
        assert_eq!(
            a.predicted, a.cached,
            "routed onto its cached prefix, predicted exactly"
        );
    }
}
