//! The built-in plugins. Names in config files are the kebab-case names
//! given here.

mod breaker;
mod filters;
mod pickers;
mod prepare;
pub(crate) mod routed;
mod scorers;
mod ttft;

pub use breaker::{BreakerConfig, CircuitBreaker};
pub use filters::{BoundedLoad, HealthFilter, RoleFilter};
pub use pickers::{
    ConsistentHash, LeastRequests, MaxScore, PowerOfTwo, RandomPick, RoundRobin, WeightedRandom,
};
pub use prepare::PrefixMatchPrepare;
pub use routed::{Evictions, Memory, RoutedChains, RoutedObserver, Speculative, wall_ms};
pub use scorers::{
    CacheAwareCost, HashAffinity, LoadScorer, NoCacheSpread, PrefixCacheScorer, SessionAffinity,
    TierAwareScorer, TierWeights,
};
pub use ttft::{MAX_TIER_TOP_K, PredictedTtft, TtftModel};
