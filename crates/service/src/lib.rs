//! cache-router's routing core as a library: one [`Router`] that every
//! front (the reference gateway, an endpoint picker, bindings, your own
//! proxy) builds on.
//!
//! # The design choice
//!
//! A [`Router`] is built only from the public layer crates: the prompt is
//! tokenized and templated exactly as the engine does it (router-hash,
//! whose parity with `transformers` is tested), hashed into a block chain,
//! decided by a profile from the configuration (router-policy, whose
//! `prefix-match` step queries router-index once), and, for a front that
//! proxies, run by router-exec over an HTTP backend with retries on other
//! pods. The index is kept current by router-events subscribed to each
//! engine's ZeroMQ stream, or by the shared log of router-nats when
//! replicas share state. What a front adds is its protocol: HTTP and
//! OpenAI's API for the gateway, Envoy's external processing for an
//! endpoint picker.
//!
//! # Items
//!
//! - [`Router`]: start from a [`Config`] (TOML, or built in code);
//!   [`Router::pick`] for a front that sends the request itself (a
//!   [`Pick`] holds the pod's load until it drops), [`Router::route`] for
//!   one that proxies (a [`Routed`] streams the engine's chunks); pods
//!   added, removed and replaced at run time; [`Health`]; [`Metrics`] and
//!   their Prometheus text.
//! - [`Request`]: a completion or a chat, checked where it enters.
//! - [`Refusal`]: a request not served, with its OpenAI-shaped answer.
//! - [`Chunk`]: what a [`Routed`] streams (router-exec's).
//! - [`HttpBackend`]: pooled HTTP to engines, server-sent events decoded
//!   as they arrive ([`SseDecoder`]), vLLM's prefill/decode bodies.
//! - [`openai`]: the OpenAI API surface a gateway and an engine both parse
//!   (endpoints, prompt tokens, usage, the error shape).
#![forbid(unsafe_code)]

mod backend;
mod config;
mod error;
mod metrics;
pub mod openai;
mod pods;
mod pool;
mod request;
mod router;
mod sse;

pub use backend::HttpBackend;
pub use config::{Config, GatewayConfig, NatsSection, PodConfig, SimulatedConfig, WorkflowKind};
pub use error::Error;
pub use metrics::Metrics;
pub use openai::{Api, ApiError, parse_body, prompt_tokens};
pub use pods::PodView;
pub use request::Request;
pub use router::{Health, Pick, PodChanges, Refusal, Routed, Router};
pub use router_exec::Chunk;
pub use sse::{SseDecoder, SseError, event as sse_event};
