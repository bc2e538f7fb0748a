//! Hybrid models end to end: simulated engines with a sliding-window or a
//! Mamba group beside full attention publish vLLM's group events; the
//! gateway predicts the hit the engine accepts, where the full-attention
//! view (every peer's) predicts a hit the engine refuses.

use serde_json::json;

use crate::{chat, post, post_settled, system_prompt};

async fn conversations(layout: &str, groups: bool) -> Vec<(u64, u64)> {
    let gw = crate::gateway(
        1,
        &format!("hybrid_groups = {groups}"),
        &format!("hybrid = \"{layout}\""),
    )
    .await;
    let system = system_prompt(7, 300);
    let a = [
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Tell me about prefix caches."}),
    ];
    let b = [
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "And what of sliding windows and their blocks?"}),
    ];
    let mut seen = Vec::new();
    for messages in [&a[..], &b[..], &a[..]] {
        let r = post_settled(&gw, "/v1/chat/completions", &chat(messages)).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        seen.push((r.predicted, r.cached));
    }
    // Unsettled too: the prediction comes from what the index holds then.
    let r = post(&gw, "/v1/chat/completions", &chat(&b)).await;
    seen.push((r.predicted, r.cached));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_follow_the_engines_hit_rule_per_group() {
    for layout in ["sliding-window:64", "mamba"] {
        let exact = conversations(layout, true).await;
        for (i, (predicted, cached)) in exact.iter().enumerate() {
            assert_eq!(predicted, cached, "{layout}, request {i}: {exact:?}");
        }
        // B shares only the system prompt: full attention holds it, the
        // other group holds nothing at that boundary, so the engine serves
        // nothing of it. The same prompt again is a whole-prompt hit.
        assert_eq!(exact[1].1, 0, "{layout}: {exact:?}");
        assert!(exact[2].1 > 0, "{layout}: {exact:?}");

        let view = conversations(layout, false).await;
        assert_eq!(
            view.iter().map(|v| v.1).collect::<Vec<_>>(),
            exact.iter().map(|v| v.1).collect::<Vec<_>>(),
            "{layout}: the engines' hits do not depend on the router's view"
        );
        assert!(
            view[1].0 > view[1].1,
            "{layout}: the full-attention view over-predicts the shared system prompt: {view:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_declared_layout_is_a_config_error() {
    let cfg = crate::config("kv_groups = [\"sliding-window\"]\n\n[simulated]\nengines = 1\n");
    let Err(err) = router_sim_engine::SimGateway::start(cfg).await else {
        panic!("refused");
    };
    assert!(err.to_string().contains("kv_groups"), "{err}");
    let cfg = crate::config("\n[simulated]\nengines = 1\nhybrid = \"sliding-window:1\"\n");
    let Err(err) = router_sim_engine::SimGateway::start(cfg).await else {
        panic!("refused");
    };
    assert!(err.to_string().contains("hybrid"), "{err}");
}
