//! The tokenizer front: Hugging Face `tokenizer.json` plus the chat template
//! of `tokenizer_config.json`.

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::Error;
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
/// engine; callers that must prevent that sanitise message text first.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    vocab_size: u32,
    model_max_length: Option<u64>,
    max_token_bytes: usize,
}

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
        let template = match config {
            None => None,
            Some((bytes, ref name)) => {
                let what = name.clone().unwrap_or_else(|| "<bytes>".to_owned());
                parse_config(bytes, &what)?
            }
        };
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
        Ok(ModelTokenizer {
            tokenizer,
            template,
            vocab_size,
            model_max_length,
            max_token_bytes,
        })
    }

    /// Encodes plain text. `add_special_tokens` applies the tokenizer's
    /// post-processor (BOS and the like), as a completions request does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
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
    pub fn encode_chat(&self, input: &ChatInput) -> Result<Vec<u32>, Error> {
        let prompt = self.render_chat(input)?;
        self.encode(&prompt, false)
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

/// Reads the chat template and special tokens from `tokenizer_config.json`.
fn parse_config(bytes: &[u8], what: &str) -> Result<Option<ChatTemplate>, Error> {
    let bad = |message: String| Error::MalformedConfig {
        what: what.to_owned(),
        message,
    };
    let config: Json = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let Json::Object(config) = config else {
        return Err(bad("the top level must be an object".into()));
    };
    let source = match config.get("chat_template") {
        None | Some(Json::Null) => return Ok(None),
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
    ChatTemplate::new(&source, special).map(Some)
}

/// Special tokens appear as strings or as `{"content": ..., ...}` objects.
fn token_content(v: &Json) -> Json {
    match v {
        Json::Object(o) => o.get("content").cloned().unwrap_or(Json::Null),
        Json::Array(items) => Json::Array(items.iter().map(token_content).collect()),
        other => other.clone(),
    }
}
