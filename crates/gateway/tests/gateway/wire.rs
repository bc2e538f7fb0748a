//! The SSE decoder checked against itself fed whole.

use proptest::prelude::*;
use router_gateway::SseDecoder;

fn sse_text(events: &[String]) -> String {
    events
        .iter()
        .map(|e| {
            let mut s: String = e.split('\n').map(|l| format!("data: {l}\r\n")).collect();
            s.push_str(": keep-alive comment\n\n");
            s
        })
        .collect()
}

proptest! {
    /// Fed in pieces cut anywhere, the decoder yields what it yields fed
    /// the whole stream at once, which is the events written.
    #[test]
    fn sse_pieces_cut_anywhere_decode_like_the_whole(
        events in proptest::collection::vec("[a-z{}:\" ]{0,12}(\n[a-z]{1,4})?", 0..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let text = sse_text(&events);
        let mut whole = Vec::new();
        SseDecoder::default().feed(text.as_bytes(), &mut whole).unwrap();
        prop_assert_eq!(&whole, &events);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
        at.sort_unstable();
        let mut d = SseDecoder::default();
        let mut pieces = Vec::new();
        let mut last = 0;
        for a in at.into_iter().chain([text.len()]) {
            d.feed(&text.as_bytes()[last..a], &mut pieces).unwrap();
            last = a;
        }
        prop_assert_eq!(pieces, events);
    }

    /// Arbitrary bytes never panic: events, a typed error, or nothing.
    #[test]
    fn sse_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut out = Vec::new();
        let _ = SseDecoder::new(256).feed(&bytes, &mut out);
    }
}

#[test]
fn an_endless_line_is_an_error_not_unbounded_memory() {
    let mut d = SseDecoder::new(64);
    let mut out = Vec::new();
    assert!(d.feed(&[b'x'; 65], &mut out).is_err());
    assert!(
        SseDecoder::new(64)
            .feed(b"data: \xff\n\n", &mut out)
            .is_err()
    );
}

#[test]
fn an_endless_event_of_short_lines_is_an_error_not_unbounded_memory() {
    let mut d = SseDecoder::new(64).max_event(1000);
    let mut out = Vec::new();
    let mut fed = 0;
    let err = loop {
        match d.feed(b"data: 0123456789\n", &mut out) {
            Ok(()) => fed += 1,
            Err(e) => break e,
        }
        assert!(fed < 200, "still buffering after {fed} lines");
    };
    assert_eq!(err, router_gateway::SseError::EventTooLong(1000));
    assert!(out.is_empty());
    // An event under the limit still decodes.
    let mut d = SseDecoder::new(64).max_event(1000);
    d.feed(b"data: a\ndata: b\n\n", &mut out).unwrap();
    assert_eq!(out, vec!["a\nb".to_owned()]);
}
