//! `compare` end to end: every index runs in a child process of its own and
//! hands its outcome back to the parent, which prints the tables.

use std::process::Command;

fn compare(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(args)
        .output()
        .expect("compare runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// The cells of the table row of `index` under the heading `title`.
fn row(stdout: &str, title: &str, index: &str) -> Vec<String> {
    let at = stdout
        .find(&format!("### {title}"))
        .unwrap_or_else(|| panic!("no table {title} in:\n{stdout}"));
    stdout[at..]
        .lines()
        .find(|l| l.starts_with(&format!("| {index} |")))
        .unwrap_or_else(|| panic!("no row {index} under {title}"))
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn each_workload_comes_back_from_a_child_process_with_its_answers() {
    let (stdout, stderr, ok) = compare(&["--quick", "--only", "W1,W3,W4"]);
    assert!(ok, "compare failed:\n{stderr}");
    let w1 = row(&stdout, "W1 shared prefixes", "router-index");
    // p50 and p99 are positive times; the setup stored W1's 4000 chains.
    let p50: f64 = w1[1].parse().expect("a p50");
    let p99: f64 = w1[2].parse().expect("a p99");
    assert!(p50 > 0.0 && p99 >= p50, "{w1:?}");
    assert!(w1[3].ends_with(" M"), "a store rate: {w1:?}");
    // 4000 quick queries, every 16th sampled; the first subject agrees
    // with itself.
    assert_eq!(w1.last().map(String::as_str), Some("0 of 250"), "{w1:?}");
    assert!(
        stdout.contains("router-index: 4.0 probes per query"),
        "probes counted in the child reach the parent:\n{stdout}"
    );
    let w3 = row(&stdout, "W3 trace", "router-index");
    assert_eq!(w3.last().map(String::as_str), Some("0 of 500"), "{w3:?}");
    let w4 = row(
        &stdout,
        "W4 concurrent: reader latency under a full-speed writer",
        "router-index",
    );
    let writer: f64 = w4[3].trim_end_matches(" k").parse().expect("a writer rate");
    assert!(writer > 0.0, "the writer ran: {w4:?}");
}

#[test]
fn a_child_with_a_bad_workload_name_fails_loudly() {
    let (_, stderr, ok) = compare(&["--child", "W9", "0"]);
    assert!(!ok);
    assert!(stderr.contains("unknown workload W9"), "{stderr}");
    let (_, stderr, ok) = compare(&["--child", "W1", "7"]);
    assert!(!ok);
    assert!(stderr.contains("no subject 7"), "{stderr}");
    let (_, stderr, ok) = compare(&["--child"]);
    assert!(!ok);
    assert!(stderr.contains("usage: compare --child"), "{stderr}");
}
