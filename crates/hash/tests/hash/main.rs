//! Integration tests of router-hash: golden vectors, parity with the Python
//! reference stack, property tests and bad input.

mod errors;
mod golden;
mod parity;
mod props;
mod segments;

use std::path::PathBuf;

/// The repository root (tokenizer assets live there).
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A test data file of this crate.
pub(crate) fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}
