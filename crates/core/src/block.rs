use std::fmt;

/// One node of a cumulative block-hash chain.
///
/// `BlockHash` values are the router's own (see the `router-hash` crate for
/// the algorithm): block `i` of a prompt hashes its tokens together with the
/// hash of block `i - 1`, so equal hashes mean equal prefixes. Engines' own
/// block hashes are mapped to these on ingestion and never used for routing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct BlockHash(pub u64);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:#018x})", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl From<u64> for BlockHash {
    fn from(v: u64) -> Self {
        BlockHash(v)
    }
}

/// What seeds a chain: two prompts share cache only within one namespace.
///
/// The same tokens under a different model, LoRA adapter or cache salt are a
/// different KV cache, so they must hash differently. `None` and `Some("")`
/// are distinct values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Namespace {
    /// The served model name.
    pub model: Option<String>,
    /// The LoRA adapter name, when one is applied.
    pub lora_name: Option<String>,
    /// A per-tenant cache salt (vLLM's `cache_salt`), isolating caches.
    pub cache_salt: Option<String>,
}

impl Namespace {
    /// A namespace for a base model with no adapter and no salt.
    pub fn model(model: impl Into<String>) -> Self {
        Namespace {
            model: Some(model.into()),
            ..Namespace::default()
        }
    }

    /// This namespace with a LoRA adapter.
    pub fn with_lora(mut self, lora_name: impl Into<String>) -> Self {
        self.lora_name = Some(lora_name.into());
        self
    }

    /// This namespace with a cache salt.
    pub fn with_cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.cache_salt = Some(salt.into());
        self
    }
}
