//! Bad requests get their status and OpenAI's error shape; none leaks a
//! load counter; `/metrics` counts exactly what was sent.

use serde_json::json;

use super::*;

async fn raw(gw: &Gateway, path: &str, body: Vec<u8>) -> (u16, Value) {
    let r = client()
        .post(format!("{}{path}", gw.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// OpenAI's error shape.
fn assert_error_shape(v: &Value, kind: &str) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert_eq!(e["type"], kind, "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_their_status_codes_and_metrics_count_them() {
    let gw = gateway(2, "max_body_bytes = 65536", "time_scale = 0.1").await;
    let good = |i: u32| json!({"model": MODEL, "prompt": format!("hello {i}"), "max_tokens": 2});

    let mut sent_ok = 0;
    for i in 0..3 {
        let a = post(&gw, "/v1/completions", &good(i)).await;
        assert_eq!(a.status, 200);
        sent_ok += 1;
    }
    let (s, v) = raw(&gw, "/v1/completions", vec![b' '; 70_000]).await;
    assert_eq!(s, 413);
    assert_error_shape(&v, "invalid_request_error");
    let (s, v) = raw(&gw, "/v1/chat/completions", b"{\"model\": ".to_vec()).await;
    assert_eq!(s, 400);
    assert_error_shape(&v, "invalid_request_error");
    let (s, v) = raw(&gw, "/v1/chat/completions", b"[1, 2]".to_vec()).await;
    assert_eq!(s, 400);
    assert_error_shape(&v, "invalid_request_error");
    let (s, v) = raw(
        &gw,
        "/v1/chat/completions",
        serde_json::to_vec(&json!({"model": MODEL})).unwrap(),
    )
    .await;
    assert_eq!(s, 400, "no messages");
    assert_eq!(v["error"]["param"], "messages");
    let (s, v) = raw(
        &gw,
        "/v1/completions",
        serde_json::to_vec(&json!({"model": MODEL, "prompt": [1, -2]})).unwrap(),
    )
    .await;
    assert_eq!(s, 400, "negative token id");
    assert_eq!(v["error"]["param"], "prompt");
    let (s, v) = raw(
        &gw,
        "/v1/completions",
        serde_json::to_vec(&json!({"model": "gpt-9", "prompt": "x"})).unwrap(),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
    let (s, v) = raw(&gw, "/v1/embeddings", b"{}".to_vec()).await;
    assert_eq!(s, 404);
    assert_error_shape(&v, "invalid_request_error");

    // /metrics parses as Prometheus text and counts exactly these.
    let m = scrape(&gw).await;
    let count = |endpoint: &str, status: &str| {
        value(
            &m,
            "cache_router_requests_total",
            &[("endpoint", endpoint), ("status", status)],
        )
    };
    assert_eq!(count("completions", "200"), f64::from(sent_ok));
    assert_eq!(count("completions", "413"), 1.0);
    assert_eq!(count("chat", "400"), 3.0);
    assert_eq!(count("completions", "400"), 1.0);
    assert_eq!(count("completions", "404"), 1.0);
    for (kind, n) in [
        ("body_too_large", 1.0),
        ("bad_request", 4.0),
        ("unknown_model", 1.0),
    ] {
        assert_eq!(
            value(&m, "cache_router_errors_total", &[("kind", kind)]),
            n,
            "{kind}"
        );
    }
    assert_eq!(value(&m, "cache_router_decision_seconds_count", &[]), 3.0);
    assert_eq!(
        value(&m, "cache_router_index_query_seconds_count", &[]),
        3.0
    );
    assert_no_load_leaked(&gw).await;

    // No pod left: 503.
    let r = client()
        .put(format!("{}/admin/pods", gw.url()))
        .json(&json!([]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let a = post(&gw, "/v1/completions", &good(9)).await;
    assert_eq!(a.status, 503);
    assert_error_shape(&a.body, "service_unavailable");
    let health = client()
        .get(format!("{}/health", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_slower_than_the_deadline_is_a_504_without_leaks() {
    // Prefill of ~2000 tokens at 20x the modelled time: over a second.
    let gw = gateway(
        2,
        "request_timeout_ms = 150\nmax_attempts = 2",
        "time_scale = 20.0",
    )
    .await;
    let long = system_prompt(5, 1500);
    for stream in [false, true] {
        let body = json!({"model": MODEL, "prompt": long, "max_tokens": 2, "stream": stream});
        let (s, v) = raw(&gw, "/v1/completions", serde_json::to_vec(&body).unwrap()).await;
        assert_eq!(s, 504, "stream={stream}: {v}");
        assert_error_shape(&v, "timeout");
    }
    let m = scrape(&gw).await;
    assert_eq!(
        value(&m, "cache_router_errors_total", &[("kind", "timeout")]),
        2.0
    );
    assert_no_load_leaked(&gw).await;
    let models: Value = client()
        .get(format!("{}/v1/models", gw.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
}
