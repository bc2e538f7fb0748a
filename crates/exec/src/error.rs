use router_core::PodId;

use crate::backend::BackendError;

/// Why a workflow failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The profile could not choose a pod (for example every pod filtered out).
    #[error("no pod to route to: {0}")]
    NoPod(router_policy::Error),
    /// Every attempt failed before its first chunk.
    #[error("step failed on {attempts} pod(s); last error: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: usize,
        /// The last attempt's error.
        last: Box<Error>,
    },
    /// The backend failed.
    #[error("pod {pod}: {source}")]
    Backend {
        /// The pod.
        pod: PodId,
        /// What it reported.
        source: BackendError,
    },
    /// The step ran past its deadline.
    #[error("pod {pod}: step timed out")]
    Timeout {
        /// The pod.
        pod: PodId,
    },
    /// A stream ended before its first chunk, or a prefill without a handle.
    #[error("pod {pod}: {what}")]
    Protocol {
        /// The pod.
        pod: PodId,
        /// What was missing.
        what: &'static str,
    },
}
