//! `--capacity-sweep`: every policy at several GPU capacities, from starved
//! to generous, as one table and one chart (pooled share and TTFT p99
//! against capacity, one line per policy).

use std::fmt::Write as _;
use std::sync::Mutex;

use router_sim::{ClusterConfig, Report, Request, Simulation, bounds};

use super::{Args, COLORS};

/// Maps a report to its height in a panel, 0 (bottom) to 1 (top).
type Axis<'a> = dyn Fn(&Report) -> f64 + 'a;

/// One policy at one capacity.
struct Point {
    capacity: usize,
    policy: usize,
    report: Report,
}

pub(super) fn run(
    args: &Args,
    trace: &[Request],
    base: &ClusterConfig,
    list: &[router_sim::Policy],
) -> Result<(), String> {
    let caps = &args.capacity_sweep;
    if caps.contains(&0) {
        return Err("--capacity-sweep capacities must be positive".into());
    }
    println!(
        "trace: {} requests; cluster: {} pods; capacity sweep over {:?} blocks per pod",
        trace.len(),
        base.pods,
        caps
    );
    let jobs: Vec<(usize, usize)> = caps
        .iter()
        .flat_map(|&c| (0..list.len()).map(move |p| (c, p)))
        .collect();
    let next = Mutex::new(0usize);
    let points = Mutex::new(Vec::new());
    // One simulation per core at a time: each is single-threaded.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let job = {
                        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                        let j = jobs.get(*n).copied();
                        *n += 1;
                        j
                    };
                    let Some((capacity, policy)) = job else {
                        return;
                    };
                    let mut cfg = base.clone();
                    cfg.gpu_blocks = capacity;
                    let (pooled, _) = bounds(trace, &cfg);
                    let mut sim = Simulation::new(trace, &cfg, &list[policy]);
                    let mut report = sim.run(&list[policy].name, |_| {});
                    report.pooled_share = if pooled > 0.0 {
                        report.block_hit_rate / pooled
                    } else {
                        0.0
                    };
                    points
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Point {
                            capacity,
                            policy,
                            report,
                        });
                }
            });
        }
    });
    let mut points = points.into_inner().unwrap_or_else(|e| e.into_inner());
    points.sort_by_key(|p| (p.capacity, p.policy));
    let at = |c: usize, p: usize| {
        points
            .iter()
            .find(|x| x.capacity == c && x.policy == p)
            .map(|x| &x.report)
    };
    for (title, value) in [
        ("pooled share, %", 0usize),
        ("TTFT p50, ms", 1),
        ("TTFT p99, ms", 2),
        ("predicted exact, %", 3),
    ] {
        print!("\n{title:<18}");
        for c in caps {
            print!(" {c:>8}");
        }
        println!();
        for (p, policy) in list.iter().enumerate() {
            print!("{:<18}", policy.name);
            for &c in caps {
                let r = at(c, p).ok_or("a sweep point is missing")?;
                match value {
                    0 => print!(" {:>8.1}", r.pooled_share * 100.0),
                    1 => print!(" {:>8.0}", r.ttft_p50_ms),
                    3 => print!(" {:>8.1}", r.predicted_exact * 100.0),
                    _ => print!(" {:>8.0}", r.ttft_p99_ms),
                }
            }
            println!();
        }
    }
    for r in points
        .iter()
        .map(|p| &p.report)
        .filter(|r| r.unfinished > 0)
    {
        println!("! {}: {} requests never finished", r.policy, r.unfinished);
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let mut csv = String::from(
        "capacity_blocks,policy,block_hit_rate,pooled_share,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,e2e_p50_ms,predicted_exact,rejected\n",
    );
    for p in &points {
        let r = &p.report;
        let _ = writeln!(
            csv,
            "{},{},{:.6},{:.6},{:.3},{:.3},{:.3},{:.3},{:.6},{}",
            p.capacity,
            r.policy,
            r.block_hit_rate,
            r.pooled_share,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.e2e_p50_ms,
            r.predicted_exact,
            r.rejected
        );
    }
    let write = |name: &str, body: String| {
        let path = args.out.join(name);
        std::fs::write(&path, body).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("sweep.csv", csv)?;
    write("sweep.svg", svg(caps, list, &points))?;
    println!("\nwrote {}/sweep.csv, sweep.svg", args.out.display());
    Ok(())
}

/// Two panels: pooled share (linear) and TTFT p99 (log) against capacity
/// (log2), one line per policy.
fn svg(caps: &[usize], list: &[router_sim::Policy], points: &[Point]) -> String {
    let (w, h) = (1000.0, 420.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let (lo_c, hi_c) = caps.iter().fold((f64::MAX, 0f64), |(lo, hi), &c| {
        let l = (c as f64).log2();
        (lo.min(l), hi.max(l))
    });
    let span_c = (hi_c - lo_c).max(1.0);
    let p99: Vec<f64> = points
        .iter()
        .map(|p| p.report.ttft_p99_ms.max(1.0))
        .collect();
    let (lo_t, hi_t) = (
        p99.iter().copied().fold(f64::MAX, f64::min).log10().floor(),
        p99.iter().copied().fold(1.0, f64::max).log10().ceil(),
    );
    let span_t = (hi_t - lo_t).max(1.0);
    let panels: [(&str, f64, Box<Axis>); 2] = [
        (
            "Share of the pooled-cache bound vs capacity",
            60.0,
            Box::new(|r: &Report| r.pooled_share.min(1.1) / 1.1),
        ),
        (
            "TTFT p99 (log) vs capacity",
            560.0,
            Box::new(move |r: &Report| (r.ttft_p99_ms.max(1.0).log10() - lo_t) / span_t),
        ),
    ];
    let (y0, pw, ph) = (40.0, 380.0, 320.0);
    for (title, x0, value) in &panels {
        let x0 = *x0;
        let _ = write!(
            s,
            r##"<text x="{}" y="24" font-size="14" text-anchor="middle">{title}</text><rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##,
            x0 + pw / 2.0
        );
        let xs = |c: usize| x0 + ((c as f64).log2() - lo_c) / span_c * pw;
        for &c in caps {
            let x = xs(c);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{c}</text>"##,
                y0 + ph,
                y0 + ph + 16.0
            );
        }
        for (i, policy) in list.iter().enumerate() {
            let pts: Vec<String> = points
                .iter()
                .filter(|p| p.policy == i)
                .map(|p| {
                    format!(
                        "{:.1},{:.1}",
                        xs(p.capacity),
                        y0 + ph - value(&p.report).clamp(0.0, 1.0) * ph
                    )
                })
                .collect();
            let c = COLORS[i % COLORS.len()];
            let dash = if i >= COLORS.len() {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"#,
                pts.join(" ")
            );
            if x0 < 100.0 {
                let _ = write!(
                    s,
                    r#"<rect x="{}" y="{}" width="10" height="10" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
                    x0 + pw - 150.0,
                    y0 + ph - 20.0 - 16.0 * (list.len() - i) as f64,
                    x0 + pw - 136.0,
                    y0 + ph - 11.0 - 16.0 * (list.len() - i) as f64,
                    policy.name
                );
            }
        }
    }
    let _ = write!(
        s,
        r#"<text x="500" y="400" text-anchor="middle">GPU cache per pod, blocks (log scale)</text>"#
    );
    for k in 0..=(span_t as i32) {
        let v = 10f64.powi(lo_t as i32 + k);
        let y = y0 + ph - f64::from(k) / span_t * ph;
        let _ = write!(
            s,
            r#"<text x="554" y="{:.1}" text-anchor="end">{}</text>"#,
            y + 4.0,
            if v >= 1000.0 {
                format!("{}s", v / 1000.0)
            } else {
                format!("{v}ms")
            }
        );
    }
    for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = y0 + ph - q / 1.1 * ph;
        let _ = write!(
            s,
            r#"<text x="54" y="{:.1}" text-anchor="end">{:.0}%</text>"#,
            y + 4.0,
            q * 100.0
        );
    }
    s.push_str("</svg>\n");
    s
}
