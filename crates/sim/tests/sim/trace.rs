//! Trace loading: the bundled trace parses; bad lines name their line.

use router_sim::{SyntheticParams, parse_mooncake, synthetic};

#[test]
fn the_bundled_trace_parses() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../assets/traces/synthetic_trace.jsonl"
    ))
    .unwrap();
    let t = parse_mooncake(&text).unwrap();
    assert_eq!(t.len(), 3993);
    assert_eq!(t.iter().map(|r| r.blocks.len()).sum::<usize>(), 121_877);
    assert!(t.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
}

#[test]
fn bad_lines_are_errors_with_their_line() {
    let ok = r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}"#;
    let cases = [
        (
            r#"{"input_length": 10, "output_length": 2, "hash_ids": [1]}"#,
            "missing field `timestamp`",
        ),
        (
            r#"{"timestamp": 5, "output_length": 2, "hash_ids": [1]}"#,
            "missing field `input_length`",
        ),
        (
            r#"{"timestamp": 5, "input_length": "ten", "output_length": 2, "hash_ids": [1]}"#,
            "`input_length` must be",
        ),
        (
            r#"{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}"#,
            "non-numeric id",
        ),
        (
            r#"{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": []}"#,
            "empty",
        ),
        (
            r#"{"timestamp": 5, "input_length": 10, "output_length": 2}"#,
            "missing field `hash_ids`",
        ),
        (
            r#"{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [1]}"#,
            "non-negative",
        ),
        (r#"not json"#, "not JSON"),
    ];
    for (bad, needle) in cases {
        let text = format!("{ok}\n\n{bad}\n{ok}\n");
        let err = parse_mooncake(&text).unwrap_err();
        assert_eq!(err.line, 3, "{bad}");
        assert!(
            err.message.contains(needle),
            "{} lacks {needle}",
            err.message
        );
    }
    let backwards = format!(
        "{ok}\n{}\n",
        ok.replace("\"timestamp\": 0", "\"timestamp\": 9")
    ) + &format!("{ok}\n");
    let err = parse_mooncake(&backwards).unwrap_err();
    assert_eq!(err.line, 3);
    assert!(
        err.to_string().contains("earlier than the previous"),
        "{err}"
    );
}

#[test]
fn the_synthetic_generator_is_deterministic_and_shares_prefixes() {
    let p = SyntheticParams::default();
    let a = synthetic(&p, 3);
    assert_eq!(a, synthetic(&p, 3));
    assert_ne!(a, synthetic(&p, 4));
    assert_eq!(a.len(), p.requests);
    // System prompts are shared: far fewer distinct first blocks than requests.
    let firsts: std::collections::HashSet<u64> = a.iter().map(|r| r.blocks[0]).collect();
    assert!(firsts.len() <= p.system_prompts);
    // Later turns extend earlier ones of the same session.
    let mut by_session: std::collections::HashMap<u64, Vec<&Vec<u64>>> = Default::default();
    for r in &a {
        by_session
            .entry(r.session.expect("synthetic requests have sessions"))
            .or_default()
            .push(&r.blocks);
    }
    for turns in by_session.values() {
        for w in turns.windows(2) {
            assert!(
                w[1].starts_with(w[0]),
                "a turn does not extend the previous one"
            );
        }
    }
}
