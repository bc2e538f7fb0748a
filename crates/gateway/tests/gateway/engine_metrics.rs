//! Engines' own reports: the simulated engines serve vLLM's `/metrics`,
//! the gateway reads each pod's capacity from it (what bounds its
//! speculative registrations) and counts an unreadable one.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{client, config, eventually, gateway, scrape, value};

#[tokio::test]
async fn the_gateway_learns_each_pods_capacity_from_its_engines_metrics() {
    let gw = gateway(2, "", "gpu_blocks = 512").await;
    // The engines speak vLLM's names.
    for pod in gw.engines() {
        let text = client()
            .get(format!("{}/metrics", pod.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let m = router_events::parse_engine_metrics(&text).unwrap();
        assert_eq!((m.gpu_blocks, m.block_size), (Some(512), Some(16)));
        assert_eq!(
            (m.running, m.waiting, m.kv_usage),
            (Some(0), Some(0), Some(0.0))
        );
    }
    eventually(Duration::from_secs(5), "both capacities read", || async {
        let s = scrape(&gw).await;
        value(&s, "cache_router_pod_kv_blocks_total", &[]) == 1024.0
    })
    .await;
    let s = scrape(&gw).await;
    assert_eq!(
        value(&s, "cache_router_engine_metrics_errors_total", &[]),
        0.0
    );
}

/// A pod whose `/health` answers and whose `/metrics` is `body`.
async fn engine_with_metrics(body: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let text = if req.starts_with("GET /metrics") {
                    body
                } else {
                    ""
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = sock.write_all(reply.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test]
async fn an_unreadable_metrics_answer_is_counted_and_the_pod_stays_routable() {
    let bad = engine_with_metrics("vllm:num_requests_waiting lots\n").await;
    let good = engine_with_metrics(
        "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\"} 1.0\n",
    )
    .await;
    let cfg = config(&format!(
        "\n[[pods]]\nname = \"bad\"\nurl = \"{bad}\"\n\n[[pods]]\nname = \"good\"\nurl = \"{good}\"\n"
    ));
    let gw = router_sim_engine::SimGateway::start(cfg).await.unwrap();
    eventually(Duration::from_secs(5), "two bad reads counted", || async {
        value(
            &scrape(&gw).await,
            "cache_router_engine_metrics_errors_total",
            &[],
        ) >= 2.0
    })
    .await;
    let s = scrape(&gw).await;
    // 100 blocks of 32 tokens are 200 of the gateway's 16-token blocks.
    assert_eq!(
        value(&s, "cache_router_pod_kv_blocks_total", &[("pod", "good")]),
        200.0
    );
    assert_eq!(
        value(&s, "cache_router_pod_kv_blocks_total", &[("pod", "bad")]),
        0.0
    );
    assert_eq!(
        value(&s, "cache_router_pod_healthy", &[("pod", "bad")]),
        1.0
    );
}
