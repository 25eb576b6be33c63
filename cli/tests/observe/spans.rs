//! A span per check at an OTLP receiver, its trace id on the decision in the ledger.

use super::*;

/// An OTLP/HTTP receiver on loopback: every `POST /v1/traces` body decoded with the
/// OpenTelemetry project's protobuf types; its spans as (trace id, parent span id, name,
/// attributes).
struct Receiver {
    addr: std::net::SocketAddr,
    spans: std::sync::Arc<std::sync::Mutex<Vec<ReceivedSpan>>>,
    _rt: tokio::runtime::Runtime,
}

#[derive(Clone, Debug)]
struct ReceivedSpan {
    trace_id: String,
    parent_span_id: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

impl Receiver {
    fn start() -> Receiver {
        use http_body_util::BodyExt;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&spans);
        rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let kept = std::sync::Arc::clone(&kept);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let kept = std::sync::Arc::clone(&kept);
                            async move {
                                let path = req.uri().path().to_owned();
                                let body = req.into_body().collect().await?.to_bytes();
                                if path == "/v1/traces" {
                                    let export = ExportTraceServiceRequest::decode(body)
                                        .expect("an OTLP ExportTraceServiceRequest");
                                    let mut k = kept.lock().unwrap();
                                    for rs in export.resource_spans {
                                        for ss in rs.scope_spans {
                                            for s in ss.spans {
                                                k.push(ReceivedSpan {
                                                    trace_id: hex::encode(&s.trace_id),
                                                    parent_span_id: hex::encode(&s.parent_span_id),
                                                    name: s.name,
                                                    attributes: s
                                                        .attributes
                                                        .into_iter()
                                                        .map(|kv| {
                                                            (kv.key, format!("{:?}", kv.value))
                                                        })
                                                        .collect(),
                                                });
                                            }
                                        }
                                    }
                                }
                                Ok::<_, hyper::Error>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::new()),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            spans,
            _rt: rt,
        }
    }
}

/// A check's span reaches an OTLP receiver the test started, under the GenAI
/// conventions, and its trace id is on the decision in the ledger; an agent's
/// `traceparent` makes the span its child and its trace id the decision's.
#[test]
fn a_span_per_check_reaches_the_collector_and_its_trace_id_is_on_the_decision() {
    if !tally_testkit::have("curl", &[], "apt-get install curl") {
        return;
    }
    let receiver = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let endpoint = format!("http://{}", receiver.addr);
    let mut served = tally().serve(dir, &["--otlp-endpoint", &endpoint]);
    served.start_run("traced", 10);
    let own = served.check("traced", "search", json!({"i": 0}));
    // With the agent's traceparent (curl: a header the test client does not send).
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(dir.join("agent.sock"))
        .args([
            "-H",
            &format!("traceparent: {parent}"),
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"run":"traced","tool":"search","effect":"read","args":{"i":1}}"#,
            "http://localhost/v1/check",
        ])
        .output()
        .expect("curl");
    let child: Value = serde_json::from_slice(&out.stdout).expect("answer");
    assert_eq!(child["decision"], "allow", "{child}");
    // A malformed traceparent is ignored, never an error.
    let bad = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(dir.join("agent.sock"))
        .args([
            "-H",
            "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"run":"traced","tool":"search","effect":"read","args":{"i":2}}"#,
            "http://localhost/v1/check",
        ])
        .output()
        .expect("curl");
    let bad: Value = serde_json::from_slice(&bad.stdout).expect("answer");
    assert_eq!(bad["decision"], "allow", "{bad}");
    // Stopping flushes the batch.
    served.stop();
    let started = Instant::now();
    while receiver.spans.lock().unwrap().len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the receiver got {:?}",
            receiver.spans.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let spans = receiver.spans.lock().unwrap().clone();
    let all = decisions(dir);
    let on = |seq: &Value| all[&seq.as_u64().expect("seq")]["trace_id"].clone();
    for s in &spans {
        assert_eq!(s.name, "execute_tool search");
        assert!(
            s.attributes["gen_ai.operation.name"].contains("execute_tool"),
            "{s:?}"
        );
        assert!(s.attributes["gen_ai.tool.name"].contains("search"), "{s:?}");
        assert!(s.attributes["tally.decision"].contains("allow"), "{s:?}");
    }
    // The agent's trace: the decision carries it, the span is the child of its parent.
    assert_eq!(on(&child["seq"]), "4bf92f3577b34da6a3ce929d0e0e4736");
    let theirs = spans
        .iter()
        .find(|s| s.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736")
        .expect("the span in the agent's trace");
    assert_eq!(theirs.parent_span_id, "00f067aa0ba902b7");
    // The daemon's own traces: each decision's trace id is its span's.
    for answer in [&own, &bad] {
        let id = on(&answer["seq"]);
        let id = id.as_str().expect("a trace id on the decision");
        assert_eq!(id.len(), 32);
        assert_ne!(id, "00000000000000000000000000000000");
        let span = spans.iter().find(|s| s.trace_id == id).expect("its span");
        assert!(span.parent_span_id.is_empty(), "{span:?}");
    }
}
