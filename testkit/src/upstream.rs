//! A fake model upstream for the proxy's tests: a real HTTP/1.1 server (hyper), over
//! plain HTTP or HTTPS with a certificate from a CA made at start (rcgen), speaking
//! enough of OpenAI's chat completions and Anthropic's Messages API for the official
//! SDKs, streaming and not.
//!
//! What each request does is chosen by its `model`, so a test in any language steers it
//! with no API of its own:
//!
//! * `fake-ok`: usage 100 input, 50 output tokens (fewer where the request's
//!   `max_tokens` is lower, as a real API never answers past it);
//! * `fake-usage-I-O`: usage I input, O output tokens (`fake-usage-1000-20`);
//!   `fake-usage-I-O-W-H` (Anthropic) also W cache-write tokens, H of them to the
//!   1-hour cache (`cache_creation_input_tokens`, `cache_creation`);
//! * `fake-cut`: a stream is cut after 2 chunks (no usage); a plain answer is cut
//!   mid-body;
//! * `fake-slow`: one chunk every 200 ms, 50 chunks (a plain answer after 10 s);
//! * `fake-429`: 429 with `Retry-After: 2`; `fake-500`: 500;
//! * `fake-redirect`: 302 to `http://127.0.0.2:1/elsewhere`;
//!   `fake-redirect-same`: 302 to `/v1/elsewhere` on this server.
//!
//! The key must be the one the upstream was started with (`Authorization: Bearer KEY`
//! for OpenAI paths, `x-api-key: KEY` for Anthropic's), else 401. Every request is kept
//! in [`FakeUpstream::seen`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// How to start a [`FakeUpstream`].
#[derive(Clone, Debug)]
pub struct FakeOptions {
    /// Serve HTTPS with a certificate for `127.0.0.1` and `localhost` from a fresh CA.
    pub tls: bool,
    /// The real key the upstream expects.
    pub key: String,
}

impl Default for FakeOptions {
    fn default() -> FakeOptions {
        FakeOptions {
            tls: false,
            key: "sk-real".into(),
        }
    }
}

/// One request the fake upstream received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Its method.
    pub method: String,
    /// Its path (and query).
    pub path: String,
    /// Whether it carried the real key where its API puts it.
    pub real_key: bool,
    /// Whether any header held something that looks like a run token (`tly_`).
    pub token_seen: bool,
    /// Header names it carried, lower case.
    pub headers: Vec<String>,
    /// The request's `model`.
    pub model: Option<String>,
    /// Its `max_tokens` (or `max_completion_tokens`).
    pub max_tokens: Option<u64>,
    /// Its `stream_options`, as JSON text.
    pub stream_options: Option<String>,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// The body's length in bytes.
    pub body_len: usize,
    /// The `traceparent` and then the `tracestate` values it carried, as received.
    pub trace: Vec<String>,
}

/// A running fake upstream; stopped when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    tls: bool,
    ca: Option<tempfile::NamedTempFile>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeUpstream {
    /// Start one on `127.0.0.1`, on a port of its own, on a thread of its own.
    pub fn start(options: FakeOptions) -> FakeUpstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake upstream");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("address");
        let (acceptor, ca) = if options.tls {
            let (acceptor, ca) = tls_acceptor();
            (Some(acceptor), Some(ca))
        } else {
            (None, None)
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::new(State {
            key: options.key,
            seen: Arc::clone(&seen),
        });
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let mut stopped = stopped;
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted {
                            Ok(a) => a,
                            Err(_) => continue,
                        },
                    };
                    let state = Arc::clone(&state);
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let state = Arc::clone(&state);
                            async move { Ok::<_, Infallible>(state.answer(req).await) }
                        });
                        let http = hyper::server::conn::http1::Builder::new();
                        match acceptor {
                            Some(a) => {
                                if let Ok(tls) = a.accept(stream).await {
                                    let _ = http.serve_connection(TokioIo::new(tls), service).await;
                                }
                            }
                            None => {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                    });
                }
            });
        });
        FakeUpstream {
            addr,
            tls: options.tls,
            ca,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The test CA's certificate (a PEM file), for `ca_file`; `None` over plain HTTP.
    pub fn ca_pem(&self) -> Option<PathBuf> {
        self.ca.as_ref().map(|f| f.path().to_path_buf())
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TLS acceptor with a fresh CA's leaf for `127.0.0.1` and `localhost`, and the CA's
/// PEM in a temporary file.
fn tls_acceptor() -> (tokio_rustls::TlsAcceptor, tempfile::NamedTempFile) {
    let pki = crate::tls::TestPki::new();
    let mut ca_file = tempfile::NamedTempFile::new().expect("CA file");
    std::io::Write::write_all(&mut ca_file, pki.ca_pem.as_bytes()).expect("write CA");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pki.leaf_key_der.clone().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_no_client_auth()
    .with_single_cert(vec![pki.leaf_der.clone().into()], key)
    .expect("server config");
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_file)
}

type Body = BoxBody<Bytes, std::io::Error>;

struct State {
    key: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|e| match e {})
                .boxed(),
        )
        .expect("response")
}

/// A body of `chunks`, each after `every`, then `end`: `Ok` ends it cleanly, `Err` cuts
/// the connection.
fn streamed(chunks: Vec<Bytes>, every: Duration, cut: bool) -> Body {
    let s = futures::stream::unfold(
        (chunks.into_iter(), cut, false),
        move |(mut it, cut, done)| async move {
            if done {
                return None;
            }
            match it.next() {
                Some(c) => {
                    if !every.is_zero() {
                        tokio::time::sleep(every).await;
                    }
                    Some((Ok(Frame::data(c)), (it, cut, false)))
                }
                None if cut => {
                    // What was sent reaches the client (hyper flushes it) before the cut.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Err(std::io::Error::other("cut by the fake upstream")),
                        (it, cut, true),
                    ))
                }
                None => None,
            }
        },
    );
    StreamBody::new(s).boxed()
}

fn sse(events: &[(Option<&str>, Value)]) -> Vec<Bytes> {
    events
        .iter()
        .map(|(name, data)| {
            Bytes::from(match name {
                Some(n) => format!("event: {n}\ndata: {data}\n\n"),
                None => format!("data: {data}\n\n"),
            })
        })
        .collect()
}

impl State {
    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let anthropic = path.starts_with("/v1/messages");
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let real_key = if anthropic {
            header("x-api-key") == self.key
        } else {
            header("authorization") == format!("Bearer {}", self.key)
        };
        let token_seen = parts
            .headers
            .values()
            .any(|v| String::from_utf8_lossy(v.as_bytes()).contains("tly_"));
        let model = json.get("model").and_then(Value::as_str).map(str::to_owned);
        let stream = json.get("stream").and_then(Value::as_bool).unwrap_or(false);
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Seen {
                method: parts.method.to_string(),
                path: path.clone(),
                real_key,
                token_seen,
                headers: parts
                    .headers
                    .keys()
                    .map(|k| k.as_str().to_owned())
                    .collect(),
                model: model.clone(),
                max_tokens: json
                    .get("max_tokens")
                    .or_else(|| json.get("max_completion_tokens"))
                    .and_then(Value::as_u64),
                stream_options: json.get("stream_options").map(|v| v.to_string()),
                stream,
                body_len: bytes.len(),
                trace: ["traceparent", "tracestate"]
                    .iter()
                    .flat_map(|n| parts.headers.get_all(*n).iter())
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect(),
            });
        if !real_key {
            let e = if anthropic {
                json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})
            } else {
                json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key", "param": null}})
            };
            return full(StatusCode::UNAUTHORIZED, e);
        }
        let model = model.unwrap_or_default();
        let (input, output, written, written_1h) = match model.as_str() {
            m if m.starts_with("fake-usage-") => {
                let mut it = m["fake-usage-".len()..]
                    .split('-')
                    .map(|n| n.parse::<u64>().unwrap_or(0));
                let mut next = || it.next().unwrap_or(0);
                (next(), next(), next(), next())
            }
            // As a real API: never more output than the request's limit.
            _ => {
                let limit = json
                    .get("max_tokens")
                    .or_else(|| json.get("max_completion_tokens"))
                    .and_then(Value::as_u64)
                    .unwrap_or(50);
                (100, limit.min(50), 0, 0)
            }
        };
        // Anthropic's input usage: cache writes only where some were made.
        let mut anthropic_usage = json!({"input_tokens": input, "output_tokens": output});
        if written > 0 {
            anthropic_usage["cache_creation_input_tokens"] = json!(written);
            anthropic_usage["cache_creation"] = json!({
                "ephemeral_5m_input_tokens": written.saturating_sub(written_1h),
                "ephemeral_1h_input_tokens": written_1h});
        }
        match model.as_str() {
            "fake-429" => {
                let mut r = full(
                    StatusCode::TOO_MANY_REQUESTS,
                    json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
                );
                r.headers_mut()
                    .insert("retry-after", hyper::header::HeaderValue::from_static("2"));
                return r;
            }
            "fake-500" => {
                return full(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": {"message": "upstream broke", "type": "server_error"}}),
                )
            }
            "fake-redirect" | "fake-redirect-same" => {
                let to = if model == "fake-redirect" {
                    "http://127.0.0.2:1/elsewhere"
                } else {
                    "/v1/elsewhere"
                };
                return Response::builder()
                    .status(StatusCode::FOUND)
                    .header("location", to)
                    .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
                    .expect("response");
            }
            _ => {}
        }
        let cut = model == "fake-cut";
        let slow = model == "fake-slow";
        if !stream {
            let body = if anthropic {
                json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                       "content": [{"type": "text", "text": "hello from the fake upstream"}],
                       "stop_reason": "end_turn", "stop_sequence": null,
                       "usage": anthropic_usage})
            } else {
                json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello from the fake upstream"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})
            };
            let text = Bytes::from(body.to_string());
            if cut {
                // A length promised, half of it sent, then the connection cut.
                let half = text.slice(..text.len() / 2);
                return Response::builder()
                    .header("content-type", "application/json")
                    .header("content-length", text.len())
                    .body(streamed(vec![half], Duration::ZERO, true))
                    .expect("response");
            }
            if slow {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            return full(StatusCode::OK, body);
        }
        let n = if slow { 50 } else { 3 };
        let events: Vec<(Option<&str>, Value)> = if anthropic {
            // The input (and cache writes) in message_start; the output in the delta.
            let mut start_usage = anthropic_usage.clone();
            start_usage["output_tokens"] = json!(1);
            let mut ev = vec![
                (
                    Some("message_start"),
                    json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
                ),
                (
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
            ];
            for i in 0..n {
                ev.push((Some("content_block_delta"), json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("w{i} ")}})));
            }
            ev.push((
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            ));
            ev.push((Some("message_delta"), json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": output}})));
            ev.push((Some("message_stop"), json!({"type": "message_stop"})));
            ev
        } else {
            let include_usage = json
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let usage_null = if include_usage {
                json!({"usage": null})
            } else {
                json!({})
            };
            let chunk = |delta: Value, finish: Value| {
                let mut c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                if let (Some(c), Some(u)) = (c.as_object_mut(), usage_null.as_object()) {
                    c.extend(u.clone());
                }
                c
            };
            let mut ev = vec![(
                None,
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            )];
            for i in 0..n {
                ev.push((
                    None,
                    chunk(json!({"content": format!("w{i} ")}), Value::Null),
                ));
            }
            ev.push((None, chunk(json!({}), json!("stop"))));
            if include_usage {
                ev.push((None, json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
                                      "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})));
            }
            ev
        };
        let mut chunks = sse(&events);
        if !anthropic {
            chunks.push(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        if cut {
            chunks.truncate(2);
        }
        let every = if slow {
            Duration::from_millis(200)
        } else if cut {
            Duration::from_millis(20)
        } else {
            Duration::ZERO
        };
        Response::builder()
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(streamed(chunks, every, cut))
            .expect("response")
    }
}
