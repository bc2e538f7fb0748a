//! `cargo fuzz run gateway_config`: the gateway's TOML configuration on
//! arbitrary text: a `Config` or an error naming a line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = router_service::Config::parse(text, std::path::Path::new("."));
    }
});
