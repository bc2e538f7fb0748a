//! The main job: replay a request trace through a simulated cluster under
//! each routing policy and compare them.
//!
//! ```sh
//! cargo run --release --example replay                  # bundled Mooncake trace, 8 pods
//! cargo run --release --example replay -- --help        # flags
//! ```
//!
//! Prints one row per policy (hit rates, share of the pooled-cache bound,
//! modelled TTFT and end-to-end latency, load balance, the router's own
//! decision time) and writes `replay.csv`, `replay.json` and `replay.svg`
//! (TTFT distribution and hit rate per policy) to `--out`.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;

mod sweep;
use indicatif::{ProgressBar, ProgressStyle};
use router_sim::{
    ClusterConfig, CostModel, Report, Request, Simulation, SyntheticParams, bounds, parse_mooncake,
    policies, synthetic,
};

/// The public Mooncake trace (Apache-2.0, licence beside it), in the
/// binary: a binary moved or installed elsewhere keeps its default.
const BUNDLED_TRACE: &str = include_str!("../../assets/traces/synthetic_trace.jsonl");

#[derive(Parser, Debug)]
#[command(about = "Replay a trace through a simulated cluster under each routing policy")]
pub(crate) struct Args {
    /// Mooncake-format trace (JSON lines); `bundled` is the public Mooncake
    /// trace compiled into the binary (assets/traces/synthetic_trace.jsonl),
    /// `synthetic` generates one instead.
    #[arg(long, default_value = "bundled")]
    trace: String,
    /// Pods in the cluster.
    #[arg(long, default_value_t = 8)]
    pods: usize,
    /// GPU prefix-cache capacity per pod, in blocks.
    #[arg(long, default_value_t = 2048)]
    capacity: usize,
    /// CPU cache tier per pod, in blocks (0: none).
    #[arg(long, default_value_t = 0)]
    cpu_capacity: usize,
    /// Policies to compare (comma separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round-robin,least-requests,consistent-hash,session-affinity,dynamo,smg-cache-aware,llm-d,cache-aware-approx,cache-aware"
    )]
    policies: Vec<String>,
    /// Also compare every profile of this TOML config file.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Arrival-rate multiplier (2: the trace's requests arrive twice as
    /// fast). At 1, round robin keeps the default cluster about 75% busy.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Delay of cache events to the router's index, ms.
    #[arg(long, default_value_t = 5.0)]
    event_delay_ms: f64,
    /// Replay in request order without timing (cache effects only).
    #[arg(long)]
    request_order: bool,
    /// Router replicas, requests alternated between them; each has its own
    /// profile and its own view of load (the index is fed by the same
    /// events).
    #[arg(long, default_value_t = 1)]
    routers: usize,
    /// With `--routers`: how long one router's load and registrations take
    /// to reach the others, ms (negative: never shared).
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    share_delay_ms: f64,
    /// Run every policy at each of these GPU capacities (blocks per pod,
    /// comma separated; e.g. `256,512,1024,2048,4096`) and chart pooled
    /// share and TTFT against capacity (`sweep.csv`, `sweep.svg`) instead
    /// of one capacity's table.
    #[arg(long, value_delimiter = ',')]
    capacity_sweep: Vec<usize>,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Synthetic trace size (with `--trace synthetic`).
    #[arg(long, default_value_t = 4000)]
    synthetic_requests: usize,
    /// Where to write replay.csv, replay.json and replay.svg.
    #[arg(long, default_value = "target/replay")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn load(args: &Args) -> Result<Vec<Request>, String> {
    if args.trace == "synthetic" {
        let mut p = SyntheticParams::default();
        p.requests = args.synthetic_requests;
        return Ok(synthetic(&p, args.seed));
    }
    if args.trace == "bundled" {
        return parse_mooncake(BUNDLED_TRACE).map_err(|e| format!("the bundled trace: {e}"));
    }
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("cannot read {}: {e}", args.trace))?;
    parse_mooncake(&text).map_err(|e| format!("{}: {e}", args.trace))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let trace = load(args)?;
    if args.pods == 0 || args.pods > 256 {
        return Err("--pods must be 1 to 256".into());
    }
    let mut cfg = ClusterConfig::default();
    cfg.pods = args.pods;
    cfg.gpu_blocks = args.capacity;
    cfg.cpu_blocks = args.cpu_capacity;
    cfg.speedup = args.speedup;
    cfg.event_delay_ms = args.event_delay_ms;
    cfg.request_order = args.request_order;
    if args.routers == 0 || args.routers > 64 {
        return Err("--routers must be 1 to 64".into());
    }
    cfg.routers = args.routers;
    cfg.share_delay_ms = args.share_delay_ms;
    cfg.model = CostModel::default();
    let mut list = Vec::new();
    for name in &args.policies {
        list.push(policies::builtin(name).ok_or_else(|| {
            format!(
                "unknown policy `{name}` (known: {})",
                policies::NAMES.join(", ")
            )
        })?);
    }
    if let Some(path) = &args.profile {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        list.extend(policies::from_config(&text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    if !args.capacity_sweep.is_empty() {
        return sweep::run(args, &trace, &cfg, &list);
    }
    let (pooled, infinite) = bounds(&trace, &cfg);
    println!(
        "trace: {} requests, {} blocks; cluster: {} pods x {} blocks{}; {}",
        trace.len(),
        trace.iter().map(|r| r.blocks.len()).sum::<usize>(),
        cfg.pods,
        cfg.gpu_blocks,
        if cfg.cpu_blocks > 0 {
            format!(" + {} CPU blocks", cfg.cpu_blocks)
        } else {
            String::new()
        },
        if cfg.request_order {
            "request order, no timing".to_owned()
        } else {
            format!("arrivals x{}", cfg.speedup)
        },
    );
    println!(
        "bounds: pooled cache (one cache of the whole cluster's capacity) {:.1}% of blocks; infinite cache {:.1}%",
        pooled * 100.0,
        infinite * 100.0
    );
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new((trace.len() * list.len()) as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {msg}")
            .map_err(|e| e.to_string())?,
    );
    let mut reports = Vec::new();
    for (i, policy) in list.iter().enumerate() {
        bar.set_message(policy.name.clone());
        let base = (i * trace.len()) as u64;
        let mut sim = Simulation::new(&trace, &cfg, policy);
        let mut r = sim.run(&policy.name, |done| bar.set_position(base + done as u64));
        r.pooled_share = if pooled > 0.0 {
            r.block_hit_rate / pooled
        } else {
            0.0
        };
        reports.push(r);
    }
    bar.finish_and_clear();
    print_table(&reports);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let write = |name: &str, body: String| {
        let path = args.out.join(name);
        std::fs::write(&path, body).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("replay.csv", csv(&reports))?;
    let json = serde_json::json!({
        "requests": trace.len(), "pods": cfg.pods, "capacity_blocks": cfg.gpu_blocks,
        "speedup": cfg.speedup, "request_order": cfg.request_order,
        "pooled_hit_rate": pooled, "infinite_hit_rate": infinite, "policies": reports,
    });
    write(
        "replay.json",
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
    )?;
    write("replay.svg", svg(&reports, pooled, infinite))?;
    println!(
        "\nwrote {}/replay.csv, replay.json, replay.svg",
        args.out.display()
    );
    Ok(())
}

/// The busiest pod's share of the requests over the mean share, and
/// whether one pod took more than half of them (a collapsed policy).
fn request_spread(r: &Report) -> (f64, bool) {
    let total: usize = r.requests_per_pod.iter().sum();
    let max = r.requests_per_pod.iter().copied().max().unwrap_or(0);
    let mean = total as f64 / r.requests_per_pod.len().max(1) as f64;
    (
        max as f64 / mean.max(1e-9),
        2 * max > total && r.requests_per_pod.len() > 1,
    )
}

fn print_table(reports: &[Report]) {
    println!(
        "\n{:<18} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>6} {:>9}",
        "policy",
        "hit blk",
        "hit tok",
        "pooled",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "E2E p50",
        "busiest",
        "cv",
        "requests",
        "util",
        "decide"
    );
    println!(
        "{:<18} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>6} {:>9}",
        "", "%", "%", "%", "ms", "ms", "ms", "ms", "x mean", "busy", "max/mean", "%", "us"
    );
    let mut collapsed = Vec::new();
    for r in reports {
        let (spread, flag) = request_spread(r);
        if flag {
            collapsed.push(r.policy.as_str());
        }
        println!(
            "{:<18} {:>7.1} {:>7.1} {:>7.1} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>8.2} {:>6.2} {:>7.2}{} {:>6.0} {:>9.2}",
            r.policy,
            r.block_hit_rate * 100.0,
            r.token_hit_rate * 100.0,
            r.pooled_share * 100.0,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.e2e_p50_ms,
            r.busiest_over_mean,
            r.busy_cv,
            spread,
            if flag { "!" } else { " " },
            r.utilisation * 100.0,
            r.decision_us_mean
        );
    }
    if !collapsed.is_empty() {
        println!(
            "! one pod took more than half of the requests: {}",
            collapsed.join(", ")
        );
    }
    if let Some(r) = reports.iter().find(|r| r.rejected > 0) {
        println!(
            "{} requests refused by every pod (longer than a pod's whole GPU cache), in no latency",
            r.rejected
        );
    }
    for r in reports.iter().filter(|r| r.unfinished > 0) {
        println!("! {}: {} requests never finished", r.policy, r.unfinished);
    }
}

fn csv(reports: &[Report]) -> String {
    let mut s = String::from(
        "policy,requests,block_hit_rate,token_hit_rate,pooled_share,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,e2e_p50_ms,e2e_p99_ms,busiest_over_mean,busy_cv,utilisation,decision_us_mean,decision_us_p99\n",
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{},{},{:.4},{:.4},{:.4},{:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{:.3},{:.3},{:.3},{:.3}",
            r.policy,
            r.requests,
            r.block_hit_rate,
            r.token_hit_rate,
            r.pooled_share,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.e2e_p50_ms,
            r.e2e_p99_ms,
            r.busiest_over_mean,
            r.busy_cv,
            r.utilisation,
            r.decision_us_mean,
            r.decision_us_p99
        );
    }
    s
}

pub(crate) const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

/// Two panels, hand-written SVG: TTFT CDF per policy (log time axis) and
/// block hit rate per policy against the two bounds.
fn svg(reports: &[Report], pooled: f64, infinite: f64) -> String {
    let (w, h) = (1000.0, 420.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    // Left: TTFT CDF.
    let (x0, y0, pw, ph) = (60.0, 40.0, 520.0, 320.0);
    let _ = write!(
        s,
        r#"<text x="{}" y="24" font-size="14" text-anchor="middle">Modelled time to first token (CDF)</text>"#,
        x0 + pw / 2.0
    );
    let max_ms = reports
        .iter()
        .filter_map(|r| r.ttft_sorted_ms.last().copied())
        .fold(10.0, f64::max);
    let (lo, hi) = (1.0f64.log10(), max_ms.log10().ceil().max(1.0));
    let xs = |ms: f64| x0 + (ms.max(1.0).log10() - lo) / (hi - lo) * pw;
    let ys = |q: f64| y0 + ph - q * ph;
    let _ = write!(
        s,
        r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    let mut decade = 1.0;
    while decade <= 10f64.powf(hi) {
        let x = xs(decade);
        let _ = write!(
            s,
            r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + ph,
            y0 + ph + 16.0,
            if decade >= 1000.0 {
                format!("{}s", decade / 1000.0)
            } else {
                format!("{decade}ms")
            }
        );
        decade *= 10.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let y = ys(q);
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{q}</text>"##,
            x0 + pw,
            x0 - 6.0,
            y + 4.0
        );
    }
    for (i, r) in reports.iter().enumerate() {
        let n = r.ttft_sorted_ms.len().max(1);
        let step = (n / 400).max(1);
        let pts: Vec<String> = r
            .ttft_sorted_ms
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k == n - 1)
            .map(|(k, ms)| format!("{:.1},{:.1}", xs(*ms), ys((k + 1) as f64 / n as f64)))
            .collect();
        let c = COLORS[i % COLORS.len()];
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            x0 + 10.0,
            y0 + 10.0 + 16.0 * i as f64,
            x0 + 24.0,
            y0 + 19.0 + 16.0 * i as f64,
            r.policy
        );
    }
    // Right: hit rate bars.
    let (bx, by, bw, bh) = (640.0, 40.0, 320.0, 320.0);
    let _ = write!(
        s,
        r#"<text x="{}" y="24" font-size="14" text-anchor="middle">Prefix-cache hit rate (blocks)</text>"#,
        bx + bw / 2.0
    );
    let _ = write!(
        s,
        r##"<rect x="{bx}" y="{by}" width="{bw}" height="{bh}" fill="none" stroke="#888"/>"##
    );
    let top = infinite.max(0.01) * 1.1;
    let yb = |v: f64| by + bh - v / top * bh;
    for (label, v, dash) in [("pooled", pooled, "6,4"), ("infinite", infinite, "2,3")] {
        let y = yb(v);
        let _ = write!(
            s,
            r##"<line x1="{bx}" y1="{y}" x2="{}" y2="{y}" stroke="#333" stroke-dasharray="{dash}"/><text x="{}" y="{}" text-anchor="end">{label} {:.0}%</text>"##,
            bx + bw,
            bx + bw - 4.0,
            y - 4.0,
            v * 100.0
        );
    }
    let slot = bw / reports.len().max(1) as f64;
    for (i, r) in reports.iter().enumerate() {
        let x = bx + slot * i as f64 + slot * 0.15;
        let y = yb(r.block_hit_rate);
        let c = COLORS[i % COLORS.len()];
        let _ = write!(
            s,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{c}"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{:.0}%</text>"#,
            slot * 0.7,
            by + bh - y,
            x + slot * 0.35,
            y - 4.0,
            r.block_hit_rate * 100.0
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" transform="rotate(-30 {:.1} {:.1})">{}</text>"#,
            x + slot * 0.5,
            by + bh + 14.0,
            x + slot * 0.5,
            by + bh + 14.0,
            r.policy
        );
    }
    s.push_str("</svg>\n");
    s
}
