//! The dependency rule of the design brief, checked over `cargo metadata`:
//! `core` <- `hash`, `index`, `events`, `policy`; `policy` <- `exec`;
//! `events`, `policy` <- `nats`. Only the
//! facade, the routing library (`router-service`) and the reference
//! integrations (`router-sim`, `router-sim-engine`) name concrete crates
//! of other layers (dev
//! dependencies are free: tests may use real implementations). Every
//! package of the workspace is checked; test support and simulated engines
//! are never a normal dependency.

use std::collections::BTreeMap;
use std::process::Command;

/// Which `router-*` crates each library crate may depend on (normal and
/// build dependencies). A crate missing here is a new crate: add it.
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("router-core", &[][..]),
        ("router-hash", &["router-core"][..]),
        ("router-index", &["router-core"][..]),
        ("router-events", &["router-core"][..]),
        ("router-policy", &["router-core"][..]),
        ("router-exec", &["router-core", "router-policy"][..]),
        // Replicas feed the data and decision layers' state; nothing
        // depends on them but the gateway.
        (
            "router-nats",
            &["router-core", "router-events", "router-policy"][..],
        ),
        // The facade re-exports the layers and the Router, nothing else.
        (
            "cache-router",
            &[
                "router-core",
                "router-hash",
                "router-index",
                "router-policy",
                "router-exec",
                "router-events",
                "router-service",
            ][..],
        ),
        // The simulator models engines and routes through the executor, as
        // the HTTP fronts do.
        (
            "router-sim",
            &[
                "router-core",
                "router-exec",
                "router-index",
                "router-policy",
            ][..],
        ),
        // The routing core as a library: every layer wired into a Router.
        (
            "router-service",
            &[
                "router-core",
                "router-events",
                "router-exec",
                "router-hash",
                "router-index",
                "router-policy",
                "router-nats",
            ][..],
        ),
        // The gateway is one front over the Router: HTTP and OpenAI's API
        // only, no layer crate named, no simulation code.
        ("router-gateway", &["router-service"][..]),
        // The endpoint picker for Envoy: another front over the Router.
        ("router-epp", &["router-service"][..]),
        // The Python package: a front too, which also exposes the data
        // layer (hashing, the index fed by event batches) to Python.
        (
            "router-python",
            &[
                "router-core",
                "router-events",
                "router-hash",
                "router-index",
                "router-service",
            ][..],
        ),
        // Simulated engines sit on top: they serve the gateway's API.
        (
            "router-sim-engine",
            &[
                "router-core",
                "router-events",
                "router-gateway",
                "router-hash",
                "router-policy",
                "router-sim",
            ][..],
        ),
        // The `cache-router` command: the gateway, over simulated engines
        // when the configuration asks for them.
        (
            "cache-router-cli",
            &["router-epp", "router-gateway", "router-sim-engine"][..],
        ),
        ("router-bench", &["router-core", "router-index"][..]),
        ("router-test-support", &["router-core", "router-exec"][..]),
    ])
}

#[test]
fn layers_depend_one_way_only() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let allowed = allowed();
    let mut checked = 0;
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        let ok = allowed
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in the layering table of tests/layering.rs"));
        for dep in pkg["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            let dev = dep["kind"].as_str() == Some("dev");
            if dep_name.starts_with("router-") && !dev {
                assert!(
                    ok.contains(&dep_name),
                    "{name} depends on {dep_name}, which the layering rule forbids"
                );
            }
        }
        checked += 1;
    }
    assert_eq!(
        checked,
        allowed.len(),
        "every crate of the layering table is a package of the workspace"
    );
}
