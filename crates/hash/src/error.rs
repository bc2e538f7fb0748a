use std::path::PathBuf;

/// Everything that can go wrong between text and a block-hash chain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A block size of zero was requested.
    #[error("block size must be at least 1 token, got 0")]
    ZeroBlockSize,
    /// A tokenizer or config file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a valid Hugging Face tokenizer.
    #[error("malformed tokenizer file {what}: {message}")]
    MalformedTokenizer {
        /// The file path, or `<bytes>` when loaded from memory.
        what: String,
        /// The parser's message.
        message: String,
    },
    /// `tokenizer_config.json` is not valid JSON of the expected shape.
    #[error("malformed tokenizer config {what}: {message}")]
    MalformedConfig {
        /// The file path, or `<bytes>` when loaded from memory.
        what: String,
        /// What was wrong.
        message: String,
    },
    /// The tokenizer failed to encode or decode.
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    /// The model has no chat template, so chat messages cannot be rendered.
    #[error("the tokenizer config has no chat template")]
    NoChatTemplate,
    /// The chat template does not compile.
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),
    /// The chat template failed while rendering (including `raise_exception`).
    #[error("chat template failed to render: {0}")]
    TemplateRender(String),
    /// A chat message is not a JSON object with a `role`.
    #[error("chat message {index} is malformed: {message}")]
    MalformedMessage {
        /// The message's position in the request.
        index: usize,
        /// What was wrong.
        message: String,
    },
    /// A token id is not in the tokenizer's vocabulary.
    #[error("token id {id} at position {position} is out of the vocabulary (size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending id.
        id: u32,
        /// Its position in the input.
        position: usize,
        /// The number of ids the tokenizer knows.
        vocab_size: u32,
    },
}
