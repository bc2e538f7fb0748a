//! router-exec's [`Backend`] over HTTP: OpenAI-compatible engines (vLLM,
//! SGLang, the simulated ones).
//!
//! One pooled client for every pod (keep-alive connections are reused);
//! connecting has its own timeout, and the executor's step deadline bounds
//! the rest. Dropping the stream drops the response, which closes the
//! connection: the engine sees the client go and aborts the request.
//! Streamed responses are decoded as server-sent events as they arrive and
//! passed on chunk by chunk; the usage a chunk carries is also reported as
//! [`Chunk::Usage`] for the cache feedback.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parking_lot::RwLock;
use router_core::PodId;
use router_exec::{Backend, BackendError, Chunk, ChunkStream, StepKind, StepRequest};
use serde_json::{Value, json};

use crate::openai::{self, Api};
use crate::sse::SseDecoder;

/// Engines reached over HTTP, by pod.
#[derive(Debug)]
pub struct HttpBackend {
    client: reqwest::Client,
    urls: RwLock<HashMap<PodId, Arc<PodUrls>>>,
}

/// A pod's engine URLs, parsed once when it is set rather than per request.
#[derive(Debug)]
struct PodUrls {
    base: String,
    /// `/v1/completions` and `/v1/chat/completions` under `base`; `None`
    /// if `base` does not parse (the request then fails as reqwest says).
    completions: Option<reqwest::Url>,
    chat: Option<reqwest::Url>,
}

impl PodUrls {
    fn new(url: &str) -> PodUrls {
        let base = url.trim_end_matches('/').to_owned();
        let parse = |api: Api| reqwest::Url::parse(&format!("{base}{}", api.path())).ok();
        PodUrls {
            completions: parse(Api::Completions),
            chat: parse(Api::Chat),
            base,
        }
    }

    fn of(&self, api: Api) -> Result<reqwest::Url, String> {
        let parsed = match api {
            Api::Completions => &self.completions,
            Api::Chat => &self.chat,
        };
        parsed
            .clone()
            .ok_or_else(|| format!("the engine URL {:?} does not parse", self.base))
    }
}

/// A client for engines: no proxy, `TCP_NODELAY`, and in a build with the
/// `rustls` feature, `https://` through rustls (ring), trusting the
/// system's authorities plus those in the PEM bytes `extra_ca`.
pub(crate) fn engine_client(
    extra_ca: Option<&[u8]>,
) -> Result<reqwest::ClientBuilder, reqwest::Error> {
    let builder = reqwest::Client::builder().no_proxy().tcp_nodelay(true);
    #[cfg(feature = "rustls")]
    {
        // reqwest's `rustls-no-provider` uses the process's default
        // provider; installing it twice is harmless (the first one stays).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = builder;
        if let Some(pem) = extra_ca {
            for cert in reqwest::Certificate::from_pem_bundle(pem)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder)
    }
    #[cfg(not(feature = "rustls"))]
    {
        let _ = extra_ca;
        Ok(builder)
    }
}

impl HttpBackend {
    /// A backend connecting within `connect_timeout`, over plain HTTP (and
    /// `https://` with the system's authorities in a `rustls` build).
    pub fn new(connect_timeout: Duration) -> Result<Self, reqwest::Error> {
        Self::with_tls(connect_timeout, None)
    }

    /// A backend that trusts, for `https://` engines in a build with the
    /// `rustls` feature, the system's authorities and those in the PEM
    /// bytes `extra_ca`.
    pub fn with_tls(
        connect_timeout: Duration,
        extra_ca: Option<&[u8]>,
    ) -> Result<Self, reqwest::Error> {
        let client = engine_client(extra_ca)?
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(HttpBackend {
            client,
            urls: RwLock::new(HashMap::new()),
        })
    }

    /// Routes `pod` to the engine at `url` (its base, without `/v1`).
    pub fn set(&self, pod: PodId, url: &str) {
        self.urls.write().insert(pod, Arc::new(PodUrls::new(url)));
    }

    /// Forgets `pod`.
    pub fn remove(&self, pod: PodId) {
        self.urls.write().remove(&pod);
    }
}

/// The body a step sends: a prefill runs one token without streaming and
/// asks for a cache handle (vLLM's disaggregated-serving protocol,
/// `kv_transfer_params`); a decode step carries the handle it got.
/// The largest non-streamed engine answer read (16 MiB).
const MAX_RESPONSE: usize = 16 << 20;
/// The largest engine error body read (64 KiB).
const MAX_ERROR_BODY: usize = 64 << 10;

/// Reads a response body of at most `limit` bytes; a longer one, or one
/// that fails midway, is an error saying so.
async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(format!("an engine response over {limit} bytes"));
    }
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > limit {
                    return Err(format!("an engine response over {limit} bytes"));
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(format!("the engine response broke off: {e}")),
        }
    }
}

fn step_body(req: StepRequest) -> Value {
    let mut body = req.body;
    match req.kind {
        StepKind::Prefill => {
            body["max_tokens"] = json!(1);
            body["stream"] = json!(false);
            if let Some(o) = body.as_object_mut() {
                o.remove("stream_options");
                o.remove("max_completion_tokens");
            }
            body["kv_transfer_params"] = json!({
                "do_remote_decode": true, "do_remote_prefill": false,
                "remote_engine_id": null, "remote_block_ids": null,
                "remote_host": null, "remote_port": null,
            });
        }
        StepKind::Decode => {
            if let Some(h) = req.handle {
                body["kv_transfer_params"] = h;
            }
        }
        StepKind::Full => {}
    }
    body
}

/// A transport error: unreachable pods are retried elsewhere.
fn transport(e: &reqwest::Error) -> BackendError {
    if e.is_connect() || e.is_timeout() {
        BackendError::Unavailable(e.to_string())
    } else {
        BackendError::Failed(e.to_string())
    }
}

/// The chunks of a whole (non-streamed) response.
fn whole_chunks(v: Value) -> Vec<Result<Chunk, BackendError>> {
    let mut out = Vec::with_capacity(3);
    if let Some((prompt_tokens, cached_tokens)) = openai::usage_of(&v) {
        out.push(Ok(Chunk::Usage {
            prompt_tokens,
            cached_tokens,
        }));
    }
    if let Some(h) = v.get("kv_transfer_params").filter(|h| !h.is_null()) {
        out.push(Ok(Chunk::Handle(h.clone())));
    }
    out.push(Ok(Chunk::Data(v)));
    out
}

struct SseState {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    decoder: SseDecoder,
    ready: VecDeque<Result<Chunk, BackendError>>,
    events: Vec<String>,
    done: bool,
}

/// Decodes a streamed response into chunks, one per event, as they come.
fn sse_chunks(resp: reqwest::Response) -> ChunkStream {
    let state = SseState {
        body: resp.bytes_stream().boxed(),
        decoder: SseDecoder::default(),
        ready: VecDeque::new(),
        events: Vec::new(),
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(c) = st.ready.pop_front() {
                return Some((c, st));
            }
            if st.done {
                return None;
            }
            match st.body.next().await {
                None => {
                    st.done = true;
                    st.ready.push_back(Err(BackendError::Failed(
                        "the stream ended without [DONE]".into(),
                    )));
                }
                Some(Err(e)) => {
                    st.done = true;
                    st.ready.push_back(Err(transport(&e)));
                }
                Some(Ok(bytes)) => {
                    if let Err(e) = st.decoder.feed(&bytes, &mut st.events) {
                        st.done = true;
                        st.ready.push_back(Err(BackendError::Failed(e.to_string())));
                        continue;
                    }
                    for data in st.events.drain(..) {
                        if data == "[DONE]" {
                            st.done = true;
                            break;
                        }
                        // Only a chunk that may carry usage is parsed; the
                        // rest pass through as the engine wrote them.
                        if !data.contains("\"usage\"") {
                            st.ready.push_back(Ok(Chunk::Text(data)));
                            continue;
                        }
                        match serde_json::from_str::<Value>(&data) {
                            Ok(v) => {
                                if let Some((prompt_tokens, cached_tokens)) = openai::usage_of(&v) {
                                    st.ready.push_back(Ok(Chunk::Usage {
                                        prompt_tokens,
                                        cached_tokens,
                                    }));
                                }
                                st.ready.push_back(Ok(Chunk::Data(v)));
                            }
                            Err(e) => {
                                st.done = true;
                                st.ready.push_back(Err(BackendError::Failed(format!(
                                    "a streamed chunk is not JSON: {e}"
                                ))));
                                break;
                            }
                        }
                    }
                }
            }
        }
    })
    .boxed()
}

impl Backend for HttpBackend {
    fn send(
        &self,
        pod: PodId,
        req: StepRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, BackendError>> {
        let base = self.urls.read().get(&pod).cloned();
        let client = self.client.clone();
        async move {
            let base =
                base.ok_or_else(|| BackendError::Unavailable(format!("{pod} has no URL")))?;
            let api = Api::of_body(&req.body);
            let url = base.of(api).map_err(BackendError::Unavailable)?;
            let body = step_body(req);
            let resp = client
                .post(url)
                .json(&body)
                .send()
                .await
                .map_err(|e| transport(&e))?;
            let status = resp.status();
            if !status.is_success() {
                let code = status.as_u16();
                let text = match read_limited(resp, MAX_ERROR_BODY).await {
                    Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                    Err(e) => e,
                };
                // 408 and 429 say "not now", not "never": another pod may take it.
                return Err(if status.is_client_error() && code != 408 && code != 429 {
                    BackendError::Rejected {
                        status: code,
                        body: text,
                    }
                } else {
                    BackendError::Failed(format!("status {code}: {text}"))
                });
            }
            let streamed = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("text/event-stream"));
            if streamed {
                return Ok(sse_chunks(resp));
            }
            let bytes = read_limited(resp, MAX_RESPONSE)
                .await
                .map_err(BackendError::Failed)?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| BackendError::Failed(format!("a response that is not JSON: {e}")))?;
            Ok(futures::stream::iter(whole_chunks(v)).boxed())
        }
        .boxed()
    }
}
