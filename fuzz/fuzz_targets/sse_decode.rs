//! `cargo fuzz run sse_decode`: the gateway's server-sent-event decoder on
//! an engine's arbitrary bytes, fed in two pieces cut at the first byte's
//! value, must yield events or an error, never panic or grow past its limit.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let mut d = router_service::SseDecoder::new(4096);
    let mut out = Vec::new();
    if d.feed(&data[..cut], &mut out).is_ok() {
        let _ = d.feed(&data[cut..], &mut out);
    }
});
