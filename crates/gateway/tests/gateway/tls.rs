//! Engines over `https://` (the `rustls` feature): a TLS terminator with a
//! test authority's certificate in front of a simulated engine. The
//! gateway reaches it only when it trusts that authority.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use router_gateway::Config;
use router_sim_engine::{SimEngine, SimGateway};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

use super::{MODEL, chat, eventually, post, qwen3};

fn tls_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

/// Serves TLS on a free port and forwards each connection's plain bytes to
/// `backend`; counts completed handshakes.
async fn tls_front(backend: SocketAddr) -> (u16, Arc<AtomicUsize>) {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(tls_dir().join("server.pem"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls_dir().join("server.key")).unwrap();
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut plain) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (port, handshakes)
}

fn config_for(engine: &SimEngine, port: u16, ca: Option<&Path>) -> Config {
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/qwen3");
    let ca = ca.map_or(String::new(), |p| {
        format!("tls_ca_file = {:?}\n", p.display().to_string())
    });
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\ntokenizer = {:?}\nhealth_interval_ms = 100\n{ca}\n[[pods]]\nname = \"tls\"\nurl = \"https://localhost:{port}\"\nevents = \"{}\"\nreplay = \"{}\"\n",
        tokenizer.display().to_string(),
        engine.events_endpoint(),
        engine.replay_endpoint()
    );
    Config::parse(&text, Path::new(".")).expect("valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_engine_is_served_when_its_authority_is_trusted() {
    let engine =
        SimEngine::start(router_sim_engine::EngineConfig::new(MODEL, qwen3()).time_scale(0.0))
            .unwrap();
    let backend: SocketAddr = engine.url().trim_start_matches("http://").parse().unwrap();
    let (port, handshakes) = tls_front(backend).await;

    let gw = SimGateway::start(config_for(&engine, port, Some(&tls_dir().join("ca.pem"))))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the https pod is healthy",
        || async { gw.pods().iter().all(|p| p.healthy) },
    )
    .await;
    let a = post(
        &gw,
        "/v1/chat/completions",
        &chat(&[json!({"role": "user", "content": "hello over tls"})]),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.pod.as_deref(), Some("tls"));
    assert!(a.body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(
        handshakes.load(Ordering::SeqCst) >= 1,
        "the request went through TLS"
    );
    drop(gw);

    // Without the authority the certificate is refused: the pod never
    // turns healthy and requests are answered 503, not sent in clear.
    let before = handshakes.load(Ordering::SeqCst);
    let gw = SimGateway::start(config_for(&engine, port, None))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        gw.pods().iter().all(|p| !p.healthy),
        "an untrusted engine is not healthy"
    );
    let a = post(
        &gw,
        "/v1/chat/completions",
        &chat(&[json!({"role": "user", "content": "hello"})]),
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        before,
        "no handshake completed"
    );
}

#[test]
fn a_bad_authority_file_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("cache-router-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine =
        SimEngine::start(router_sim_engine::EngineConfig::new(MODEL, qwen3()).time_scale(0.0))
            .unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificates here\n").unwrap();
    for (ca, what) in [
        (bad.clone(), "a malformed file"),
        (empty, "a file without certificates"),
        (dir.join("missing.pem"), "a missing file"),
    ] {
        let err = rt
            .block_on(SimGateway::start(config_for(&engine, 1, Some(&ca))))
            .expect_err(what);
        let text = err.to_string();
        assert!(
            text.contains("tls_ca_file") || text.contains("cannot read"),
            "{what}: {text}"
        );
        assert!(
            text.contains(&ca.display().to_string()),
            "names the file: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
