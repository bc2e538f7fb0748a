//! What the executor needs from an engine: send a step, stream the result.

use std::pin::Pin;

use futures::Stream;
use futures::future::BoxFuture;
use router_core::PodId;
use serde_json::Value;

/// Which part of a request a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// The whole request on one pod.
    Full,
    /// Prefill only; the response carries a cache handle.
    Prefill,
    /// Decode, given the handle of a prefill (or prefill and decode when
    /// there is none, as a conditional flow does for short prompts).
    Decode,
}

/// One step sent to a backend.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StepRequest {
    /// What the step runs.
    pub kind: StepKind,
    /// The client's request body (for HTTP engines, the OpenAI JSON).
    pub body: Value,
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// The cache handle of an earlier prefill step (vLLM's
    /// `kv_transfer_params`), for a decode step.
    pub handle: Option<Value>,
}

impl StepRequest {
    /// A request of `prompt_tokens` tokens with `body`, run as one step.
    pub fn new(body: Value, prompt_tokens: u64) -> Self {
        StepRequest {
            kind: StepKind::Full,
            body,
            prompt_tokens,
            handle: None,
        }
    }
}

/// One piece of a step's response.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Chunk {
    /// Response data passed through to the caller (a streamed event or a body).
    Data(Value),
    /// Response data as the engine's own JSON text, passed through without
    /// being parsed and written again (a streamed event that carries nothing
    /// the router reads).
    Text(String),
    /// Token usage as the engine reports it (vLLM:
    /// `usage.prompt_tokens_details.cached_tokens`).
    Usage {
        /// Prompt tokens of the request.
        prompt_tokens: u64,
        /// Prompt tokens served from the engine's prefix cache, if reported.
        cached_tokens: Option<u64>,
    },
    /// The cache handle a prefill returns for its decode step.
    Handle(Value),
}

/// Why a backend failed a step.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The pod could not be reached or refused the request.
    #[error("pod unavailable: {0}")]
    Unavailable(String),
    /// The pod failed the request.
    #[error("pod failed the request: {0}")]
    Failed(String),
    /// The pod refused the request as invalid (an HTTP 4xx). Any pod would,
    /// so it is not retried, and it says nothing about the pod's health.
    #[error("request rejected with status {status}: {body}")]
    Rejected {
        /// The status the pod answered with.
        status: u16,
        /// What it said.
        body: String,
    },
}

/// A step's response.
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<Chunk, BackendError>> + Send>>;

/// An engine endpoint: sends a step to a pod and streams the result back.
///
/// Dropping the returned future or stream cancels the request; an HTTP
/// backend closes the connection, a simulated one stops generating.
pub trait Backend: Send + Sync {
    /// Sends `request` to `pod`.
    fn send(
        &self,
        pod: PodId,
        request: StepRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, BackendError>>;
}

impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    fn send(
        &self,
        pod: PodId,
        request: StepRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, BackendError>> {
        (**self).send(pod, request)
    }
}
