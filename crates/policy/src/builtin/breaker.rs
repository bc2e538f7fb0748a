use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use router_core::PodId;

use crate::context::Context;
use crate::plugin::{Filter, Plugin};
use crate::pod::{Outcome, PodState};

/// When the breaker opens and how long it stays open.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// A response slower than this counts as a failure (0 = latency ignored).
    pub latency_ms: f64,
    /// How long an open breaker stays open before one probe request is let
    /// through (half-open).
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            latency_ms: 0.0,
            cooldown_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// `circuit-breaker`: drops pods whose recent requests failed or were too
/// slow. Closed -> open after `failures` consecutive failures (or slow
/// responses); open -> half-open after the cool-down, when exactly one probe
/// request goes through; its success closes the breaker, its failure opens
/// it again. Fed by [`CircuitBreaker::record`].
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    pods: Mutex<HashMap<PodId, State>>,
    /// Pods not closed: while zero, `keep` takes no lock.
    tripped: AtomicUsize,
}

impl CircuitBreaker {
    /// A breaker with `config`.
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreaker {
            config,
            pods: Mutex::new(HashMap::new()),
            tripped: AtomicUsize::new(0),
        }
    }

    /// Records how a request to `pod` ended.
    pub fn record(&self, pod: PodId, latency: Duration, outcome: Outcome) {
        self.record_at(pod, latency, outcome, Instant::now());
    }

    fn record_at(&self, pod: PodId, latency: Duration, outcome: Outcome, now: Instant) {
        let slow =
            self.config.latency_ms > 0.0 && latency.as_secs_f64() * 1000.0 > self.config.latency_ms;
        let bad = outcome == Outcome::Failure || slow;
        let mut pods = self.pods.lock();
        let st = pods.entry(pod).or_insert(State::Closed { failures: 0 });
        let was_tripped = !matches!(st, State::Closed { .. });
        let open = State::Open {
            until: now + Duration::from_millis(self.config.cooldown_ms),
        };
        *st = match (*st, bad) {
            (State::Closed { .. }, false) => State::Closed { failures: 0 },
            (State::Closed { failures }, true) if failures + 1 >= self.config.failures => open,
            (State::Closed { failures }, true) => State::Closed {
                failures: failures + 1,
            },
            (State::HalfOpen { .. }, false) => State::Closed { failures: 0 },
            (State::HalfOpen { .. }, true) => open,
            // Late results of requests sent before it opened change nothing.
            (s @ State::Open { .. }, _) => s,
        };
        let is_tripped = !matches!(st, State::Closed { .. });
        match (was_tripped, is_tripped) {
            (false, true) => {
                self.tripped.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.tripped.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn keep_at(&self, pod: PodId, now: Instant) -> bool {
        if self.tripped.load(Ordering::Relaxed) == 0 {
            return true;
        }
        let mut pods = self.pods.lock();
        let Some(st) = pods.get_mut(&pod) else {
            return true;
        };
        match *st {
            State::Closed { .. } => true,
            State::Open { until } if now >= until => {
                *st = State::HalfOpen { probing: true };
                true
            }
            State::Open { .. } => false,
            // One probe at a time.
            State::HalfOpen { probing } => {
                *st = State::HalfOpen { probing: true };
                !probing
            }
        }
    }

    /// Whether the breaker of `pod` is open or half-open.
    pub fn is_tripped(&self, pod: PodId) -> bool {
        !matches!(
            self.pods.lock().get(&pod),
            None | Some(State::Closed { .. })
        )
    }
}

impl Plugin for CircuitBreaker {
    fn name(&self) -> &str {
        "circuit-breaker"
    }
}

impl Filter for CircuitBreaker {
    fn keep(&self, _: &Context, pod: &PodState) -> bool {
        self.keep_at(pod.id, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32, latency_ms: f64) -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig {
            failures,
            latency_ms,
            cooldown_ms: 1000,
        })
    }

    #[test]
    fn opens_on_consecutive_failures_and_half_opens_after_cooldown() {
        let b = breaker(3, 0.0);
        let p = PodId::new(1, 0);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        b.record_at(p, ms(5), Outcome::Failure, t0);
        b.record_at(p, ms(5), Outcome::Failure, t0);
        b.record_at(p, ms(5), Outcome::Success, t0); // resets the count
        b.record_at(p, ms(5), Outcome::Failure, t0);
        b.record_at(p, ms(5), Outcome::Failure, t0);
        assert!(b.keep_at(p, t0), "two in a row: still closed");
        b.record_at(p, ms(5), Outcome::Failure, t0);
        assert!(!b.keep_at(p, t0), "three in a row: open");
        assert!(!b.keep_at(p, t0 + ms(999)));
        assert!(b.keep_at(p, t0 + ms(1000)), "cool-down over: one probe");
        assert!(!b.keep_at(p, t0 + ms(1001)), "only one probe at a time");
        b.record_at(p, ms(5), Outcome::Failure, t0 + ms(1002));
        assert!(!b.keep_at(p, t0 + ms(1500)), "failed probe: open again");
        assert!(b.keep_at(p, t0 + ms(2002)));
        b.record_at(p, ms(5), Outcome::Success, t0 + ms(2003));
        assert!(
            b.keep_at(p, t0 + ms(2004)) && !b.is_tripped(p),
            "probe succeeded: closed"
        );
        assert!(b.keep_at(PodId::new(2, 0), t0), "other pods unaffected");
    }

    #[test]
    fn slow_responses_count_as_failures() {
        let b = breaker(2, 100.0);
        let p = PodId::new(1, 0);
        let t0 = Instant::now();
        b.record_at(p, Duration::from_millis(150), Outcome::Success, t0);
        b.record_at(p, Duration::from_millis(150), Outcome::Success, t0);
        assert!(!b.keep_at(p, t0));
    }
}
