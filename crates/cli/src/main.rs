//! `cache-router`: the reference gateway, an OpenAI-compatible router in
//! front of vLLM or SGLang engines, or in front of simulated ones it starts
//! itself.
//!
//! ```text
//! cargo install --locked --path crates/cli     # installs `cache-router`
//! cache-router                                 # 4 simulated engines on 127.0.0.1:8000
//! cache-router --config my.toml                # your engines (see the README)
//! cache-router --replicas 2 --nats nats://127.0.0.1:4222
//!                                     # two replicas on :8000 and :8001 sharing state over NATS
//! cache-router --epp 127.0.0.1:9002            # also Envoy's endpoint picker (deploy/envoy/)
//! curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hi"}]}'
//! ```

use std::path::{Path, PathBuf};

use clap::Parser;
use router_gateway::{Config, DEFAULT_CONFIG, Gateway};
use router_sim_engine::SimGateway;

/// mimalloc rather than glibc's malloc: a request is a few hundred small
/// allocations (JSON, headers, the chain), and glibc's arenas per thread
/// keep the peak of what each once held (see `pool.rs` in router-service).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(about = "Cache-aware OpenAI-compatible gateway (reference integration of cache-router)")]
struct Args {
    /// Configuration file (default: the bundled crates/gateway/gateway.toml,
    /// four simulated engines, with the tokenizer of the checkout this
    /// binary was built from).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve on this address instead of the file's `gateway.listen`.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Use this profile instead of the file's `gateway.profile`.
    #[arg(long)]
    profile: Option<String>,
    /// Start this many simulated engines instead of the file's count.
    #[arg(long)]
    engines: Option<usize>,
    /// Be one of several router replicas sharing their event log,
    /// snapshots, load and registrations through this NATS server
    /// (JetStream on), as a `[nats]` table does.
    #[arg(long)]
    nats: Option<String>,
    /// This replica's name with `--nats` (unique among the replicas).
    #[arg(long)]
    replica: Option<String>,
    /// Run this many replicas in this process, on consecutive ports, the
    /// first one's simulated engines shared by all (needs `--nats` or a
    /// `[nats]` table).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Also serve the router as an endpoint picker for Envoy (ext_proc
    /// gRPC, the Gateway API Inference Extension's protocol) on this
    /// address; Envoy's configuration is deploy/envoy/envoy.yaml.
    #[arg(long)]
    epp: Option<std::net::SocketAddr>,
}

fn load(args: &Args) -> Result<Config, router_gateway::Error> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::parse(
            DEFAULT_CONFIG,
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway"),
        )?,
    };
    if let Some(l) = args.listen {
        config.gateway.listen = l;
    }
    if let Some(p) = &args.profile {
        config.gateway.profile = p.clone();
    }
    if let (Some(n), Some(sim)) = (args.engines, config.simulated.as_mut()) {
        sim.engines = n;
    }
    if let Some(url) = &args.nats {
        let mut text = format!("url = {url:?}\n");
        if let Some(r) = &args.replica {
            text.push_str(&format!("replica = {r:?}\n"));
        }
        if config.simulated.is_some() {
            // Simulated engines are new on every run: a log of their own,
            // not the history of the last run's engines under the same names.
            text.push_str(&format!("prefix = \"sim-{}\"\n", std::process::id()));
        }
        let table = toml::from_str(&text).map_err(|e| router_gateway::Error::Config {
            line: 0,
            message: format!("--nats/--replica: {e}"),
        })?;
        config.nats = Some(table);
    }
    Ok(config)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // The libraries log through `tracing`: pods joining and leaving, skipped
    // event batches, replays, snapshots. `RUST_LOG` filters (default info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cache-router: {e}");
            std::process::exit(2);
        }
    };
    if args.replicas > 1 && config.nats.is_none() {
        eprintln!("cache-router: --replicas needs --nats (or a [nats] table) to share state");
        std::process::exit(2);
    }
    // Bound before the engines take ephemeral ports, as the gateway's own
    // address is (`SimGateway::start`): none of them can take it.
    let epp_listener = match args.epp {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some((addr, l)),
            Err(e) => {
                eprintln!("cache-router: cannot listen on {addr} for the endpoint picker: {e}");
                std::process::exit(1);
            }
        },
        None => None,
    };
    // Every replica's address too (consecutive ports), before the first
    // one's engines start.
    let mut listeners = Vec::new();
    for r in 0..args.replicas.max(1) {
        let mut c = config.clone();
        let port = config.gateway.listen.port();
        c.gateway
            .listen
            .set_port(if port == 0 { 0 } else { port + r as u16 });
        match Gateway::bind(&c).await {
            Ok(l) => listeners.push((c.gateway.listen, l)),
            Err(e) => {
                eprintln!("cache-router: {e}");
                std::process::exit(1);
            }
        }
    }
    let mut gateways = Vec::new();
    for (r, (listen, listener)) in listeners.into_iter().enumerate() {
        let mut c = config.clone();
        c.gateway.listen = listen;
        if r > 0 {
            // Further replicas route to the first one's engines.
            c.simulated = None;
            c.pods = gateways
                .first()
                .map(SimGateway::engine_pods)
                .unwrap_or_default();
        }
        if let Some(n) = c.nats.as_mut()
            && args.replicas > 1
        {
            let base = n.replica.clone().unwrap_or_else(|| "gw".into());
            n.replica = Some(format!("{base}-{r}"));
        }
        match SimGateway::serve(listener, c).await {
            Ok(g) => gateways.push(g),
            Err(e) => {
                eprintln!("cache-router: {e}");
                std::process::exit(1);
            }
        }
    }
    for gateway in &gateways {
        println!("cache-router gateway on {}", gateway.url());
    }
    for p in gateways[0].pods() {
        println!(
            "  pod {:<8} {} events {} replay {}",
            p.config.name,
            p.config.url,
            p.config.events.as_deref().unwrap_or("-"),
            p.config.replay.as_deref().unwrap_or("-")
        );
    }
    println!(
        "POST /v1/chat/completions, /v1/completions; GET /v1/models, /health, /metrics, /admin/pods"
    );
    if let Some((addr, listener)) = epp_listener {
        let epp = router_epp::Epp::new(
            gateways[0].router().clone(),
            router_epp::EppConfig::default(),
        );
        tokio::spawn(async move {
            if let Err(e) = epp.serve(listener, std::future::pending()).await {
                eprintln!("cache-router: the endpoint picker stopped: {e}");
            }
        });
        println!("endpoint picker (Envoy ext_proc) on {addr}");
    }
    let _ = tokio::signal::ctrl_c().await;
    println!("cache-router: stopping");
}
