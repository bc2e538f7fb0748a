//! A generation request as the router takes it.

use serde_json::{Value, json};

use crate::openai::{self, Api, ApiError};

/// One OpenAI generation request (a completion or a chat), checked once
/// where it enters: the model named, the prompt or the messages, the
/// options the engine reads (forwarded as they are), and the session the
/// request belongs to, if any.
///
/// ```
/// use router_service::{Api, Request};
///
/// let r = Request::chat("Qwen/Qwen3-0.6B", [("system", "Be brief."), ("user", "Hello")])
///     .with_max_tokens(16)
///     .with_session("user-42");
/// assert_eq!(r.api(), Api::Chat);
/// assert_eq!(r.model(), "Qwen/Qwen3-0.6B");
/// assert_eq!(r.max_tokens(), 16);
/// assert_eq!(r.session(), Some("user-42"));
///
/// let raw = br#"{"model": "m", "prompt": "Once upon a time", "stream": true}"#;
/// let r = Request::from_openai(Api::Completions, raw).unwrap();
/// assert!(r.is_stream());
/// assert!(Request::from_openai(Api::Completions, b"{\"prompt\": \"no model\"}").is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    api: Api,
    model: String,
    session: Option<String>,
    body: Value,
}

impl Request {
    /// A request from an OpenAI body's bytes: a JSON object naming its
    /// `model`, with `stream`, `stream_options` and `n` read as vLLM reads
    /// them; otherwise a 400 in OpenAI's shape. The session is the body's
    /// `user`, if any ([`Request::with_session`] overrides it).
    pub fn from_openai(api: Api, raw: &[u8]) -> Result<Request, ApiError> {
        Request::from_body(api, openai::parse_body(raw)?)
    }

    /// A request from an OpenAI body already parsed.
    pub fn from_json(api: Api, mut body: Value) -> Result<Request, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
                None,
            ));
        }
        openai::normalise(&mut body)?;
        Request::from_body(api, body)
    }

    fn from_body(api: Api, body: Value) -> Result<Request, ApiError> {
        let model = match body.get("model") {
            Some(Value::String(m)) => m.clone(),
            None => return Err(ApiError::bad_request("`model` is required", Some("model"))),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "`model` must be a string",
                    Some("model"),
                ));
            }
        };
        let session = body.get("user").and_then(Value::as_str).map(str::to_owned);
        Ok(Request {
            api,
            model,
            session,
            body,
        })
    }

    /// A completion of `prompt`.
    pub fn completion(model: &str, prompt: &str) -> Request {
        Request {
            api: Api::Completions,
            model: model.into(),
            session: None,
            body: json!({"model": model, "prompt": prompt}),
        }
    }

    /// A chat of `(role, content)` messages.
    pub fn chat<'a>(
        model: &str,
        messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Request {
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        Request {
            api: Api::Chat,
            model: model.into(),
            session: None,
            body: json!({"model": model, "messages": messages}),
        }
    }

    /// The same request in the session `id` (session affinity, the hash key).
    pub fn with_session(mut self, id: impl Into<String>) -> Request {
        self.session = Some(id.into());
        self
    }

    /// The same request asking for at most `n` tokens out.
    pub fn with_max_tokens(mut self, n: u64) -> Request {
        self.set("max_tokens", Value::from(n));
        self
    }

    /// The same request, streamed or not.
    pub fn streamed(mut self, stream: bool) -> Request {
        self.set("stream", Value::Bool(stream));
        self
    }

    /// Sets an option (every constructor makes the body an object).
    fn set(&mut self, key: &str, v: Value) {
        if let Value::Object(o) = &mut self.body {
            o.insert(key.into(), v);
        }
    }

    /// The endpoint.
    pub fn api(&self) -> Api {
        self.api
    }

    /// The model named.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The session, if any.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Whether the answer streams.
    pub fn is_stream(&self) -> bool {
        openai::is_stream(&self.body)
    }

    /// Whether a streamed request asked for the final usage chunk.
    pub fn wants_usage(&self) -> bool {
        openai::wants_usage(&self.body)
    }

    /// Tokens asked for (`max_tokens` or `max_completion_tokens`; 0: none said).
    pub fn max_tokens(&self) -> u64 {
        ["max_tokens", "max_completion_tokens"]
            .iter()
            .find_map(|k| self.body.get(*k).and_then(Value::as_u64))
            .unwrap_or(0)
    }

    /// The body as the engine will get it.
    pub fn body(&self) -> &Value {
        &self.body
    }

    pub(crate) fn into_parts(self) -> (Api, Value) {
        (self.api, self.body)
    }
}
