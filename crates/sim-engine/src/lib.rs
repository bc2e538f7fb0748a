//! Simulated engines, and a gateway started over them: what runs the
//! router's real path on a machine without a GPU.
//!
//! A [`SimEngine`] is a real HTTP server (OpenAI's completions and chat,
//! vLLM's `/metrics`) and real ZeroMQ sockets (vLLM's KV-event publisher
//! and replay endpoint) on loopback, whose cache and timing come from
//! router-sim. [`SimGateway`] starts the engines of a configuration's
//! `[simulated]` table and then router-gateway's [`Gateway`] over them and
//! the file's `[[pods]]`, as the `cache-router` command does.
//!
//! This crate is for tests, examples and the main job; nothing in the
//! router depends on it.
#![forbid(unsafe_code)]

mod engine;

use std::sync::Arc;

use router_gateway::{Config, Error, Gateway, PodConfig};
use router_hash::ModelTokenizer;
use router_policy::Role;

pub use engine::{EngineConfig, Hybrid, SimEngine};

/// Starts the engines of `config`'s `[simulated]` table (taking it) and
/// adds their pods (`sim-0`, `sim-1`, ...) as fixed pods, which a reload
/// keeps. Nothing is started when the table is absent.
pub fn start_engines(config: &mut Config) -> Result<Vec<SimEngine>, Error> {
    let Some(sim) = config.simulated.take() else {
        return Ok(Vec::new());
    };
    let g = &config.gateway;
    let tokenizer = Arc::new(ModelTokenizer::from_dir(&g.tokenizer)?);
    let hybrid = sim
        .hybrid
        .as_deref()
        .map(str::parse::<Hybrid>)
        .transpose()
        .map_err(|message| Error::Config {
            line: 0,
            message: format!("[simulated] hybrid: {message}"),
        })?;
    let mut engines = Vec::with_capacity(sim.engines);
    let mut pods = Vec::with_capacity(sim.engines);
    for i in 0..sim.engines {
        let mut ec = EngineConfig::new(g.model.clone(), tokenizer.clone())
            .block_size(g.block_size)
            .gpu_blocks(sim.gpu_blocks)
            .time_scale(sim.time_scale)
            .encoding(sim.encoding)
            .default_max_tokens(sim.default_max_tokens)
            .hybrid(hybrid)
            .adapters(sim.adapters.clone());
        ec.topic = "kv-events".into();
        let e = SimEngine::start(ec)?;
        let mut pod = PodConfig::new(format!("sim-{i}"), e.url());
        if sim.events {
            pod = pod.with_events(e.events_endpoint(), Some(e.replay_endpoint().to_owned()));
        }
        pod.topic = "kv-events".into();
        pod.adapters = sim.adapters.clone();
        if sim.prefill_engines > 0 {
            pod.role = if i < sim.prefill_engines {
                Role::Prefill
            } else {
                Role::Decode
            };
        }
        pods.push(pod);
        engines.push(e);
    }
    for pod in pods {
        config.add_fixed_pod(pod);
    }
    Ok(engines)
}

/// A gateway and the simulated engines it was started over. Dereferences
/// to the [`Gateway`]; dropping it stops the gateway, then the engines.
#[derive(Debug)]
pub struct SimGateway {
    // Field order is drop order: the gateway stops before its engines.
    gateway: Gateway,
    engines: Vec<SimEngine>,
}

impl SimGateway {
    /// Starts `config`'s simulated engines ([`start_engines`]), then the
    /// gateway, on the current tokio runtime (multi-threaded). The
    /// gateway's address is bound before the engines take ephemeral ports
    /// of their own: otherwise an engine could take a port chosen free for
    /// the gateway, answer its `/health`, and die with the process when the
    /// gateway's bind then fails.
    pub async fn start(config: Config) -> Result<SimGateway, Error> {
        let listener = Gateway::bind(&config).await?;
        SimGateway::serve(listener, config).await
    }

    /// [`SimGateway::start`] on a `listener` the caller bound (with
    /// [`Gateway::bind`]): several gateways in one process bind all their
    /// addresses before any of them starts engines.
    pub async fn serve(
        listener: tokio::net::TcpListener,
        mut config: Config,
    ) -> Result<SimGateway, Error> {
        let engines = start_engines(&mut config)?;
        let gateway = Gateway::serve(listener, config).await?;
        Ok(SimGateway { gateway, engines })
    }

    /// The simulated engines, in pod order (`sim-0`, `sim-1`, ...).
    pub fn engines(&self) -> &[SimEngine] {
        &self.engines
    }

    /// The simulated engines, to kill or restart one.
    pub fn engines_mut(&mut self) -> &mut [SimEngine] {
        &mut self.engines
    }

    /// The simulated engines' pods, as another gateway (a replica over the
    /// same engines) would list them.
    pub fn engine_pods(&self) -> Vec<PodConfig> {
        self.gateway.fixed_pods()
    }
}

impl std::ops::Deref for SimGateway {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}
