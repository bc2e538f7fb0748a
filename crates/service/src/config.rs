//! The gateway's configuration file (TOML).
//!
//! ```toml
//! [gateway]
//! listen = "127.0.0.1:8000"
//! model = "Qwen/Qwen3-0.6B"            # the name clients send
//! tokenizer = "assets/tokenizers/qwen3" # tokenizer.json + tokenizer_config.json
//! block_size = 16                      # the engines' --block-size
//! profile = "cache-aware"              # one of [profiles.*] below
//!
//! [[pods]]
//! name = "vllm-0"
//! url = "http://10.0.0.7:8000"
//! events = "tcp://10.0.0.7:5557"
//! replay = "tcp://10.0.0.7:5558"
//!
//! [profiles.cache-aware]
//! # as router-policy's configuration
//! ```
//!
//! Relative paths are taken from the file's directory. Unknown keys are
//! refused with their line; the `[profiles.*]` tables are router-policy's
//! and checked by its registry.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use router_policy::Role;
use serde::Deserialize;

use crate::Error;
use router_events::Encoding;

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The gateway itself.
    pub gateway: GatewayConfig,
    /// The engines to route to.
    #[serde(default)]
    pub pods: Vec<PodConfig>,
    /// Simulated engines to start on loopback (added to `pods`).
    pub simulated: Option<SimulatedConfig>,
    /// Router replicas over NATS JetStream (none: one gateway on its own).
    pub nats: Option<NatsSection>,
    /// More models behind the same router, beside `[gateway]`'s: each with
    /// its tokenizer, block size and pods (`[[pods]]` naming it in
    /// `model`); requests go to a model's pods by their `model`.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Routing profiles (router-policy's format), kept as text for its
    /// registry, which reports errors with this file's line numbers.
    #[serde(default, rename = "profiles")]
    profiles_table: Option<toml::Table>,
    /// The file's text.
    #[serde(skip)]
    pub(crate) text: String,
    /// The file it came from, for `POST /admin/reload`.
    #[serde(skip)]
    pub(crate) path: Option<PathBuf>,
    /// The file's modification time and length before it was read (what
    /// `watch_pods_ms` compares with).
    #[serde(skip)]
    pub(crate) loaded_stamp: Option<(Option<std::time::SystemTime>, u64)>,
    /// Pods added by code that a reloaded file keeps ([`Config::add_fixed_pod`]).
    #[serde(skip)]
    pub(crate) fixed: Vec<PodConfig>,
}

/// The `[gateway]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// Address to serve on (`127.0.0.1:0`: any free port).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The served model's name, as clients send it and engines expect it.
    pub model: String,
    /// Directory with the model's `tokenizer.json` (and
    /// `tokenizer_config.json` with its chat template).
    pub tokenizer: PathBuf,
    /// Tokens per KV block, as the engines are configured.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// The routing profile, one of `[profiles.*]` (single dispatch).
    #[serde(default = "default_profile")]
    pub profile: String,
    /// `single` (one pod runs the request) or `prefill-decode` (a prefill
    /// pod, then a decode pod given its KV handle).
    #[serde(default)]
    pub workflow: WorkflowKind,
    /// The prefill step's profile (`prefill-decode`).
    #[serde(default = "default_prefill_profile")]
    pub prefill_profile: String,
    /// The decode step's profile (`prefill-decode`).
    #[serde(default = "default_decode_profile")]
    pub decode_profile: String,
    /// Prompts of at most this many tokens skip the prefill step
    /// (`prefill-decode`; 0: none do).
    #[serde(default)]
    pub decode_only_below_tokens: u64,
    /// Largest request body accepted, in bytes (413 beyond).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's headers (and, on a
    /// kept-alive connection, to start the next request), in ms: the
    /// connection is closed past it.
    #[serde(default = "default_header_timeout")]
    pub header_timeout_ms: u64,
    /// The most prompt tokens a request may have (with its `max_tokens`,
    /// the most it may ask for in all), as vLLM's `max_model_len`: a longer
    /// one is a 400, refused before tokenizing when its text alone is too
    /// long. Default: the tokenizer's `model_max_length`; 0: no limit.
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// Extra certificate authorities (a PEM file) trusted for `https://`
    /// engines, beside the system's; needs a build with the `rustls`
    /// feature.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Tokenize chat requests with transformers' `sanitize_control_tokens`:
    /// control tokens written in messages, tools and template variables
    /// count as plain text. Only for engines that tokenize that way; vLLM
    /// does not (it renders the template to text first), so the default is
    /// off and the router's chains match vLLM's.
    #[serde(default)]
    pub sanitize_control_tokens: bool,
    /// With a token, the `/admin` calls need `Authorization: Bearer <token>`
    /// (401 without it).
    #[serde(default)]
    pub admin_token: Option<String>,
    /// How long a client may take to send a request's body, in ms (408).
    #[serde(default = "default_body_timeout")]
    pub body_timeout_ms: u64,
    /// A request's deadline from routing to its last chunk, in ms (504).
    #[serde(default = "default_timeout")]
    pub request_timeout_ms: u64,
    /// Connecting to an engine, in ms.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// Attempts per request, on different pods.
    #[serde(default = "default_attempts")]
    pub max_attempts: usize,
    /// Prompts tokenized at once off the async threads (the tokenizer
    /// threads; a short chat is tokenized in place, see
    /// `openai::is_light`).
    #[serde(default = "default_tokenize")]
    pub tokenize_concurrency: usize,
    /// Keep the token ids of the text between a chat's control tokens (its
    /// messages) up to this many MiB, so the history a conversation sends
    /// again at every turn is tokenized once; 0: tokenize every prompt
    /// whole. The ids are exactly those of tokenizing the whole prompt.
    #[serde(default = "default_tokenize_cache")]
    pub tokenize_cache_mb: usize,
    /// Interval of the engines' health probes, in ms.
    #[serde(default = "default_health_interval")]
    pub health_interval_ms: u64,
    /// Failed probes in a row before a pod is taken out.
    #[serde(default = "default_unhealthy_after")]
    pub unhealthy_after: u32,
    /// How long an unhealthy pod keeps its record, in ms: back within it,
    /// it is routed on what it held (once its stream shows the same
    /// engine); past it, it leaves the index and rejoins empty.
    #[serde(default = "default_unhealthy_grace")]
    pub unhealthy_grace_ms: u64,
    /// Watch the configuration file: when it changes, its `[[pods]]` are
    /// applied (as `POST /admin/reload` does), checked this often, in ms.
    /// 0 (the default): not watched. A pod list kept in a file that a
    /// deployment rewrites (a Kubernetes ConfigMap, say) is followed this way.
    #[serde(default)]
    pub watch_pods_ms: u64,
    /// Approximate mode, for pods without `events`: how long a chain routed
    /// to such a pod counts as cached there, in ms.
    #[serde(default = "default_approx_ttl")]
    pub approx_ttl_ms: u64,
    /// Approximate mode: blocks remembered per pod without `events` (about
    /// its engine's KV capacity); the least recently routed leave first.
    #[serde(default = "default_approx_capacity")]
    pub approx_capacity_blocks: usize,
    /// Hybrid models: predict hits from every KV-cache group the vLLM
    /// engines report (sliding window, Mamba, chunked local attention), as
    /// the engine accepts them. `false` keeps the full-attention-only view
    /// (every peer router's), an upper bound for hybrid models.
    #[serde(default = "yes")]
    pub hybrid_groups: bool,
    /// Chunked local attention's chunk in tokens (Llama 4's
    /// `attention_chunk_size`), which vLLM's events do not carry. Without
    /// it such groups' events are skipped and counted
    /// (`cache_router_events_skipped_total{reason="unsupported_group"}`).
    #[serde(default)]
    pub attention_chunk_size: Option<u32>,
    /// A hybrid model's other KV-cache groups, declared for pods whose
    /// events have not described theirs yet (vLLM publishes a group once it
    /// stores a block): `sliding-window:<tokens>`, `chunked-local:<tokens>`,
    /// `mamba`. Empty: learned from events only.
    #[serde(default)]
    pub kv_groups: Vec<String>,
}

/// One `[[models]]` table: a model served beside `[gateway]`'s, with the
/// settings that differ between models (the rest are `[gateway]`'s).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ModelConfig {
    /// The model's name, as clients send it and its engines expect it.
    pub name: String,
    /// Directory with its `tokenizer.json` (and `tokenizer_config.json`).
    pub tokenizer: PathBuf,
    /// Tokens per KV block on its engines.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Its context limit (see `gateway.max_prompt_tokens`).
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// Its other KV-cache groups, if it is a hybrid model (see
    /// `gateway.kv_groups`).
    #[serde(default)]
    pub kv_groups: Vec<String>,
    /// Its chunked local attention's chunk (see
    /// `gateway.attention_chunk_size`).
    #[serde(default)]
    pub attention_chunk_size: Option<u32>,
}

/// The `[nats]` table: this gateway is one of several replicas sharing
/// one event log, snapshots, load and registrations over NATS JetStream.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NatsSection {
    /// The server, for example `nats://127.0.0.1:4222`.
    pub url: String,
    /// This replica's name, unique among the replicas (default: made from
    /// the process id and a random part).
    #[serde(default)]
    pub replica: Option<String>,
    /// Names the stream, the object store and the subjects (replicas
    /// sharing state use the same one).
    #[serde(default = "default_nats_prefix")]
    pub prefix: String,
    /// How often the index is snapshotted, in ms (0: never).
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every_ms: u64,
    /// How long another replica's load counts without news, in ms.
    #[serde(default = "default_lease")]
    pub lease_ms: u64,
    /// Whether in-flight load is shared.
    #[serde(default = "yes")]
    pub share_load: bool,
    /// Whether speculative registrations are shared.
    #[serde(default = "yes")]
    pub share_routed: bool,
}

impl NatsSection {
    /// The replica's configuration.
    pub fn to_config(&self) -> router_nats::NatsConfig {
        let replica = self.replica.clone().unwrap_or_else(|| {
            use std::hash::{BuildHasher, RandomState};
            let r = RandomState::new().hash_one(std::process::id()) % 1_000_000;
            format!("gw-{}-{r:06}", std::process::id())
        });
        let mut c = router_nats::NatsConfig::new(self.url.clone(), replica);
        c.prefix = self.prefix.clone();
        c.snapshot_every = std::time::Duration::from_millis(self.snapshot_every_ms);
        c.lease = std::time::Duration::from_millis(self.lease_ms.max(1));
        c.share_load = self.share_load;
        c.share_routed = self.share_routed;
        c
    }
}

fn default_nats_prefix() -> String {
    "cache-router".into()
}
fn default_snapshot_every() -> u64 {
    10_000
}
fn default_lease() -> u64 {
    1_500
}

/// How a request is run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowKind {
    /// One pod runs the whole request.
    #[default]
    Single,
    /// Prefill on one pod, decode on another with the prefill's KV handle.
    PrefillDecode,
}

/// One engine (one data-parallel rank).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PodConfig {
    /// A unique name.
    pub name: String,
    /// The engine's OpenAI-compatible HTTP base URL.
    pub url: String,
    /// Its KV-event publisher (vLLM `--kv-events-config` `endpoint`, with
    /// the host filled in), if it publishes events.
    #[serde(default)]
    pub events: Option<String>,
    /// Its replay endpoint (`replay_endpoint`).
    #[serde(default)]
    pub replay: Option<String>,
    /// The event topic (`topic`; empty: all).
    #[serde(default)]
    pub topic: String,
    /// Its role.
    #[serde(default)]
    pub role: Role,
    /// The model it serves: one of `[[models]]` (absent: `[gateway]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The LoRA adapters it serves (vLLM's `--lora-modules` names): a
    /// request naming one as its `model` goes to these pods only, its
    /// blocks hashed under the adapter (as vLLM hashes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
}

impl PodConfig {
    /// A pod serving whole requests at `url`, without events.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        PodConfig {
            name: name.into(),
            url: url.into(),
            events: None,
            replay: None,
            topic: String::new(),
            role: Role::Both,
            model: None,
            adapters: Vec::new(),
        }
    }

    /// Serving `model` (one of `[[models]]`).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Serving the LoRA adapters `adapters`.
    pub fn with_adapters<S: Into<String>>(mut self, adapters: impl IntoIterator<Item = S>) -> Self {
        self.adapters = adapters.into_iter().map(Into::into).collect();
        self
    }

    /// With an event endpoint and, optionally, a replay endpoint.
    pub fn with_events(mut self, events: impl Into<String>, replay: Option<String>) -> Self {
        self.events = Some(events.into());
        self.replay = replay;
        self
    }
}

fn encoding<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Encoding, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

/// The `[simulated]` table: simulated engines to start on loopback
/// (router-sim-engine's `SimGateway` starts them; `Gateway::start` alone
/// refuses a file with this table).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SimulatedConfig {
    /// How many.
    pub engines: usize,
    /// The first this many are prefill pods and the rest decode pods
    /// (0: every engine runs whole requests).
    #[serde(default)]
    pub prefill_engines: usize,
    /// Their event encoding (`map`, vLLM's default, or `array`).
    #[serde(default, deserialize_with = "encoding")]
    pub encoding: Encoding,
    /// Multiplies every modelled duration (0.1: ten times faster than the
    /// modelled GPU).
    #[serde(default = "one")]
    pub time_scale: f64,
    /// KV blocks each engine's GPU holds.
    #[serde(default = "default_gpu_blocks")]
    pub gpu_blocks: usize,
    /// `max_tokens` when a request gives none.
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: u32,
    /// Whether the gateway follows their KV events (false: they are routed
    /// in approximate mode, as engines without events are).
    #[serde(default = "yes")]
    pub events: bool,
    /// A hybrid model: `sliding-window:<tokens>` or `mamba` (a second
    /// KV-cache group beside full attention, with vLLM's hit rule and
    /// events). Absent: full attention only.
    #[serde(default)]
    pub hybrid: Option<String>,
    /// LoRA adapters every engine serves (their pods list them).
    #[serde(default)]
    pub adapters: Vec<String>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8000))
}
fn default_block_size() -> u32 {
    16
}
fn default_profile() -> String {
    "cache-aware".into()
}
fn default_prefill_profile() -> String {
    "prefill".into()
}
fn default_decode_profile() -> String {
    "decode".into()
}
fn default_max_body() -> usize {
    4 << 20
}
fn default_timeout() -> u64 {
    60_000
}
fn default_connect_timeout() -> u64 {
    1_000
}
fn default_attempts() -> usize {
    3
}
fn default_tokenize() -> usize {
    2
}
fn default_tokenize_cache() -> usize {
    router_hash::SEGMENT_CACHE_BYTES >> 20
}
fn default_health_interval() -> u64 {
    1_000
}
fn default_unhealthy_after() -> u32 {
    2
}
fn default_header_timeout() -> u64 {
    10_000
}
fn default_body_timeout() -> u64 {
    30_000
}
fn default_unhealthy_grace() -> u64 {
    30_000
}
fn default_approx_ttl() -> u64 {
    300_000
}
fn default_approx_capacity() -> usize {
    32_768
}
fn yes() -> bool {
    true
}
fn one() -> f64 {
    1.0
}
fn default_gpu_blocks() -> usize {
    4096
}
fn default_max_tokens() -> u32 {
    16
}

impl Config {
    /// Adds `pod` to the pods, to be kept when `POST /admin/reload`
    /// applies a file that does not list it (the simulated engines' pods,
    /// say, which a file cannot name before they are started).
    pub fn add_fixed_pod(&mut self, pod: PodConfig) {
        self.pods.push(pod.clone());
        self.fixed.push(pod);
    }

    /// Parses `text`, taking relative paths from `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Config, Error> {
        let mut c: Config = toml::from_str(text).map_err(|e| Error::Config {
            line: e.span().map_or(0, |s| line_at(text, s.start)),
            message: e.message().to_owned(),
        })?;
        c.text = text.to_owned();
        normalise_pods(&mut c.pods)?;
        if c.gateway.tokenizer.is_relative() {
            c.gateway.tokenizer = base.join(&c.gateway.tokenizer);
        }
        if let Some(ca) = c.gateway.tls_ca_file.as_mut().filter(|p| p.is_relative()) {
            *ca = base.join(&*ca);
        }
        for m in c.models.iter_mut().filter(|m| m.tokenizer.is_relative()) {
            m.tokenizer = base.join(&m.tokenizer);
        }
        c.check()?;
        Ok(c)
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.to_owned(),
            source: e,
        })?;
        let mut c = Config::parse(&text, path.parent().unwrap_or(Path::new(".")))?;
        c.path = Some(path.to_owned());
        c.loaded_stamp = stamp;
        Ok(c)
    }

    /// Whether the file has `[profiles.*]` of its own (otherwise the
    /// gateway uses router-policy's default profile).
    pub fn has_profiles(&self) -> bool {
        self.profiles_table.as_ref().is_some_and(|t| !t.is_empty())
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |message: String| Err(Error::Config { line: 0, message });
        let g = &self.gateway;
        if g.block_size == 0 {
            return bad("gateway.block_size must be at least 1".into());
        }
        if g.tls_ca_file.is_some() && !cfg!(feature = "rustls") {
            return bad(
                "gateway.tls_ca_file needs a build with the `rustls` feature (engines over https://)"
                    .into(),
            );
        }
        if g.max_attempts == 0 || g.tokenize_concurrency == 0 {
            return bad("gateway.max_attempts and tokenize_concurrency must be at least 1".into());
        }
        if let Some(s) = &self.simulated {
            if s.prefill_engines > s.engines {
                return bad(format!(
                    "simulated.prefill_engines ({}) is more than simulated.engines ({})",
                    s.prefill_engines, s.engines
                ));
            }
            if !(s.time_scale.is_finite() && s.time_scale >= 0.0) {
                return bad(format!(
                    "simulated.time_scale must be a finite number >= 0, got {}",
                    s.time_scale
                ));
            }
        }
        if let Some(n) = &self.nats {
            n.to_config().check().map_err(|e| Error::Config {
                line: 0,
                message: e.to_string(),
            })?;
        }
        self.check_models()?;
        check_pod_models(&self.pods, &self.model_names())
    }

    /// Every model served: `[gateway]`'s first, then `[[models]]`'.
    pub fn model_names(&self) -> Vec<&str> {
        std::iter::once(self.gateway.model.as_str())
            .chain(self.models.iter().map(|m| m.name.as_str()))
            .collect()
    }

    fn check_models(&self) -> Result<(), Error> {
        let bad = |message: String| Err(Error::Config { line: 0, message });
        if self.models.is_empty() {
            return Ok(());
        }
        if self.nats.is_some() {
            return bad("[nats] serves one model: replicas of a router with [[models]] are not supported yet".into());
        }
        let mut seen = std::collections::HashSet::new();
        for name in self.model_names() {
            if name.is_empty() || !seen.insert(name) {
                return bad(format!(
                    "models: `{name}` is named twice (or empty); each model needs a name of its own"
                ));
            }
        }
        if let Some(m) = self.models.iter().find(|m| m.block_size == 0) {
            return bad(format!(
                "models `{}`: block_size must be at least 1",
                m.name
            ));
        }
        Ok(())
    }

    /// The pods serving `model` (`[gateway]`'s model for pods naming none).
    pub(crate) fn pods_of(&self, model: &str) -> Vec<PodConfig> {
        self.pods
            .iter()
            .filter(|p| p.model.as_deref().unwrap_or(&self.gateway.model) == model)
            .cloned()
            .collect()
    }

    /// The configuration of one model (`[gateway]`'s for `None`) with the
    /// pods that serve it: what one model's part of a [`Router`] starts
    /// from.
    ///
    /// [`Router`]: crate::Router
    pub(crate) fn for_model(&self, model: Option<&ModelConfig>) -> Config {
        let mut c = self.clone();
        c.models.clear();
        let name = model.map_or(self.gateway.model.as_str(), |m| m.name.as_str());
        let of = |p: &PodConfig| p.model.as_deref().unwrap_or(&self.gateway.model) == name;
        c.pods.retain(of);
        c.fixed.retain(of);
        if let Some(m) = model {
            let g = &mut c.gateway;
            g.model = m.name.clone();
            g.tokenizer = m.tokenizer.clone();
            g.block_size = m.block_size;
            g.max_prompt_tokens = m.max_prompt_tokens;
            g.kv_groups = m.kv_groups.clone();
            g.attention_chunk_size = m.attention_chunk_size;
            // Engines of other models are not simulated.
            c.simulated = None;
        }
        c
    }
}

/// Every pod's `model` is one served; adapter names are not empty and
/// not a served model's.
pub(crate) fn check_pod_models(pods: &[PodConfig], models: &[&str]) -> Result<(), Error> {
    for p in pods {
        if let Some(m) = &p.model
            && !models.contains(&m.as_str())
        {
            return Err(Error::Pods(format!(
                "pod `{}`: model `{m}` is not served (models: {})",
                p.name,
                models.join(", ")
            )));
        }
        if let Some(a) = p
            .adapters
            .iter()
            .find(|a| a.is_empty() || models.contains(&a.as_str()))
        {
            return Err(Error::Pods(format!(
                "pod `{}`: adapter `{a}` is empty or a model's name",
                p.name
            )));
        }
    }
    Ok(())
}

/// Pod names must be unique and URLs HTTP.
/// The longest pod name accepted.
pub(crate) const MAX_POD_NAME: usize = 64;

/// Checks a pod list and puts it in normal form: names of 1 to 64 letters,
/// digits, `.`, `_` or `-` (they end up in logs, metric labels and admin
/// paths); URLs parsed, `http://` with a host (or `https://` in a build
/// with the `rustls` feature),
/// without a trailing `/`; event endpoints `tcp://host:port`. Two pods with
/// the same name or the same URL are a conflict.
pub(crate) fn normalise_pods(pods: &mut [PodConfig]) -> Result<(), Error> {
    for p in pods.iter_mut() {
        normalise_pod(p)?;
    }
    let mut names = std::collections::HashSet::new();
    let mut urls = std::collections::HashSet::new();
    for p in pods.iter() {
        if !names.insert(p.name.as_str()) {
            return Err(Error::PodConflict(format!(
                "two pods are named `{}`",
                p.name
            )));
        }
        if !urls.insert(p.url.as_str()) {
            return Err(Error::PodConflict(format!(
                "two pods have the url `{}`",
                p.url
            )));
        }
    }
    Ok(())
}

/// Checks one pod and puts it in normal form (see [`normalise_pods`]).
pub(crate) fn normalise_pod(p: &mut PodConfig) -> Result<(), Error> {
    let shown: String = p
        .name
        .chars()
        .take(MAX_POD_NAME)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if p.name.is_empty()
        || p.name.len() > MAX_POD_NAME
        || !p
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(Error::Pods(format!(
            "pod name \"{shown}\" must be 1 to {MAX_POD_NAME} letters, digits, `.`, `_` or `-`"
        )));
    }
    let url = reqwest::Url::parse(&p.url).map_err(|e| {
        Error::Pods(format!(
            "pod `{}`: url `{}`: {e}",
            p.name,
            p.url.escape_debug()
        ))
    })?;
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "rustls") => {}
        "https" => {
            return Err(Error::Pods(format!(
                "pod `{}`: url `{}`: https:// needs a build with the `rustls` feature",
                p.name, p.url
            )));
        }
        other => {
            return Err(Error::Pods(format!(
                "pod `{}`: url `{}`: scheme `{other}` is not http://",
                p.name, p.url
            )));
        }
    }
    if url.host_str().is_none_or(str::is_empty) || url.query().is_some() || url.fragment().is_some()
    {
        return Err(Error::Pods(format!(
            "pod `{}`: url `{}` needs a host and no query or fragment",
            p.name, p.url
        )));
    }
    p.url = url.as_str().trim_end_matches('/').to_owned();
    for ep in p.events.iter_mut().chain(p.replay.iter_mut()) {
        let parsed = reqwest::Url::parse(ep).ok().filter(|u| {
            u.scheme() == "tcp"
                && u.host_str().is_some_and(|h| !h.is_empty())
                && u.port().is_some()
                && u.path().trim_matches('/').is_empty()
        });
        match parsed {
            Some(u) => {
                *ep = format!(
                    "tcp://{}:{}",
                    u.host_str().unwrap_or_default(),
                    u.port().unwrap_or(0)
                );
            }
            None => {
                return Err(Error::Pods(format!(
                    "pod `{}`: event endpoint `{}` is not tcp://host:port",
                    p.name,
                    ep.escape_debug()
                )));
            }
        }
    }
    Ok(())
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}
