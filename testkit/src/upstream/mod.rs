//! A fake model upstream for the proxy's tests: a real HTTP/1.1 server (hyper), over
//! plain HTTP or HTTPS with a certificate from a CA made at start (rcgen), speaking
//! OpenAI's Chat Completions (`/v1/chat/completions`) and Responses (`/v1/responses`)
//! and Anthropic's Messages (`/v1/messages`, a query string allowed) and token counting
//! (`/v1/messages/count_tokens`: `{"input_tokens": N}`, no usage, nothing billed), JSON
//! and streaming, as the official SDKs and real agents read them: Anthropic's stream with
//! its `event:` lines (`message_start`, `ping`, `content_block_*`, `message_delta`,
//! `message_stop`), the Responses stream with its typed events (`response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, ..., `response.completed` (or `response.incomplete`, `response.failed`) carrying the
//! usage), tool calls as `tool_use` blocks, `tool_calls` and `function_call` items.
//!
//! What each request does is chosen by its `model`, so a test in any language steers it
//! with no API of its own:
//!
//! * `fake-ok`: usage 100 input, 50 output tokens (fewer where the request's
//!   `max_tokens` is lower, as a real API never answers past it: the answer then says
//!   it was cut at the limit, as each API says it: Chat's `finish_reason: "length"`,
//!   Anthropic's `stop_reason: "max_tokens"`, Responses' `status: "incomplete"` with
//!   `incomplete_details.reason: "max_output_tokens"`, its stream ending with
//!   `response.incomplete`; a script's answer is its script's, whole, its usage capped
//!   alike);
//! * `fake-usage-I-O`: usage I input, O output tokens (`fake-usage-1000-20`);
//!   `fake-usage-I-O-W-H` (Anthropic) also W cache-write tokens, H of them to the
//!   1-hour cache (`cache_creation_input_tokens`, `cache_creation`); on OpenAI's APIs
//!   W of the I input tokens are cached (`cached_tokens`) and H of the O output tokens
//!   are reasoning tokens (Responses' `reasoning_tokens`);
//! * `fake-bill-tools-T-S`: bills what the body does not carry: 100 input tokens plus T
//!   (the provider's tool-use system prompt) when the body has `tools`, 50 output, and
//!   on Anthropic S web searches (`usage.server_tool_use.web_search_requests`);
//! * `fake-images-T`: 100 input tokens plus T for each image the request holds where
//!   its API takes one (Anthropic `image` parts, in a message or a `tool_result`; Chat
//!   `image_url` parts; Responses `input_image` parts), 50 output;
//! * `fake-tier-NAME`: a request with no `service_tier`, or `auto`, is served at tier
//!   NAME (a named tier is served as named); any model's answer says the tier that
//!   served it, where the request named one (OpenAI `service_tier`, Anthropic
//!   `usage.service_tier`), and [`bill`] prices a tier's answers at the price given as
//!   `MODEL@TIER` (the default tier, `default` or `standard`, at `MODEL`'s);
//! * `fake-cut`: a stream is cut after 2 chunks (no usage); a plain answer is cut
//!   mid-body;
//! * `fake-failed`, `fake-failed-I-O`: a Responses stream that ends with
//!   `response.failed` (`status: "failed"`, an `error`), its `usage` null as OpenAI's
//!   reference shows it, or I input and O output tokens; any other call: 500;
//! * `fake-slow`: one chunk every 200 ms, 50 chunks (a plain answer after 10 s);
//! * `fake-huge-event`: a stream whose second event never ends (17 MiB, no blank line);
//! * `fake-429`: 429 with `Retry-After: 2`; `fake-500`: 500;
//! * `fake-redirect`: 302 to `http://127.0.0.2:1/elsewhere`;
//!   `fake-redirect-same`: 302 to `/v1/elsewhere` on this server; any model a test
//!   gave a `Location` of its own ([`FakeUpstream::redirect`]): 302 there, byte for
//!   byte.
//!
//! A test can also script a conversation under any model name ([`FakeUpstream::script`]):
//! the answer asks for the script's tool calls one by one, the k-th when the request
//! already carries k tool results, then gives the final text. It is read from the request
//! alone, so an agent's retries and parallel requests see the same script.
//!
//! The key must be the one the upstream was started with (`Authorization: Bearer KEY`
//! for OpenAI paths, `x-api-key: KEY` for Anthropic's), else 401. Every request is kept
//! in [`FakeUpstream::seen`], and what each answer billed in [`FakeUpstream::billed`]
//! (an answer whose usage reached the client in full: not errors, cut answers, streams
//! left before their end, `fake-huge-event`, or token counts); [`assert_bill`] prices
//! that bill and compares it with the ledger's ([`Ledger`]), less what the ledger holds
//! or settled without a bill ([`Unbilled`]).

use std::collections::BTreeMap;
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

mod bill;
mod reply;
mod request;

pub use bill::{assert_bill, bill, open_reservations, Ledger, Price, Unbilled};
use reply::{End, Reply, LIMIT_FIELDS};
use request::{api_of, has_tools, images, numbers_after, tool_results, Api, Numbers};

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
    /// Its `max_tokens` (or `max_completion_tokens`, or `max_output_tokens`).
    pub max_tokens: Option<u64>,
    /// Which of `max_tokens`, `max_completion_tokens` and `max_output_tokens` it
    /// carried.
    pub limit_fields: Vec<String>,
    /// Its `stream_options`, as JSON text.
    pub stream_options: Option<String>,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// The body's length in bytes.
    pub body_len: usize,
    /// The `traceparent` and then the `tracestate` values it carried, as received.
    pub trace: Vec<String>,
}

/// What one answer billed, by class of token, as the fake upstream reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    /// The request's path (and query).
    pub path: String,
    /// The request's `model`.
    pub model: String,
    /// Input tokens at the input price (for OpenAI, the prompt less its cached part).
    pub input: u64,
    /// Input tokens read from the cache.
    pub cached: u64,
    /// Input tokens written to the 5-minute cache (Anthropic).
    pub written: u64,
    /// Input tokens written to the 1-hour cache (Anthropic).
    pub written_1h: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Of the output, reasoning tokens (OpenAI Responses).
    pub reasoning: u64,
    /// Server-side web searches (Anthropic `server_tool_use.web_search_requests`).
    pub web_searches: u64,
    /// The billing tier the answer says served it, where it says.
    pub tier: Option<String>,
}

/// One tool call a scripted model asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The tool's name as the agent declared it (`Bash`, `get_weather`).
    pub name: String,
    /// Its input (Anthropic's `input`; OpenAI's `arguments`, as JSON text).
    pub input: Value,
}

/// A scripted conversation ([`FakeUpstream::script`]): the model asks for `calls` in
/// order, then answers `then`.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    /// The tool calls, one per answer.
    pub calls: Vec<ToolCall>,
    /// The final text.
    pub then: String,
    /// Input and output tokens each answer reports.
    pub usage: (u64, u64),
}

impl Script {
    /// The same tool call `n` times, then `then`; 100 input and 50 output tokens a turn.
    pub fn repeat(name: &str, input: Value, n: usize, then: &str) -> Script {
        Script {
            calls: vec![
                ToolCall {
                    name: name.to_owned(),
                    input,
                };
                n
            ],
            then: then.to_owned(),
            usage: (100, 50),
        }
    }
}

/// A running fake upstream; stopped when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    tls: bool,
    ca: Option<tempfile::NamedTempFile>,
    seen: Arc<Mutex<Vec<Seen>>>,
    billed: Arc<Mutex<Vec<Billed>>>,
    scripts: Arc<Mutex<BTreeMap<String, Script>>>,
    redirects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
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
        let billed = Arc::new(Mutex::new(Vec::new()));
        let scripts = Arc::new(Mutex::new(BTreeMap::new()));
        let redirects = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::new(State {
            key: options.key,
            seen: Arc::clone(&seen),
            billed: Arc::clone(&billed),
            scripts: Arc::clone(&scripts),
            redirects: Arc::clone(&redirects),
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
            billed,
            scripts,
            redirects,
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

    /// What every answer so far billed, in order (answers whose usage reached the client
    /// in full).
    pub fn billed(&self) -> Vec<Billed> {
        self.billed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// From now on, requests for `model` follow `script` (the module's doc).
    pub fn script(&self, model: &str, script: Script) {
        self.scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(model.to_owned(), script);
    }

    /// From now on, requests for `model` are answered `302 Found` with `location` as its
    /// `Location`, byte for byte (a tab, a backslash, bytes that are not ASCII).
    pub fn redirect(&self, model: &str, location: &[u8]) {
        self.redirects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(model.to_owned(), location.to_vec());
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
    billed: Arc<Mutex<Vec<Billed>>>,
    scripts: Arc<Mutex<BTreeMap<String, Script>>>,
    redirects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
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

/// What to do once a body has been sent to its end (the fake's bill of an answer).
type AtEnd = Box<dyn FnOnce() + Send + Sync>;

/// A body of `chunks`, each after `every`, then `end`: `Ok` ends it cleanly (then
/// `at_end` runs: the client read it all), `Err` cuts the connection.
fn streamed(chunks: Vec<Bytes>, every: Duration, cut: bool, at_end: Option<AtEnd>) -> Body {
    let s = futures::stream::unfold(
        (chunks.into_iter(), cut, false, at_end),
        move |(mut it, cut, done, at_end)| async move {
            if done {
                return None;
            }
            match it.next() {
                Some(c) => {
                    if !every.is_zero() {
                        tokio::time::sleep(every).await;
                    }
                    Some((Ok(Frame::data(c)), (it, cut, false, at_end)))
                }
                None if cut => {
                    // What was sent reaches the client (hyper flushes it) before the cut.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Err(std::io::Error::other("cut by the fake upstream")),
                        (it, cut, true, at_end),
                    ))
                }
                None => {
                    if let Some(f) = at_end {
                        f();
                    }
                    None
                }
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
        let api = api_of(&path);
        let anthropic = matches!(api, Api::Messages | Api::CountTokens);
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
                    .or_else(|| json.get("max_output_tokens"))
                    .and_then(Value::as_u64),
                limit_fields: LIMIT_FIELDS
                    .iter()
                    .filter(|k| json.get(**k).is_some())
                    .map(|k| (*k).to_owned())
                    .collect(),
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
        let redirect = self
            .redirects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&model)
            .cloned();
        if let Some(to) = redirect {
            return Response::builder()
                .status(StatusCode::FOUND)
                .header(
                    "location",
                    hyper::header::HeaderValue::from_bytes(&to).expect("a header value"),
                )
                .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
                .expect("response");
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
            m if m.starts_with("fake-failed") && !(api == Api::Responses && stream) => {
                return full(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": {"message": "upstream broke", "type": "server_error"}}),
                )
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
        let script = self
            .scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&model)
            .cloned();
        // Whether the answer stops at the request's limit, short of what it would say.
        let mut at_limit = false;
        let n = match model.as_str() {
            // Failed with no usage at all.
            "fake-failed" => Numbers::default(),
            m if m.starts_with("fake-failed-") => {
                let mut next = numbers_after(m, "fake-failed-");
                Numbers {
                    input: next(),
                    output: next(),
                    ..Numbers::default()
                }
            }
            m if m.starts_with("fake-usage-") => {
                let mut next = numbers_after(m, "fake-usage-");
                Numbers {
                    input: next(),
                    output: next(),
                    third: next(),
                    fourth: next(),
                    searches: 0,
                }
            }
            m if m.starts_with("fake-images-") => {
                let each = numbers_after(m, "fake-images-")();
                Numbers {
                    input: 100 + each * images(api, &json),
                    output: 50,
                    ..Numbers::default()
                }
            }
            m if m.starts_with("fake-bill-tools-") => {
                let mut next = numbers_after(m, "fake-bill-tools-");
                let (tool_prompt, searches) = (next(), next());
                Numbers {
                    input: 100 + if has_tools(&json) { tool_prompt } else { 0 },
                    output: 50,
                    searches,
                    ..Numbers::default()
                }
            }
            _ => {
                let (input, output) = script.as_ref().map_or((100, 50), |s| s.usage);
                // As a real API: never more output than the request's limit.
                let limit = LIMIT_FIELDS
                    .iter()
                    .find_map(|k| json.get(*k).and_then(Value::as_u64))
                    .unwrap_or(u64::MAX);
                at_limit = script.is_none() && limit < output;
                Numbers {
                    input,
                    output: output.min(limit),
                    ..Numbers::default()
                }
            }
        };
        if api == Api::CountTokens {
            // Counting is free: an answer with no usage, nothing billed.
            return full(StatusCode::OK, json!({"input_tokens": n.input}));
        }
        // The turn: the script's next tool call while the agent offers tools, else text.
        let call = script.as_ref().and_then(|s| {
            let k = tool_results(api, &json);
            (has_tools(&json) && k < s.calls.len()).then(|| (k, s.calls[k].clone()))
        });
        let text = script
            .as_ref()
            .map_or("hello from the fake upstream".to_owned(), |s| {
                s.then.clone()
            });
        let cut = model == "fake-cut";
        let slow = model == "fake-slow";
        // A failed response bills what its usage says, if it says anything.
        let failed = model.starts_with("fake-failed");
        let unbilled = failed && n.input + n.output == 0;
        // The tier that serves it: the one named, else (`auto`, none) the model's.
        let tier = match json.get("service_tier").and_then(Value::as_str) {
            Some("default") if !anthropic => Some("default".to_owned()),
            Some("standard_only") => Some("standard".to_owned()),
            Some(t) if t != "auto" => Some(t.to_owned()),
            _ => model
                .strip_prefix("fake-tier-")
                .map(str::to_owned)
                .or_else(|| {
                    json.get("service_tier")
                        .map(|_| if anthropic { "standard" } else { "default" }.to_owned())
                }),
        };
        let billed = match api {
            Api::Messages => Billed {
                input: n.input,
                written: n.third.saturating_sub(n.fourth),
                written_1h: n.fourth.min(n.third),
                output: n.output,
                web_searches: n.searches,
                ..Billed::default()
            },
            _ => Billed {
                input: n.input - n.third.min(n.input),
                cached: n.third.min(n.input),
                output: n.output,
                reasoning: n.fourth.min(n.output),
                ..Billed::default()
            },
        };
        // Billed once the answer's usage has reached the client: never for a cut answer or
        // one with no usage, a stream only at its end (not one the client left).
        let billed = (!cut && !unbilled && model != "fake-huge-event").then(|| Billed {
            path: path.clone(),
            model: model.clone(),
            tier: tier.clone(),
            ..billed
        });
        let log = Arc::clone(&self.billed);
        let bill: AtEnd = Box::new(move || {
            if let Some(b) = billed {
                log.lock().unwrap_or_else(|e| e.into_inner()).push(b);
            }
        });
        let reply = Reply {
            model: &model,
            tier: tier.as_deref(),
            n,
            call: call.as_ref(),
            text: &text,
            scripted: script.is_some(),
            end: if failed {
                End::Failed
            } else if at_limit {
                End::AtLimit
            } else {
                End::Done
            },
        };
        if !stream {
            let body = match api {
                Api::Messages => reply.message(),
                Api::Responses => reply.response(true),
                _ => reply.completion(),
            };
            let text = Bytes::from(body.to_string());
            if cut {
                // A length promised, half of it sent, then the connection cut.
                let half = text.slice(..text.len() / 2);
                return Response::builder()
                    .header("content-type", "application/json")
                    .header("content-length", text.len())
                    .body(streamed(vec![half], Duration::ZERO, true, None))
                    .expect("response");
            }
            if slow {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            bill();
            return full(StatusCode::OK, body);
        }
        let pieces = if slow { 50 } else { 3 };
        let mut chunks = match api {
            Api::Messages => sse(&reply.message_events(pieces)),
            Api::Responses => sse(&reply.response_events(pieces)),
            _ => {
                let include_usage = json
                    .pointer("/stream_options/include_usage")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let mut c = sse(&reply.completion_chunks(pieces, include_usage));
                c.push(Bytes::from_static(b"data: [DONE]\n\n"));
                c
            }
        };
        if cut {
            chunks.truncate(2);
        }
        if model == "fake-huge-event" {
            // After its first events, one event that never ends: 17 MiB of data in 1 MiB
            // chunks, no blank line (a stream no API sends).
            chunks.truncate(1);
            chunks.push(Bytes::from_static(b"data: "));
            chunks.extend((0..17).map(|_| Bytes::from(vec![b'x'; 1 << 20])));
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
            .body(streamed(chunks, every, cut, Some(bill)))
            .expect("response")
    }
}
