//! router-service's `Router` as a front uses it, over simulated engines
//! (real HTTP servers and real vLLM-format ZeroMQ events on loopback):
//! `pick` for a front that sends the request itself, `route` for one that
//! proxies, refusals, and the load a pick holds.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use router_exec::Chunk;
use router_service::{Api, Config, Request, Router};
use serde_json::{Value, json};

const MODEL: &str = "Qwen/Qwen3-0.6B";

/// A router over `engines` simulated engines, `extra` lines under
/// `[gateway]`; the engines live as long as the router is used.
async fn router(engines: usize, extra: &str) -> (Router, Vec<router_sim_engine::SimEngine>) {
    let text = format!(
        "[gateway]\nmodel = \"{MODEL}\"\ntokenizer = \"../../assets/tokenizers/qwen3\"\n\
         health_interval_ms = 100\n{extra}\n\n[simulated]\nengines = {engines}\ntime_scale = 0.1\n"
    );
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config = Config::parse(&text, base).expect("valid config");
    let sims = router_sim_engine::start_engines(&mut config).expect("engines start");
    (Router::start(config).await.expect("router starts"), sims)
}

fn long_chat(topic: u32, words: usize) -> Request {
    let system: String = (0..words)
        .map(|i| format!("w{topic}x{} ", i % 97))
        .collect();
    Request::chat(MODEL, [("system", system.as_str()), ("user", "Summarise.")]).with_max_tokens(8)
}

/// Sends the request a pick chose, as an endpoint picker's proxy would;
/// the engine's reported cached tokens.
async fn send(url: &str, request: &Request) -> u64 {
    let reply: Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{url}{}", request.api().path()))
        .json(request.body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    reply
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

fn gauge(text: &str, name: &str, pod: &str) -> Option<f64> {
    let want = format!("{name}{{pod=\"{pod}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_finds_the_pod_holding_the_prefix_and_holds_its_load_until_dropped() {
    let (router, _engines) = router(4, "").await;
    let first = router.pick(long_chat(1, 400)).await.expect("a pod");
    assert_eq!(first.predicted_cached_tokens, 0, "nothing cached yet");
    let home = first.pod.clone();
    let text = router.metrics_text();
    assert_eq!(gauge(&text, "cache_router_pod_in_flight", &home), Some(1.0));
    send(&first.url, &long_chat(1, 400)).await;
    first.finish(true);
    assert_eq!(
        gauge(&router.metrics_text(), "cache_router_pod_in_flight", &home),
        Some(0.0),
        "a finished pick gives its load back"
    );
    // The engine's events reach the index; the same prefix then goes home.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut next = router.pick(long_chat(1, 400)).await.unwrap();
    while next.predicted_cached_tokens == 0 && Instant::now() < deadline {
        drop(next);
        tokio::time::sleep(Duration::from_millis(50)).await;
        next = router.pick(long_chat(1, 400)).await.unwrap();
    }
    assert_eq!(next.pod, home);
    assert!(next.predicted_cached_tokens >= 400, "{next:?}");
    let cached = send(&next.url, &long_chat(1, 400)).await;
    assert_eq!(
        cached, next.predicted_cached_tokens,
        "the prediction is what the engine reports"
    );
    let mut next = next;
    next.first_token();
    next.cached_tokens(cached);
    drop(next);
    assert_eq!(
        gauge(&router.metrics_text(), "cache_router_pod_in_flight", &home),
        Some(0.0),
        "a dropped pick gives its load back too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_among_a_subset_keeps_to_it_and_an_empty_one_is_refused() {
    let (router, _engines) = router(3, "").await;
    let pods = router.pods();
    let only = pods[2].config.url.clone();
    for topic in 0..6 {
        let p = router
            .pick_among(long_chat(topic, 50), |url| url == only)
            .await
            .unwrap();
        assert_eq!(p.url, only);
    }
    let none = router
        .pick_among(long_chat(9, 50), |_| false)
        .await
        .unwrap_err();
    assert_eq!((none.kind, none.error.status), ("no_pod", 503));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_router_cannot_serve_are_refused_with_a_reason() {
    let (router, _engines) = router(2, "max_prompt_tokens = 64").await;
    let other = router
        .pick(Request::completion("another-model", "hi"))
        .await
        .unwrap_err();
    assert_eq!((other.kind, other.error.status), ("unknown_model", 404));
    let long = router.pick(long_chat(0, 200)).await.unwrap_err();
    assert_eq!((long.kind, long.error.status), ("prompt_too_long", 400));
    let asks = router
        .pick(Request::completion(MODEL, "hi").with_max_tokens(1000))
        .await
        .unwrap_err();
    assert_eq!(asks.kind, "prompt_too_long", "{asks}");
    let bad = Request::from_openai(Api::Chat, br#"{"model": 3, "messages": []}"#).unwrap_err();
    assert_eq!(bad.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_streams_the_engines_answer_and_names_the_pod() {
    let (router, _engines) = router(2, "").await;
    let routed = router
        .route(long_chat(3, 100).streamed(true))
        .await
        .expect("routed");
    assert!(routed.pod.is_some());
    assert_eq!(routed.prefill_pod, None);
    let chunks: Vec<Chunk> = routed.map(Result::unwrap).collect().await;
    assert!(
        chunks.iter().any(|c| matches!(c, Chunk::Data(_))),
        "{chunks:?}"
    );
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, Chunk::Usage { prompt_tokens, .. } if *prompt_tokens >= 100)),
        "the usage the router asked for on a stream arrives: {chunks:?}"
    );
    let whole = router
        .route(Request::completion(MODEL, "Hello"))
        .await
        .unwrap();
    let last: Vec<Chunk> = whole.map(Result::unwrap).collect().await;
    assert!(
        last.iter()
            .any(|c| matches!(c, Chunk::Data(v) if v["object"] == json!("text_completion"))),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_needs_a_workflow_of_one_step() {
    let (router, _engines) = router(2, "workflow = \"prefill-decode\"").await;
    let r = router.pick(long_chat(0, 50)).await.unwrap_err();
    assert!(r.error.message.contains("one step"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_pods_file_is_followed_and_a_broken_one_is_skipped() {
    // Two engines, started apart from the router the file configures.
    let (_, engines) = router(2, "").await;
    let dir = std::env::temp_dir().join(format!("cache-router-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("router.toml");
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/qwen3");
    let write = |pods: &[usize]| {
        let mut text = format!(
            "[gateway]\nmodel = \"{MODEL}\"\ntokenizer = {:?}\nwatch_pods_ms = 50\n",
            tokenizer.display().to_string()
        );
        for &i in pods {
            text.push_str(&format!(
                "\n[[pods]]\nname = \"e{i}\"\nurl = \"{}\"\n",
                engines[i].url()
            ));
        }
        std::fs::write(&file, text).unwrap();
    };
    let names =
        |r: &Router| -> Vec<String> { r.pods().into_iter().map(|p| p.config.name).collect() };
    write(&[0]);
    let watched = Router::start(Config::load(&file).unwrap()).await.unwrap();
    assert_eq!(names(&watched), ["e0"]);
    let wait_for = |want: &'static [&'static str]| {
        let watched = watched.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while names(&watched) != want {
                assert!(
                    Instant::now() < deadline,
                    "pods {:?}, not {want:?}",
                    names(&watched)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // Modification times can be coarse: a different length is a change too.
    write(&[0, 1]);
    wait_for(&["e0", "e1"]).await;
    std::fs::write(&file, "[gateway]\nnot toml at all [[").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        names(&watched),
        ["e0", "e1"],
        "a broken file changes nothing"
    );
    write(&[1]);
    wait_for(&["e1"]).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_pick_decides_as_the_async_one_on_the_callers_thread() {
    let (router, _engines) = router(3, "max_prompt_tokens = 2048").await;
    let router = std::sync::Arc::new(router);
    let first = router.pick(long_chat(2, 300)).await.unwrap();
    send(&first.url, &long_chat(2, 300)).await;
    first.finish(true);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut want = router.pick(long_chat(2, 300)).await.unwrap();
    while want.predicted_cached_tokens == 0 && Instant::now() < deadline {
        drop(want);
        tokio::time::sleep(Duration::from_millis(50)).await;
        want = router.pick(long_chat(2, 300)).await.unwrap();
    }
    let held = want;
    let want = (
        held.pod.clone(),
        held.predicted_cached_tokens,
        held.prompt_tokens,
    );
    held.finish(true);
    assert!(want.1 >= 300, "{want:?}");
    let r = router.clone();
    let (got, other, long) = tokio::task::spawn_blocking(move || {
        let p = r.pick_blocking(long_chat(2, 300)).expect("a pod");
        let got = (p.pod.clone(), p.predicted_cached_tokens, p.prompt_tokens);
        p.finish(true);
        let other = r
            .pick_blocking(Request::completion("another-model", "hi"))
            .unwrap_err();
        let long = r.pick_blocking(long_chat(0, 3000)).unwrap_err();
        (got, other, long)
    })
    .await
    .unwrap();
    assert_eq!(got, want, "the same pod, prediction and prompt");
    assert_eq!((other.kind, other.error.status), ("unknown_model", 404));
    assert_eq!((long.kind, long.error.status), ("prompt_too_long", 400));
    assert_eq!(
        gauge(
            &router.metrics_text(),
            "cache_router_pod_in_flight",
            &want.0
        ),
        Some(0.0),
        "a finished blocking pick gives its load back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_salt_hashes_the_request_in_a_namespace_of_its_own() {
    let (router, _engines) = router(1, "").await;
    let plain = long_chat(5, 400);
    let first = router.pick(plain.clone()).await.expect("a pod");
    send(&first.url, &plain).await;
    first.finish(true);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = router.pick(plain.clone()).await.unwrap();
    while again.predicted_cached_tokens == 0 && Instant::now() < deadline {
        drop(again);
        tokio::time::sleep(Duration::from_millis(50)).await;
        again = router.pick(plain.clone()).await.unwrap();
    }
    assert!(again.predicted_cached_tokens >= 400, "{again:?}");
    drop(again);
    // vLLM keys a salted request's blocks by its salt: another tenant's
    // identical prompt meets nothing of it.
    let mut body = plain.body().clone();
    body["cache_salt"] = json!("tenant-a");
    let salted = Request::from_json(Api::Chat, body).unwrap();
    let p = router.pick(salted).await.unwrap();
    assert_eq!(p.predicted_cached_tokens, 0, "{p:?}");
}
