//! Chat templates rendered the way Hugging Face `transformers` renders them.

use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, ErrorKind, State};
use serde_json::{Map, Value as Json};

use crate::Error;
use crate::control::{self, ControlTokens};
use crate::pyjson::{self, DumpOptions};

const TEMPLATE_NAME: &str = "chat_template";

/// The input of a chat prompt: OpenAI-style messages plus template options.
///
/// Messages are kept as JSON so every field a template may read
/// (`tool_calls`, `reasoning_content`, `name`, ...) reaches it unchanged and in
/// its original key order.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ChatInput {
    /// The messages, each a JSON object with at least a `role`.
    pub messages: Vec<Json>,
    /// Tool (function) definitions, passed to the template as `tools`.
    pub tools: Option<Vec<Json>>,
    /// Whether to open an assistant turn at the end (`add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// Extra template variables (OpenAI's `chat_template_kwargs`, such as
    /// Qwen3's `enable_thinking`).
    pub kwargs: Map<String, Json>,
    /// Leave the final message open for the model to continue, as
    /// transformers' `continue_final_message` does: the field to continue
    /// (`content`, or a reasoning field), `None` for a closed chat.
    pub continue_final_message: Option<String>,
    /// Encode the control tokens found in the caller's strings (messages,
    /// tools, template variables) as plain text, as transformers'
    /// `sanitize_control_tokens` does: only the template's own control
    /// tokens become control-token ids. It needs tokenizing, so only
    /// [`ModelTokenizer::encode_chat`](crate::ModelTokenizer::encode_chat)
    /// honours it; rendering to text refuses it, as transformers does.
    pub sanitize_control_tokens: bool,
}

impl ChatInput {
    /// Messages with a generation prompt, no tools and no extra variables.
    pub fn new(messages: Vec<Json>) -> Self {
        ChatInput {
            messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: Map::new(),
            continue_final_message: None,
            sanitize_control_tokens: false,
        }
    }

    /// Asks for transformers' `sanitize_control_tokens`.
    pub fn sanitized(mut self) -> Self {
        self.sanitize_control_tokens = true;
        self
    }

    /// Leaves the final message's `field` open (and adds no generation
    /// prompt, which cannot go with it).
    pub fn continue_final(mut self, field: impl Into<String>) -> Self {
        self.continue_final_message = Some(field.into());
        self.add_generation_prompt = false;
        self
    }

    /// Sets the tool definitions.
    pub fn with_tools(mut self, tools: Vec<Json>) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Sets `add_generation_prompt`.
    pub fn with_generation_prompt(mut self, yes: bool) -> Self {
        self.add_generation_prompt = yes;
        self
    }

    /// Sets one extra template variable.
    pub fn with_kwarg(mut self, key: impl Into<String>, value: Json) -> Self {
        self.kwargs.insert(key.into(), value);
        self
    }
}

/// A compiled chat template with the transformers-compatible environment.
///
/// The environment matches `transformers`' `ImmutableSandboxedEnvironment`:
/// `trim_blocks` and `lstrip_blocks`, loop controls, `raise_exception`,
/// `namespace`, Python string and dict methods (`startswith`, `split`,
/// `strip(chars)`, `items()`, ...), Python's `json.dumps` as `tojson` and
/// Python's spelling of `None`, `True`, `False` and floats when printed.
pub struct ChatTemplate {
    env: Environment<'static>,
    special_tokens: Map<String, Json>,
    source: String,
}

/// What transformers appends to the message it leaves open, to find where
/// it ends in the rendered text.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// The fields transformers aliases reasoning under.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `special_tokens` (for example `bos_token`,
    /// `eos_token`) become template variables, as transformers passes them.
    pub fn new(source: &str, special_tokens: Map<String, Json>) -> Result<Self, Error> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::TemplateSyntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, state, value| match pyjson::python_str(value) {
            Some(s) => out.write_str(&s).map_err(minijinja::Error::from),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| Error::TemplateSyntax(render_error(&e)))?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            source: source.to_owned(),
        })
    }

    /// Renders the prompt text for `input`.
    ///
    /// A template that fails names the first message whose conversation
    /// prefix fails to render, and the template line it failed on.
    pub fn render(&self, input: &ChatInput) -> Result<String, Error> {
        if input.sanitize_control_tokens {
            return Err(Error::TemplateRender(
                "sanitize_control_tokens needs tokenizing: use ModelTokenizer::encode_chat".into(),
            ));
        }
        self.render_with(input, None)
    }

    /// The template's literal text (see [`control::template_literals`]).
    pub(crate) fn literals(&self) -> Vec<String> {
        control::template_literals(&self.source)
    }

    /// Renders `input`, with the control tokens in the caller's strings
    /// marked when `control` is given.
    pub(crate) fn render_with(
        &self,
        input: &ChatInput,
        control: Option<&ControlTokens>,
    ) -> Result<String, Error> {
        let mut messages = normalize_messages(&input.messages)?;
        let render_err = |m: &str| Error::TemplateRender(m.to_owned());
        if messages.is_empty() {
            return Err(render_err("the conversation has no messages"));
        }
        let mut tools = input.tools.clone().map_or(Json::Null, Json::Array);
        let mut kwargs = Json::Object(input.kwargs.clone());
        if let Some(c) = control {
            messages.iter_mut().for_each(|m| c.mark_json(m));
            c.mark_json(&mut tools);
            c.mark_json(&mut kwargs);
        }
        // transformers' `continue_final_message`: tag the field, render, cut
        // the text at the tag.
        let continued = match &input.continue_final_message {
            Some(field) => Some(self.tag_final(input, &mut messages, field)?),
            None => None,
        };
        let Json::Object(kwargs) = kwargs else {
            unreachable!("marking keeps an object an object")
        };
        let mut ctx = self.special_tokens.clone();
        ctx.extend(kwargs);
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(input.add_generation_prompt),
        );
        // The messages move into the context: a request's render copies
        // them no further. Only a failed render takes them back out.
        ctx.insert("messages".into(), Json::Array(messages));
        let rendered = match self.render_context(&ctx) {
            Ok(r) => r,
            Err(e) => {
                let Some(Json::Array(messages)) = ctx.shift_remove("messages") else {
                    unreachable!("inserted above")
                };
                return Err(self.locate_failure(&mut ctx, &messages, &e));
            }
        };
        let Some(final_text) = continued else {
            return Ok(rendered);
        };
        let tag = CONTINUE_TAG.trim();
        if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
            return Err(render_err(
                "continue_final_message is set but the final message does not appear in the rendered chat",
            ));
        }
        let at = rendered.rfind(tag).expect("checked above");
        Ok(if rendered[at..].starts_with(CONTINUE_TAG) {
            rendered[..at].to_owned()
        } else {
            // The template trimmed the tag's trailing space.
            rendered[..at].trim_end().to_owned()
        })
    }

    /// Tags the final message's `field` (and its reasoning aliases) for
    /// `continue_final_message`; the field's text before tagging.
    fn tag_final(
        &self,
        input: &ChatInput,
        messages: &mut [Json],
        field: &str,
    ) -> Result<String, Error> {
        let render_err = |m: String| Error::TemplateRender(m);
        if input.add_generation_prompt {
            return Err(render_err(
                "continue_final_message and add_generation_prompt are not compatible".into(),
            ));
        }
        let last = messages
            .last_mut()
            .and_then(Json::as_object_mut)
            .expect("normalised messages are objects");
        let final_text = match last.get(field) {
            Some(Json::String(s)) => s.clone(),
            None | Some(Json::Null) => {
                return Err(render_err(format!(
                    "continue_final_message is set but the final message has no \"{field}\" to continue"
                )));
            }
            Some(_) => {
                return Err(render_err(format!(
                    "continue_final_message: the final message's \"{field}\" is not text"
                )));
            }
        };
        let fields: Vec<String> = if REASONING_FIELDS.contains(&field) {
            REASONING_FIELDS
                .iter()
                .filter(|f| last.get(**f) == Some(&Json::String(final_text.clone())))
                .map(|f| (*f).to_owned())
                .collect()
        } else {
            vec![field.to_owned()]
        };
        if !fields.iter().any(|f| self.source.contains(f.as_str())) {
            return Err(render_err(format!(
                "continue_final_message is set to \"{field}\" but the chat template does not read it"
            )));
        }
        for f in &fields {
            last.insert(
                f.clone(),
                Json::String(format!("{final_text}{CONTINUE_TAG}")),
            );
        }
        Ok(final_text)
    }

    fn render_context(&self, ctx: &Map<String, Json>) -> Result<String, minijinja::Error> {
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        tmpl.render(Value::from(Serde(ctx)))
    }

    /// The error for a failed render, naming the template line and the
    /// first message whose conversation prefix fails: a binary search over
    /// prefixes (the prefix of `hi` messages fails, that of `lo` renders or
    /// is empty), so a long conversation costs a few renders, not one per
    /// message.
    fn locate_failure(
        &self,
        ctx: &mut Map<String, Json>,
        messages: &[Json],
        err: &minijinja::Error,
    ) -> Error {
        let mut detail = render_error(err);
        if let Some(text) = err
            .line()
            .and_then(|l| self.source.lines().nth(l.saturating_sub(1)))
        {
            let text = text.trim();
            let shown: String = text.chars().take(120).collect();
            let more = if shown.len() < text.len() { "..." } else { "" };
            detail.push_str(&format!("; the template's line reads `{shown}{more}`"));
        }
        let (mut lo, mut hi) = (0, messages.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            ctx.insert("messages".into(), Json::Array(messages[..mid].to_vec()));
            if self.render_context(ctx).is_err() {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let role = messages[hi - 1]
            .get("role")
            .and_then(Json::as_str)
            .unwrap_or("?");
        Error::TemplateRender(format!("at message {} ({role}): {detail}", hi - 1))
    }
}

/// An error with its chain of causes (minijinja keeps the detail there).
fn render_error(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Brings OpenAI-style messages into the shape chat templates expect.
///
/// - Each message must be an object with a string `role`.
/// - Content given as a list of parts becomes the text parts joined by
///   newlines, as vLLM does for templates that take string content.
/// - Reasoning given as `thinking` or `reasoning` is also exposed as
///   `reasoning_content` (and the reverse), as transformers does.
fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, Error> {
    let mut out = Vec::with_capacity(messages.len());
    for (index, m) in messages.iter().enumerate() {
        let Json::Object(obj) = m else {
            return Err(Error::MalformedMessage {
                index,
                message: "a message must be a JSON object".into(),
            });
        };
        match obj.get("role") {
            Some(Json::String(_)) => {}
            _ => {
                return Err(Error::MalformedMessage {
                    index,
                    message: "`role` must be a string".into(),
                });
            }
        }
        // transformers drops the keys whose value is None (OpenAI's
        // `content: null` beside `tool_calls`): templates test for presence.
        let mut obj: Map<String, Json> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(Json::Array(parts)) = obj.get("content") {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    Json::String(s) => texts.push(s.as_str()),
                    Json::Object(p) => {
                        if let Some(Json::String(t)) = p.get("text") {
                            texts.push(t.as_str());
                        }
                    }
                    _ => {
                        return Err(Error::MalformedMessage {
                            index,
                            message: "content parts must be objects or strings".into(),
                        });
                    }
                }
            }
            let joined = texts.join("\n");
            obj.insert("content".into(), Json::String(joined));
        }
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| obj.get(*k).filter(|v| !v.is_null()).cloned());
        if let Some(r) = reasoning {
            let mut aliased = Map::with_capacity(obj.len() + 2);
            aliased.insert("thinking".into(), r.clone());
            for (k, v) in obj {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), r);
            obj = aliased;
        }
        out.push(Json::Object(obj));
    }
    Ok(out)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let mut opts = DumpOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ..DumpOptions::default()
    };
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        if let Some(s) = indent.as_str() {
            opts.indent = Some(s.to_owned());
        } else if let Ok(n) = usize::try_from(indent.clone()) {
            opts.indent = Some(" ".repeat(n));
        } else if !indent.is_none() {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer or a string",
            ));
        }
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key]: [String; 2] = seps.try_into().map_err(|_| {
            minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            )
        })?;
        opts.item_sep = Some(item);
        opts.key_sep = Some(key);
    }
    kwargs.assert_all_used()?;
    Ok(Value::from(pyjson::dumps(value, &opts)?))
}

fn raise_exception(_state: &State, message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}
