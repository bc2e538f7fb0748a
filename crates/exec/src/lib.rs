//! The execution layer: runs a request's steps against backends.
//!
//! # The design choice
//!
//! A workflow is an ordered list of steps, each with its own routing
//! profile; single dispatch is the one-step case and nothing is
//! special-cased for it. Every step but the last runs to completion (a
//! prefill returns its cache handle, which the next decision sees in the
//! context and the next request carries); the last step streams to the
//! caller. An attempt that fails before its first chunk is retried on
//! another pod (the failed one excluded) with backoff; an error after
//! streaming began is reported, never retried blindly. Each attempt's load
//! accounting is an RAII guard, so success, error, timeout and the caller
//! dropping the stream all return the pod's counters to where they were.
//!
//! # Items
//!
//! - [`Backend`] (send a step, get a [`ChunkStream`]), [`StepRequest`],
//!   [`Chunk`], [`StepKind`].
//! - [`Workflow`], [`Step`], [`Shortcut`]; context keys [`PREFILL_POD`] and
//!   [`CACHE_HANDLE`] for the decode decision.
//! - [`Executor`] with [`RetryPolicy`] and an optional [`Observer`];
//!   [`Execution`] is the caller's stream.
//! - [`Feedback`]: the engine's reported cached tokens against the router's
//!   prediction, optionally correcting the index.
//!
//! # A prefill -> decode workflow in a few lines
//!
//! ```no_run
//! # async fn run(backend: std::sync::Arc<dyn router_exec::Backend>) -> Result<(), router_exec::Error> {
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use router_exec::{Executor, Feedback, StepRequest, Workflow};
//! use router_policy::builtin::{LeastRequests, RoleFilter};
//! use router_policy::{Context, Fleet, Profile, Role};
//!
//! let by_role = |role| -> Arc<Profile> {
//!     Arc::new(Profile::builder(format!("{role:?}")).filter(RoleFilter::new(role))
//!         .picker(LeastRequests::default()).build().expect("valid"))
//! };
//! let workflow = Workflow::prefill_decode(by_role(Role::Prefill), by_role(Role::Decode));
//! let exec = Executor::new(backend, Arc::new(Fleet::new()), Arc::new(Feedback::new(16)));
//! let body = serde_json::json!({"model": "qwen3", "prompt": "Hello"});
//! let mut out = exec.execute(&workflow, Context::new(), StepRequest::new(body, 2)).await?;
//! while let Some(chunk) = out.next().await {
//!     println!("{:?}", chunk?);
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod backend;
mod error;
mod executor;
mod feedback;
mod workflow;

pub use backend::{Backend, BackendError, Chunk, ChunkStream, StepKind, StepRequest};
pub use error::Error;
pub use executor::{Execution, Executor, Lease, Observer, RetryPolicy};
pub use feedback::{Feedback, FeedbackStats};
pub use workflow::{CACHE_HANDLE, PREFILL_POD, Shortcut, Step, Workflow};
