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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_starting_until_probed_and_counts_only_answering_pods() {
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
model = "{}"
tokenizer = "../../assets/tokenizers/qwen3"
health_interval_ms = 300
unhealthy_after = 5

[[pods]]
name = "dead-0"
url = "http://127.0.0.1:1"

[[pods]]
name = "dead-1"
url = "http://127.0.0.1:2"
"#,
        crate::MODEL
    );
    let config =
        router_gateway::Config::parse(&text, std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    let gw = router_sim_engine::SimGateway::start(config).await.unwrap();
    let health = || async {
        let r = client()
            .get(format!("{}/health", gw.url()))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    };
    let (status, body) = health().await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["status"] == "starting" || body["status"] == "unavailable",
        "{body}"
    );
    // After the first round: both dead pods failed once (still routable,
    // unhealthy_after = 5) but neither counts as healthy.
    crate::eventually(Duration::from_secs(5), "the first probe round", || async {
        health().await.1["status"] == "unavailable"
    })
    .await;
    let (status, body) = health().await;
    assert_eq!(
        (status, body["healthy_pods"].as_u64()),
        (503, Some(0)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_by_the_header_and_body_timeouts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = gateway(1, "header_timeout_ms = 400\nbody_timeout_ms = 400", "").await;
    let addr = gw.addr();
    // Reads until the server closes (0 bytes or an error), or 5 s.
    async fn closed_within(s: &mut tokio::net::TcpStream) -> (Duration, String) {
        let start = std::time::Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => panic!("the connection was still open after 5 s"),
            }
        }
        (start.elapsed(), String::from_utf8_lossy(&got).into_owned())
    }

    // An idle connection that never sends a request.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (after, _) = closed_within(&mut idle).await;
    assert!(after < Duration::from_secs(3), "{after:?}");

    // Headers trickled a byte at a time, never finished.
    let mut trickle = tokio::net::TcpStream::connect(addr).await.unwrap();
    trickle
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..50 {
            if trickle.write_all(b"X").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    assert!(
        writer.await.unwrap(),
        "the server kept reading trickled headers for 5 s"
    );

    // A body declared at 1000 bytes that stops after 10: a 408.
    let mut short = tokio::net::TcpStream::connect(addr).await.unwrap();
    short
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":")
        .await
        .unwrap();
    let (after, answer) = closed_within(&mut short).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(after < Duration::from_secs(3), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_input_is_validated_normalised_and_guarded_by_the_token() {
    let gw = gateway(1, "admin_token = \"s3cret\"", "").await;
    let http = client();
    let url = format!("{}/admin/pods", gw.url());
    let post_pod = |pod: Value, token: Option<&'static str>| {
        let mut r = http.post(&url).json(&pod);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    // No token, a wrong one: 401 with OpenAI's error shape.
    for token in [None, Some("wrong")] {
        let (status, body) =
            post_pod(json!({"name": "a", "url": "http://127.0.0.1:9"}), token).await;
        assert_eq!(status, 401, "{body}");
        assert_error_shape(&body, "invalid_request_error");
    }
    let listed = http.get(&url).send().await.unwrap();
    assert_eq!(listed.status(), 401);
    // Bad names and URLs: 400 naming the problem; nothing was added.
    let long = "n".repeat(100_000);
    // https:// is refused only where no TLS is built in.
    let https = json!({"name": "a", "url": "https://10.0.0.1:8000"});
    let https = (!cfg!(feature = "rustls")).then_some((https, "https"));
    for (pod, what) in [
        (json!({"name": "", "url": "http://127.0.0.1:9"}), "pod name"),
        (
            json!({"name": "a\nb", "url": "http://127.0.0.1:9"}),
            "pod name",
        ),
        (
            json!({"name": long, "url": "http://127.0.0.1:9"}),
            "pod name",
        ),
        (json!({"name": "a", "url": "http://"}), "url"),
        (json!({"name": "a", "url": "ftp://10.0.0.1"}), "scheme"),
        (
            json!({"name": "a", "url": "http://127.0.0.1:9", "events": "tcp://not a host:99999"}),
            "event endpoint",
        ),
        (
            json!({"name": "a", "url": "http://127.0.0.1:9", "events": "tcp://127.0.0.1"}),
            "event endpoint",
        ),
    ]
    .into_iter()
    .chain(https)
    {
        let (status, body) = post_pod(pod.clone(), Some("s3cret")).await;
        assert_eq!(status, 400, "{pod}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{message}");
        assert!(!message.contains('\n'), "the name is escaped: {message}");
        assert!(
            message.len() < 1000,
            "the name is cut: {} bytes",
            message.len()
        );
    }
    assert_eq!(gw.pods().len(), 1);
    // A URL is normalised: the same engine with a trailing `/` or another
    // case is a conflict, not a second pod.
    let (status, _) = post_pod(
        json!({"name": "extra", "url": "http://LOCALHOST:9/"}),
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, 201);
    assert!(
        gw.pods()
            .iter()
            .any(|p| p.config.url == "http://localhost:9")
    );
    let (status, body) = post_pod(
        json!({"name": "extra2", "url": "http://localhost:9"}),
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = post_pod(
        json!({"name": "extra", "url": "http://127.0.0.1:10"}),
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    // An oversized admin body: a JSON 413. (Its own client: the gateway
    // answers without reading the body and closes that connection, which a
    // pooled client could otherwise pick for the next call.)
    let big = client()
        .put(&url)
        .bearer_auth("s3cret")
        .header("content-type", "application/json")
        .body(vec![b' '; 3 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    assert_error_shape(&big.json::<Value>().await.unwrap(), "invalid_request_error");
    let removed = http
        .delete(format!("{url}/extra"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_over_the_context_limit_are_refused_as_vllm_refuses_them() {
    let gw = gateway(1, "max_prompt_tokens = 100\nmax_body_bytes = 8388608", "").await;
    let completion = |prompt: String, max_tokens: u64| json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens});
    // 3 MB of text: refused before it is tokenized (its bytes alone show it).
    let huge = post(
        &gw,
        "/v1/completions",
        &completion("word ".repeat(600_000), 4),
    )
    .await;
    assert_eq!(huge.status, 400, "{:?}", huge.body);
    assert_eq!(huge.body["error"]["code"], "context_length_exceeded");
    assert!(
        huge.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at least")
    );
    // Over the limit once tokenized.
    let long = post(
        &gw,
        "/v1/completions",
        &completion(system_prompt(5, 150), 4),
    )
    .await;
    assert_eq!(long.status, 400, "{:?}", long.body);
    assert!(
        long.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in the prompt")
    );
    // Under it, but not with what it asks for.
    let short = system_prompt(6, 20);
    let asks = post(&gw, "/v1/completions", &completion(short.clone(), 90)).await;
    assert_eq!(asks.status, 400, "{:?}", asks.body);
    let fine = post(&gw, "/v1/completions", &completion(short, 4)).await;
    assert_eq!(fine.status, 200, "{:?}", fine.body);
    assert_no_load_leaked(&gw).await;
}
