//! Counters return to where they were after every path: a property test
//! over random failure schedules and cancellation points.

use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use router_exec::{StepRequest, Workflow};
use router_policy::{Context, Role};
use router_test_support::{Script, ScriptedBackend};
use serde_json::json;

use super::{assert_idle, by_role, executor, fleet};

fn script() -> impl Strategy<Value = Script> {
    prop_oneof![
        Just(Script::Default),
        Just(Script::FailToConnect),
        Just(Script::FailFirst),
        (0usize..3).prop_map(Script::FailAfter),
        Just(Script::Hang),
        (1u64..4).prop_map(|ms| Script::Slow(Duration::from_millis(ms))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn counters_return_to_zero_on_every_path(
        schedules in prop::collection::vec(prop::collection::vec(script(), 0..4), 4),
        requests in prop::collection::vec((any::<bool>(), 0usize..4, 1u64..200), 1..6),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let (fleet, ids) = fleet(&[Role::Prefill, Role::Prefill, Role::Decode, Role::Decode]);
            let backend = ScriptedBackend::new();
            for (id, s) in ids.iter().zip(&schedules) {
                backend.script(*id, s.clone());
            }
            let exec = executor(&backend, &fleet);
            let wf = Workflow::prefill_decode(by_role(Role::Prefill), by_role(Role::Decode))
                .with_timeout(Duration::from_millis(20));
            for (pd, cancel_after, tokens) in requests {
                let wf = if pd { wf.clone() } else { Workflow::single(by_role(Role::Decode)).with_timeout(Duration::from_millis(20)) };
                let req = StepRequest::new(json!({"prompt": "x"}), tokens);
                if let Ok(mut e) = exec.execute(&wf, Context::new(), req).await {
                    let mut seen = 0;
                    while seen < cancel_after {
                        match e.next().await {
                            Some(_) => seen += 1,
                            None => break,
                        }
                    }
                    drop(e); // the caller goes away (or the stream already ended)
                }
                assert_idle(&fleet, &ids);
                assert_eq!(backend.open_streams(), 0);
            }
        });
    }
}
