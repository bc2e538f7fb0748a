//! cache-router as an endpoint picker (EPP) for Envoy: the Gateway API
//! Inference Extension's endpoint-picker protocol (v1) over Envoy's
//! external processing, one front over [`router_service::Router`].
//!
//! # The protocol
//!
//! Envoy's `ext_proc` filter opens one `ExternalProcessor/Process` stream
//! per HTTP request and sends its headers, its body (buffered: the filter's
//! `request_body_mode: BUFFERED`, or streamed, below) and the response's
//! headers and body (`response_body_mode: STREAMED`). The picker answers:
//!
//! - request headers: continue, with any client-sent
//!   `x-gateway-destination-endpoint` removed (the client does not choose);
//!   when Envoy sends the body without waiting for this answer
//!   (`request_body_mode: STREAMED` with
//!   `send_body_without_waiting_for_header_response: true`, which the
//!   stream's first message reports in its `protocol_config`), the answer
//!   is held until the body has come and carries the decision below, and
//!   each body chunk is then passed on unchanged: one round trip a request
//!   instead of two (`deploy/envoy/envoy.yaml` does this);
//! - request body: the request is parsed as OpenAI's completions or chat,
//!   tokenized and decided by the router ([`Router::pick_among`], among the
//!   `ip:port`s of the `envoy.lb.subset_hint` metadata when Envoy sends
//!   one); the answer sets `x-gateway-destination-endpoint: ip:port` as a
//!   header and in the `envoy.lb` dynamic metadata, and clears the route
//!   cache. A request the router refuses gets an immediate response: 400 or
//!   404 in OpenAI's shape, 503 when no pod can take it;
//! - response headers: continue, adding `x-cache-router-pod` and
//!   `x-cache-router-predicted-cached-tokens` (what the index predicted);
//! - response body: the first chunk ends the pod's queued prefill, the
//!   usage (`usage.prompt_tokens_details.cached_tokens`, in the whole body
//!   or in the stream's usage chunk) is compared with the prediction, and
//!   the end of the stream ends the pick's load.
//!
//! The load a pick holds is counted from the request body to the end of the
//! response; a stream that ends early (Envoy gave up, the client left)
//! drops it, which gives the load back. Bodies are bounded
//! ([`EppConfig::max_body_bytes`], [`EppConfig::max_response_bytes`]): a
//! larger request is refused with 413, a larger whole response is passed on
//! without reading its usage.
//!
//! Paths other than the two generation endpoints (`/v1/models`, say) go to
//! any healthy pod. gRPC health answers for `liveness`, `readiness` (a pod
//! answering) and `envoy.service.ext_proc.v3.ExternalProcessor`.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as In;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Out;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures::Stream;
use router_service::openai::{self, Api, ApiError};
use router_service::{Pick, Refusal, Request, Router, SseDecoder};
use tonic::{Status, Streaming};

/// The header (and `envoy.lb` metadata key) naming the chosen endpoint.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key: the `ip:port`s the picker may choose from.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The metadata namespace of the decision.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Header naming the pod chosen, added to the response.
pub const POD_HEADER: &str = "x-cache-router-pod";
/// Header with the cached tokens the index predicted, added to the response.
pub const PREDICTED_HEADER: &str = "x-cache-router-predicted-cached-tokens";
/// The request header carrying a decision to the observing filter (split
/// mode: see [`OBSERVER_METADATA`]).
pub const EXCHANGE_HEADER: &str = "x-cache-router-exchange";
/// The gRPC metadata key of a decision filter whose response side another,
/// observing, ext_proc filter watches (`observability_mode`, so Envoy waits
/// on no response message): `initial_metadata: [{ key:
/// x-cache-router-observer, value: separate }]` on the decision filter's
/// `grpc_service`. The decision then travels in [`EXCHANGE_HEADER`], the pod
/// and the prediction as request headers a route copies to the response.
pub const OBSERVER_METADATA: &str = "x-cache-router-observer";
/// Decisions waiting for their observing stream at most this long.
const HANDOFF_TTL: Duration = Duration::from_secs(600);
/// Decisions waiting at most; beyond, the oldest are dropped (their load
/// given back).
const HANDOFF_MAX: usize = 65_536;

/// The gRPC service name Envoy's health check asks for.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// What the picker accepts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EppConfig {
    /// The largest request body read (413 above it).
    pub max_body_bytes: usize,
    /// The largest whole (not streamed) response read for its usage;
    /// larger ones pass without it.
    pub max_response_bytes: usize,
    /// The request header naming a session (session affinity); the
    /// body's `user` serves when it is absent.
    pub session_header: String,
}

impl Default for EppConfig {
    fn default() -> Self {
        EppConfig {
            max_body_bytes: 8 << 20,
            max_response_bytes: 4 << 20,
            session_header: "x-session-id".into(),
        }
    }
}

/// The endpoint picker: an `ExternalProcessor` over a [`Router`].
#[derive(Clone, Debug)]
pub struct Epp {
    router: Router,
    config: Arc<EppConfig>,
    handoff: Arc<Handoff>,
}

/// A decision made on the decision filter's stream, waiting for the
/// observing filter's stream of the same request.
struct Handed {
    pick: Pick,
    streamed: bool,
    label: &'static str,
    at: Instant,
}

/// Decisions handed from a decision stream to an observing one, by id;
/// bounded in age and count (a request whose response never comes, say
/// because Envoy answered it locally without its observer, gives its load
/// back when it expires or is pushed out).
#[derive(Default)]
struct Handoff {
    waiting: parking_lot::Mutex<Waiting>,
    next: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Waiting {
    by_id: HashMap<u64, Handed>,
    /// When expired decisions were last looked for (at most once a second,
    /// not on every insert).
    swept: Option<Instant>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("waiting", &self.waiting.lock().by_id.len())
            .finish()
    }
}

impl Handoff {
    fn put(&self, h: Handed) -> u64 {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Distinct per process and request (the header is removed from
        // clients' requests before any filter runs).
        let id =
            n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id()).rotate_left(32);
        // Decisions dropped here give their pods' load back: outside the
        // lock.
        let mut dropped = Vec::new();
        let mut w = self.waiting.lock();
        if w.swept
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            w.swept = Some(Instant::now());
            let expired: Vec<u64> = w
                .by_id
                .iter()
                .filter(|(_, h)| h.at.elapsed() >= HANDOFF_TTL)
                .map(|(k, _)| *k)
                .collect();
            dropped.extend(expired.iter().filter_map(|k| w.by_id.remove(k)));
        }
        if w.by_id.len() >= HANDOFF_MAX
            && let Some(oldest) = w.by_id.iter().min_by_key(|(_, h)| h.at).map(|(k, _)| *k)
        {
            dropped.extend(w.by_id.remove(&oldest));
        }
        w.by_id.insert(id, h);
        drop(w);
        drop(dropped);
        id
    }

    fn take(&self, id: u64) -> Option<Handed> {
        self.waiting.lock().by_id.remove(&id)
    }

    fn len(&self) -> usize {
        self.waiting.lock().by_id.len()
    }
}

impl Epp {
    /// A picker deciding with `router`.
    pub fn new(router: Router, config: EppConfig) -> Self {
        Epp {
            router,
            config: Arc::new(config),
            handoff: Arc::default(),
        }
    }

    /// Decisions waiting for their observing stream (split mode).
    pub fn waiting_decisions(&self) -> usize {
        self.handoff.len()
    }

    /// Serves the picker and gRPC health on `listener` until `shutdown`
    /// resolves; readiness follows the router's health (checked every
    /// second).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        // A body chunk is decoded whole before it can be refused with 413
        // (tonic's default limit, 4 MiB, would end the stream instead):
        // room for chunks up to twice the largest body read.
        let decoding_limit = self
            .config
            .max_body_bytes
            .saturating_mul(2)
            .saturating_add(1 << 20);
        let (reporter, health) = tonic_health::server::health_reporter();
        let router = self.router.clone();
        let ready = tokio::spawn(async move {
            loop {
                let h = router.health();
                let status = if h.probed && h.answering > 0 {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                reporter
                    .set_service_status("liveness", tonic_health::ServingStatus::Serving)
                    .await;
                reporter.set_service_status("readiness", status).await;
                reporter.set_service_status(EXT_PROC_SERVICE, status).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let served = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(
                ExternalProcessorServer::new(self).max_decoding_message_size(decoding_limit),
            )
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        ready.abort();
        served
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Epp {
    type ProcessStream = Responses;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        let split = request
            .metadata()
            .get(OBSERVER_METADATA)
            .is_some_and(|v| v.as_bytes() == b"separate");
        let inbound = request.into_inner();
        let mut exchange = Exchange::new(self.router.clone(), self.config.clone());
        exchange.handoff = Some(self.handoff.clone());
        exchange.split = split;
        let out = futures::stream::unfold(
            (inbound, exchange, VecDeque::new()),
            |(mut inbound, mut exchange, mut queue)| async move {
                loop {
                    // A message may be answered later (a request's headers
                    // held until its body has come) or with several
                    // replies at once (the headers' and the body's).
                    if let Some(reply) = queue.pop_front() {
                        return Some((Ok(reply), (inbound, exchange, queue)));
                    }
                    match inbound.message().await {
                        Ok(Some(msg)) if msg.observability_mode => {
                            // In observability mode Envoy waits on no
                            // answer, and none is sent.
                            exchange.handle(msg, &mut queue).await;
                            queue.clear();
                            if exchange.answered {
                                // The response is over: close the stream
                                // rather than leave it to Envoy's deferred
                                // close (5 s by default), which kept
                                // thousands of finished exchanges open at
                                // full load.
                                return None;
                            }
                        }
                        Ok(Some(msg)) => exchange.handle(msg, &mut queue).await,
                        // The stream ended (the request is over, or Envoy
                        // gave up): the exchange drops, and so does its
                        // pick's load.
                        Ok(None) | Err(_) => return None,
                    }
                }
            },
        );
        Ok(tonic::Response::new(Box::pin(out)))
    }
}

/// One HTTP request's exchange with Envoy.
struct Exchange {
    router: Router,
    config: Arc<EppConfig>,
    path: String,
    session: Option<String>,
    subset: Option<Vec<String>>,
    body: Vec<u8>,
    pick: Option<Pick>,
    /// The answer's label for metrics (`chat`, `completions`).
    label: &'static str,
    streamed: bool,
    status: u16,
    first_chunk_seen: bool,
    sse: SseDecoder,
    whole: Option<Vec<u8>>,
    /// Where decisions go in split mode, and come from on an observing
    /// stream.
    handoff: Option<Arc<Handoff>>,
    /// A decision filter whose response side another filter observes.
    split: bool,
    /// The response ended (its headers or body with end of stream).
    answered: bool,
    /// Envoy sends the body without waiting for the answer to the headers
    /// (`request_body_mode: STREAMED` with
    /// `send_body_without_waiting_for_header_response`): the headers'
    /// answer is held until the body has come and carries the decision, one
    /// round trip a request instead of two.
    early_body: bool,
    /// The headers' answer is held (early body).
    headers_held: bool,
    /// Body chunks not yet answered (early body).
    owed_chunks: usize,
}

impl Exchange {
    fn new(router: Router, config: Arc<EppConfig>) -> Self {
        Exchange {
            router,
            path: String::new(),
            session: None,
            subset: None,
            body: Vec::new(),
            pick: None,
            label: "other",
            streamed: false,
            status: 0,
            first_chunk_seen: false,
            sse: SseDecoder::new(config.max_response_bytes).max_event(config.max_response_bytes),
            whole: Some(Vec::new()),
            handoff: None,
            split: false,
            answered: false,
            early_body: false,
            headers_held: false,
            owed_chunks: 0,
            config,
        }
    }

    /// Envoy's message answered into `out`: no reply yet (headers held),
    /// one, or several (the held headers' and the body's).
    async fn handle(&mut self, msg: ProcessingRequest, out: &mut VecDeque<ProcessingResponse>) {
        if let Some(hint) = subset_hint(msg.metadata_context.as_ref()) {
            self.subset = Some(hint);
        }
        // Sent on a stream's first message only.
        if let Some(p) = msg.protocol_config {
            self.early_body = p.send_body_without_waiting_for_header_response
                && p.request_body_mode == BodySendMode::Streamed as i32;
        }
        let one = match msg.request {
            Some(In::RequestHeaders(h)) => self.request_headers(&h),
            Some(In::RequestBody(b)) => return self.request_body(b, out).await,
            Some(In::ResponseHeaders(h)) => Some(self.response_headers(&h)),
            Some(In::ResponseBody(b)) => Some(self.response_body(&b)),
            Some(In::RequestTrailers(_)) => {
                Some(reply(Out::RequestTrailers(TrailersResponse::default())))
            }
            Some(In::ResponseTrailers(_)) => {
                Some(reply(Out::ResponseTrailers(TrailersResponse::default())))
            }
            None => Some(reply(Out::RequestHeaders(HeadersResponse::default()))),
        };
        out.extend(one);
    }

    fn request_headers(&mut self, h: &HttpHeaders) -> Option<ProcessingResponse> {
        self.path = header(h, ":path").unwrap_or_default();
        self.session = header(h, &self.config.session_header);
        self.take_handed(h);
        if h.end_of_stream {
            // No body follows: not a generation; any healthy pod serves it.
            match self.any_endpoint() {
                Some(ep) => {
                    return Some(with_metadata(
                        reply(Out::RequestHeaders(response(destination(&ep)))),
                        &ep,
                    ));
                }
                None => return Some(immediate(&no_pod())),
            }
        }
        if self.early_body {
            // Answered with the body's decision.
            self.headers_held = true;
            return None;
        }
        let mut m = HeaderMutation::default();
        remove_client_headers(&mut m);
        Some(reply(Out::RequestHeaders(response(CommonResponse {
            header_mutation: Some(m),
            ..Default::default()
        }))))
    }

    async fn request_body(&mut self, b: HttpBody, out: &mut VecDeque<ProcessingResponse>) {
        if self.body.len() + b.body.len() > self.config.max_body_bytes {
            let e = ApiError::new(
                413,
                "invalid_request_error",
                "request_too_large",
                format!(
                    "the request body is larger than {} bytes",
                    self.config.max_body_bytes
                ),
            );
            self.router.metrics().error("body_too_large");
            return out.push_back(immediate(&e));
        }
        self.body.extend_from_slice(&b.body);
        if !b.end_of_stream {
            if self.early_body {
                // Answered once the decision is made.
                self.owed_chunks += 1;
            } else {
                out.push_back(reply(Out::RequestBody(BodyResponse::default())));
            }
            return;
        }
        let route = self.path.split('?').next().unwrap_or_default();
        let api = match route {
            "/v1/completions" => Some(Api::Completions),
            "/v1/chat/completions" => Some(Api::Chat),
            // No request headers were sent (`request_header_mode: SKIP`):
            // the body says which endpoint.
            "" => None,
            _ => {
                return match self.any_endpoint() {
                    Some(ep) => self.decided(destination(&ep), &ep, out),
                    None => out.push_back(immediate(&no_pod())),
                };
            }
        };
        self.label = api.map_or("generate", Api::label);
        match self.pick(api).await {
            Ok(pick) => {
                let ep = endpoint_of(&pick.url).unwrap_or_default();
                let mut common = destination(&ep);
                match (&self.handoff, common.header_mutation.as_mut()) {
                    (Some(handoff), Some(m)) if self.split => {
                        // The observing filter takes it from here; the
                        // route copies the pod and the prediction to the
                        // response.
                        m.set_headers.push(set_header(POD_HEADER, &pick.pod));
                        m.set_headers.push(set_header(
                            PREDICTED_HEADER,
                            &pick.predicted_cached_tokens.to_string(),
                        ));
                        let id = handoff.put(Handed {
                            pick,
                            streamed: self.streamed,
                            label: self.label,
                            at: Instant::now(),
                        });
                        m.set_headers
                            .push(set_header(EXCHANGE_HEADER, &id.to_string()));
                    }
                    _ => self.pick = Some(pick),
                }
                self.decided(common, &ep, out)
            }
            Err(r) => {
                let m = self.router.metrics();
                m.error(r.kind);
                m.request(self.label, r.error.status);
                out.push_back(immediate(&r.error))
            }
        }
    }

    /// The decision `common` (for `endpoint`) as the body's answer; with an
    /// early body, as the held headers' answer (the client's control
    /// headers removed, as that answer does) and then every body chunk's.
    fn decided(
        &mut self,
        mut common: CommonResponse,
        endpoint: &str,
        out: &mut VecDeque<ProcessingResponse>,
    ) {
        if !std::mem::take(&mut self.headers_held) {
            return out.push_back(with_metadata(
                reply(Out::RequestBody(body_response(common))),
                endpoint,
            ));
        }
        if let Some(m) = common.header_mutation.as_mut() {
            remove_client_headers(m);
        }
        out.push_back(with_metadata(
            reply(Out::RequestHeaders(response(common))),
            endpoint,
        ));
        let chunks = std::mem::take(&mut self.owed_chunks) + 1;
        out.extend((0..chunks).map(|_| reply(Out::RequestBody(BodyResponse::default()))));
    }

    async fn pick(&mut self, api: Option<Api>) -> Result<Pick, Refusal> {
        let body = std::mem::take(&mut self.body);
        let bad = |e| Refusal::new("bad_request", e);
        let mut request = match api {
            Some(api) => Request::from_openai(api, &body).map_err(bad)?,
            None => {
                let v = openai::parse_body(&body).map_err(bad)?;
                Request::from_json(Api::of_body(&v), v).map_err(bad)?
            }
        };
        self.label = request.api().label();
        if let Some(s) = &self.session {
            request = request.with_session(s.clone());
        }
        self.streamed = request.is_stream();
        match self.subset.clone() {
            Some(allowed) => {
                self.router
                    .pick_among(request, |url| {
                        endpoint_of(url).is_some_and(|ep| allowed.contains(&ep))
                    })
                    .await
            }
            None => self.router.pick(request).await,
        }
    }

    /// On an observing stream, the decision handed over in
    /// [`EXCHANGE_HEADER`]: in the request's headers, or in the response's
    /// (an observer that skips the request copies it there with the route's
    /// `response_headers_to_add`, one message less a request).
    fn take_handed(&mut self, h: &HttpHeaders) {
        if self.pick.is_some() {
            return;
        }
        if let (Some(id), Some(handoff)) = (
            header(h, EXCHANGE_HEADER).and_then(|v| v.parse::<u64>().ok()),
            &self.handoff,
        ) && let Some(handed) = handoff.take(id)
        {
            // The observing stream of a request decided on another.
            self.pick = Some(handed.pick);
            self.streamed = handed.streamed;
            self.label = handed.label;
        }
    }

    fn response_headers(&mut self, h: &HttpHeaders) -> ProcessingResponse {
        self.take_handed(h);
        self.status = header(h, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut set = Vec::new();
        if let Some(p) = &self.pick {
            set.push(set_header(POD_HEADER, &p.pod));
            set.push(set_header(
                PREDICTED_HEADER,
                &p.predicted_cached_tokens.to_string(),
            ));
        }
        if h.end_of_stream {
            self.finish();
        }
        reply(Out::ResponseHeaders(response(CommonResponse {
            header_mutation: Some(HeaderMutation {
                set_headers: set,
                ..Default::default()
            }),
            ..Default::default()
        })))
    }

    fn response_body(&mut self, b: &HttpBody) -> ProcessingResponse {
        if let Some(p) = &mut self.pick {
            if !std::mem::replace(&mut self.first_chunk_seen, true) {
                p.first_token();
            }
            if self.streamed {
                let mut events = Vec::new();
                // An over-long event or line ends the reading of usage, not
                // the answer.
                if self.sse.feed(&b.body, &mut events).is_ok() {
                    // Only the usage chunk is parsed, not every token's.
                    for e in events.iter().filter(|e| e.contains("\"usage\"")) {
                        if let Some(c) = cached_of(e.as_bytes()) {
                            p.cached_tokens(c);
                        }
                    }
                }
            } else if let Some(whole) = &mut self.whole {
                if whole.len() + b.body.len() <= self.config.max_response_bytes {
                    whole.extend_from_slice(&b.body);
                } else {
                    self.whole = None;
                }
            }
        }
        if b.end_of_stream {
            if let (Some(p), Some(whole), false) = (&mut self.pick, &self.whole, self.streamed)
                && let Some(c) = cached_of(whole)
            {
                p.cached_tokens(c);
            }
            self.finish();
        }
        reply(Out::ResponseBody(BodyResponse::default()))
    }

    /// The response ended: the pick's load ends, the answer is counted.
    fn finish(&mut self) {
        self.answered = true;
        if let Some(p) = self.pick.take() {
            let m = self.router.metrics();
            m.request(self.label, self.status);
            m.pod_request(&p.pod, self.status);
            p.finish((200..500).contains(&self.status));
        }
    }

    /// A healthy pod's endpoint, for requests the router does not decide.
    fn any_endpoint(&self) -> Option<String> {
        self.router
            .pods()
            .into_iter()
            .filter(|p| p.healthy && p.in_index)
            .filter_map(|p| endpoint_of(&p.config.url))
            .find(|ep| self.subset.as_ref().is_none_or(|s| s.contains(ep)))
    }
}

/// `host:port` of a pod's base URL (`http://10.0.0.7:8000` -> `10.0.0.7:8000`).
pub fn endpoint_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split('/').next()?;
    if host.is_empty() {
        return None;
    }
    if host.contains(':') && !host.ends_with(']') {
        Some(host.to_owned())
    } else if url.starts_with("https://") {
        Some(format!("{host}:443"))
    } else {
        Some(format!("{host}:80"))
    }
}

/// The cached tokens of a response body or stream chunk, if it reports
/// usage.
fn cached_of(json: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let (_, cached) = openai::usage_of(&v)?;
    Some(cached.unwrap_or(0))
}

/// The `ip:port`s of the subset hint, if the request carries one.
fn subset_hint(meta: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = meta?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = match &hint.fields.get(SUBSET_KEY)?.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => s.split(',').map(|e| e.trim().to_owned()).collect(),
        _ => return None,
    };
    Some(list)
}

/// A header's value (Envoy sends `raw_value` bytes; older ones `value`).
fn header(h: &HttpHeaders, name: &str) -> Option<String> {
    h.headers.as_ref()?.headers.iter().find_map(|v| {
        if !v.key.eq_ignore_ascii_case(name) {
            return None;
        }
        if v.raw_value.is_empty() {
            Some(v.value.clone())
        } else {
            String::from_utf8(v.raw_value.clone()).ok()
        }
    })
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        // OVERWRITE_IF_EXISTS_OR_ADD
        append_action: 2,
        ..Default::default()
    }
}

/// Removes the control headers a client may have sent (the client does not
/// choose its pod), but not those `m` sets: it overwrites them anyway.
fn remove_client_headers(m: &mut HeaderMutation) {
    for name in [DESTINATION_HEADER, EXCHANGE_HEADER] {
        let set = m
            .set_headers
            .iter()
            .any(|s| s.header.as_ref().is_some_and(|h| h.key == name));
        if !set {
            m.remove_headers.push(name.into());
        }
    }
}

/// The decision as a header mutation: the destination set (and a
/// client's removed), the route cache cleared.
fn destination(endpoint: &str) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: vec![set_header(DESTINATION_HEADER, endpoint)],
            ..Default::default()
        }),
        clear_route_cache: true,
        ..Default::default()
    }
}

fn response(common: CommonResponse) -> HeadersResponse {
    HeadersResponse {
        response: Some(common),
    }
}

fn body_response(common: CommonResponse) -> BodyResponse {
    BodyResponse {
        response: Some(common),
    }
}

fn reply(out: Out) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(out),
        ..Default::default()
    }
}

/// The decision in the `envoy.lb` dynamic metadata too.
fn with_metadata(mut r: ProcessingResponse, endpoint: &str) -> ProcessingResponse {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let lb = Struct {
        fields: [(DESTINATION_HEADER.to_owned(), string(endpoint))].into(),
    };
    r.dynamic_metadata = Some(Struct {
        fields: [(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]
        .into(),
    });
    r
}

fn no_pod() -> ApiError {
    ApiError::new(
        503,
        "service_unavailable",
        "no_healthy_pod",
        "no pod can take the request".into(),
    )
}

/// An answer Envoy sends the client instead of routing: `error`'s status
/// and JSON body.
fn immediate(error: &ApiError) -> ProcessingResponse {
    let code =
        StatusCode::try_from(i32::from(error.status)).unwrap_or(StatusCode::InternalServerError);
    reply(Out::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code: code as i32 }),
        headers: Some(HeaderMutation {
            set_headers: vec![set_header("content-type", "application/json")],
            ..Default::default()
        }),
        body: error.body().to_string().into_bytes(),
        details: format!("cache_router_{}", error.code.unwrap_or("refused")),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(
            endpoint_of("http://10.0.0.7:8000").as_deref(),
            Some("10.0.0.7:8000")
        );
        assert_eq!(
            endpoint_of("http://engine.local/v1").as_deref(),
            Some("engine.local:80")
        );
        assert_eq!(
            endpoint_of("https://engine.local").as_deref(),
            Some("engine.local:443")
        );
        assert_eq!(endpoint_of("http://").as_deref(), None);
    }

    #[test]
    fn the_subset_hint_is_read_as_a_list_or_a_comma_string() {
        let meta = |v: Value| Metadata {
            filter_metadata: [(
                SUBSET_NAMESPACE.to_owned(),
                Struct {
                    fields: [(SUBSET_KEY.to_owned(), v)].into(),
                },
            )]
            .into(),
            ..Default::default()
        };
        let s = |x: &str| Value {
            kind: Some(Kind::StringValue(x.into())),
        };
        let list = Value {
            kind: Some(Kind::ListValue(
                envoy_types::pb::google::protobuf::ListValue {
                    values: vec![s("1.2.3.4:80"), s("5.6.7.8:80")],
                },
            )),
        };
        assert_eq!(
            subset_hint(Some(&meta(list))),
            Some(vec!["1.2.3.4:80".into(), "5.6.7.8:80".into()])
        );
        assert_eq!(
            subset_hint(Some(&meta(s("1.2.3.4:80, 5.6.7.8:80")))),
            Some(vec!["1.2.3.4:80".into(), "5.6.7.8:80".into()])
        );
        assert_eq!(subset_hint(None), None);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
    }

    #[test]
    fn a_refusal_is_an_immediate_response_with_its_status_and_body() {
        let r = immediate(&ApiError::unknown_model("x"));
        let Some(Out::ImmediateResponse(i)) = r.response else {
            panic!("{r:?}")
        };
        assert_eq!(i.status.unwrap().code, 404);
        let body: serde_json::Value = serde_json::from_slice(&i.body).unwrap();
        assert_eq!(body["error"]["code"], "model_not_found");
    }
}
