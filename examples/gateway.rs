//! The reference gateway: an OpenAI-compatible router in front of vLLM
//! engines, or in front of simulated ones it starts itself.
//!
//! ```text
//! cargo run --release --example gateway                      # 4 simulated engines on 127.0.0.1:8000
//! cargo run --release --example gateway -- --config my.toml  # your engines (see the README)
//! curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hi"}]}'
//! ```

use std::path::{Path, PathBuf};

use clap::Parser;
use router_gateway::{Config, DEFAULT_CONFIG, Gateway};

#[derive(Parser, Debug)]
#[command(about = "Cache-aware OpenAI-compatible gateway (reference integration of cache-router)")]
struct Args {
    /// Configuration file (default: the bundled crates/gateway/gateway.toml,
    /// four simulated engines).
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
}

fn load(args: &Args) -> Result<Config, router_gateway::Error> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::parse(
            DEFAULT_CONFIG,
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/gateway"),
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
    Ok(config)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let config = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gateway: {e}");
            std::process::exit(2);
        }
    };
    let gateway = match Gateway::start(config).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gateway: {e}");
            std::process::exit(1);
        }
    };
    println!("cache-router gateway on {}", gateway.url());
    for p in gateway.pods() {
        println!(
            "  pod {:<8} {} events {}",
            p.config.name,
            p.config.url,
            p.config.events.as_deref().unwrap_or("-")
        );
    }
    println!(
        "POST /v1/chat/completions, /v1/completions; GET /v1/models, /health, /metrics, /admin/pods"
    );
    let _ = tokio::signal::ctrl_c().await;
    println!("gateway: stopping");
}
