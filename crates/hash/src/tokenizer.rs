//! The tokenizer front: Hugging Face `tokenizer.json` plus the chat template
//! of `tokenizer_config.json`.

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value as Json};

use tokenizers::{Model, Normalizer, OffsetReferential, OffsetType, PreTokenizer};

use crate::Error;
use crate::control::{ControlTokens, Piece};
use crate::segments::{Part, Segments};
use crate::template::{ChatInput, ChatTemplate};

/// The special-token variables transformers hands to chat templates.
const SPECIAL_TOKEN_KEYS: [&str; 5] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "additional_special_tokens",
];

/// A model's tokenizer and chat template: text or chat messages in, the
/// exact token ids the engine will cache out.
///
/// Plain text is encoded as an OpenAI completions request is (special tokens
/// of the post-processor added when asked); chat messages are rendered with
/// the model's template and the result encoded without adding special tokens,
/// as `transformers` and vLLM do. A literal special token inside message text
/// (say `<|im_start|>`) becomes its control-token id, exactly as on the
/// engine, unless the input asks for transformers' `sanitize_control_tokens`
/// ([`ChatInput::sanitized`]).
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    /// The control tokens of the chat template (empty without one).
    control: ControlTokens,
    vocab_size: u32,
    model_max_length: Option<u64>,
    max_token_bytes: usize,
    /// The ids of text between added tokens, kept across calls (none: off,
    /// or the tokenizer's added tokens reach into their neighbours).
    segments: Option<Segments>,
}

/// The default bound of the kept pieces' ids, in bytes
/// ([`ModelTokenizer::set_segment_cache`]).
pub const SEGMENT_CACHE_BYTES: usize = 64 << 20;

impl fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("template", &self.template.is_some())
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// Loads `tokenizer.json` and, if present, `tokenizer_config.json` from a
    /// model directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let config = dir.join("tokenizer_config.json");
        let config = config.exists().then_some(config);
        Self::from_files(dir.join("tokenizer.json"), config.as_deref())
    }

    /// Loads a `tokenizer.json` and an optional `tokenizer_config.json`.
    pub fn from_files(tokenizer: impl AsRef<Path>, config: Option<&Path>) -> Result<Self, Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| Error::Io {
                path: p.to_owned(),
                source,
            })
        };
        let tpath = tokenizer.as_ref();
        let tbytes = read(tpath)?;
        let cbytes = config.map(read).transpose()?;
        Self::load(
            &tbytes,
            &tpath.display().to_string(),
            cbytes
                .as_deref()
                .map(|b| (b, config.map(|p| p.display().to_string()))),
        )
    }

    /// Loads from the bytes of `tokenizer.json` and of an optional
    /// `tokenizer_config.json`.
    pub fn from_bytes(tokenizer: &[u8], config: Option<&[u8]>) -> Result<Self, Error> {
        Self::load(tokenizer, "<bytes>", config.map(|c| (c, None)))
    }

    fn load(
        tokenizer: &[u8],
        tname: &str,
        config: Option<(&[u8], Option<String>)>,
    ) -> Result<Self, Error> {
        let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer).map_err(|e| {
            Error::MalformedTokenizer {
                what: tname.to_owned(),
                message: e.to_string(),
            }
        })?;
        let vocab_size = tokenizer
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |m| m.saturating_add(1));
        let (template, listed) = match config {
            None => (None, None),
            Some((bytes, ref name)) => {
                let what = name.clone().unwrap_or_else(|| "<bytes>".to_owned());
                parse_config(bytes, &what)?
            }
        };
        let control = ControlTokens::new(
            template
                .as_ref()
                .map(|t| control_tokens(&tokenizer, t, listed.as_deref()))
                .unwrap_or_default(),
        );
        // `transformers` writes a huge number (1e30) for "no limit".
        let model_max_length = config
            .and_then(|(bytes, _)| serde_json::from_slice::<Json>(bytes).ok())
            .and_then(|c| c.get("model_max_length").and_then(Json::as_f64))
            .filter(|n| (1.0..1e9).contains(n))
            .map(|n| n as u64);
        // The longest text a token stands for, in bytes (byte-level BPE
        // marks map a byte to a character of up to 2 bytes): a bound below
        // which no text can be, whatever its tokens.
        let max_token_bytes = tokenizer
            .get_vocab(true)
            .keys()
            .map(|t| t.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let segments = Segments::new(&tokenizer, SEGMENT_CACHE_BYTES);
        Ok(ModelTokenizer {
            tokenizer,
            template,
            control,
            vocab_size,
            model_max_length,
            max_token_bytes,
            segments,
        })
    }

    /// Keeps the ids of the text between added tokens (a chat's messages)
    /// across calls, up to about `bytes` bytes of ids (0: off; default
    /// [`SEGMENT_CACHE_BYTES`]), so the history a conversation repeats is
    /// tokenized once. The ids are those of encoding the whole text: the
    /// tokenizer encodes the text between its added tokens piece by
    /// piece. A tokenizer whose added tokens strip whitespace, must be
    /// single words or are normalized encodes without it.
    pub fn set_segment_cache(&mut self, bytes: usize) {
        self.segments = Segments::new(&self.tokenizer, bytes);
    }

    /// Whether pieces are kept ([`ModelTokenizer::set_segment_cache`]).
    pub fn segment_cache(&self) -> bool {
        self.segments.is_some()
    }

    /// Encodes plain text. `add_special_tokens` applies the tokenizer's
    /// post-processor (BOS and the like), as a completions request does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        if let Some(seg) = &self.segments
            && !add_special_tokens
            && text.len() >= 1024
        {
            let mut ids = Vec::with_capacity(text.len() / 3);
            for part in seg.parts(text) {
                match part {
                    Part::Added(id) => ids.push(id),
                    Part::Text(piece) => {
                        ids.extend_from_slice(&seg.ids_of(piece, |p| self.encode_whole(p, false))?);
                    }
                }
            }
            return Ok(ids);
        }
        self.encode_whole(text, add_special_tokens)
    }

    /// [`ModelTokenizer::encode`] of the whole text at once.
    fn encode_whole(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Whether the config carried a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders chat messages to prompt text with the model's template.
    pub fn render_chat(&self, input: &ChatInput) -> Result<String, Error> {
        self.template
            .as_ref()
            .ok_or(Error::NoChatTemplate)?
            .render(input)
    }

    /// Renders and encodes chat messages: the token ids the engine caches.
    ///
    /// With [`ChatInput::sanitize_control_tokens`] the control tokens in the
    /// caller's strings are encoded as plain text (transformers'
    /// `encode_marked_chat`).
    pub fn encode_chat(&self, input: &ChatInput) -> Result<Vec<u32>, Error> {
        let template = self.template.as_ref().ok_or(Error::NoChatTemplate)?;
        if !input.sanitize_control_tokens {
            let prompt = template.render(input)?;
            return self.encode(&prompt, false);
        }
        let marked = template.render_with(input, Some(&self.control))?;
        let newline = self.encode("\n", false)?;
        let mut ids = Vec::new();
        for (i, piece) in self.control.split(&marked).into_iter().enumerate() {
            match piece {
                // The text before the first marker is encoded as it is.
                Piece::Text(text) if i == 0 => ids.extend(self.encode(text, false)?),
                Piece::Text("") => {}
                Piece::Text(text) => ids.extend(self.encode_piece(text, false, &newline)?),
                Piece::Marked(token) => {
                    let piece_ids = self.encode_piece(token, true, &newline)?;
                    if let Some(id) = self.tokenizer.token_to_id(token)
                        && piece_ids.contains(&id)
                    {
                        return Err(Error::Tokenizer(format!(
                            "cannot sanitize {token:?}: the tokenizer produces it from plain text"
                        )));
                    }
                    ids.extend(piece_ids);
                }
            }
        }
        Ok(ids)
    }

    /// The control tokens `sanitize_control_tokens` encodes as text in the
    /// caller's strings, longest first.
    pub fn control_tokens(&self) -> &[String] {
        self.control.tokens()
    }

    /// transformers' `_encode_chat_piece`: a piece from the middle of a
    /// chat, encoded after a newline that is then removed (so no prefix
    /// space is added), as plain text without added tokens if `as_text`.
    fn encode_piece(&self, piece: &str, as_text: bool, newline: &[u32]) -> Result<Vec<u32>, Error> {
        let encode = |t: &str| {
            if as_text {
                self.encode_without_added_tokens(t)
            } else {
                self.encode(t, false)
            }
        };
        let ids = encode(&format!("\n{piece}"))?;
        match ids.strip_prefix(newline) {
            Some(rest) => Ok(rest.to_vec()),
            None => encode(piece),
        }
    }

    /// The backend's pipeline without its added tokens: normalizer,
    /// pre-tokenizer, model (transformers' `_encode_without_added_tokens`).
    fn encode_without_added_tokens(&self, text: &str) -> Result<Vec<u32>, Error> {
        let err = |e: tokenizers::Error| Error::Tokenizer(e.to_string());
        let mut normalized = tokenizers::NormalizedString::from(text);
        if let Some(n) = self.tokenizer.get_normalizer() {
            n.normalize(&mut normalized).map_err(err)?;
        }
        let mut pre = tokenizers::PreTokenizedString::from(normalized.get());
        if let Some(p) = self.tokenizer.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(err)?;
        }
        let mut ids = Vec::new();
        for (split, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Char) {
            let tokens = self.tokenizer.get_model().tokenize(split).map_err(err)?;
            ids.extend(tokens.iter().map(|t| t.id));
        }
        Ok(ids)
    }

    /// One more than the largest token id the tokenizer knows.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The model's context length as `tokenizer_config.json` gives it
    /// (`model_max_length`), if it gives a real one.
    pub fn model_max_length(&self) -> Option<u64> {
        self.model_max_length
    }

    /// At least how many tokens a text of `bytes` bytes encodes to: its
    /// bytes over the longest token's (a bound, for refusing a prompt that
    /// is too long before tokenizing it).
    pub fn min_tokens_for_bytes(&self, bytes: usize) -> usize {
        bytes / self.max_token_bytes
    }

    /// Checks that every id is in the vocabulary (for prompts given as ids).
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), Error> {
        for (position, &id) in ids.iter().enumerate() {
            if id >= self.vocab_size || self.tokenizer.id_to_token(id).is_none() {
                return Err(Error::TokenOutOfVocab {
                    id,
                    position,
                    vocab_size: self.vocab_size,
                });
            }
        }
        Ok(())
    }

    /// Decodes ids to text, after checking them.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        self.check_ids(ids)?;
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// transformers' `_get_control_tokens`: the special added tokens, plus the
/// added tokens in `chat_control_tokens` if the config lists them, else the
/// non-whitespace added tokens in the template's literal text.
fn control_tokens(
    tokenizer: &tokenizers::Tokenizer,
    template: &ChatTemplate,
    listed: Option<&[String]>,
) -> Vec<String> {
    let literals = template.literals();
    let mut added: Vec<_> = tokenizer.get_added_tokens_decoder().into_iter().collect();
    added.sort_by_key(|(id, _)| *id);
    added
        .into_iter()
        .map(|(_, t)| t)
        .filter(|t| {
            t.special
                || match listed {
                    Some(list) => list.contains(&t.content),
                    None => {
                        !t.content.trim().is_empty()
                            && literals.iter().any(|l| l.contains(t.content.as_str()))
                    }
                }
        })
        .map(|t| t.content)
        .collect()
}

/// What `tokenizer_config.json` says about chat: the template, and the
/// `chat_control_tokens` list if it has one.
type ChatConfig = (Option<ChatTemplate>, Option<Vec<String>>);

/// Reads the chat template, special tokens and `chat_control_tokens` from
/// `tokenizer_config.json`.
fn parse_config(bytes: &[u8], what: &str) -> Result<ChatConfig, Error> {
    let bad = |message: String| Error::MalformedConfig {
        what: what.to_owned(),
        message,
    };
    let config: Json = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let Json::Object(config) = config else {
        return Err(bad("the top level must be an object".into()));
    };
    let listed = match config.get("chat_control_tokens") {
        None | Some(Json::Null) => None,
        Some(Json::Array(items)) => Some(
            items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("`chat_control_tokens` must be a list of strings".into()))?,
        ),
        Some(_) => return Err(bad("`chat_control_tokens` must be a list of strings".into())),
    };
    let source = match config.get("chat_template") {
        None | Some(Json::Null) => return Ok((None, listed)),
        Some(Json::String(s)) => s.clone(),
        // The older multi-template form: [{"name": ..., "template": ...}].
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .ok_or_else(|| bad("`chat_template` list has no usable template".into()))?
            .to_owned(),
        Some(_) => return Err(bad("`chat_template` must be a string or a list".into())),
    };
    let mut special = Map::new();
    for key in SPECIAL_TOKEN_KEYS {
        match config.get(key) {
            None | Some(Json::Null) => {}
            Some(v) => {
                special.insert(key.to_owned(), token_content(v));
            }
        }
    }
    Ok((Some(ChatTemplate::new(&source, special)?), listed))
}

/// Special tokens appear as strings or as `{"content": ..., ...}` objects.
fn token_content(v: &Json) -> Json {
    match v {
        Json::Object(o) => o.get("content").cloned().unwrap_or(Json::Null),
        Json::Array(items) => Json::Array(items.iter().map(token_content).collect()),
        other => other.clone(),
    }
}
