//! `cargo fuzz run decode_batch`: the event decoder on arbitrary bytes must
//! return a value or an error, never panic, hang or over-allocate.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = router_events::decode_batch(data);
});
