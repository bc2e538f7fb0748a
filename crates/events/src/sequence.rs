//! The order of one engine stream: what a batch's sequence number and
//! timestamp say about it, whatever carried it (ZeroMQ, a NATS stream).

/// What to do with a batch, from its sequence number and timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The next batch (or the first one seen): apply it.
    Next,
    /// Batches `from..upto` are missing: heal the gap (replay) or clear
    /// the pod, then apply this one.
    Gap {
        /// The first missing sequence number.
        from: u64,
        /// This batch's sequence number.
        upto: u64,
    },
    /// Already applied (a replayed batch seen again live): skip it.
    Stale,
    /// The sequence went backwards on a batch newer than the last one
    /// applied: a new publisher (the engine restarted). Clear the pod's
    /// record and follow the new stream from this batch.
    Restart,
}

/// Tracks one stream's position: the next sequence number expected and the
/// timestamp of the last batch applied.
///
/// A publisher numbers its batches from 0 and stamps them with its clock.
/// A sequence number below the expected one is either a batch seen twice
/// (its timestamp is not newer than the last applied) or the first batches
/// of a restarted engine (newer): the timestamp tells them apart, so a
/// restart is never mistaken for stale traffic and a duplicate never
/// clears a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sequencer {
    expected: Option<u64>,
    last_ts: f64,
}

impl Sequencer {
    /// A stream not yet seen.
    pub fn new() -> Self {
        Sequencer::default()
    }

    /// The next sequence number expected, once a batch was applied.
    pub fn expected(&self) -> Option<u64> {
        self.expected
    }

    /// The timestamp of the last batch applied (0 before any).
    pub fn last_ts(&self) -> f64 {
        self.last_ts
    }

    /// What batch `seq` stamped `ts` (`None`: it did not decode) is.
    pub fn check(&self, seq: u64, ts: Option<f64>) -> Verdict {
        match self.expected {
            None => Verdict::Next,
            Some(e) if seq == e => Verdict::Next,
            Some(e) if seq > e => Verdict::Gap { from: e, upto: seq },
            Some(_) => match ts {
                Some(ts) if ts > self.last_ts => Verdict::Restart,
                _ => Verdict::Stale,
            },
        }
    }

    /// Batch `seq` (stamped `ts` if it decoded) was applied.
    pub fn applied(&mut self, seq: u64, ts: Option<f64>) {
        self.expected = Some(seq.saturating_add(1));
        if let Some(ts) = ts.filter(|t| t.is_finite()) {
            self.last_ts = self.last_ts.max(ts);
        }
    }

    /// Forgets the position (a new publisher follows).
    pub fn reset(&mut self) {
        *self = Sequencer::default();
    }

    /// Restores a position saved earlier (a snapshot).
    pub fn restore(expected: Option<u64>, last_ts: f64) -> Self {
        Sequencer { expected, last_ts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_gaps_duplicates_and_restarts() {
        let mut s = Sequencer::new();
        assert_eq!(s.check(7, Some(1.0)), Verdict::Next, "joining mid-stream");
        s.applied(7, Some(1.0));
        assert_eq!(s.check(8, Some(1.1)), Verdict::Next);
        s.applied(8, Some(1.1));
        assert_eq!(s.check(11, Some(1.2)), Verdict::Gap { from: 9, upto: 11 });
        assert_eq!(s.check(8, Some(1.1)), Verdict::Stale, "seen twice");
        assert_eq!(s.check(3, None), Verdict::Stale, "undecodable and old");
        assert_eq!(
            s.check(0, Some(5.0)),
            Verdict::Restart,
            "newer: a new engine"
        );
        s.reset();
        assert_eq!(s.check(0, Some(5.0)), Verdict::Next);
        s.applied(0, Some(5.0));
        assert_eq!(s.expected(), Some(1));
        s.applied(1, Some(f64::NAN));
        assert_eq!(s.last_ts(), 5.0, "a NaN stamp is not a time");
    }
}
