//! Profiles from a TOML file.
//!
//! ```toml
//! [profiles.default]
//! inputs  = ["chain", "prompt_tokens"]       # keys the caller sets
//! prepare = [{ type = "prefix-match" }]
//! filters = [{ type = "health" }, { type = "circuit-breaker", failures = 3 }]
//! scorers = [{ type = "cache-aware-cost", weight = 1.0, block_size = 16 }]
//! picker  = { type = "max-score" }
//! ```
//!
//! Every plugin table has `type`, an optional `name` (to use one type twice)
//! and, for scorers, `weight` (default 1). The remaining fields are the
//! plugin's parameters. Unknown types, unknown fields, wrong types and
//! invalid compositions are errors that give the line.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use router_core::PrefixIndex;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;

use crate::Error;
use crate::builtin::{
    BoundedLoad, BreakerConfig, CacheAwareCost, CircuitBreaker, ConsistentHash, HashAffinity,
    HealthFilter, LeastRequests, LoadScorer, MaxScore, NoCacheSpread, PowerOfTwo,
    PrefixCacheScorer, PrefixMatchPrepare, RandomPick, RoleFilter, RoundRobin, SessionAffinity,
    TierAwareScorer, TierWeights, WeightedRandom,
};
use crate::builtin::{MAX_TIER_TOP_K, Memory, PredictedTtft, RoutedChains, Speculative, TtftModel};
use crate::context::{Context, Key, KeyId};
use crate::keys::{CACHE_HITS, CHAIN, HASH_KEY, NOW_MS, PROMPT_TOKENS, SESSION_ID};
use crate::peers::{KvUtilization, PrecisePrefix, QueueScorer, SmgCacheAware, SmgConfig};
use crate::plugin::{Filter, Picker, Plugin, Prepare, Scorer};
use crate::pod::{PodState, Role};
use crate::profile::Profile;

/// A plugin built by a factory, by stage.
#[allow(missing_debug_implementations)] // holds trait objects; each is Debug itself
pub enum Built {
    /// A prepare plugin.
    Prepare(Box<dyn Prepare>),
    /// A filter.
    Filter(Box<dyn Filter>),
    /// A scorer.
    Scorer(Box<dyn Scorer>),
    /// A picker.
    Picker(Box<dyn Picker>),
}

/// A plugin's parameters: the fields of its table besides `type`, `name`
/// and `weight`.
#[derive(Debug, Clone)]
pub struct Params(toml::Table);

impl Params {
    /// Reads all parameters into `T` (use `#[serde(deny_unknown_fields)]`
    /// so misspelt fields are errors).
    pub fn parse<T: DeserializeOwned>(self) -> Result<T, String> {
        toml::Value::Table(self.0)
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_owned())
    }

    /// Fails unless there are no parameters.
    pub fn none(self) -> Result<(), String> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!("unknown parameter `{k}`")),
        }
    }
}

/// What factories may use besides their parameters.
#[derive(Clone, Default)]
pub struct Env {
    /// The index, for plugins that query it.
    pub index: Option<Arc<dyn PrefixIndex>>,
    /// The routed-chains table `speculative` plugins share (each gets its
    /// own without it).
    pub routed: Option<Arc<RoutedChains>>,
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("index", &self.index.is_some())
            .field("routed", &self.routed.is_some())
            .finish()
    }
}

type Factory = Box<dyn Fn(Params, &Env) -> Result<Built, String> + Send + Sync>;

/// Plugin factories and known keys by name: built-ins plus any custom ones.
pub struct Registry {
    factories: HashMap<String, Factory>,
    keys: HashMap<String, KeyId>,
    env: Env,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.factories.keys().collect();
        names.sort();
        f.debug_struct("Registry").field("plugins", &names).finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    profiles: BTreeMap<String, ProfileSpec>,
}

/// The `profiles` table of a larger document whose other tables belong to
/// the embedder (who checks them).
#[derive(Deserialize)]
struct EmbeddedSpec {
    #[serde(default)]
    profiles: BTreeMap<String, ProfileSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileSpec {
    #[serde(default)]
    inputs: Vec<Spanned<String>>,
    #[serde(default)]
    prepare: Vec<Spanned<PluginSpec>>,
    #[serde(default)]
    filters: Vec<Spanned<PluginSpec>>,
    #[serde(default)]
    scorers: Vec<Spanned<PluginSpec>>,
    picker: Option<Spanned<PluginSpec>>,
}

#[derive(Deserialize)]
struct PluginSpec {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    weight: Option<f64>,
    #[serde(flatten)]
    params: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleParams {
    role: Role,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CostParams {
    overlap_weight: f64,
    block_size: u64,
}

impl Default for CostParams {
    fn default() -> Self {
        CostParams {
            overlap_weight: 1.0,
            block_size: 16,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SpeculativeParams {
    ttl_ms: u64,
    capacity_blocks: usize,
}

impl Default for SpeculativeParams {
    fn default() -> Self {
        SpeculativeParams {
            ttl_ms: Memory::SPECULATIVE.ttl_ms,
            capacity_blocks: Memory::SPECULATIVE.capacity_blocks,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HashParams {
    load_factor: f64,
}

impl Default for HashParams {
    fn default() -> Self {
        HashParams { load_factor: 1.25 }
    }
}

/// The 1-based line of byte `offset` in `text`.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn toml_error(text: &str, e: &toml::de::Error) -> Error {
    Error::Config {
        line: e.span().map_or(0, |s| line_at(text, s.start)),
        message: e.message().to_owned(),
    }
}

fn need_index(env: &Env) -> Result<Arc<dyn PrefixIndex>, String> {
    env.index
        .clone()
        .ok_or_else(|| "this plugin needs an index; pass one with Registry::with_index".to_owned())
}

impl Registry {
    /// The built-in plugins and keys.
    pub fn with_builtins() -> Self {
        let mut r = Registry {
            factories: HashMap::new(),
            keys: HashMap::new(),
            env: Env::default(),
        };
        r.register_key(CHAIN);
        r.register_key(PROMPT_TOKENS);
        r.register_key(SESSION_ID);
        r.register_key(HASH_KEY);
        r.register_key(CACHE_HITS);
        r.register_key(NOW_MS);
        r.register("prefix-match", |p, env| {
            p.none()?;
            Ok(Built::Prepare(Box::new(PrefixMatchPrepare::new(
                need_index(env)?,
            ))))
        });
        r.register("health", |p, _| {
            p.none()?;
            Ok(Built::Filter(Box::new(HealthFilter)))
        });
        r.register("role", |p, _| {
            let RoleParams { role } = p.parse()?;
            Ok(Built::Filter(Box::new(RoleFilter::new(role))))
        });
        r.register("bounded-load", |p, _| {
            let h: HashParams = p.parse()?;
            Ok(Built::Filter(Box::new(BoundedLoad::new(h.load_factor))))
        });
        r.register("circuit-breaker", |p, _| {
            let c: BreakerConfig = p.parse()?;
            Ok(Built::Filter(Box::new(CircuitBreaker::new(c))))
        });
        r.register("prefix-cache", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(PrefixCacheScorer)))
        });
        r.register("load", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(LoadScorer)))
        });
        r.register("tier-aware", |p, env| {
            let w: TierWeights = p.parse()?;
            Ok(Built::Scorer(Box::new(TierAwareScorer::new(
                need_index(env)?,
                w,
            ))))
        });
        r.register("session-affinity", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(SessionAffinity::default())))
        });
        r.register("hash-affinity", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(HashAffinity)))
        });
        r.register("no-cache-spread", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(NoCacheSpread)))
        });
        r.register("cache-aware-cost", |p, _| {
            let c: CostParams = p.parse()?;
            Ok(Built::Scorer(Box::new(CacheAwareCost::new(
                c.overlap_weight,
                c.block_size,
            ))))
        });
        r.register("predicted-ttft", |p, env| {
            let m: TtftModel = p.parse()?;
            if m.block_size == 0 || m.step_tokens == 0 {
                return Err("`block_size` and `step_tokens` must be positive".into());
            }
            if m.tier_top_k > MAX_TIER_TOP_K {
                return Err(format!("`tier_top_k` must be at most {MAX_TIER_TOP_K}"));
            }
            let finite = [
                m.step_ms,
                m.token_us,
                m.attention_ns,
                m.kv_read_ns,
                m.cpu_load_us,
                m.compute_weight,
            ];
            if finite.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err("timing constants and `compute_weight` must be finite and >= 0".into());
            }
            Ok(Built::Scorer(Box::new(PredictedTtft::new(
                m,
                env.index.clone(),
            ))))
        });
        r.register("speculative", |p, env| {
            let s: SpeculativeParams = p.parse()?;
            if s.ttl_ms == 0 || s.capacity_blocks == 0 {
                return Err("`ttl_ms` and `capacity_blocks` must be positive".into());
            }
            let memory = Memory::new(s.ttl_ms, s.capacity_blocks);
            let table = match &env.routed {
                Some(t) => {
                    t.set_default(memory);
                    t.clone()
                }
                None => Arc::new(RoutedChains::new(memory)),
            };
            let mut spec = Speculative::new(table);
            if let Some(index) = &env.index {
                spec = spec.with_index(index.clone());
            }
            Ok(Built::Prepare(Box::new(spec)))
        });
        r.register("smg-cache-aware", |p, _| {
            let c: SmgConfig = p.parse()?;
            if !(0.0..=1.0).contains(&c.cache_threshold) {
                return Err("`cache_threshold` must be in 0..=1".into());
            }
            if !c.balance_rel_threshold.is_finite() || c.balance_rel_threshold < 0.0 {
                return Err("`balance_rel_threshold` must be finite and >= 0".into());
            }
            Ok(Built::Picker(Box::new(SmgCacheAware::new(c))))
        });
        r.register("queue", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(QueueScorer)))
        });
        r.register("kv-utilization", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(KvUtilization)))
        });
        r.register("precise-prefix", |p, _| {
            p.none()?;
            Ok(Built::Scorer(Box::new(PrecisePrefix)))
        });
        r.register("max-score", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(MaxScore::default())))
        });
        r.register("weighted-random", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(WeightedRandom::default())))
        });
        r.register("round-robin", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(RoundRobin::default())))
        });
        r.register("random", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(RandomPick::default())))
        });
        r.register("least-requests", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(LeastRequests::default())))
        });
        r.register("power-of-two", |p, _| {
            p.none()?;
            Ok(Built::Picker(Box::new(PowerOfTwo::default())))
        });
        r.register("consistent-hash", |p, _| {
            let h: HashParams = p.parse()?;
            Ok(Built::Picker(Box::new(ConsistentHash::new(h.load_factor))))
        });
        r
    }

    /// Every `speculative` plugin built by this registry shares `table`
    /// (one per gateway, so all profiles and steps see every routing).
    pub fn with_routed(mut self, table: Arc<RoutedChains>) -> Self {
        self.env.routed = Some(table);
        self
    }

    /// Plugins that query the index (`prefix-match`, `tier-aware`) use `index`.
    pub fn with_index(mut self, index: Arc<dyn PrefixIndex>) -> Self {
        self.env.index = Some(index);
        self
    }

    /// Registers a plugin factory under `name`, usable from config like a
    /// built-in (a later registration replaces an earlier one).
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F)
    where
        F: Fn(Params, &Env) -> Result<Built, String> + Send + Sync + 'static,
    {
        self.factories.insert(name.into(), Box::new(factory));
    }

    /// Makes a context key nameable in a profile's `inputs`.
    pub fn register_key<T: 'static>(&mut self, key: Key<T>) {
        self.keys.insert(key.name().to_owned(), key.id());
    }

    /// Loads every profile of a TOML document holding only `[profiles.*]`.
    pub fn load(&self, text: &str) -> Result<BTreeMap<String, Profile>, Error> {
        let file: FileSpec = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        self.build_all(text, file.profiles)
    }

    /// Loads the `[profiles.*]` of a larger TOML document (a gateway's
    /// configuration file), ignoring its other tables; line numbers in
    /// errors are the document's. No `profiles` table yields no profiles.
    pub fn load_embedded(&self, text: &str) -> Result<BTreeMap<String, Profile>, Error> {
        let file: EmbeddedSpec = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        self.build_all(text, file.profiles)
    }

    fn build_all(
        &self,
        text: &str,
        profiles: BTreeMap<String, ProfileSpec>,
    ) -> Result<BTreeMap<String, Profile>, Error> {
        let line_of = |offset: usize| line_at(text, offset);
        let mut out = BTreeMap::new();
        for (name, spec) in profiles {
            let mut b = Profile::builder(name.clone());
            for input in &spec.inputs {
                let key = self
                    .keys
                    .get(input.get_ref())
                    .ok_or_else(|| Error::Config {
                        line: line_of(input.span().start),
                        message: format!(
                            "profile `{name}`: unknown input key `{}`",
                            input.get_ref()
                        ),
                    })?;
                b = b.input(*key);
            }
            let build = |s: Spanned<PluginSpec>,
                         stage: &str|
             -> Result<(Built, Option<f64>), Error> {
                let line = line_of(s.span().start);
                let spec = s.into_inner();
                let factory = self
                    .factories
                    .get(&spec.kind)
                    .ok_or_else(|| Error::Config {
                        line,
                        message: format!("profile `{name}`: unknown plugin type `{}`", spec.kind),
                    })?;
                let built = factory(Params(spec.params), &self.env).map_err(|m| Error::Config {
                    line,
                    message: format!("profile `{name}`: plugin `{}`: {m}", spec.kind),
                })?;
                let wrong = |got: &str| Error::Config {
                    line,
                    message: format!(
                        "profile `{name}`: plugin `{}` is a {got}, listed under {stage}",
                        spec.kind
                    ),
                };
                let (stage_of, kind) = match &built {
                    Built::Prepare(_) => ("prepare", "prepare plugin"),
                    Built::Filter(_) => ("filters", "filter"),
                    Built::Scorer(_) => ("scorers", "scorer"),
                    Built::Picker(_) => ("picker", "picker"),
                };
                if stage_of != stage {
                    return Err(wrong(kind));
                }
                if spec.weight.is_some() && stage != "scorers" {
                    return Err(Error::Config {
                        line,
                        message: format!("profile `{name}`: only scorers take a `weight`"),
                    });
                }
                let built = match spec.name {
                    Some(n) => rename(built, n),
                    None => built,
                };
                Ok((built, spec.weight))
            };
            for s in spec.prepare {
                if let (Built::Prepare(p), _) = build(s, "prepare")? {
                    b = b.prepare_boxed(p);
                }
            }
            for s in spec.filters {
                if let (Built::Filter(f), _) = build(s, "filters")? {
                    b = b.filter_boxed(f);
                }
            }
            for s in spec.scorers {
                if let (Built::Scorer(sc), w) = build(s, "scorers")? {
                    b = b.scorer_boxed(sc, w.unwrap_or(1.0));
                }
            }
            let profile_line = spec.picker.as_ref().map_or(0, |p| line_of(p.span().start));
            if let Some(s) = spec.picker {
                if let (Built::Picker(p), _) = build(s, "picker")? {
                    b = b.picker_boxed(p);
                }
            }
            let profile = b.build().map_err(|e| Error::Config {
                line: profile_line,
                message: e.to_string(),
            })?;
            out.insert(name, profile);
        }
        Ok(out)
    }
}

/// A plugin under another name (one type used twice in a profile).
struct Renamed<T: ?Sized> {
    name: String,
    inner: Box<T>,
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Renamed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {:?}", self.name, self.inner)
    }
}

macro_rules! renamed_plugin {
    ($t:ident) => {
        impl Plugin for Renamed<dyn $t> {
            fn name(&self) -> &str {
                &self.name
            }
            fn needs(&self) -> Vec<KeyId> {
                self.inner.needs()
            }
            fn produces(&self) -> Vec<KeyId> {
                self.inner.produces()
            }
            fn on_pick(&self, ctx: &Context, pod: &PodState) {
                self.inner.on_pick(ctx, pod)
            }
        }
    };
}

renamed_plugin!(Prepare);
renamed_plugin!(Filter);
renamed_plugin!(Scorer);
renamed_plugin!(Picker);

impl Prepare for Renamed<dyn Prepare> {
    fn prepare(&self, ctx: &mut Context, pods: &[PodState]) {
        self.inner.prepare(ctx, pods)
    }
}

impl Filter for Renamed<dyn Filter> {
    fn keep(&self, ctx: &Context, pod: &PodState) -> bool {
        self.inner.keep(ctx, pod)
    }
    fn retain(&self, ctx: &Context, pods: &mut Vec<PodState>) {
        self.inner.retain(ctx, pods)
    }
}

impl Scorer for Renamed<dyn Scorer> {
    fn score(&self, ctx: &Context, pods: &[PodState], out: &mut [f64]) {
        self.inner.score(ctx, pods, out)
    }
}

impl Picker for Renamed<dyn Picker> {
    fn pick(&self, ctx: &Context, pods: &[PodState], scores: &[f64]) -> Option<usize> {
        self.inner.pick(ctx, pods, scores)
    }
}

fn rename(b: Built, name: String) -> Built {
    match b {
        Built::Prepare(inner) => Built::Prepare(Box::new(Renamed { name, inner })),
        Built::Filter(inner) => Built::Filter(Box::new(Renamed { name, inner })),
        Built::Scorer(inner) => Built::Scorer(Box::new(Renamed { name, inner })),
        Built::Picker(inner) => Built::Picker(Box::new(Renamed { name, inner })),
    }
}
