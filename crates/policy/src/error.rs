/// Why a profile could not be built or loaded, or a request not decided.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A plugin needs a context key that no earlier plugin produces and the
    /// caller does not declare as an input.
    #[error("profile `{profile}`: plugin `{plugin}` needs `{key}`, which nothing produces")]
    MissingProducer {
        /// The profile.
        profile: String,
        /// The plugin with the unmet need.
        plugin: String,
        /// The key's name.
        key: &'static str,
    },
    /// A profile has no picker.
    #[error("profile `{profile}` has no picker")]
    NoPicker {
        /// The profile.
        profile: String,
    },
    /// A scorer's weight is negative, NaN or infinite.
    #[error(
        "profile `{profile}`: scorer `{plugin}` has invalid weight {weight} (must be finite and >= 0)"
    )]
    InvalidWeight {
        /// The profile.
        profile: String,
        /// The scorer.
        plugin: String,
        /// The weight given.
        weight: f64,
    },
    /// Two plugins of a profile share a name.
    #[error("profile `{profile}`: two plugins are named `{plugin}`")]
    DuplicateName {
        /// The profile.
        profile: String,
        /// The shared name.
        plugin: String,
    },
    /// The config file is not valid TOML or not of the expected shape.
    #[error("config line {line}: {message}")]
    Config {
        /// 1-based line in the file (0 when unknown).
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// Every candidate pod was filtered out.
    #[error("no pod left after filter `{filter}`")]
    NoCandidates {
        /// The filter that removed the last pod (or `fleet` when there were none).
        filter: String,
    },
}
