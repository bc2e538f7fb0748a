//! One workload's setup and queries through one index, for counting
//! instructions under callgrind, which a shared, noisy machine cannot
//! disturb (`scripts/instructions.sh` runs it).
//!
//! ```sh
//! cargo run --release -p router-bench --features peers --bin cost -- \
//!     [--subject router-index|kv-index] [--n 1024 --k 64 --chains 8 | --w1 | --w3 | --w4] --queries 1000 \
//!     [--capacity BLOCKS]
//! ```
//!
//! Instructions per query are the difference of two runs that differ
//! only in the number of queries (the setup, the same in both, cancels);
//! instructions per stored block come from the setup alone. `--w3`
//! replays the bundled trace as `compare`'s W3 does (its events between
//! its queries, `--queries` ignored): count it with callgrind's
//! `--toggle-collect` on the query call. `--w4` runs W4's writer alone:
//! W1's state, then `--queries` of its events (no queries). `--capacity`
//! gives router-index a capacity hint (`IndexConfig::capacity`). The times it
//! prints are of a hot loop (few chains, all in cache) and are only a
//! sanity check: `compare` measures cold latency.

use std::time::Instant;

use router_bench::subject::{Ours, Subject};
use router_bench::workload::{self, Op, Workload};
use router_index::IndexConfig;

struct Args {
    subject: String,
    w1: bool,
    w3: bool,
    w4: bool,
    n: usize,
    k: usize,
    chains: usize,
    queries: usize,
    capacity: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        subject: "router-index".into(),
        w1: false,
        w3: false,
        w4: false,
        n: 1024,
        k: 64,
        chains: 8,
        queries: 1000,
        capacity: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--w1" || flag == "--w3" || flag == "--w4" {
            a.w1 |= flag == "--w1";
            a.w3 |= flag == "--w3";
            a.w4 |= flag == "--w4";
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || value.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--subject" => a.subject = value.clone(),
            "--n" => a.n = num()?.max(1),
            "--k" => a.k = num()?.max(1),
            "--chains" => a.chains = num()?.max(1),
            "--queries" => a.queries = num()?,
            "--capacity" => a.capacity = num()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn subject(name: &str, pods: usize, capacity: usize) -> Result<Box<dyn Subject>, String> {
    match name {
        "router-index" => Ok(Box::new(Ours::with_config(
            pods,
            IndexConfig::default().capacity(capacity),
        ))),
        #[cfg(feature = "peers")]
        "kv-index" => Ok(Box::new(router_bench::subject::KvIndex::new(pods))),
        other => Err(format!(
            "unknown subject {other} (router-index, or kv-index with --features peers)"
        )),
    }
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cost: {e}");
            std::process::exit(2);
        }
    };
    let w: Workload = if args.w4 {
        // W4's writer alone: W1's state, then `--queries` writer events.
        let mut w = workload::w1(1, 0);
        let mut rng = workload::Rng::new(9);
        w.run = (0..args.queries)
            .map(|_| workload::w4_event(&w, &mut rng))
            .collect();
        w.name = "W4's writer events".into();
        w
    } else if args.w1 {
        workload::w1(1, args.queries)
    } else if args.w3 {
        let path = workload::TRACE_PATH;
        match std::fs::read_to_string(path) {
            Ok(text) => workload::w3(&workload::read_trace(&text).0, 8, 4096),
            Err(e) => {
                eprintln!("cost: cannot read {path}: {e}");
                std::process::exit(2);
            }
        }
    } else {
        workload::w2(1, args.n, args.k, args.chains, args.queries)
    };
    let s = match subject(&args.subject, w.pods, args.capacity) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cost: {e}");
            std::process::exit(2);
        }
    };
    let t = Instant::now();
    let mut blocks = 0usize;
    for op in &w.setup {
        if let Op::Store {
            pod,
            chain,
            from,
            to,
        } = op
        {
            s.store(
                *pod,
                &w.chains[*chain as usize],
                *from as usize,
                *to as usize,
            );
            blocks += (*to - *from) as usize;
        }
    }
    s.flush();
    let setup = t.elapsed();
    let mut out = Vec::new();
    let (mut queries, mut found) = (0usize, 0usize);
    let t = Instant::now();
    for op in &w.run {
        match op {
            Op::Query { chain } => {
                out.clear();
                s.query(&w.chains[*chain as usize], &mut out);
                found += out.len();
                queries += 1;
            }
            event => {
                workload::apply(&*s, &w, event);
            }
        }
    }
    let run = t.elapsed();
    let setup = if blocks > 0 {
        format!(
            "{blocks} blocks stored in the setup ({:.0} ns each)",
            setup.as_nanos() as f64 / blocks as f64
        )
    } else {
        "no setup".to_string()
    };
    // W3's run interleaves its events with its queries: the time per query
    // then includes them.
    let events = w.run.len() - queries;
    if queries == 0 && events == 0 {
        println!("{} on {}: {setup}; nothing run", args.subject, w.name);
        return;
    }
    if queries == 0 {
        println!(
            "{} on {}: {setup}; {events} events run ({:.0} ns per event)",
            args.subject,
            w.name,
            run.as_nanos() as f64 / events.max(1) as f64,
        );
        return;
    }
    println!(
        "{} on {}: {setup}; {queries} queries and {events} events run ({:.0} ns per query, events included; {found} pods found)",
        args.subject,
        w.name,
        run.as_nanos() as f64 / queries.max(1) as f64,
    );
}
