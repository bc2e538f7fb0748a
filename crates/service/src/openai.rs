//! The OpenAI API surface both sides share: which endpoint a body is for,
//! the prompt's token ids (the engine's own tokenization, so the router's
//! hashes match what the engine caches), and the error shape.

use router_hash::{ChatInput, ModelTokenizer};
use serde_json::{Value, json};

/// The two generation endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/completions`: a `prompt`.
    Completions,
    /// `POST /v1/chat/completions`: `messages` through the chat template.
    Chat,
}

impl Api {
    /// The endpoint's path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }

    /// The endpoint a request body is for (`messages` makes it a chat).
    pub fn of_body(body: &Value) -> Api {
        if body.get("messages").is_some() {
            Api::Chat
        } else {
            Api::Completions
        }
    }

    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::Chat => "chat",
        }
    }
}

/// An error in OpenAI's shape:
/// `{"error": {"message", "type", "param", "code"}}` with its HTTP status.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
#[non_exhaustive]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// OpenAI's `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// OpenAI's `code`, if any (`model_not_found`, ...).
    pub code: Option<&'static str>,
    /// The request field at fault, if any.
    pub param: Option<&'static str>,
    /// What went wrong, for a person.
    pub message: String,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            code: None,
            param,
            message: message.into(),
        }
    }

    /// Any status, type and code.
    pub fn new(status: u16, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            code: Some(code),
            param: None,
            message,
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn unknown_model(model: &str) -> Self {
        ApiError {
            status: 404,
            kind: "invalid_request_error",
            code: Some("model_not_found"),
            param: Some("model"),
            message: format!("The model `{model}` does not exist."),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// An axum response with the error's status and JSON body (the `axum`
/// feature), for fronts built on axum.
#[cfg(feature = "axum")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

/// Parses a request body: a JSON object, with `stream`, `stream_options`
/// and `n` read as vLLM reads them, or a 400.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(mut v @ Value::Object(_)) => {
            normalise(&mut v)?;
            Ok(v)
        }
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(ApiError::bad_request(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
}

/// A boolean as pydantic's lax mode reads one (vLLM's request models):
/// `true`/`false`, `0`/`1` (ints or floats), and the strings `0 1 f t n y
/// no yes off on false true` in any case. `None`: not a boolean.
fn lax_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "f" | "n" | "no" | "off" | "false" => Some(false),
            "1" | "t" | "y" | "yes" | "on" | "true" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

/// Reads `stream`, `stream_options.include_usage` and `n` as vLLM's server
/// does (lax booleans, integer strings) and writes them back as JSON
/// booleans and integers, so the gateway and the engine agree on them; a
/// value vLLM would refuse is a 400 naming the field. `null` is absent.
pub(crate) fn normalise(body: &mut Value) -> Result<(), ApiError> {
    let o = body.as_object_mut().expect("an object");
    match o.get("stream") {
        None | Some(Value::Null) => {
            o.remove("stream");
        }
        Some(v) => {
            let b = lax_bool(v).ok_or_else(|| {
                ApiError::bad_request("`stream` must be a boolean", Some("stream"))
            })?;
            o.insert("stream".into(), Value::Bool(b));
        }
    }
    if let Some(opts) = o.get_mut("stream_options") {
        match opts {
            Value::Null => {}
            Value::Object(m) => match m.get("include_usage") {
                None | Some(Value::Null) => {}
                Some(v) => {
                    let b = lax_bool(v).ok_or_else(|| {
                        ApiError::bad_request(
                            "`stream_options.include_usage` must be a boolean",
                            Some("stream_options"),
                        )
                    })?;
                    m.insert("include_usage".into(), Value::Bool(b));
                }
            },
            _ => {
                return Err(ApiError::bad_request(
                    "`stream_options` must be an object",
                    Some("stream_options"),
                ));
            }
        }
    }
    match o.get("n") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let n = match v {
                Value::Number(n) => n.as_u64().or_else(|| {
                    n.as_f64()
                        .filter(|x| x.fract() == 0.0 && *x >= 0.0)
                        .map(|x| x as u64)
                }),
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            }
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                ApiError::bad_request("`n` must be an integer of at least 1", Some("n"))
            })?;
            o.insert("n".into(), Value::from(n));
        }
    }
    Ok(())
}

/// Checks the body's `model` against the served one.
pub fn check_model(body: &Value, served: &str) -> Result<(), ApiError> {
    match body.get("model") {
        Some(Value::String(m)) if m == served => Ok(()),
        Some(Value::String(m)) => Err(ApiError::unknown_model(m)),
        None => Err(ApiError::bad_request("`model` is required", Some("model"))),
        Some(_) => Err(ApiError::bad_request(
            "`model` must be a string",
            Some("model"),
        )),
    }
}

/// The prompt's token ids, tokenized the way vLLM does: a completion's
/// `prompt` with the tokenizer's special tokens (or token ids as given); a
/// chat's `messages` rendered through the model's chat template
/// (`tools`, `add_generation_prompt`, `continue_final_message` and
/// `chat_template_kwargs` honoured)
/// and encoded without adding special tokens again; assistant tool-call
/// arguments as vLLM hands them to the template (objects). `sanitize` asks
/// for transformers' `sanitize_control_tokens` on chats.
pub fn prompt_tokens(
    api: Api,
    body: &Value,
    tok: &ModelTokenizer,
    sanitize: bool,
) -> Result<Vec<u32>, ApiError> {
    match api {
        Api::Completions => completion_tokens(body, tok),
        Api::Chat => chat_tokens(body, tok, sanitize),
    }
}

fn completion_tokens(body: &Value, tok: &ModelTokenizer) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("prompt"));
    let ids_of = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        let ids = items
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("`prompt` token ids must be non-negative integers"))?;
        tok.check_ids(&ids)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?;
        Ok(ids)
    };
    let encode = |text: &str| {
        tok.encode(text, true)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))
    };
    match body.get("prompt") {
        Some(Value::String(text)) => encode(text),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(bad("`prompt` is empty")),
            [Value::String(text)] => encode(text),
            [Value::Array(ids)] => ids_of(ids),
            items if items.iter().all(Value::is_number) => ids_of(items),
            _ => Err(bad(
                "batched prompts are not supported: send one prompt per request",
            )),
        },
        Some(_) => Err(bad("`prompt` must be a string or a list of token ids")),
        None => Err(bad("`prompt` is required")),
    }
}

/// vLLM's `_postprocess_messages`: assistant tool calls reach the template
/// with their `arguments` as an object (a JSON string is parsed; empty,
/// unparsable or non-object arguments become `{}`), an empty `tool_calls`
/// list is dropped, and entries that are not function calls are a 400
/// naming the message and the call.
fn tool_call_arguments(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = messages.to_vec();
    for (i, message) in out.iter_mut().enumerate() {
        let Some(m) = message.as_object_mut() else {
            continue;
        };
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(Value::Array(calls)) = m.get_mut("tool_calls") else {
            continue;
        };
        if calls.is_empty() {
            // Keeps the other keys in order, as Python's `dict.pop` does.
            m.shift_remove("tool_calls");
            continue;
        }
        for (j, call) in calls.iter_mut().enumerate() {
            let bad = |what: &str| {
                ApiError::bad_request(
                    format!("messages[{i}].tool_calls[{j}]: {what}"),
                    Some("messages"),
                )
            };
            let Some(call) = call.as_object_mut() else {
                return Err(bad("assistant tool_calls entries must be objects"));
            };
            let is_function = call
                .get("type")
                .is_none_or(|t| t.as_str() == Some("function"));
            let function = match call.get_mut("function") {
                Some(Value::Object(f)) if is_function => f,
                _ => {
                    return Err(bad(
                        "chat completions only support assistant tool_calls of type 'function' with a `function` object",
                    ));
                }
            };
            let parsed = match function.get("arguments") {
                Some(Value::Object(o)) => Value::Object(o.clone()),
                Some(Value::String(text)) if !text.is_empty() => {
                    match serde_json::from_str::<Value>(text) {
                        Ok(Value::Object(o)) => Value::Object(o),
                        // vLLM keeps the conversation going: a malformed
                        // history entry must not fail every later turn.
                        _ => Value::Object(Default::default()),
                    }
                }
                _ => Value::Object(Default::default()),
            };
            function.insert("arguments".into(), parsed);
        }
    }
    Ok(out)
}

fn chat_tokens(body: &Value, tok: &ModelTokenizer, sanitize: bool) -> Result<Vec<u32>, ApiError> {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(ApiError::bad_request(
                "`messages` is empty",
                Some("messages"),
            ));
        }
        _ => {
            return Err(ApiError::bad_request(
                "`messages` must be a list of messages",
                Some("messages"),
            ));
        }
    };
    if let Some(i) = messages
        .iter()
        .position(|m| !m.get("role").is_some_and(Value::is_string))
    {
        return Err(ApiError::bad_request(
            format!("message {i} has no `role`"),
            Some("messages"),
        ));
    }
    let mut input = ChatInput::new(tool_call_arguments(messages)?);
    if sanitize {
        input = input.sanitized();
    }
    match body.get("tools") {
        Some(Value::Array(tools)) => input = input.with_tools(tools.clone()),
        Some(Value::Null) | None => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "`tools` must be a list",
                Some("tools"),
            ));
        }
    }
    if let Some(v) = body.get("add_generation_prompt") {
        let yes = v.as_bool().ok_or_else(|| {
            ApiError::bad_request(
                "`add_generation_prompt` must be a boolean",
                Some("add_generation_prompt"),
            )
        })?;
        input = input.with_generation_prompt(yes);
    }
    // vLLM's `continue_final_message`: the final (assistant) message is left
    // open for the model to continue; it cannot go with a generation prompt.
    match body.get("continue_final_message").map(|v| (v, lax_bool(v))) {
        None | Some((Value::Null, _)) | Some((_, Some(false))) => {}
        Some((_, Some(true))) => {
            if body.get("add_generation_prompt").and_then(lax_bool) == Some(true) {
                return Err(ApiError::bad_request(
                    "`continue_final_message` and `add_generation_prompt` cannot both be set",
                    Some("continue_final_message"),
                ));
            }
            input = input.continue_final("content");
        }
        Some((_, None)) => {
            return Err(ApiError::bad_request(
                "`continue_final_message` must be a boolean",
                Some("continue_final_message"),
            ));
        }
    }
    match body.get("chat_template_kwargs") {
        Some(Value::Object(kw)) => {
            for (k, v) in kw {
                input = input.with_kwarg(k.clone(), v.clone());
            }
        }
        Some(Value::Null) | None => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "`chat_template_kwargs` must be an object",
                Some("chat_template_kwargs"),
            ));
        }
    }
    tok.encode_chat(&input)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))
}

/// At least how many prompt tokens `body` holds, without tokenizing: token
/// ids count one each, text counts `min_tokens(bytes)` (its bytes over the
/// longest token's), message contents and prompt strings summed.
pub(crate) fn prompt_tokens_at_least(body: &Value, min_tokens: impl Fn(usize) -> usize) -> usize {
    let (ids, bytes) = prompt_size(body);
    ids + min_tokens(bytes)
}

/// The prompt's token ids and text bytes: prompt strings and message
/// contents (their `text` parts) summed.
fn prompt_size(body: &Value) -> (usize, usize) {
    fn text_bytes(v: &Value) -> usize {
        match v {
            Value::String(s) => s.len(),
            Value::Array(a) => a.iter().map(text_bytes).sum(),
            Value::Object(o) => o.get("text").map_or(0, text_bytes),
            _ => 0,
        }
    }
    let mut ids = 0;
    let mut bytes = 0;
    match body.get("prompt") {
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => ids += a.len(),
        Some(Value::Array(a)) => {
            for p in a {
                match p {
                    Value::Array(inner) if inner.iter().all(Value::is_number) => ids += inner.len(),
                    other => bytes += text_bytes(other),
                }
            }
        }
        Some(v) => bytes += text_bytes(v),
        None => {}
    }
    if let Some(Value::Array(msgs)) = body.get("messages") {
        bytes += msgs
            .iter()
            .filter_map(|m| m.get("content"))
            .map(text_bytes)
            .sum::<usize>();
    }
    (ids, bytes)
}

/// Text up to this many bytes is tokenized where the request is (a few
/// tens of microseconds): the hop to a tokenizer thread and back costs
/// more than the work.
pub(crate) const INLINE_TOKENIZE_BYTES: usize = 2048;

/// Messages up to this many are templated where the request is.
const INLINE_MESSAGES: usize = 8;

/// Whether tokenizing `body` is light enough to do on the async thread
/// that holds the request: text of at most [`INLINE_TOKENIZE_BYTES`], at
/// most a few messages, no tools (their schemas are templated too) and
/// at most a few thousand token ids. Anything heavier goes to the
/// tokenizer threads.
pub(crate) fn is_light(body: &Value) -> bool {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) => m.len(),
        _ => 0,
    };
    if messages > INLINE_MESSAGES || body.get("tools").is_some_and(|t| !t.is_null()) {
        return false;
    }
    // Every string of the body counts, not only the contents: a template
    // renders other fields too (an assistant's `tool_calls`, names), and a
    // hostile client must not get a long render onto an async thread.
    let mut budget = INLINE_TOKENIZE_BYTES + 256;
    let (ids, bytes) = prompt_size(body);
    bytes <= INLINE_TOKENIZE_BYTES
        && ids <= 4 * INLINE_TOKENIZE_BYTES
        && strings_within(body, &mut budget)
}

/// Whether the strings of `v` (keys included) total at most `budget`
/// bytes, stopping as soon as they do not.
fn strings_within(v: &Value, budget: &mut usize) -> bool {
    fn take(budget: &mut usize, n: usize) -> bool {
        match budget.checked_sub(n) {
            Some(left) => {
                *budget = left;
                true
            }
            None => false,
        }
    }
    match v {
        Value::String(s) => take(budget, s.len()),
        Value::Array(a) => a.iter().all(|x| strings_within(x, budget)),
        Value::Object(o) => o
            .iter()
            .all(|(k, x)| take(budget, k.len()) && strings_within(x, budget)),
        _ => true,
    }
}

/// Whether the request asks for a streamed response.
pub fn is_stream(body: &Value) -> bool {
    body.get("stream").and_then(Value::as_bool).unwrap_or(false)
}

/// Whether a streamed request asked for the final usage chunk.
pub fn wants_usage(body: &Value) -> bool {
    body.pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` of
/// a response or a chunk, if it carries usage.
pub fn usage_of(v: &Value) -> Option<(u64, Option<u64>)> {
    let usage = v.get("usage").filter(|u| u.is_object())?;
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let cached = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64);
    Some((prompt, cached))
}

/// Whether a streamed chunk is the usage-only one (no choices).
pub fn is_usage_only(v: &Value) -> bool {
    v.get("usage").is_some_and(Value::is_object)
        && v.get("choices")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_short_tool_free_prompts_are_tokenized_in_place() {
        let chat = |content: &str, n: usize| {
            let m: Vec<Value> = (0..n)
                .map(|_| json!({"role": "user", "content": content}))
                .collect();
            json!({"model": "m", "messages": m})
        };
        assert!(is_light(&chat("Hello", 1)));
        assert!(is_light(&chat(&"x".repeat(INLINE_TOKENIZE_BYTES), 1)));
        assert!(!is_light(&chat(&"x".repeat(INLINE_TOKENIZE_BYTES + 1), 1)));
        // The text is summed over messages and parts.
        assert!(!is_light(&chat(
            &"x".repeat(INLINE_TOKENIZE_BYTES / 2 + 1),
            2
        )));
        let parts = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x".repeat(INLINE_TOKENIZE_BYTES)},
            {"type": "text", "text": "y"}]}]});
        assert!(!is_light(&parts));
        assert!(is_light(&chat("a", INLINE_MESSAGES)));
        assert!(!is_light(&chat("a", INLINE_MESSAGES + 1)));
        let mut tools = chat("Hello", 1);
        tools["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        assert!(!is_light(&tools));
        tools["tools"] = Value::Null;
        assert!(is_light(&tools));
        assert!(is_light(&json!({"model": "m", "prompt": "Hello"})));
        assert!(!is_light(
            &json!({"model": "m", "prompt": ["x".repeat(1500), "y".repeat(1500)]})
        ));
        assert!(is_light(&json!({"model": "m", "prompt": vec![7; 100]})));
        // Text outside the contents counts too.
        let calls = json!({"model": "m", "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                "function": {"name": "f", "arguments": "x".repeat(100_000)}}]}]});
        assert!(!is_light(&calls));
        assert!(!is_light(
            &json!({"model": "m", "prompt": vec![7; 4 * INLINE_TOKENIZE_BYTES + 1]})
        ));
    }

    #[test]
    fn stream_and_n_are_read_as_vllm_reads_them() {
        for (v, want) in [
            (json!(true), true),
            (json!("true"), true),
            (json!("Yes"), true),
            (json!(1), true),
            (json!(1.0), true),
            (json!("off"), false),
            (json!(0), false),
            (json!(false), false),
        ] {
            let body = json!({"model": "m", "stream": v.clone(), "n": "2"}).to_string();
            let parsed = parse_body(body.as_bytes()).unwrap();
            assert_eq!(parsed["stream"], json!(want), "{v}");
            assert_eq!(is_stream(&parsed), want);
            assert_eq!(parsed["n"], json!(2));
        }
        let parsed =
            parse_body(br#"{"stream": null, "stream_options": {"include_usage": "1"}}"#).unwrap();
        assert!(parsed.get("stream").is_none() && !is_stream(&parsed));
        assert!(wants_usage(&parsed));
        // continue_final_message renders the open assistant turn the engine
        // continues (the prefill is the prompt's end).
        let tok = ModelTokenizer::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tokenizers/qwen3"
        ))
        .unwrap();
        let body = parse_body(
            br#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, wor"}], "continue_final_message": true, "add_generation_prompt": false}"#,
        )
        .unwrap();
        let ids = prompt_tokens(Api::Chat, &body, &tok, false).unwrap();
        let text = tok.decode(&ids, false).unwrap();
        assert!(text.ends_with("Hello, wor"), "{text:?}");
        let both = parse_body(
            br#"{"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": true}"#,
        )
        .unwrap();
        assert!(
            prompt_tokens(Api::Chat, &both, &tok, false).is_ok(),
            "add_generation_prompt defaults off with it"
        );
        let clash = parse_body(
            br#"{"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": "yes", "add_generation_prompt": true}"#,
        )
        .unwrap();
        assert_eq!(
            prompt_tokens(Api::Chat, &clash, &tok, false)
                .unwrap_err()
                .status,
            400
        );
        for bad in [
            r#"{"stream": "maybe"}"#,
            r#"{"stream": 2}"#,
            r#"{"stream": [true]}"#,
            r#"{"stream_options": 3}"#,
            r#"{"stream_options": {"include_usage": "x"}}"#,
            r#"{"n": 0}"#,
            r#"{"n": 1.5}"#,
            r#"{"n": "two"}"#,
            r#"{"n": -1}"#,
        ] {
            let e = parse_body(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
        }
    }

    fn qwen3() -> ModelTokenizer {
        ModelTokenizer::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tokenizers/qwen3"
        ))
        .unwrap()
    }

    fn chat_ids(tok: &ModelTokenizer, body: Value, sanitize: bool) -> Result<Vec<u32>, ApiError> {
        prompt_tokens(Api::Chat, &body, tok, sanitize)
    }

    #[test]
    fn tool_call_arguments_reach_the_template_as_vllm_hands_them() {
        let tok = qwen3();
        let turn = |calls: Value| {
            json!({"messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "sunny"},
            ]})
        };
        let call = |args: Value| json!([{"type": "function", "function": {"name": "w", "arguments": args}}]);
        let object = chat_ids(&tok, turn(call(json!({"city": "Paris", "n": 1.5}))), false).unwrap();
        // A JSON string (OpenAI's form) is parsed: the template serialises
        // the object, with Python's separators, not the client's spelling.
        let string = chat_ids(
            &tok,
            turn(call(json!("{\"city\":\"Paris\",\"n\":1.5}"))),
            false,
        )
        .unwrap();
        assert_eq!(string, object);
        let text = tok.decode(&string, false).unwrap();
        assert!(
            text.contains(r#""arguments": {"city": "Paris", "n": 1.5}"#),
            "{text}"
        );
        // Empty, unparsable and non-object arguments become {}.
        let empty = chat_ids(&tok, turn(call(json!({}))), false).unwrap();
        for args in [json!(""), json!("{not json"), json!("[1, 2]"), json!(null)] {
            assert_eq!(
                chat_ids(&tok, turn(call(args.clone())), false).unwrap(),
                empty,
                "{args}"
            );
        }
        // An empty list is dropped, as if there were no tool calls.
        let none = json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": "sunny"},
        ]});
        assert_eq!(
            chat_ids(&tok, turn(json!([])), false).unwrap(),
            chat_ids(&tok, none, false).unwrap()
        );
        // Entries that are not function calls are a 400 naming the call.
        for bad in [
            json!([1]),
            json!([{"type": "code", "function": {"name": "w"}}]),
            json!([{"type": "function"}]),
        ] {
            let e = chat_ids(&tok, turn(bad.clone()), false).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert!(
                e.message.contains("messages[1].tool_calls[0]"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn sanitizing_encodes_control_tokens_in_messages_as_text() {
        let tok = qwen3();
        let body = json!({"messages": [{"role": "user", "content": "say <|im_end|> now"}]});
        let plain = chat_ids(&tok, body.clone(), false).unwrap();
        let sanitized = chat_ids(&tok, body, true).unwrap();
        let im_end = tok.encode("<|im_end|>", false).unwrap();
        let count = |ids: &[u32]| ids.iter().filter(|&&i| i == im_end[0]).count();
        // The template closes the user turn with one; the user wrote another.
        assert_eq!(count(&plain), 2);
        assert_eq!(count(&sanitized), 1);
        assert_eq!(
            tok.decode(&plain, false).unwrap(),
            tok.decode(&sanitized, false).unwrap()
        );
    }
}
