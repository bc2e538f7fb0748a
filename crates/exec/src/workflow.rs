//! Workflows: ordered steps, each with its own profile.

use std::sync::Arc;
use std::time::Duration;

use router_policy::keys::CACHE_HITS;
use router_policy::{Context, Key, Profile};
use serde_json::Value;

use crate::backend::StepKind;

/// The pod that ran a request's prefill, for the decode decision.
pub const PREFILL_POD: Key<router_core::PodId> = Key::new("prefill_pod");
/// The cache handle the prefill returned, for the decode decision.
pub const CACHE_HANDLE: Key<Value> = Key::new("cache_handle");

/// One step: what it runs, how its pod is chosen, how long it may take.
#[derive(Clone, Debug)]
pub struct Step {
    /// What the step runs.
    pub kind: StepKind,
    /// The profile choosing its pod.
    pub profile: Arc<Profile>,
    /// The step's deadline, from its first attempt to its last chunk.
    pub timeout: Duration,
}

impl Step {
    /// A step of `kind` routed by `profile` with a 60 s deadline.
    pub fn new(kind: StepKind, profile: Arc<Profile>) -> Self {
        Step {
            kind,
            profile,
            timeout: Duration::from_secs(60),
        }
    }

    /// Sets the deadline.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// When a prefill->decode workflow sends a request straight to decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shortcut {
    /// Prompts of at most this many tokens skip the prefill step.
    pub max_prompt_tokens: u64,
    /// Prompts with at least this share of their blocks cached on some pod
    /// (read from `CACHE_HITS` if the caller set it) skip it too.
    pub min_cached_fraction: f64,
}

/// An ordered set of steps. Every step but the last runs to completion;
/// the last one streams to the caller.
#[derive(Clone, Debug)]
pub struct Workflow {
    pub(crate) steps: Vec<Step>,
    pub(crate) shortcut: Option<Shortcut>,
}

impl Workflow {
    /// One step on one pod: single dispatch.
    pub fn single(profile: Arc<Profile>) -> Self {
        Workflow {
            steps: vec![Step::new(StepKind::Full, profile)],
            shortcut: None,
        }
    }

    /// Prefill on a pod chosen by `prefill`, then decode on a pod chosen by
    /// `decode` with the prefill's pod and handle in the context.
    pub fn prefill_decode(prefill: Arc<Profile>, decode: Arc<Profile>) -> Self {
        Workflow {
            steps: vec![
                Step::new(StepKind::Prefill, prefill),
                Step::new(StepKind::Decode, decode),
            ],
            shortcut: None,
        }
    }

    /// Any steps, in order.
    pub fn from_steps(steps: Vec<Step>) -> Self {
        Workflow {
            steps,
            shortcut: None,
        }
    }

    /// Sends short or well-cached prompts straight to the last step.
    pub fn with_shortcut(mut self, shortcut: Shortcut) -> Self {
        self.shortcut = Some(shortcut);
        self
    }

    /// Sets every step's deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        for s in &mut self.steps {
            s.timeout = timeout;
        }
        self
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The steps this request runs (all, or the last alone when the
    /// shortcut applies).
    pub(crate) fn plan(&self, ctx: &Context, prompt_tokens: u64) -> &[Step] {
        let skip = self.shortcut.is_some_and(|s| {
            let cached = ctx.get(CACHE_HITS).is_some_and(|h| {
                h.chain_len() > 0 && h.best() as f64 >= s.min_cached_fraction * h.chain_len() as f64
            });
            prompt_tokens <= s.max_prompt_tokens || cached
        });
        if skip {
            &self.steps[self.steps.len().saturating_sub(1)..]
        } else {
            &self.steps
        }
    }
}
