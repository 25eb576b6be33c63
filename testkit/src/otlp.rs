//! An OTLP/HTTP trace receiver for tests: spans a daemon exports, decoded with the
//! OpenTelemetry project's own protobuf types.

use std::collections::BTreeMap;

/// An OTLP/HTTP receiver on loopback: every `POST /v1/traces` body decoded with the
/// OpenTelemetry project's protobuf types; its spans as (trace id, parent span id, name,
/// attributes).
pub struct Receiver {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// Every span received so far.
    pub spans: std::sync::Arc<std::sync::Mutex<Vec<ReceivedSpan>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One span as received.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// Its trace id, lowercase hex.
    pub trace_id: String,
    /// Its own span id, lowercase hex.
    pub span_id: String,
    /// Its parent's span id, lowercase hex (empty for a root span).
    pub parent_span_id: String,
    /// Its W3C `tracestate`.
    pub trace_state: String,
    /// Its name.
    pub name: String,
    /// Its kind (the protobuf enum: 1 internal, 3 client).
    pub kind: i32,
    /// Its attributes, each value as its protobuf `Debug` text.
    pub attributes: BTreeMap<String, String>,
}

impl Receiver {
    /// Listen on a loopback port.
    pub fn start() -> Receiver {
        // Bound here, served on a thread of its own with its own runtime: a test may
        // start (and drop) it inside an async runtime of its own.
        let bound = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        bound.set_nonblocking(true).expect("nonblocking");
        let addr = bound.local_addr().expect("addr");
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&spans);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                tokio::select! {
                    _ = stopped => {}
                    _ = serve(bound, kept) => {}
                }
            });
        });
        Receiver {
            addr,
            spans,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Its `http://` endpoint (for `--otlp-endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans received, once there are at least `n` (at most 20 s).
    pub fn wait_for(&self, n: usize) -> Vec<ReceivedSpan> {
        let started = std::time::Instant::now();
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "the receiver got only {spans:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Spans as received, shared between the receiver and its connections.
type Kept = std::sync::Arc<std::sync::Mutex<Vec<ReceivedSpan>>>;

/// Accept connections on `bound`, each served on a task of its own, until the listener
/// fails.
async fn serve(bound: std::net::TcpListener, kept: Kept) {
    let listener = tokio::net::TcpListener::from_std(bound).expect("listener");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let kept = std::sync::Arc::clone(&kept);
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    answer(req, std::sync::Arc::clone(&kept))
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// One request: a `POST /v1/traces` body's spans kept; every request answered 200 with
/// no body.
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    kept: Kept,
) -> Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, hyper::Error> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    if path == "/v1/traces" {
        keep_spans(&body, &kept);
    }
    Ok(hyper::Response::new(http_body_util::Full::new(
        bytes::Bytes::new(),
    )))
}

/// Decode an OTLP `ExportTraceServiceRequest` and keep each of its spans.
fn keep_spans(body: &[u8], kept: &Kept) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let export =
        ExportTraceServiceRequest::decode(body).expect("an OTLP ExportTraceServiceRequest");
    let mut k = kept.lock().unwrap();
    for rs in export.resource_spans {
        for ss in rs.scope_spans {
            for s in ss.spans {
                k.push(ReceivedSpan {
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_span_id: hex::encode(&s.parent_span_id),
                    trace_state: s.trace_state,
                    name: s.name,
                    kind: s.kind,
                    attributes: s
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, format!("{:?}", kv.value)))
                        .collect(),
                });
            }
        }
    }
}
