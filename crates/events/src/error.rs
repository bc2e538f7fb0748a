/// Why an event batch could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not the MessagePack the engines send.
    #[error("malformed batch at byte {offset}: {what}")]
    Malformed {
        /// Where reading stopped.
        offset: usize,
        /// What was expected or wrong.
        what: &'static str,
    },
    /// Valid MessagePack of the wrong shape.
    #[error("unexpected batch shape: {0}")]
    Shape(String),
}
