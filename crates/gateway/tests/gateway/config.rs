//! Configuration files: the bundled one is valid; bad ones are refused
//! with their line.

use router_gateway::{Config, DEFAULT_CONFIG, Error, Gateway};
use router_sim_engine::SimGateway;

use super::*;

fn parse(text: &str) -> Result<Config, Error> {
    Config::parse(text, Path::new(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn the_bundled_config_parses() {
    let c = parse(DEFAULT_CONFIG).unwrap();
    assert_eq!(c.gateway.model, MODEL);
    assert_eq!(c.simulated.as_ref().unwrap().engines, 4);
    assert!(c.gateway.tokenizer.join("tokenizer.json").exists());
}

#[test]
fn bad_configs_are_refused_with_their_line() {
    let head = "[gateway]\nmodel = \"m\"\ntokenizer = \"t\"\n";
    let cases = [
        (format!("{head}colour = 3\n"), 4, "unknown field"),
        (format!("{head}block_size = \"x\"\n"), 4, "invalid type"),
        (
            format!("{head}\n[[pods]]\nname = \"a\"\nurl = 5\n"),
            7,
            "invalid type",
        ),
        ("[gateway]\nmodel = \"m\"\n".to_owned(), 1, "tokenizer"),
    ];
    for (text, line, what) in cases {
        match parse(&text) {
            Err(Error::Config { line: l, message }) => {
                assert_eq!(l, line, "{text}: {message}");
                assert!(message.contains(what), "{message}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let dup = format!(
        "{head}[[pods]]\nname = \"a\"\nurl = \"http://x:1\"\n[[pods]]\nname = \"a\"\nurl = \"http://y:1\"\n"
    );
    assert!(matches!(parse(&dup), Err(Error::PodConflict(m)) if m.contains("two pods")));
    let not_http = format!("{head}[[pods]]\nname = \"a\"\nurl = \"ftp://x\"\n");
    assert!(matches!(parse(&not_http), Err(Error::Pods(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_profile_or_a_bad_profile_stops_the_start() {
    let base = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nmodel = \"{MODEL}\"\ntokenizer = \"../../assets/tokenizers/qwen3\"\n"
    );
    let unknown = parse(&format!("{base}profile = \"fastest\"\n")).unwrap();
    let err = Gateway::start(unknown).await.unwrap_err();
    assert!(err.to_string().contains("fastest"), "{err}");
    let bad = parse(&format!(
        "{base}profile = \"p\"\n\n[profiles.p]\npicker = {{ type = \"max-scor\" }}\n"
    ))
    .unwrap();
    match Gateway::start(bad).await.unwrap_err() {
        Error::Policy(router_policy::Error::Config { line, .. }) => assert_eq!(line, 8),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_simulation_starts_simulated_engines() {
    let mut c = parse(DEFAULT_CONFIG).unwrap();
    c.gateway.listen = "127.0.0.1:0".parse().unwrap();
    match Gateway::start(c.clone()).await.unwrap_err() {
        Error::Config { message, .. } => assert!(message.contains("SimGateway"), "{message}"),
        other => panic!("{other:?}"),
    }
    let gw = SimGateway::start(c).await.unwrap();
    let names: Vec<String> = gw.pods().into_iter().map(|p| p.config.name).collect();
    assert_eq!(names, ["sim-0", "sim-1", "sim-2", "sim-3"]);
    // The engines' pods are fixed: a replica over the same engines lists them.
    assert_eq!(gw.engine_pods().len(), 4);
    assert_eq!(gw.engines().len(), 4);
}

#[test]
fn bad_models_are_refused() {
    let head = "[gateway]\nmodel = \"m\"\ntokenizer = \"t\"\n";
    let model = |name: &str| format!("[[models]]\nname = \"{name}\"\ntokenizer = \"t\"\n");
    let cases = [
        (format!("{head}{}", model("m")), "named twice"),
        (format!("{head}{}{}", model("b"), model("b")), "named twice"),
        (
            format!("{head}{}block_size = 0\n", model("b")),
            "block_size",
        ),
        (
            format!(
                "{head}{}[nats]\nurl = \"nats://127.0.0.1:4222\"\n",
                model("b")
            ),
            "[nats]",
        ),
    ];
    for (text, what) in cases {
        match parse(&text) {
            Err(Error::Config { message, .. }) => {
                assert!(message.contains(what), "{text}: {message}")
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let pods = [
        "[[pods]]\nname = \"a\"\nurl = \"http://x:1\"\nmodel = \"nope\"\n",
        "[[pods]]\nname = \"a\"\nurl = \"http://x:1\"\nadapters = [\"m\"]\n",
        "[[pods]]\nname = \"a\"\nurl = \"http://x:1\"\nadapters = [\"\"]\n",
    ];
    for p in pods {
        let text = format!("{head}{}{p}", model("b"));
        assert!(matches!(parse(&text), Err(Error::Pods(_))), "{text}");
    }
    let ok = format!(
        "{head}{}[[pods]]\nname = \"a\"\nurl = \"http://x:1\"\nmodel = \"b\"\nadapters = [\"sql\"]\n",
        model("b")
    );
    let c = parse(&ok).unwrap();
    assert_eq!(c.model_names(), ["m", "b"]);
    assert_eq!(c.pods[0].adapters, ["sql"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_reported_before_anything_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = parse(DEFAULT_CONFIG).unwrap();
    c.gateway.listen = taken.local_addr().unwrap();
    // A tokenizer that cannot load: the router would fail on it, so a bind
    // error shows the address was tried first.
    c.gateway.tokenizer = "/nonexistent/tokenizer".into();
    match SimGateway::start(c).await.unwrap_err() {
        Error::Bind { what, .. } => assert_eq!(what, taken.local_addr().unwrap().to_string()),
        other => panic!("{other:?}"),
    }
}
