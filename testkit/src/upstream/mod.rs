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
//! Gemini's `generateContent` and `streamGenerateContent?alt=sse`
//! (`/v1beta/models/MODEL:METHOD`, the model the path's) answer in Gemini's words
//! (`candidates`, `usageMetadata`: `fake-usage-I-O-C-T` reports C of the I prompt
//! tokens cached and T of the O output tokens as thoughts); Azure OpenAI's
//! `/openai/deployments/DEPLOYMENT/chat/completions` (the deployment as the model where
//! the body names none) and `/openai/responses` answer as OpenAI's.
//!
//! Bedrock's Converse (`/model/MODEL/converse`, `/converse-stream` in AWS event-stream
//! frames, the model the path's) answers in Bedrock's words ([`bedrock`]); its calls
//! must be SigV4-signed by [`AWS_CREDENTIAL`], checked by botocore.
//!
//! The key must be the one the upstream was started with (`Authorization: Bearer KEY`
//! for OpenAI paths, `x-api-key: KEY` for Anthropic's, `x-goog-api-key: KEY` for
//! Gemini's, `api-key: KEY` for Azure's), in no other key header and no `key=` query,
//! else 401. Every request is kept
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

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper_util::rt::TokioIo;
use serde_json::Value;

mod answer;
mod bedrock;
mod bill;
mod gemini;
mod reply;
mod request;

pub use bedrock::{AWS_CREDENTIAL, AWS_REGION};
pub use bill::{assert_bill, bill, open_reservations, Ledger, Price, Unbilled};

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
    /// The body as received.
    pub body: String,
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
    unsigned_ok: Arc<std::sync::atomic::AtomicBool>,
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
        let unsigned_ok = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::new(State {
            key: options.key,
            seen: Arc::clone(&seen),
            billed: Arc::clone(&billed),
            scripts: Arc::clone(&scripts),
            redirects: Arc::clone(&redirects),
            unsigned_ok: Arc::clone(&unsigned_ok),
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
            unsigned_ok,
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

    /// From now on, Bedrock calls are answered without their signature checked: for
    /// the proxy's benchmark only, which calls the fake directly beside the proxy (the
    /// check is a Python process per call, far slower than what it measures). A test
    /// never calls it.
    pub fn accept_unsigned_bedrock(&self) {
        self.unsigned_ok
            .store(true, std::sync::atomic::Ordering::SeqCst);
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
    unsigned_ok: Arc<std::sync::atomic::AtomicBool>,
}
