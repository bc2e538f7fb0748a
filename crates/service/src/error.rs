use std::path::PathBuf;

/// Why the gateway or a simulated engine could not start or change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file is malformed (`line` 0: not tied to a line).
    #[error("config line {line}: {message}")]
    Config {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A pod is malformed (its name, URL or endpoints).
    #[error("pods: {0}")]
    Pods(String),
    /// A pod's name or URL is taken.
    #[error("pods: {0}")]
    PodConflict(String),
    /// The tokenizer could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] router_hash::Error),
    /// A profile is invalid.
    #[error("profile: {0}")]
    Policy(#[from] router_policy::Error),
    /// The index refused a pod (for example, too many pods).
    #[error("index: {0}")]
    Index(#[from] router_core::Error),
    /// NATS could not be reached or set up (`[nats]`).
    #[error("{0}")]
    Nats(String),
    /// A socket could not be bound.
    #[error("cannot listen on {what}: {message}")]
    Bind {
        /// The address or endpoint.
        what: String,
        /// The cause.
        message: String,
    },
}
