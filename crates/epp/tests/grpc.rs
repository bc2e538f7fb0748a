//! The picker over a real gRPC stream (tonic's client, as Envoy's ext_proc
//! filter would talk): the subset hint, a stream abandoned after the pick,
//! and the health service.

use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as In;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Out;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use router_epp::{DESTINATION_HEADER, Epp, EppConfig, SUBSET_KEY, SUBSET_NAMESPACE};
use router_service::{Config, Router};
use router_sim_engine::SimEngine;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const MODEL: &str = "Qwen/Qwen3-0.6B";

async fn setup(engines: usize) -> (Router, Vec<SimEngine>, String, Epp) {
    let text = format!(
        "[gateway]\nmodel = \"{MODEL}\"\ntokenizer = \"../../assets/tokenizers/qwen3\"\n\
         health_interval_ms = 100\n\n[simulated]\nengines = {engines}\ntime_scale = 0.1\n"
    );
    let mut config = Config::parse(&text, Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let sims = router_sim_engine::start_engines(&mut config).unwrap();
    let router = Router::start(config).await.unwrap();
    let epp = Epp::new(router.clone(), EppConfig::default());
    let url = serve(epp.clone()).await;
    (router, sims, url, epp)
}

/// Serves `epp` on a port of its own; its URL.
async fn serve(epp: Epp) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(epp.serve(listener, std::future::pending()));
    url
}

fn headers(path: &str, end: bool) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    ProcessingRequest {
        request: Some(In::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    h(":path", path),
                    h(":method", "POST"),
                    h(DESTINATION_HEADER, "6.6.6.6:1"),
                ],
            }),
            end_of_stream: end,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn body(json: &str, subset: Option<&[String]>) -> ProcessingRequest {
    let metadata_context = subset.map(|s| Metadata {
        filter_metadata: [(
            SUBSET_NAMESPACE.to_owned(),
            Struct {
                fields: [(
                    SUBSET_KEY.to_owned(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: s
                                .iter()
                                .map(|e| Value {
                                    kind: Some(Kind::StringValue(e.clone())),
                                })
                                .collect(),
                        })),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    });
    ProcessingRequest {
        metadata_context,
        request: Some(In::RequestBody(HttpBody {
            body: json.as_bytes().to_vec(),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// One exchange up to the decision: the response to the headers and to
/// the body; the stream's sender is returned to keep it open.
async fn decide(
    url: &str,
    json: &str,
    subset: Option<&[String]>,
) -> (
    Out,
    Out,
    mpsc::Sender<ProcessingRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse>,
) {
    let mut client = ExternalProcessorClient::connect(url.to_owned())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    tx.send(headers("/v1/chat/completions", false))
        .await
        .unwrap();
    let mut replies = client
        .process(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = replies.message().await.unwrap().unwrap().response.unwrap();
    tx.send(body(json, subset)).await.unwrap();
    let second = replies.message().await.unwrap().unwrap().response.unwrap();
    (first, second, tx, replies)
}

fn destination(out: &Out) -> Option<String> {
    let Out::RequestBody(b) = out else {
        return None;
    };
    let m = b.response.as_ref()?.header_mutation.as_ref()?;
    m.set_headers.iter().find_map(|h| {
        let h = h.header.as_ref()?;
        (h.key == DESTINATION_HEADER).then(|| String::from_utf8(h.raw_value.clone()).unwrap())
    })
}

fn chat_json(words: usize) -> String {
    let text: String = (0..words).map(|i| format!("w{i} ")).collect();
    format!(r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{text}"}}]}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_bounds_the_choice_and_an_empty_one_is_503() {
    let (router, engines, url, _) = setup(3).await;
    let only = vec![router_epp::endpoint_of(engines[1].url()).unwrap()];
    for _ in 0..4 {
        let (first, second, _tx, _rx) = decide(&url, &chat_json(30), Some(&only)).await;
        let Out::RequestHeaders(h) = first else {
            panic!("{first:?}")
        };
        let removed = &h.response.unwrap().header_mutation.unwrap().remove_headers;
        assert!(
            removed.iter().any(|h| h == DESTINATION_HEADER),
            "the client's choice is removed: {removed:?}"
        );
        assert_eq!(destination(&second).as_deref(), Some(only[0].as_str()));
    }
    let nowhere = vec!["10.9.9.9:80".to_owned()];
    let (_, second, _tx, _rx) = decide(&url, &chat_json(30), Some(&nowhere)).await;
    let Out::ImmediateResponse(i) = second else {
        panic!("{second:?}")
    };
    assert_eq!(i.status.unwrap().code, 503);
    drop(router);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_stream_gives_its_pods_load_back() {
    let (router, _engines, url, _) = setup(2).await;
    let in_flight = |r: &Router| -> f64 {
        r.metrics_text()
            .lines()
            .filter(|l| l.starts_with("cache_router_pod_in_flight{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut open = Vec::new();
    for _ in 0..5 {
        let (_, second, tx, rx) = decide(&url, &chat_json(10), None).await;
        assert!(destination(&second).is_some(), "{second:?}");
        open.push((tx, rx));
    }
    assert_eq!(in_flight(&router), 5.0, "each pick holds its pod's load");
    // Envoy (or the client) goes away without a response.
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight(&router) != 0.0 {
        assert!(Instant::now() < deadline, "the load stays held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A malformed body is a 400, and holds nothing.
    let (_, second, _tx, _rx) = decide(&url, "{not json", None).await;
    let Out::ImmediateResponse(i) = second else {
        panic!("{second:?}")
    };
    assert_eq!(i.status.unwrap().code, 400);
    assert_eq!(in_flight(&router), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_handed_to_an_observing_stream_holds_the_load_until_the_response_ends() {
    let (router, _engines, url, epp) = setup(2).await;
    let in_flight = || -> f64 {
        router
            .metrics_text()
            .lines()
            .filter(|l| l.starts_with("cache_router_pod_in_flight{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // The decision stream, marked as one whose response another observes.
    let mut client = ExternalProcessorClient::connect(url.clone()).await.unwrap();
    let (tx, rx) = mpsc::channel(4);
    tx.send(headers("/v1/chat/completions", false))
        .await
        .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert(router_epp::OBSERVER_METADATA, "separate".parse().unwrap());
    let mut replies = client.process(req).await.unwrap().into_inner();
    replies.message().await.unwrap().unwrap();
    tx.send(body(&chat_json(20), None)).await.unwrap();
    let Out::RequestBody(b) = replies.message().await.unwrap().unwrap().response.unwrap() else {
        panic!("not a body response")
    };
    let set = b.response.unwrap().header_mutation.unwrap().set_headers;
    let value = |k: &str| {
        set.iter()
            .filter_map(|h| h.header.as_ref())
            .find(|h| h.key == k)
            .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
    };
    let id = value(router_epp::EXCHANGE_HEADER).expect("the decision is handed over");
    assert!(value(router_epp::POD_HEADER).is_some());
    drop(tx);
    drop(replies);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        in_flight(),
        1.0,
        "the decision stream ended; the request has not"
    );
    assert_eq!(epp.waiting_decisions(), 1);

    // The observing stream: Envoy waits on no answer, and gets none.
    let (tx, rx) = mpsc::channel(8);
    let observed = |r: In| ProcessingRequest {
        observability_mode: true,
        request: Some(r),
        ..Default::default()
    };
    let hv = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    tx.send(observed(In::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                hv(":path", "/v1/chat/completions"),
                hv(router_epp::EXCHANGE_HEADER, &id),
            ],
        }),
        ..Default::default()
    })))
    .await
    .unwrap();
    tx.send(observed(In::ResponseHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![hv(":status", "200")],
        }),
        ..Default::default()
    })))
    .await
    .unwrap();
    let usage = br#"{"object": "chat.completion", "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 0}}}"#;
    tx.send(observed(In::ResponseBody(HttpBody {
        body: usage.to_vec(),
        end_of_stream: true,
        ..Default::default()
    })))
    .await
    .unwrap();
    let mut client = ExternalProcessorClient::connect(url).await.unwrap();
    let mut replies = client
        .process(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight() != 0.0 {
        assert!(
            Instant::now() < deadline,
            "the response's end gives the load back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(epp.waiting_decisions(), 0, "the observer took it");
    // Envoy keeps its side open (its deferred close is 5 s): the picker
    // ends the stream itself once the response is over, having answered
    // nothing.
    let ended = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("the picker closes an observed stream once its response ends");
    assert!(
        ended.unwrap().is_none(),
        "nothing is answered to an observer"
    );
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_its_headers_is_routed_by_what_it_holds() {
    let (_router, _engines, url, _) = setup(2).await;
    let mut client = ExternalProcessorClient::connect(url).await.unwrap();
    let (tx, rx) = mpsc::channel(4);
    // request_header_mode: SKIP: the body comes first; `messages` make it a chat.
    tx.send(body(&chat_json(10), None)).await.unwrap();
    let mut replies = client
        .process(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let out = replies.message().await.unwrap().unwrap().response.unwrap();
    assert!(destination(&out).is_some(), "{out:?}");
}

/// A request's headers as Envoy sends them when the body follows without
/// waiting for their answer (`request_body_mode: STREAMED`,
/// `send_body_without_waiting_for_header_response: true`, reported in the
/// stream's first message).
fn headers_body_following(path: &str) -> ProcessingRequest {
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
    use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
    let mut h = headers(path, false);
    h.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::Streamed as i32,
        send_body_without_waiting_for_header_response: true,
        ..Default::default()
    });
    h
}

fn chunk(s: &str, end: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::RequestBody(HttpBody {
            body: s.as_bytes().to_vec(),
            end_of_stream: end,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Sends `messages` at once, none waiting for an answer, on a new stream
/// to `url`; the replies.
async fn send_all(
    url: &str,
    messages: Vec<ProcessingRequest>,
) -> (
    mpsc::Sender<ProcessingRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse>,
) {
    let mut client = ExternalProcessorClient::connect(url.to_owned())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(messages.len().max(1));
    for m in messages {
        tx.send(m).await.unwrap();
    }
    let replies = client
        .process(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, replies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_body_sent_at_once_the_headers_answer_carries_the_decision() {
    let (router, engines, url, _) = setup(3).await;
    let only = vec![router_epp::endpoint_of(engines[2].url()).unwrap()];
    let json = chat_json(40);
    let (a, rest) = json.split_at(json.len() / 3);
    let (b, c) = rest.split_at(rest.len() / 2);
    // The headers (the subset hint in their metadata) and the body's three
    // chunks.
    let mut first = headers_body_following("/v1/chat/completions");
    first.metadata_context = body("", Some(&only)).metadata_context;
    let (_tx, mut replies) = send_all(
        &url,
        vec![first, chunk(a, false), chunk(b, false), chunk(c, true)],
    )
    .await;
    // The headers' answer comes first and already holds the whole body's
    // decision: it was held until the body came.
    let Out::RequestHeaders(h) = replies.message().await.unwrap().unwrap().response.unwrap() else {
        panic!("the headers are answered first")
    };
    let common = h.response.unwrap();
    assert!(common.clear_route_cache);
    let m = common.header_mutation.unwrap();
    let set: Vec<(String, String)> = m
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .map(|h| {
            (
                h.key.clone(),
                String::from_utf8(h.raw_value.clone()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        set,
        vec![(DESTINATION_HEADER.to_owned(), only[0].clone())],
        "the subset hint's pod, and the client's choice overwritten"
    );
    assert_eq!(
        m.remove_headers,
        vec![router_epp::EXCHANGE_HEADER.to_owned()],
        "the client's other control header removed, not the one set"
    );
    // Then each of the three chunks, in order, passed on unchanged.
    for i in 0..3 {
        let out = replies.message().await.unwrap().unwrap().response.unwrap();
        let Out::RequestBody(b) = &out else {
            panic!("chunk {i}: {out:?}")
        };
        assert!(b.response.is_none(), "chunk {i}: {out:?}");
    }

    // A body over the limit is refused as it comes, before its end.
    let mut config = EppConfig::default();
    config.max_body_bytes = 100;
    let small = serve(Epp::new(router.clone(), config)).await;
    let big = "x".repeat(80);
    let (_tx, mut replies) = send_all(
        &small,
        vec![
            headers_body_following("/v1/chat/completions"),
            chunk(&big, false),
            chunk(&big, false),
        ],
    )
    .await;
    let out = replies.message().await.unwrap().unwrap().response.unwrap();
    let Out::ImmediateResponse(i) = out else {
        panic!("{out:?}")
    };
    assert_eq!(i.status.unwrap().code, 413);
}
