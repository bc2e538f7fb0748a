//! `cargo fuzz run snapshot_decode`: an index snapshot read back from the
//! NATS object store, on arbitrary bytes (and on valid snapshots with
//! bytes flipped): a snapshot or an error, never a panic or an allocation
//! the input cannot back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use router_nats::Snapshot;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Snapshot::decode(data) {
        // What decodes re-encodes to the same bytes.
        assert_eq!(s.encode(), data);
    }
});
