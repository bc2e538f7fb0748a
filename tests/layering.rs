//! The dependency rule of the design brief, checked over `cargo metadata`:
//! `core` <- `hash`, `index`, `events`, `policy`; `policy` <- `exec`;
//! `events`, `policy` <- `nats`. Only the
//! facade and the reference integrations (`router-sim`, `router-gateway`)
//! name concrete crates of other layers (dev dependencies are free: tests
//! may use real implementations).

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
        if !name.starts_with("router-")
            || name == "router-sim"
            || name == "router-gateway"
            || name.ends_with("-bench")
            || name.ends_with("-test-support")
        {
            continue;
        }
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
    assert!(
        checked >= 2,
        "expected to check at least router-core and router-hash"
    );
}
