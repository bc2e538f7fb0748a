//! The built-in plugins. Names in config files are the kebab-case names
//! given here.

mod breaker;
mod filters;
mod pickers;
mod prepare;
mod scorers;

pub use breaker::{BreakerConfig, CircuitBreaker};
pub use filters::{BoundedLoad, HealthFilter, RoleFilter};
pub use pickers::{
    ConsistentHash, LeastRequests, MaxScore, PowerOfTwo, RandomPick, RoundRobin, WeightedRandom,
};
pub use prepare::PrefixMatchPrepare;
pub use scorers::{
    CacheAwareCost, HashAffinity, LoadScorer, NoCacheSpread, PrefixCacheScorer, SessionAffinity,
    TierAwareScorer, TierWeights,
};
