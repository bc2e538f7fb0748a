//! Single dispatch, prefill->decode, retries, timeouts, cancellation, feedback.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodKey, PrefixIndex, Tier};
use router_exec::{
    CACHE_HANDLE, Chunk, Error, Executor, Feedback, PREFILL_POD, RetryPolicy, Shortcut, StepKind,
    StepRequest, Workflow,
};
use router_index::{Index, IndexConfig};
use router_policy::builtin::{BreakerConfig, CircuitBreaker, MaxScore, RoleFilter};
use router_policy::keys::{CACHE_HITS, CHAIN, CacheHits};
use router_policy::{Context, Profile, Role, scorer_fn};
use router_test_support::{Script, ScriptedBackend};
use serde_json::json;

use super::{assert_idle, by_role, executor, fleet, in_slot_order};

fn request(tokens: u64) -> StepRequest {
    StepRequest::new(json!({"model": "m", "prompt": "hi"}), tokens)
}

/// One request of 16 tokens, single dispatch, pods preferred in slot order.
async fn single(exec: &Executor) -> Result<router_exec::Execution, Error> {
    exec.execute(
        &Workflow::single(in_slot_order()),
        Context::new(),
        request(16),
    )
    .await
}

async fn collect(mut e: router_exec::Execution) -> Vec<Result<Chunk, Error>> {
    let mut out = Vec::new();
    while let Some(c) = e.next().await {
        out.push(c);
    }
    out
}

#[tokio::test]
async fn single_dispatch_streams_every_chunk_and_settles() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    let exec = executor(&backend, &fleet);
    let wf = Workflow::single(by_role(Role::Both));
    let e = exec
        .execute(&wf, Context::new(), request(32))
        .await
        .unwrap();
    assert_eq!(e.steps().len(), 1);
    assert_eq!(e.steps()[0].0, StepKind::Full);
    let pod = e.pod().unwrap();
    assert_eq!(
        fleet.get(pod).unwrap().in_flight,
        1,
        "counted while streaming"
    );
    let chunks = collect(e).await;
    assert_eq!(chunks.len(), 3);
    assert!(matches!(
        chunks[2],
        Ok(Chunk::Usage {
            prompt_tokens: 32,
            ..
        })
    ));
    assert_eq!(backend.calls().len(), 1);
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn prefill_then_decode_passes_the_handle_and_the_knowledge() {
    let (fleet, ids) = fleet(&[Role::Prefill, Role::Prefill, Role::Decode, Role::Decode]);
    let backend = ScriptedBackend::new();
    let exec = executor(&backend, &fleet);
    // The decode decision sees the prefill pod: it prefers the decode pod
    // two slots above it (say, on the same host).
    let decode = Arc::new(
        Profile::builder("decode")
            .input(PREFILL_POD.id())
            .input(CACHE_HANDLE.id())
            .filter(RoleFilter::new(Role::Decode))
            .scorer(
                scorer_fn("near-prefill", |ctx, p| {
                    let pre = ctx.get(PREFILL_POD).map_or(99, |p| p.slot());
                    if p.id.slot() == pre + 2 { 1.0 } else { 0.0 }
                }),
                1.0,
            )
            .picker(MaxScore::default())
            .build()
            .unwrap(),
    );
    let wf = Workflow::prefill_decode(by_role(Role::Prefill), decode);
    for _ in 0..4 {
        let e = exec
            .execute(&wf, Context::new(), request(64))
            .await
            .unwrap();
        let steps = e.steps().to_vec();
        assert_eq!(steps[0].0, StepKind::Prefill);
        assert_eq!(steps[1].0, StepKind::Decode);
        assert!(steps[0].1.slot() < 2 && steps[1].1.slot() == steps[0].1.slot() + 2);
        let chunks = collect(e).await;
        assert!(chunks.iter().all(Result::is_ok));
    }
    let calls = backend.calls();
    for pair in calls.chunks(2) {
        assert_eq!(pair[0].kind, StepKind::Prefill, "prefill runs first");
        assert_eq!(pair[1].kind, StepKind::Decode);
        assert_eq!(
            pair[1].handle,
            Some(json!({ "prefill_pod": pair[0].pod.slot() }))
        );
    }
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn the_shortcut_sends_short_prompts_straight_to_decode() {
    let (fleet, _) = fleet(&[Role::Prefill, Role::Decode]);
    let backend = ScriptedBackend::new();
    let exec = executor(&backend, &fleet);
    let wf = Workflow::prefill_decode(by_role(Role::Prefill), by_role(Role::Decode)).with_shortcut(
        Shortcut {
            max_prompt_tokens: 100,
            min_cached_fraction: 0.9,
        },
    );
    let e = exec
        .execute(&wf, Context::new(), request(50))
        .await
        .unwrap();
    assert_eq!(e.steps().len(), 1);
    assert_eq!(e.steps()[0].0, StepKind::Decode);
    collect(e).await;
    let e = exec
        .execute(&wf, Context::new(), request(500))
        .await
        .unwrap();
    assert_eq!(
        e.steps().len(),
        2,
        "a long, uncached prompt takes both steps"
    );
    collect(e).await;
    // Well cached: straight to decode.
    let mut m = router_core::PrefixMatch::new(10);
    m.push(router_core::PodMatch {
        pod: router_core::PodId::new(1, 0),
        blocks: 10,
    });
    let mut ctx = Context::new();
    ctx.insert(CACHE_HITS, CacheHits::from_match(&m));
    let e = exec.execute(&wf, ctx, request(500)).await.unwrap();
    assert_eq!(e.steps().len(), 1);
}

#[tokio::test]
async fn a_failed_attempt_retries_on_another_pod_and_feeds_the_breaker() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    backend.script(ids[0], [Script::FailToConnect]);
    backend.script(ids[1], [Script::FailFirst]);
    let breaker = Arc::new(CircuitBreaker::new({
        let mut c = BreakerConfig::default();
        c.failures = 1;
        c
    }));
    #[derive(Default)]
    struct Seen(
        parking_lot::Mutex<Vec<(router_core::PodId, bool)>>,
        std::sync::atomic::AtomicUsize,
    );
    impl router_exec::Observer for Seen {
        fn decided(&self, _: StepKind, _: router_core::PodId, _: Duration) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn attempt_failed(&self, pod: router_core::PodId, _: &Error, will_retry: bool) {
            self.0.lock().push((pod, will_retry));
        }
    }
    let seen = Arc::new(Seen::default());
    let exec = executor(&backend, &fleet)
        .with_breaker(breaker.clone())
        .with_observer(seen.clone());
    let e = single(&exec).await.unwrap();
    assert_eq!(e.pod(), Some(ids[2]));
    assert_eq!(*seen.0.lock(), [(ids[0], true), (ids[1], true)]);
    assert_eq!(
        seen.1.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "three decisions"
    );
    let pods: Vec<_> = backend.calls().iter().map(|c| c.pod).collect();
    assert_eq!(pods, ids, "slot 0, then 1 (0 excluded), then 2");
    assert!(breaker.is_tripped(ids[0]) && breaker.is_tripped(ids[1]));
    assert!(!breaker.is_tripped(ids[2]));
    collect(e).await;
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn exhausted_retries_are_a_typed_error() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both, Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    for id in &ids {
        backend.script(*id, [Script::FailFirst]);
    }
    let exec = executor(&backend, &fleet);
    let err = single(&exec).await.unwrap_err();
    match err {
        Error::Exhausted { attempts: 3, last } => assert!(matches!(*last, Error::Backend { .. })),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(backend.calls().len(), 3);
    assert_idle(&fleet, &ids);
    // Fewer pods than attempts: the profile runs out first.
    let (small, small_ids) = super::fleet(&[Role::Both]);
    let backend = ScriptedBackend::new();
    backend.script(small_ids[0], [Script::FailToConnect]);
    let err = single(&executor(&backend, &small)).await.unwrap_err();
    assert!(
        matches!(err, Error::Exhausted { attempts: 1, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_rejected_request_is_neither_retried_nor_held_against_the_pod() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    for id in &ids {
        backend.script(*id, [Script::Reject]);
    }
    let breaker = Arc::new(CircuitBreaker::new({
        let mut c = BreakerConfig::default();
        c.failures = 1;
        c
    }));
    let exec = executor(&backend, &fleet).with_breaker(breaker.clone());
    let err = single(&exec).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                source: router_exec::BackendError::Rejected { status: 400, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(backend.calls().len(), 1, "not retried on the other pod");
    assert!(!breaker.is_tripped(backend.calls()[0].pod));
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn an_error_after_streaming_began_is_reported_not_retried() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    backend.script(ids[0], [Script::FailAfter(1)]);
    let exec = executor(&backend, &fleet);
    let e = single(&exec).await.unwrap();
    let chunks = collect(e).await;
    assert!(chunks[0].is_ok());
    assert!(matches!(chunks[1], Err(Error::Backend { .. })));
    assert_eq!(chunks.len(), 2);
    assert_eq!(backend.calls().len(), 1, "never retried");
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn a_step_past_its_deadline_times_out() {
    let (fleet, ids) = fleet(&[Role::Both]);
    let backend = ScriptedBackend::new();
    backend.script(
        ids[0],
        [Script::Hang, Script::Slow(Duration::from_millis(30))],
    );
    let exec = executor(&backend, &fleet);
    let wf = Workflow::single(in_slot_order()).with_timeout(Duration::from_millis(40));
    let err = exec
        .execute(&wf, Context::new(), request(16))
        .await
        .unwrap_err();
    assert_eq!(err, Error::Timeout { pod: ids[0] });
    assert_idle(&fleet, &ids);
    // Slow after the first chunk: the deadline cuts the stream.
    let e = exec
        .execute(&wf, Context::new(), request(16))
        .await
        .unwrap();
    let chunks = collect(e).await;
    assert!(
        matches!(chunks.last(), Some(Err(Error::Timeout { .. }))),
        "{chunks:?}"
    );
    assert_eq!(backend.cancelled(), 1, "the timed-out stream was dropped");
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn a_caller_going_away_cancels_the_backend_stream() {
    let (fleet, ids) = fleet(&[Role::Both]);
    let backend = ScriptedBackend::new();
    backend.script(ids[0], [Script::Slow(Duration::from_millis(5))]);
    let exec = executor(&backend, &fleet);
    let mut e = single(&exec).await.unwrap();
    assert!(e.next().await.unwrap().is_ok());
    assert_eq!(backend.open_streams(), 1);
    drop(e);
    assert_eq!(backend.open_streams(), 0);
    assert_eq!(backend.cancelled(), 1);
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn feedback_compares_and_lowers_the_index_claim_on_a_miss() {
    let index = Index::<4>::new(IndexConfig::default());
    let pod = index.join(&PodKey::new("a", 0)).unwrap();
    let chain: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
    index
        .apply(&CacheEvent::Stored {
            pod,
            tier: Tier::Gpu,
            blocks: chain.clone(),
        })
        .unwrap();
    let fleet = Arc::new(router_policy::Fleet::new());
    fleet.upsert(router_policy::PodState::new(pod, Role::Both));
    let backend = ScriptedBackend::new();
    backend.set_cached(pod, 3 * 16); // the engine had only 3 of the 8 blocks
    let exec = Executor::new(
        backend.clone(),
        fleet.clone(),
        Arc::new(Feedback::new(16).correcting(index.clone())),
    )
    .with_retry(RetryPolicy::new(1, Duration::from_millis(1)));
    let profile = Arc::new(router_policy::default_profile(index.clone(), 16));
    let mut ctx = Context::new();
    ctx.insert(CHAIN, chain.clone());
    ctx.insert(router_policy::keys::PROMPT_TOKENS, 8 * 16);
    let e = exec
        .execute(&Workflow::single(profile), ctx, request(8 * 16))
        .await
        .unwrap();
    collect(e).await;
    let s = exec.feedback().stats();
    assert_eq!(
        (s.reports, s.predicted_tokens, s.actual_tokens, s.misses),
        (1, 128, 48, 1)
    );
    assert_eq!(s.difference(), 80);
    assert_eq!(s.corrected_blocks, 5);
    assert_eq!(
        index.match_prefix(&chain).blocks_for(pod),
        3,
        "the index no longer claims the missed blocks"
    );
    assert_idle(&fleet, &[pod]);
}

#[tokio::test]
async fn an_executor_for_leases_decides_and_counts_but_sends_nothing() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both]);
    let exec = Executor::for_leases(fleet.clone(), Arc::new(Feedback::new(16)));
    let wf = Workflow::single(in_slot_order());
    let mut lease = exec.lease(&wf, Context::new(), 33, &[]).unwrap();
    assert_eq!(lease.pod(), ids[0]);
    let held = fleet.get(ids[0]).unwrap();
    assert_eq!(
        (
            held.in_flight,
            held.queued_prefill_tokens,
            held.kv_blocks_used
        ),
        (1, 33, 3)
    );
    lease.first_token();
    lease.cached_tokens(0);
    assert_eq!(exec.feedback().stats().reports, 1);
    lease.finish(true);
    assert_idle(&fleet, &ids);
    // Running a workflow on it fails on every pod, and settles each attempt.
    let err = exec.execute(&wf, Context::new(), request(16)).await.err();
    assert!(
        matches!(err, Some(Error::Exhausted { .. } | Error::Backend { .. })),
        "{err:?}"
    );
    assert_idle(&fleet, &ids);
}

#[tokio::test]
async fn a_lease_counts_the_pods_load_until_it_ends_and_sends_nothing() {
    let (fleet, ids) = fleet(&[Role::Both, Role::Both, Role::Both]);
    let backend = ScriptedBackend::new();
    let breaker = Arc::new(CircuitBreaker::new({
        let mut c = BreakerConfig::default();
        c.failures = 1;
        c
    }));
    let exec = executor(&backend, &fleet).with_breaker(breaker.clone());
    let wf = Workflow::single(in_slot_order());
    let mut lease = exec.lease(&wf, Context::new(), 40, &[]).unwrap();
    assert_eq!(lease.pod(), ids[0]);
    let held = fleet.get(ids[0]).unwrap();
    assert_eq!(
        (
            held.in_flight,
            held.queued_prefill_tokens,
            held.kv_blocks_used
        ),
        (1, 40, 3),
        "counted as a request the executor runs: 40 tokens, 3 blocks of 16"
    );
    lease.first_token();
    assert_eq!(fleet.get(ids[0]).unwrap().queued_prefill_tokens, 0);
    // The next lease avoids the excluded pods.
    let other = exec.lease(&wf, Context::new(), 16, &ids[..2]).unwrap();
    assert_eq!(other.pod(), ids[2]);
    other.finish(false);
    assert!(
        breaker.is_tripped(ids[2]),
        "a failed lease counts against its pod"
    );
    drop(lease);
    assert!(!breaker.is_tripped(ids[0]), "a dropped lease says nothing");
    assert!(backend.calls().is_empty(), "a lease sends nothing");
    assert_idle(&fleet, &ids);
    assert!(matches!(
        exec.lease(&wf, Context::new(), 16, &ids),
        Err(Error::NoPod(_))
    ));
    let pd = Workflow::prefill_decode(by_role(Role::Both), by_role(Role::Both));
    assert!(matches!(
        exec.lease(&pd, Context::new(), 16, &[]),
        Err(Error::Protocol { .. })
    ));
}
