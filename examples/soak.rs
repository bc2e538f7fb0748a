//! Soak: normal chat load with hostile clients mixed in, against a gateway
//! process, sampling its memory and open files to show they stay flat.
//!
//! ```text
//! cargo build --release -p cache-router-cli --example soak
//! ./target/release/examples/soak --minutes 10
//! ```
//!
//! It starts `--gateway-bin` twice: once with the bundled config, hosting
//! four simulated engines (their replay buffers grow to 10000 batches
//! each, so that process's memory grows by design), and once as the
//! gateway under test, with those engines as its pods (events and replay
//! on). Normal sessions (multi-turn chats, streamed) run against the
//! second beside clients that:
//! - trickle header bytes, or open connections and send nothing;
//! - declare a body and stall;
//! - send garbage request lines, malformed JSON, bodies over the limit,
//!   prompts over the context limit;
//! - drop streamed answers after the first chunk, or read them slowly.
//!
//! Every loop stops at the deadline. Each sample row gives the gateway's
//! RSS and open file descriptors (and the engines' host's RSS); at the end the in-flight gauges must be
//! back at 0, the descriptors back near their start, and every normal turn
//! answered. The exit status is non-zero if not.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
#[command(about = "Normal load plus hostile clients against the gateway, memory sampled")]
struct Args {
    /// How long the mixed load runs.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 30)]
    sample_secs: u64,
    /// Normal chat sessions running at once.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// The gateway binary (`cache-router`, crates/cli), started with its bundled config.
    #[arg(long, default_value = "target/release/cache-router")]
    gateway_bin: PathBuf,
}

const MODEL: &str = "Qwen/Qwen3-0.6B";

#[derive(Default)]
struct Counts {
    turns_ok: AtomicU64,
    turns_failed: AtomicU64,
    hostile: AtomicU64,
    /// Hostile requests answered with something other than what was expected.
    unexpected: AtomicU64,
}

fn proc_status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Starts `bin` with `args`, its stdout to `log`.
fn spawn(bin: &std::path::Path, args: &[&str], log: &std::path::Path) -> std::process::Child {
    std::process::Command::new(bin)
        .args(args)
        .stdout(std::fs::File::create(log).expect("a log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

/// Waits until `url/health` answers 200.
async fn healthy(url: &str) {
    let ready = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{url}/health"))
        .await
        .map_or(true, |r| r.status() != 200)
    {
        assert!(Instant::now() < ready, "{url} did not become healthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn words(seed: u64, n: usize) -> String {
    const VOCAB: [&str; 12] = [
        "cache", "prefix", "router", "block", "engine", "token", "latency", "pod", "shard",
        "bitmap", "event", "profile",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            VOCAB[(x % VOCAB.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One normal session after another until the deadline: 4 streamed turns
/// on a growing history.
async fn normal(url: String, id: usize, end: Instant, counts: Arc<Counts>) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut session = 0u64;
    while Instant::now() < end {
        session += 1;
        let seed = (id as u64) << 32 | session;
        let mut messages = vec![
            json!({"role": "system", "content": words(id as u64 % 3, 200)}),
            json!({"role": "user", "content": words(seed, 300)}),
        ];
        for turn in 0..4 {
            let body =
                json!({"model": MODEL, "messages": messages, "max_tokens": 8, "stream": true});
            let ok = match client
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .timeout(Duration::from_secs(60))
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => {
                    r.bytes().await.is_ok_and(|b| b.ends_with(b"[DONE]\n\n"))
                }
                _ => false,
            };
            let c = if ok {
                &counts.turns_ok
            } else {
                &counts.turns_failed
            };
            c.fetch_add(1, Ordering::Relaxed);
            messages.push(json!({"role": "assistant", "content": "ok"}));
            messages.push(json!({"role": "user", "content": words(seed ^ turn, 20)}));
        }
    }
}

/// Writes `request` raw, reads the answer's status line (within `wait`).
async fn raw(addr: &str, request: &[u8], wait: Duration) -> Option<u16> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(request).await.ok()?;
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(wait, s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace().nth(1)?.parse().ok()
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The hostile mix, one kind after another, until the deadline.
async fn hostile(addr: String, id: usize, end: Instant, counts: Arc<Counts>) {
    let url = format!("http://{addr}");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut round = id;
    while Instant::now() < end {
        round += 1;
        let expect_ok =
            |status: Option<u16>, want: &[u16]| status.is_some_and(|s| want.contains(&s));
        let fine = match round % 9 {
            // Header bytes trickled: the header timeout (10 s) closes it.
            0 => {
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    continue;
                };
                let started = Instant::now();
                let mut closed = false;
                for b in b"POST /v1/chat/completions HTTP/1.1\r\nx-slow: "
                    .iter()
                    .cycle()
                    .take(40)
                {
                    if s.write_all(&[*b]).await.is_err() {
                        closed = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                closed || started.elapsed() < Duration::from_secs(12)
            }
            // Connected, silent: closed by the header timeout.
            1 => {
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    continue;
                };
                let mut b = [0u8; 1];
                matches!(
                    tokio::time::timeout(Duration::from_secs(15), s.read(&mut b)).await,
                    Ok(Ok(0) | Err(_))
                )
            }
            // A declared body that stalls: 408 after the body timeout.
            2 => {
                let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\"";
                expect_ok(raw(&addr, head, Duration::from_secs(40)).await, &[408])
            }
            3 => expect_ok(
                raw(&addr, b"GARBAGE \x00\xff\r\n\r\n", Duration::from_secs(5)).await,
                &[400],
            ),
            4 => expect_ok(
                raw(
                    &addr,
                    &post("/v1/chat/completions", b"{\"messages\": [{\"role\": 3"),
                    Duration::from_secs(5),
                )
                .await,
                &[400],
            ),
            // Over max_body_bytes (4 MiB).
            5 => {
                let big = vec![b'a'; 5 << 20];
                let r = client
                    .post(format!("{url}/v1/completions"))
                    .header("content-type", "application/json")
                    .body(big)
                    .send()
                    .await;
                // The gateway may answer 413 and close before reading it all.
                r.map_or(true, |r| r.status() == 413)
            }
            // Over the context limit: 131072 tokens.
            6 => {
                let body =
                    json!({"model": MODEL, "prompt": "cache ".repeat(140_000), "max_tokens": 1});
                client
                    .post(format!("{url}/v1/completions"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 400)
            }
            // A streamed answer dropped after its first chunk.
            7 => {
                let body = json!({"model": MODEL, "messages": [{"role": "user", "content": words(round as u64, 50)}], "max_tokens": 64, "stream": true});
                match client
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        let mut s = r.bytes_stream();
                        s.next().await.is_some()
                    }
                    _ => false,
                }
            }
            // A streamed answer read a few bytes at a time, slowly.
            _ => {
                let body = serde_json::to_vec(&json!({"model": MODEL, "messages": [{"role": "user", "content": words(round as u64, 50)}], "max_tokens": 32, "stream": true})).unwrap();
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    continue;
                };
                if s.write_all(&post("/v1/chat/completions", &body))
                    .await
                    .is_err()
                {
                    continue;
                }
                let mut b = [0u8; 16];
                let mut got = 0;
                for _ in 0..20 {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                got > 0
            }
        };
        counts.hostile.fetch_add(1, Ordering::Relaxed);
        if !fine {
            counts.unexpected.fetch_add(1, Ordering::Relaxed);
            eprintln!("soak: hostile kind {} answered unexpectedly", round % 9);
        }
    }
}

async fn metric(url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("cache-router-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The engines' host, then the gateway under test in front of them.
    let host_addr = free_addr();
    let mut host = spawn(
        &args.gateway_bin,
        &["--listen", &host_addr],
        &dir.join("host.log"),
    );
    healthy(&format!("http://{host_addr}")).await;
    // The pod list is printed once the gateway is up; its last line
    // starts with POST.
    let host_log = loop {
        let text = std::fs::read_to_string(dir.join("host.log")).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("POST")) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tokenizer = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/tokenizers/qwen3");
    let addr = free_addr();
    let mut config = format!(
        "[gateway]\nlisten = \"{addr}\"\nmodel = \"{MODEL}\"\ntokenizer = \"{tokenizer}\"\n"
    );
    for line in host_log
        .lines()
        .filter(|l| l.trim_start().starts_with("pod "))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        // pod NAME URL events EP replay EP
        config.push_str(&format!(
            "\n[[pods]]\nname = \"{}\"\nurl = \"{}\"\nevents = \"{}\"\nreplay = \"{}\"\n",
            f[1], f[2], f[4], f[6]
        ));
    }
    std::fs::write(dir.join("front.toml"), &config).unwrap();
    let front_config = dir.join("front.toml").display().to_string();
    let mut child = spawn(
        &args.gateway_bin,
        &["--config", &front_config],
        &dir.join("front.log"),
    );
    let url = format!("http://{addr}");
    healthy(&url).await;
    let pid = child.id();
    let fds_at_start = open_fds(pid);
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.minutes * 60.0);
    let mut tasks = Vec::new();
    for i in 0..args.sessions {
        tasks.push(tokio::spawn(normal(url.clone(), i, end, counts.clone())));
    }
    for i in 0..9 {
        tasks.push(tokio::spawn(hostile(addr.clone(), i, end, counts.clone())));
    }
    println!(
        "| minute | gateway RSS MiB | gateway open fds | normal turns ok | failed | hostile requests | unexpected | engines' host RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut rss = Vec::new();
    loop {
        let row = |t: f64, rss: u64| {
            println!(
                "| {:.1} | {:.1} | {} | {} | {} | {} | {} | {:.1} |",
                t / 60.0,
                rss as f64 / 1024.0,
                open_fds(pid),
                counts.turns_ok.load(Ordering::Relaxed),
                counts.turns_failed.load(Ordering::Relaxed),
                counts.hostile.load(Ordering::Relaxed),
                counts.unexpected.load(Ordering::Relaxed),
                proc_status(host.id(), "VmRSS:") as f64 / 1024.0,
            )
        };
        let r = proc_status(pid, "VmRSS:");
        rss.push(r);
        row(start.elapsed().as_secs_f64(), r);
        if Instant::now() >= end {
            break;
        }
        tokio::time::sleep(Duration::from_secs(args.sample_secs).min(end - Instant::now())).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    // Connections the hostile clients left are closed by the timeouts.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let in_flight = metric(&url, "cache_router_pod_in_flight").await;
    let fds_after = open_fds(pid);
    let peak = rss.iter().max().copied().unwrap_or(0);
    // Memory after the first sample (warm-up) against the end.
    let warm = rss.get(1).copied().unwrap_or(peak);
    let last = *rss.last().unwrap_or(&0);
    println!(
        "\nRSS: warm {:.1} MiB, peak {:.1} MiB, end {:.1} MiB ({:+.1}% from warm); fds {} at start, {} after; in-flight gauges {}",
        warm as f64 / 1024.0,
        peak as f64 / 1024.0,
        last as f64 / 1024.0,
        (last as f64 / warm.max(1) as f64 - 1.0) * 100.0,
        fds_at_start,
        fds_after,
        in_flight
    );
    for c in [&mut child, &mut host] {
        let _ = c.kill();
        let _ = c.wait();
    }
    std::fs::remove_dir_all(&dir).ok();
    let failed = counts.turns_failed.load(Ordering::Relaxed);
    let unexpected = counts.unexpected.load(Ordering::Relaxed);
    let leaked_fds = fds_after > fds_at_start + 8;
    if failed > 0 || unexpected > 0 || in_flight != 0.0 || leaked_fds {
        eprintln!(
            "soak: FAILED ({failed} normal turns failed, {unexpected} unexpected answers, in-flight {in_flight}, fds {fds_at_start} -> {fds_after})"
        );
        std::process::exit(1);
    }
}
