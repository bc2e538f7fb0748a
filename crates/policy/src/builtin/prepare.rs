use std::fmt;
use std::sync::Arc;

use router_core::PrefixIndex;

use crate::context::{Context, KeyId};
use crate::keys::{CACHE_HITS, CHAIN, CacheHits};
use crate::plugin::{Plugin, Prepare};
use crate::pod::PodState;

/// `prefix-match`: queries the index once for the request's chain and
/// publishes the matched blocks per pod as [`CACHE_HITS`].
pub struct PrefixMatchPrepare {
    index: Arc<dyn PrefixIndex>,
}

impl PrefixMatchPrepare {
    /// Queries `index`.
    pub fn new(index: Arc<dyn PrefixIndex>) -> Self {
        PrefixMatchPrepare { index }
    }
}

impl fmt::Debug for PrefixMatchPrepare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrefixMatchPrepare")
    }
}

impl Plugin for PrefixMatchPrepare {
    fn name(&self) -> &str {
        "prefix-match"
    }
    fn needs(&self) -> Vec<KeyId> {
        vec![CHAIN.id()]
    }
    fn produces(&self) -> Vec<KeyId> {
        vec![CACHE_HITS.id()]
    }
}

impl Prepare for PrefixMatchPrepare {
    fn prepare(&self, ctx: &mut Context, _: &[PodState]) {
        let hits = match ctx.get(CHAIN) {
            Some(chain) => CacheHits::from_match(&self.index.match_prefix(chain)),
            None => CacheHits::default(),
        };
        ctx.insert(CACHE_HITS, hits);
    }
}
