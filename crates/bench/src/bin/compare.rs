//! Side-by-side comparison of router-index and the peer indexes.
//!
//! ```sh
//! cargo run --release -p router-bench --features peers --bin compare -- [--quick] [--loaded] [--only W1,W2,W3,W4]
//! ```
//!
//! Every subject runs the same seeded workloads, each workload in a fresh
//! process of its own (this binary again, with `--child`), so no subject
//! inherits another's heap, page faults or caches: in one shared process
//! the subject run first paid the page faults of every later one's memory
//! (W1's stores ran up to 1.3x faster for the same index run last).
//! Sampled query answers are compared across subjects. Memory is what a
//! counting global allocator saw the index keep: after the setup (W1, W2),
//! and after the run's stores and evictions (W3, over the (block, pod)
//! pairs left). Without the `peers` feature only router-index runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use router_bench::quantile_us;
use router_bench::subject::{Ours, Subject};
use router_bench::workload::{self, Op, Rng, Workload};
use serde_json::{Value, json};

/// Counts live heap bytes, to measure each index's memory.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments,
// which uphold `GlobalAlloc`'s contract; the counter has no effect on the
// memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type Factory = fn(usize) -> Box<dyn Subject>;

fn subjects() -> Vec<(&'static str, Factory)> {
    #[allow(unused_mut)] // only the `peers` feature adds to it
    let mut v: Vec<(&'static str, Factory)> = vec![("router-index", |p| Box::new(Ours::new(p)))];
    #[cfg(feature = "peers")]
    {
        use router_bench::subject::{Dynamo, KvIndex};
        v.push(("kv-index ChainIndex", |p| Box::new(KvIndex::new(p))));
        v.push(("Dynamo CRTC", |p| Box::new(Dynamo::new(p))));
    }
    v
}

/// What one subject did on one workload.
#[derive(Default)]
struct Outcome {
    name: String,
    /// The workload's table title, as the child process built it.
    title: String,
    query_ns: Vec<u64>,
    setup_blocks: u64,
    setup_events: u64,
    setup_secs: f64,
    run_events: u64,
    run_blocks: u64,
    run_secs: f64,
    bytes: i64,
    residencies: u64,
    /// Live bytes once the run's events are applied (the harness's own
    /// buffers taken out), and the (block, pod) pairs held then: W3 only.
    end_bytes: i64,
    end_residencies: u64,
    answers: Vec<Vec<(u32, u32)>>,
    /// Probes per query, for subjects that count them.
    probes: Option<f64>,
    /// W4: the writer's events per second.
    writer_rate: f64,
}

impl Outcome {
    /// The outcome as one line of JSON, from a child process.
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "title": self.title,
            "query_ns": self.query_ns,
            "setup_blocks": self.setup_blocks,
            "setup_events": self.setup_events,
            "setup_secs": self.setup_secs,
            "run_events": self.run_events,
            "run_blocks": self.run_blocks,
            "run_secs": self.run_secs,
            "bytes": self.bytes,
            "residencies": self.residencies,
            "end_bytes": self.end_bytes,
            "end_residencies": self.end_residencies,
            "answers": self.answers,
            "probes": self.probes,
            "writer_rate": self.writer_rate,
        })
    }

    /// Reads what [`Outcome::to_json`] wrote.
    fn from_json(v: &Value) -> Option<Outcome> {
        let u = |k: &str| v.get(k).and_then(Value::as_u64);
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        Some(Outcome {
            name: v.get("name")?.as_str()?.to_owned(),
            title: v.get("title")?.as_str()?.to_owned(),
            query_ns: serde_json::from_value(v.get("query_ns")?.clone()).ok()?,
            setup_blocks: u("setup_blocks")?,
            setup_events: u("setup_events")?,
            setup_secs: f("setup_secs")?,
            run_events: u("run_events")?,
            run_blocks: u("run_blocks")?,
            run_secs: f("run_secs")?,
            bytes: v.get("bytes")?.as_i64()?,
            residencies: u("residencies")?,
            end_bytes: v.get("end_bytes")?.as_i64()?,
            end_residencies: u("end_residencies")?,
            answers: serde_json::from_value(v.get("answers")?.clone()).ok()?,
            probes: f("probes"),
            writer_rate: f("writer_rate")?,
        })
    }
}

/// The prefix of the child's one line of output.
const OUTCOME: &str = "OUTCOME ";

/// Runs `workload` once per subject, each in a fresh process (this binary
/// with `--child`), and collects the outcomes in subject order.
fn isolated(workload: &str, quick: bool) -> Vec<Outcome> {
    let exe = std::env::current_exe().expect("the path of this binary");
    (0..subjects().len())
        .map(|i| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--child", workload, &i.to_string()]);
            if quick {
                cmd.arg("--quick");
            }
            let out = cmd.output().expect("a child process of compare");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().find_map(|l| l.strip_prefix(OUTCOME));
            match line
                .and_then(|l| serde_json::from_str(l).ok())
                .as_ref()
                .and_then(Outcome::from_json)
            {
                Some(o) => o,
                None => {
                    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
                    panic!(
                        "{workload}: subject {i}'s process gave no outcome ({})",
                        out.status
                    );
                }
            }
        })
        .collect()
}

/// In a child process: runs one subject on one workload and prints its
/// outcome.
fn child(workload: &str, subject: usize, quick: bool) {
    let Some(&(_, make)) = subjects().get(subject) else {
        eprintln!("no subject {subject} (0 to {})", subjects().len() - 1);
        std::process::exit(2);
    };
    let (w, sample, title) = if workload == "W1" {
        let w = workload::w1(1, if quick { 4_000 } else { 40_000 });
        (w, 16, None)
    } else if workload == "W3" {
        let (w, bad) = match w3_workload(quick) {
            Ok(wb) => wb,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        };
        let title = format!("{} ({bad} unreadable lines)", w.name);
        (w, 8, Some(title))
    } else if workload == "W4" {
        let w = Arc::new(workload::w1(4, if quick { 4_000 } else { 40_000 }));
        let o = w4_one(&w, make, quick);
        println!("{OUTCOME}{}", o.to_json());
        return;
    } else if let Some((n, k)) = workload
        .strip_prefix("W2:")
        .and_then(|nk| nk.split_once(':'))
        .and_then(|(n, k)| Some((n.parse::<usize>().ok()?, k.parse::<usize>().ok()?)))
    {
        // About 2^17 blocks per workload, whatever the chain length: far
        // more state than the caches hold, for every subject.
        let chains = ((1usize << 17) / n).max(1);
        let w = workload::w2(2, n, k, chains, if quick { 300 } else { 3_000 });
        (w, 50, None)
    } else {
        eprintln!("unknown workload {workload} (W1, W2:<n>:<k>, W3 or W4)");
        std::process::exit(2);
    };
    let mut o = run(&w, make, sample);
    o.title = title.unwrap_or_else(|| w.name.clone());
    println!("{OUTCOME}{}", o.to_json());
}

/// Runs a workload: setup (timed as a whole), then the run phase with every
/// query timed alone. Answers of every `sample`-th query are kept.
fn run(w: &Workload, make: Factory, sample: usize) -> Outcome {
    let before = LIVE.load(Ordering::Relaxed) as i64;
    let s = make(w.pods);
    let mut o = Outcome {
        name: s.name().to_owned(),
        ..Outcome::default()
    };
    let t = Instant::now();
    for op in &w.setup {
        apply(&*s, w, op, &mut o.setup_blocks);
        o.setup_events += 1;
    }
    s.flush();
    o.setup_secs = t.elapsed().as_secs_f64();
    o.bytes = LIVE.load(Ordering::Relaxed) as i64 - before;
    o.residencies = o.setup_blocks;
    let mut out = Vec::new();
    let t = Instant::now();
    let mut queries = 0usize;
    let mut pending = false;
    let probes_before = s.probes();
    for op in &w.run {
        match op {
            Op::Query { chain } => {
                if pending {
                    s.flush(); // asynchronous indexes answer on applied state
                    pending = false;
                }
                out.clear();
                let c = &w.chains[*chain as usize];
                let q = Instant::now();
                s.query(c, &mut out);
                o.query_ns.push(q.elapsed().as_nanos() as u64);
                if queries % sample == 0 {
                    let mut a = out.clone();
                    a.sort_unstable();
                    o.answers.push(a);
                }
                queries += 1;
            }
            _ => {
                apply(&*s, w, op, &mut o.run_blocks);
                o.run_events += 1;
                pending = true;
            }
        }
    }
    s.flush();
    o.run_secs = t.elapsed().as_secs_f64();
    if let Some(r) = w.end_residencies {
        // The harness's allocations since `before`, counted exactly (the
        // allocator counts requested sizes): what is left is the index's.
        let harness = o.name.capacity()
            + o.query_ns.capacity() * std::mem::size_of::<u64>()
            + o.answers.capacity() * std::mem::size_of::<Vec<(u32, u32)>>()
            + o.answers
                .iter()
                .map(|a| a.capacity() * std::mem::size_of::<(u32, u32)>())
                .sum::<usize>()
            + out.capacity() * std::mem::size_of::<(u32, u32)>();
        o.end_bytes = LIVE.load(Ordering::Relaxed) as i64 - before - harness as i64;
        o.end_residencies = r;
    }
    if let (Some(a), Some(b)) = (probes_before, s.probes()) {
        o.probes = Some((b - a) as f64 / queries.max(1) as f64);
    }
    o.query_ns.sort_unstable();
    drop(s);
    o
}

fn apply(s: &dyn Subject, w: &Workload, op: &Op, blocks: &mut u64) {
    *blocks += workload::apply(s, w, op);
}

/// How many sampled answers differ from the first subject's.
fn disagreements(outcomes: &[Outcome]) -> Vec<usize> {
    let base = &outcomes[0].answers;
    outcomes
        .iter()
        .map(|o| o.answers.iter().zip(base).filter(|(a, b)| a != b).count())
        .collect()
}

fn us(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn query_table(title: &str, outcomes: &[Outcome], extra: &[(&str, Vec<String>)]) {
    let agree = disagreements(outcomes);
    println!("\n### {title}\n");
    let mut head = "| index | query p50 (us) | query p99 (us) |".to_string();
    let mut rule = "|---|---:|---:|".to_string();
    for (h, _) in extra {
        head.push_str(&format!(" {h} |"));
        rule.push_str("---:|");
    }
    head.push_str(" sampled answers differing from router-index |");
    rule.push_str("---:|");
    println!("{head}\n{rule}");
    for (i, o) in outcomes.iter().enumerate() {
        let mut row = format!(
            "| {} | {} | {} |",
            o.name,
            us(quantile_us(&o.query_ns, 0.5)),
            us(quantile_us(&o.query_ns, 0.99))
        );
        for (_, col) in extra {
            row.push_str(&format!(" {} |", col[i]));
        }
        row.push_str(&format!(" {} of {} |", agree[i], o.answers.len()));
        println!("{row}");
    }
    for o in outcomes {
        if let Some(p) = o.probes {
            println!("\n{}: {p:.1} probes per query", o.name);
        }
    }
}

fn w1(quick: bool) {
    let outcomes = isolated("W1", quick);
    let stores: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.1} M", o.setup_blocks as f64 / o.setup_secs / 1e6))
        .collect();
    let events: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.2} M", o.setup_events as f64 / o.setup_secs / 1e6))
        .collect();
    let bytes: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.1}", o.bytes as f64 / o.residencies as f64))
        .collect();
    query_table(
        &outcomes[0].title,
        &outcomes,
        &[
            ("stored blocks/s", stores),
            ("store events/s (128 blocks)", events),
            ("bytes per (block, pod)", bytes),
        ],
    );
}

fn w2(quick: bool) {
    let ns: &[usize] = if quick { &[1024] } else { &[32, 1024, 4096] };
    for &n in ns {
        for k in [1usize, 8, 64] {
            if k > n {
                continue;
            }
            let outcomes = isolated(&format!("W2:{n}:{k}"), quick);
            let bytes: Vec<String> = outcomes
                .iter()
                .map(|o| format!("{:.2}", o.bytes as f64 / o.residencies as f64))
                .collect();
            query_table(
                &outcomes[0].title,
                &outcomes,
                &[("bytes per (block, pod)", bytes)],
            );
        }
    }
}

/// W3's workload and the trace's unreadable lines, or why the trace
/// cannot be read.
fn w3_workload(quick: bool) -> Result<(Workload, usize), String> {
    let path = workload::TRACE_PATH;
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let (mut reqs, bad) = workload::read_trace(&text);
    if quick {
        reqs.truncate(4_000);
    }
    Ok((workload::w3(&reqs, 8, 4096), bad))
}

fn w3(quick: bool) {
    let path = workload::TRACE_PATH;
    if let Err(e) = std::fs::metadata(path) {
        println!("\nW3 skipped: cannot read {path}: {e}");
        return;
    }
    let outcomes = isolated("W3", quick);
    let events: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.2} M", o.run_blocks as f64 / o.run_secs / 1e6))
        .collect();
    let bytes: Vec<String> = outcomes
        .iter()
        .map(|o| {
            format!(
                "{:.1}",
                o.end_bytes as f64 / o.end_residencies.max(1) as f64
            )
        })
        .collect();
    query_table(
        &outcomes[0].title,
        &outcomes,
        &[
            ("blocks applied/s incl. queries", events),
            ("bytes per (block, pod) after the run", bytes),
        ],
    );
}

/// W4 for one subject: a writer thread applies store/remove events of W1
/// at full speed while this thread queries.
fn w4_one(w: &Arc<Workload>, make: Factory, quick: bool) -> Outcome {
    let s: Arc<dyn Subject> = Arc::from(make(w.pods));
    for op in &w.setup {
        apply(&*s, w, op, &mut 0);
    }
    s.flush();
    let stop = Arc::new(AtomicBool::new(false));
    let applied = Arc::new(AtomicU64::new(0));
    let writer = {
        let (s, w, stop, applied) = (s.clone(), w.clone(), stop.clone(), applied.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(9);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                apply(&*s, &w, &workload::w4_event(&w, &mut rng), &mut 0);
                n += 1;
                if n % 64 == 0 {
                    s.flush(); // keeps an asynchronous index's queue bounded
                    applied.store(n, Ordering::Relaxed);
                }
            }
            applied.store(n, Ordering::Relaxed);
        })
    };
    let mut o = Outcome {
        name: s.name().to_owned(),
        ..Outcome::default()
    };
    let mut out = Vec::new();
    // Query for a fixed time, cycling through W1's queries, so the writer
    // runs the whole time whatever the query speed.
    let span = std::time::Duration::from_millis(if quick { 300 } else { 2000 });
    let t = Instant::now();
    'outer: loop {
        for op in &w.run {
            if let Op::Query { chain } = op {
                out.clear();
                let q = Instant::now();
                s.query(&w.chains[*chain as usize], &mut out);
                o.query_ns.push(q.elapsed().as_nanos() as u64);
            }
            if o.query_ns.len() % 1024 == 0 && t.elapsed() >= span {
                break 'outer;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer thread");
    o.query_ns.sort_unstable();
    o.writer_rate = applied.load(Ordering::Relaxed) as f64 / secs;
    o
}

/// W4: reader latency and writer speed, each subject in its own process.
fn w4(quick: bool) {
    let outcomes = isolated("W4", quick);
    println!("\n### W4 concurrent: reader latency under a full-speed writer\n");
    println!(
        "| index | reader p50 (us) | reader p99 (us) | writer events/s (store 128 blocks or remove 64) |"
    );
    println!("|---|---:|---:|---:|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {:.0} k |",
            o.name,
            us(quantile_us(&o.query_ns, 0.5)),
            us(quantile_us(&o.query_ns, 0.99)),
            o.writer_rate / 1e3
        );
    }
}

/// Bytes per stored block when each block is held by `r` pods, for
/// router-index's compact holders (index stats and the allocator agree to a
/// few percent) against a full 256-bit bitmap per block.
fn memory() {
    use router_core::{BlockHash, Tier};
    println!("\n### Memory: bytes per stored block by residency (router-index)\n");
    println!(
        "| pods per block | bytes per block (allocator) | bytes per block (index stats) | bytes per (block, pod) | full-bitmap layout, per block |"
    );
    println!("|---:|---:|---:|---:|---:|");
    const BLOCKS: u64 = 200_000;
    let mut map_buckets = None;
    for r in [1usize, 2, 8, 64] {
        let before = LIVE.load(Ordering::Relaxed) as i64;
        let ours = Ours::new(64);
        let pods: Vec<_> = (0..64)
            .map(|i| {
                use router_core::PodDirectory;
                ours.index()
                    .pod_id(&router_core::PodKey::new(format!("http://pod-{i}"), 0))
                    .expect("joined")
            })
            .collect();
        let blocks: Vec<BlockHash> = (0..BLOCKS)
            .map(|i| BlockHash(workload::mix(i ^ 0xB10C)))
            .collect();
        for (c, chunk) in blocks.chunks(16).enumerate() {
            for k in 0..r {
                let pod = pods[(c + k) % 64];
                let _ = ours.index().store(pod, Tier::Gpu, chunk);
            }
        }
        let bytes = LIVE.load(Ordering::Relaxed) as i64 - before;
        let st = ours.index().stats();
        // A full bitmap per block: 8-byte key + 32-byte bitmap per slot, at
        // the same slot count (taken from the one-pod row, where the index
        // holds no slab bitmaps and a slot is 16 bytes).
        let slots = *map_buckets.get_or_insert(st.bytes as f64 / 16.0);
        let full = (slots * (8.0 + 32.0)) / BLOCKS as f64;
        println!(
            "| {r} | {:.1} | {:.1} | {:.1} | {:.1} |",
            bytes as f64 / BLOCKS as f64,
            st.bytes as f64 / BLOCKS as f64,
            bytes as f64 / (BLOCKS as f64 * r as f64),
            full.max(0.0)
        );
    }
}

/// A loaded router host: a thread streaming through a buffer much larger
/// than the caches (reading and writing every cache line), for as long as
/// the process runs.
fn start_background_load(mib: usize) {
    std::thread::spawn(move || {
        let mut buf = vec![1u64; mib << 17];
        let mut x = 0u64;
        loop {
            for v in buf.iter_mut().step_by(8) {
                x = x.wrapping_add(*v);
                *v = x;
            }
            std::hint::black_box(x);
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let (Some(workload), Some(subject)) = (
            args.get(i + 1),
            args.get(i + 2).and_then(|s| s.parse::<usize>().ok()),
        ) else {
            eprintln!("usage: compare --child <W1|W2:n:k|W3|W4> <subject index> [--quick]");
            std::process::exit(2);
        };
        child(workload, subject, quick);
        return;
    }
    if args.iter().any(|a| a == "--loaded") {
        println!("loaded: a background thread streams through 256 MiB the whole run");
        start_background_load(256);
    }
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(str::to_owned).collect());
    let want = |w: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == w));
    println!(
        "subjects: {}",
        subjects()
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    if want("W1") {
        w1(quick);
    }
    if want("W2") {
        w2(quick);
    }
    if want("W3") {
        w3(quick);
    }
    if want("W4") {
        w4(quick);
    }
    if want("memory") {
        memory();
    }
}
