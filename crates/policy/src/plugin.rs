//! The plugin traits of the four stages, and closures as plugins.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::context::{Context, KeyId};
use crate::pod::PodState;

/// What every plugin has: a name, and the context keys it reads and writes.
/// Only `name` is required.
pub trait Plugin: Send + Sync + fmt::Debug {
    /// The plugin's name in its profile (unique there).
    fn name(&self) -> &str;
    /// Keys this plugin reads from the context.
    fn needs(&self) -> Vec<KeyId> {
        Vec::new()
    }
    /// Keys this plugin writes into the context.
    fn produces(&self) -> Vec<KeyId> {
        Vec::new()
    }
    /// Called with the chosen pod after every decision (for memory such as
    /// session affinity).
    fn on_pick(&self, ctx: &Context, pod: &PodState) {
        let _ = (ctx, pod);
    }
}

/// Stage 1: computes per-request data (for example the prefix match).
pub trait Prepare: Plugin {
    /// Fills the context for this request.
    fn prepare(&self, ctx: &mut Context, pods: &[PodState]);
}

/// Stage 2: keeps or drops each candidate. Filters never fail.
pub trait Filter: Plugin {
    /// Whether `pod` may serve this request.
    fn keep(&self, ctx: &Context, pod: &PodState) -> bool;

    /// Keeps the candidates that may serve this request. Defaults to
    /// [`Filter::keep`] per pod; filters that judge a pod against the others
    /// (a load bound) override this.
    fn retain(&self, ctx: &Context, pods: &mut Vec<PodState>) {
        pods.retain(|p| self.keep(ctx, p));
    }
}

/// Stage 3: scores candidates in `0..=1` (higher is better). A scorer with
/// no opinion leaves every score equal.
pub trait Scorer: Plugin {
    /// Writes one score per pod into `out` (same order, pre-zeroed).
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]);
}

/// Stage 4: picks one candidate from the weighted total scores.
pub trait Picker: Plugin {
    /// The index of the chosen pod in `pods`, `None` only when `pods` is empty.
    fn pick(&self, ctx: &Context, pods: &[PodState], scores: &[f64]) -> Option<usize>;
}

/// A filter from a closure: `filter_fn("gpu-a100", |_, pod| ...)`.
pub fn filter_fn<F>(name: impl Into<String>, f: F) -> FnFilter<F>
where
    F: Fn(&Context, &PodState) -> bool + Send + Sync,
{
    FnFilter {
        name: name.into(),
        f,
    }
}

/// A per-pod scorer from a closure returning a score in `0..=1`.
pub fn scorer_fn<F>(name: impl Into<String>, f: F) -> FnScorer<F>
where
    F: Fn(&Context, &PodState) -> f64 + Send + Sync,
{
    FnScorer {
        name: name.into(),
        f,
        needs: Vec::new(),
    }
}

/// See [`filter_fn`].
pub struct FnFilter<F> {
    name: String,
    f: F,
}

impl<F> fmt::Debug for FnFilter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FnFilter({})", self.name)
    }
}

impl<F: Fn(&Context, &PodState) -> bool + Send + Sync> Plugin for FnFilter<F> {
    fn name(&self) -> &str {
        &self.name
    }
}

impl<F: Fn(&Context, &PodState) -> bool + Send + Sync> Filter for FnFilter<F> {
    fn keep(&self, ctx: &Context, pod: &PodState) -> bool {
        (self.f)(ctx, pod)
    }
}

/// See [`scorer_fn`].
pub struct FnScorer<F> {
    name: String,
    f: F,
    needs: Vec<KeyId>,
}

impl<F> FnScorer<F> {
    /// Declares a context key the closure reads, so profile validation
    /// checks that something produces it.
    pub fn needs(mut self, key: KeyId) -> Self {
        self.needs.push(key);
        self
    }
}

impl<F> fmt::Debug for FnScorer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FnScorer({})", self.name)
    }
}

impl<F: Fn(&Context, &PodState) -> f64 + Send + Sync> Plugin for FnScorer<F> {
    fn name(&self) -> &str {
        &self.name
    }
    fn needs(&self) -> Vec<KeyId> {
        self.needs.clone()
    }
}

impl<F: Fn(&Context, &PodState) -> f64 + Send + Sync> Scorer for FnScorer<F> {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        for (o, p) in out.iter_mut().zip(pods) {
            *o = (self.f)(ctx, p).clamp(0.0, 1.0);
        }
    }
}

/// A lock-free stream of pseudo-random numbers for pickers (SplitMix64 over
/// an atomic counter): fair tie-breaking without a shared lock.
#[derive(Debug)]
pub(crate) struct Rng(AtomicU64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(AtomicU64::new(seed))
    }

    pub(crate) fn next(&self) -> u64 {
        // SplitMix64.
        let gamma = router_core::GOLDEN_GAMMA;
        router_core::mix64(
            self.0
                .fetch_add(gamma, Ordering::Relaxed)
                .wrapping_add(gamma),
        )
    }

    /// A value in `0..n` (`n > 0`).
    pub(crate) fn below(&self, n: usize) -> usize {
        ((self.next() as u128 * n as u128) >> 64) as usize
    }

    /// A value in `0..1`.
    pub(crate) fn unit(&self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
