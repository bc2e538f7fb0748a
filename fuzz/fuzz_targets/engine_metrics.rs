//! `cargo fuzz run engine_metrics`: an engine's `/metrics` text of any
//! bytes gives a report or a typed error, never a panic, and a report's
//! usage stays a fraction.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(m) = router_events::parse_engine_metrics(&text) {
        assert!(m.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
        let _ = m.capacity_blocks(16);
    }
});
