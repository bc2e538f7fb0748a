use std::sync::atomic::{AtomicUsize, Ordering};

use crate::context::{Context, KeyId};
use crate::keys::HASH_KEY;
use crate::plugin::{Picker, Plugin, Rng};
use crate::pod::PodState;

/// Scores this close count as a tie.
const TIE: f64 = 1e-9;

/// A uniformly random index among the items `eligible` accepts (reservoir
/// sampling, one pass, no allocation).
fn random_among(rng: &Rng, n: usize, mut eligible: impl FnMut(usize) -> bool) -> Option<usize> {
    let mut chosen = None;
    let mut seen = 0usize;
    for i in 0..n {
        if eligible(i) {
            seen += 1;
            if rng.below(seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

macro_rules! named {
    ($t:ty, $name:literal) => {
        impl Plugin for $t {
            fn name(&self) -> &str {
                $name
            }
        }
    };
}

/// `max-score`: the highest total score; ties broken uniformly at random,
/// so equal pods share traffic.
#[derive(Debug)]
pub struct MaxScore {
    rng: Rng,
}

impl Default for MaxScore {
    fn default() -> Self {
        MaxScore { rng: Rng::new(1) }
    }
}

named!(MaxScore, "max-score");

impl Picker for MaxScore {
    fn pick(&self, _: &Context, pods: &[PodState], scores: &[f64]) -> Option<usize> {
        let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        random_among(&self.rng, pods.len().min(scores.len()), |i| {
            scores[i] >= best - TIE
        })
    }
}

/// `weighted-random`: chance proportional to the total score (uniform when
/// every score is 0).
#[derive(Debug)]
pub struct WeightedRandom {
    rng: Rng,
}

impl Default for WeightedRandom {
    fn default() -> Self {
        WeightedRandom { rng: Rng::new(2) }
    }
}

named!(WeightedRandom, "weighted-random");

impl Picker for WeightedRandom {
    fn pick(&self, _: &Context, pods: &[PodState], scores: &[f64]) -> Option<usize> {
        let n = pods.len().min(scores.len());
        let total: f64 = scores[..n].iter().map(|s| s.max(0.0)).sum();
        if total <= 0.0 {
            return random_among(&self.rng, n, |_| true);
        }
        let mut x = self.rng.unit() * total;
        for (i, s) in scores[..n].iter().enumerate() {
            x -= s.max(0.0);
            if x < 0.0 {
                return Some(i);
            }
        }
        (n > 0).then(|| n - 1)
    }
}

/// `round-robin`: candidates in turn, ignoring scores.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

named!(RoundRobin, "round-robin");

impl Picker for RoundRobin {
    fn pick(&self, _: &Context, pods: &[PodState], _: &[f64]) -> Option<usize> {
        (!pods.is_empty()).then(|| self.next.fetch_add(1, Ordering::Relaxed) % pods.len())
    }
}

/// `random`: a uniformly random candidate.
#[derive(Debug)]
pub struct RandomPick {
    rng: Rng,
}

impl Default for RandomPick {
    fn default() -> Self {
        RandomPick { rng: Rng::new(3) }
    }
}

named!(RandomPick, "random");

impl Picker for RandomPick {
    fn pick(&self, _: &Context, pods: &[PodState], _: &[f64]) -> Option<usize> {
        (!pods.is_empty()).then(|| self.rng.below(pods.len()))
    }
}

/// `least-requests`: the fewest requests in flight, ties at random.
#[derive(Debug)]
pub struct LeastRequests {
    rng: Rng,
}

impl Default for LeastRequests {
    fn default() -> Self {
        LeastRequests { rng: Rng::new(4) }
    }
}

named!(LeastRequests, "least-requests");

impl Picker for LeastRequests {
    fn pick(&self, _: &Context, pods: &[PodState], _: &[f64]) -> Option<usize> {
        let min = pods.iter().map(|p| p.in_flight).min()?;
        random_among(&self.rng, pods.len(), |i| pods[i].in_flight == min)
    }
}

/// `power-of-two`: two random candidates, the one with fewer requests in
/// flight (ties: the higher score).
#[derive(Debug)]
pub struct PowerOfTwo {
    rng: Rng,
}

impl Default for PowerOfTwo {
    fn default() -> Self {
        PowerOfTwo { rng: Rng::new(5) }
    }
}

named!(PowerOfTwo, "power-of-two");

impl Picker for PowerOfTwo {
    fn pick(&self, _: &Context, pods: &[PodState], scores: &[f64]) -> Option<usize> {
        let n = pods.len();
        match n {
            0 => None,
            1 => Some(0),
            _ => {
                let a = self.rng.below(n);
                let b = (a + 1 + self.rng.below(n - 1)) % n;
                let key = |i: usize| (pods[i].in_flight, -scores.get(i).copied().unwrap_or(0.0));
                Some(if key(b) < key(a) { b } else { a })
            }
        }
    }
}

/// `consistent-hash`: rendezvous (highest-random-weight) hashing of the
/// request's [`HASH_KEY`] over the candidates, with bounded load (Mirrokni,
/// Thorup and Zadimoghaddam): the preferred pod unless it would exceed
/// `ceil(load_factor * (in_flight_total + 1) / candidates)` requests in
/// flight, else the next in its preference order. A pod joining or leaving
/// moves only the keys it wins or held.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsistentHash {
    load_factor: f64,
}

impl ConsistentHash {
    /// Bounded load with `load_factor` (at least 1; 1.25 is common).
    pub fn new(load_factor: f64) -> Self {
        ConsistentHash {
            load_factor: if load_factor.is_finite() {
                load_factor.max(1.0)
            } else {
                1.25
            },
        }
    }

    /// The bound on requests in flight per pod for the next request.
    pub fn bound(&self, pods: &[PodState]) -> u64 {
        let total: u64 = pods.iter().map(|p| p.in_flight as u64).sum();
        (self.load_factor * (total + 1) as f64 / pods.len().max(1) as f64).ceil() as u64
    }
}

impl Default for ConsistentHash {
    fn default() -> Self {
        ConsistentHash::new(1.25)
    }
}

/// The rendezvous-hashing weight of `pod` for `key`.
pub(crate) fn rendezvous_weight(key: u64, pod: &PodState) -> u64 {
    let pod_key = (pod.id.slot() as u64) << 32 | pod.id.epoch() as u64;
    router_core::mix64(key ^ pod_key.wrapping_mul(router_core::GOLDEN_GAMMA))
}

impl Plugin for ConsistentHash {
    fn name(&self) -> &str {
        "consistent-hash"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![HASH_KEY.id()]
    }
}

impl Picker for ConsistentHash {
    fn pick(&self, ctx: &Context, pods: &[PodState], _: &[f64]) -> Option<usize> {
        let key = ctx.get(HASH_KEY).copied().unwrap_or(0);
        let bound = self.bound(pods);
        // The least loaded pod is always under the bound, so some pod is eligible.
        pods.iter()
            .enumerate()
            .filter(|(_, p)| (p.in_flight as u64) < bound)
            .max_by_key(|(_, p)| rendezvous_weight(key, p))
            .map(|(i, _)| i)
    }
}
