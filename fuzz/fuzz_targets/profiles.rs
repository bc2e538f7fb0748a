//! `cargo fuzz run profiles`: routing profiles in router-policy's TOML on
//! arbitrary text, validated and built against a real index: profiles or
//! an error, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use router_index::{Index, IndexConfig};

fuzz_target!(|data: &[u8]| {
    static INDEX: OnceLock<std::sync::Arc<Index<4>>> = OnceLock::new();
    let index = INDEX.get_or_init(|| Index::<4>::new(IndexConfig::default()));
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = router_policy::Registry::with_builtins()
            .with_index(index.clone())
            .load(text);
    }
});
