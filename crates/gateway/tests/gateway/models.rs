//! LoRA adapters, cache salts and several models behind one gateway, end
//! to end against simulated engines that serve them as vLLM does (an
//! adapter's blocks hashed and published under its name, a salt on the
//! first block, a 404 for a model the engine does not serve).

use std::path::Path;

use router_gateway::{Config, Gateway, PodConfig};
use router_sim_engine::{EngineConfig, SimEngine};
use serde_json::{Value, json};

use crate::{MODEL, chat, client, post, post_settled, qwen3, system_prompt};

const GPT2: &str = "openai-community/gpt2";

fn gpt2() -> std::sync::Arc<router_hash::ModelTokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/gpt2");
    std::sync::Arc::new(router_hash::ModelTokenizer::from_dir(dir).unwrap())
}

fn engine(ec: EngineConfig) -> SimEngine {
    let mut ec = ec.time_scale(0.05);
    ec.topic = "kv-events".into();
    SimEngine::start(ec).unwrap()
}

fn pod(name: &str, e: &SimEngine) -> PodConfig {
    let mut p = PodConfig::new(name, e.url())
        .with_events(e.events_endpoint(), Some(e.replay_endpoint().to_owned()));
    p.topic = "kv-events".into();
    p
}

async fn start(text: &str, pods: Vec<PodConfig>) -> Gateway {
    let mut cfg = Config::parse(text, Path::new(env!("CARGO_MANIFEST_DIR"))).expect("valid config");
    for p in pods {
        cfg.add_fixed_pod(p);
    }
    Gateway::start(cfg).await.expect("gateway starts")
}

fn with_model(mut body: Value, model: &str) -> Value {
    body["model"] = json!(model);
    body
}

async fn models_listed(gw: &Gateway) -> Vec<(String, Value)> {
    let r = client()
        .get(format!("{}/v1/models", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_owned(), m["parent"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_adapters_go_to_the_pods_serving_them_and_hash_apart() {
    let with = engine(EngineConfig::new(MODEL, qwen3()).adapters(["sql-lora"]));
    let without = engine(EngineConfig::new(MODEL, qwen3()));
    let gw = start(
        &format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\n\
             tokenizer = \"../../assets/tokenizers/qwen3\"\nhealth_interval_ms = 100\n"
        ),
        vec![
            pod("lora-0", &with).with_adapters(["sql-lora"]),
            pod("base-0", &without),
        ],
    )
    .await;
    let messages = [
        json!({"role": "system", "content": system_prompt(3, 200)}),
        json!({"role": "user", "content": "List the tables."}),
    ];
    let lora = with_model(chat(&messages), "sql-lora");
    for i in 0..3 {
        let r = post_settled(&gw, "/v1/chat/completions", &lora).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.pod.as_deref(), Some("lora-0"), "request {i}");
        assert_eq!(r.body["model"], "sql-lora");
        assert_eq!(r.predicted, r.cached, "request {i}: {:?}", r.body);
        if i > 0 {
            assert!(r.cached > 0, "the adapter's prompt is cached again");
        }
    }
    // The same prompt on the base model: other hashes, nothing cached, and
    // the router does not predict the adapter's blocks for it.
    let r = post_settled(&gw, "/v1/chat/completions", &chat(&messages)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!((r.predicted, r.cached), (0, 0), "{:?}", r.body);

    let r = post(
        &gw,
        "/v1/chat/completions",
        &with_model(chat(&messages), "no-such-lora"),
    )
    .await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(r.body["error"]["code"], "model_not_found");

    let listed = models_listed(&gw).await;
    assert_eq!(
        listed,
        vec![
            (MODEL.to_owned(), Value::Null),
            ("sql-lora".to_owned(), json!(MODEL))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_salts_hash_apart_on_the_engines_and_in_the_router() {
    let e = engine(EngineConfig::new(MODEL, qwen3()));
    let gw = start(
        &format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\n\
             tokenizer = \"../../assets/tokenizers/qwen3\"\nhealth_interval_ms = 100\n"
        ),
        vec![pod("sim-0", &e)],
    )
    .await;
    let messages = [json!({"role": "user", "content": system_prompt(5, 200)})];
    let salted = |salt: &str| {
        let mut b = chat(&messages);
        b["cache_salt"] = json!(salt);
        b
    };
    let first = post_settled(&gw, "/v1/chat/completions", &salted("tenant-a")).await;
    assert_eq!((first.predicted, first.cached), (0, 0));
    let again = post_settled(&gw, "/v1/chat/completions", &salted("tenant-a")).await;
    assert!(again.cached > 0, "{:?}", again.body);
    assert_eq!(again.predicted, again.cached);
    for other in [salted("tenant-b"), chat(&messages)] {
        let r = post_settled(&gw, "/v1/chat/completions", &other).await;
        assert_eq!((r.predicted, r.cached), (0, 0), "{:?}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_models_each_with_its_tokenizer_block_size_and_pods() {
    let qwen = engine(EngineConfig::new(MODEL, qwen3()));
    let g0 = engine(EngineConfig::new(GPT2, gpt2()).block_size(40));
    let g1 = engine(EngineConfig::new(GPT2, gpt2()).block_size(40));
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\n\
         tokenizer = \"../../assets/tokenizers/qwen3\"\nhealth_interval_ms = 100\n\n\
         [[models]]\nname = \"{GPT2}\"\ntokenizer = \"../../assets/tokenizers/gpt2\"\n\
         block_size = 40\nmax_prompt_tokens = 1024\n"
    );
    let gw = start(
        &text,
        vec![
            pod("qwen-0", &qwen),
            pod("gpt2-0", &g0).with_model(GPT2),
            pod("gpt2-1", &g1).with_model(GPT2),
        ],
    )
    .await;
    let prompt = system_prompt(9, 300);
    let completion = json!({"model": GPT2, "prompt": prompt, "max_tokens": 4});
    let mut served = Vec::new();
    for i in 0..3 {
        let r = post_settled(&gw, "/v1/completions", &completion).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let pod = r.pod.clone().unwrap();
        assert!(pod.starts_with("gpt2-"), "request {i} went to {pod}");
        // Exact only when the router hashes with gpt2's tokenizer and
        // 40-token blocks (a size the gateway's 16 does not divide).
        assert_eq!(r.predicted, r.cached, "request {i}: {:?}", r.body);
        served.push(pod);
    }
    assert!(
        served.windows(2).all(|w| w[0] == w[1]),
        "the cached prefix keeps the prompt on one pod: {served:?}"
    );
    let again = post_settled(&gw, "/v1/completions", &completion).await;
    assert!(again.cached >= 256, "{:?}", again.body);

    let r = post(
        &gw,
        "/v1/chat/completions",
        &chat(&[json!({"role": "user", "content": "hi"})]),
    )
    .await;
    assert_eq!((r.status, r.pod.as_deref()), (200, Some("qwen-0")));
    let r = post(
        &gw,
        "/v1/completions",
        &json!({"model": "gpt-5", "prompt": "hi"}),
    )
    .await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    // Each model's own context limit.
    let long = json!({"model": GPT2, "prompt": system_prompt(1, 1500), "max_tokens": 4});
    let r = post(&gw, "/v1/completions", &long).await;
    assert_eq!(r.status, 400, "{:?}", r.body);

    let listed: Vec<String> = models_listed(&gw).await.into_iter().map(|m| m.0).collect();
    assert_eq!(listed, [MODEL, GPT2]);

    // Pods join their model's set at run time; an unknown model is refused.
    let admin = |p: &PodConfig| {
        client()
            .post(format!("{}/admin/pods", gw.url()))
            .json(p)
            .send()
    };
    let g2 = engine(EngineConfig::new(GPT2, gpt2()).block_size(40));
    let bad = PodConfig::new("odd-0", g2.url()).with_model("no-such-model");
    assert_eq!(admin(&bad).await.unwrap().status(), 400);
    let dup = PodConfig::new("qwen-0", g2.url()).with_model(GPT2);
    assert_eq!(admin(&dup).await.unwrap().status(), 409);
    assert_eq!(
        admin(&pod("gpt2-2", &g2).with_model(GPT2))
            .await
            .unwrap()
            .status(),
        201
    );
    let pods = gw.pods();
    let of = |name: &str| {
        pods.iter()
            .find(|p| p.config.name == name)
            .map(|p| p.config.model.clone())
    };
    assert_eq!(of("gpt2-2"), Some(Some(GPT2.to_owned())));
    assert_eq!(pods.len(), 4);

    // The models share one metrics registry, each pod under its name.
    let text = crate::scrape(&gw).await;
    for pod in ["qwen-0", served[0].as_str()] {
        let n = crate::value(
            &text,
            "cache_router_pod_prompt_tokens_total",
            &[("pod", pod)],
        );
        assert!(n > 0.0, "{pod} has its prompt tokens counted");
    }
}
