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
use tally_record::money::{per_million, Nanos};

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

/// A model's prices as a test gives them to the policy, each in nanodollars: per
/// million tokens of each class, and per web search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Per million input tokens.
    pub input_per_mtok: u64,
    /// Per million output tokens.
    pub output_per_mtok: u64,
    /// Per million cached input tokens.
    pub cached_input_per_mtok: u64,
    /// Per million tokens written to the 5-minute cache.
    pub cache_write_per_mtok: u64,
    /// Per million tokens written to the 1-hour cache.
    pub cache_write_1h_per_mtok: u64,
    /// Per web search.
    pub per_web_search: u64,
}

impl Price {
    /// Whole dollars per million input and output tokens (`input_per_mtok = 10`).
    pub fn usd(input_per_mtok: u64, output_per_mtok: u64) -> Price {
        let usd = tally_record::money::NANOS_PER_DOLLAR;
        Price {
            input_per_mtok: input_per_mtok * usd,
            output_per_mtok: output_per_mtok * usd,
            ..Price::default()
        }
    }

    /// What `b` costs at these prices, each class rounded up to the nanodollar as the
    /// proxy rounds it.
    pub fn of(&self, b: &Billed) -> u64 {
        let at = |units: u64, price: u64| {
            per_million(units, Nanos(price))
                .expect("a fake bill fits in u64 nanodollars")
                .0
        };
        at(b.input, self.input_per_mtok)
            + at(b.cached, self.cached_input_per_mtok)
            + at(b.written, self.cache_write_per_mtok)
            + at(b.written_1h, self.cache_write_1h_per_mtok)
            + at(b.output, self.output_per_mtok)
            + b.web_searches * self.per_web_search
    }
}

/// The ledger's side of the bill, as the auditor reads it: each run's handoff `spend`
/// (`tally handoff --json`), summed over the runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Nanodollars settled by outcomes.
    pub settled_nanos: u64,
    /// Nanodollars held: reserved by allowed calls with no settlement yet.
    pub held_nanos: u64,
}

impl Ledger {
    /// Every run's spend in a `tally handoff --json` report (its `handoffs`).
    pub fn handed_off(report: &Value) -> Ledger {
        let handoffs = report["handoffs"]
            .as_array()
            .unwrap_or_else(|| panic!("no handoffs in the handoff report: {report}"));
        Ledger::of(handoffs)
    }

    /// The spend of `handoffs` (each one run's handoff), summed.
    pub fn of(handoffs: &[Value]) -> Ledger {
        let nanos = |h: &Value, what: &str| {
            h["spend"][what]
                .as_u64()
                .unwrap_or_else(|| panic!("no spend.{what} in the handoff: {h}"))
        };
        handoffs.iter().fold(Ledger::default(), |l, h| Ledger {
            settled_nanos: l.settled_nanos + nanos(h, "settled_nanos"),
            held_nanos: l.held_nanos + nanos(h, "reserved_nanos"),
        })
    }
}

/// What the ledger counts that the fake upstream billed nothing for (it bills only
/// answers whose usage reached the client in full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unbilled {
    /// Held: calls whose usage never reached the client (cut, killed, past a deadline),
    /// each held at its reservation ([`open_reservations`]).
    pub held_nanos: u64,
    /// Settled without a bill: an operator's settlement from the provider's own figure,
    /// an `error` settled at its reservation.
    pub settled_nanos: u64,
}

impl Unbilled {
    /// Nothing: every call the ledger counts the upstream billed, and nothing is held.
    pub const NONE: Unbilled = Unbilled {
        held_nanos: 0,
        settled_nanos: 0,
    };
}

/// What the allows among one run's `decisions` (each `{seq, decision}`, as `tally
/// verify-proof --json` lists them; [`crate::Tally::decisions`]) reserved for attempts no
/// outcome settled (none, or only an `unknown` or `timeout` naming no amount): what the
/// ledger must hold for them.
pub fn open_reservations(decisions: &[Value]) -> u64 {
    let attempt = |d: &Value| d["decision"]["attempt"].as_u64();
    let settles = |d: &Value| {
        let d = &d["decision"];
        d["kind"] == "outcome"
            && (d["settled_nanos"].is_u64()
                || !["unknown", "timeout"].contains(&d["status"].as_str().unwrap_or("")))
    };
    let settled: Vec<u64> = decisions
        .iter()
        .filter(|d| settles(d))
        .filter_map(attempt)
        .collect();
    decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .filter(|d| attempt(d).is_some_and(|a| !settled.contains(&a)))
        .map(|d| d["decision"]["reserve_nanos"].as_u64().unwrap_or(0))
        .sum()
}

/// What `upstreams` billed, priced at `prices` (by model; a billed model without a price
/// fails the test), nanodollars.
pub fn bill(upstreams: &[&FakeUpstream], prices: &[(&str, Price)]) -> u64 {
    let prices: BTreeMap<&str, Price> = prices.iter().copied().collect();
    upstreams
        .iter()
        .flat_map(|u| u.billed())
        .map(|b| {
            let key = match b.tier.as_deref() {
                None | Some("default" | "standard") => b.model.clone(),
                Some(t) => format!("{}@{t}", b.model),
            };
            prices
                .get(key.as_str())
                .unwrap_or_else(|| panic!("the fake upstream billed {key} with no price given"))
                .of(&b)
        })
        .sum()
}

/// The one comparison of the upstreams' bill with the ledger, to the nanodollar: every
/// answer `upstreams` billed, priced at `prices` ([`bill`]), plus what the ledger settled
/// without a bill (`unbilled.settled_nanos`), is what the ledger settled; and what the
/// ledger holds is exactly `unbilled.held_nanos`, the reservations of the calls the
/// upstream billed nothing for since their usage never reached the client.
pub fn assert_bill(
    upstreams: &[&FakeUpstream],
    prices: &[(&str, Price)],
    ledger: Ledger,
    unbilled: Unbilled,
) {
    let bill = bill(upstreams, prices);
    let billed: Vec<Billed> = upstreams.iter().flat_map(|u| u.billed()).collect();
    assert_eq!(
        ledger.settled_nanos,
        bill + unbilled.settled_nanos,
        "the ledger settled {} nanodollars; the upstream billed {bill} for {} answers, and \
         {} was settled without a bill: {billed:#?}",
        ledger.settled_nanos,
        billed.len(),
        unbilled.settled_nanos,
    );
    assert_eq!(
        ledger.held_nanos, unbilled.held_nanos,
        "the ledger holds {} nanodollars; the calls the upstream billed nothing for reserved {}",
        ledger.held_nanos, unbilled.held_nanos
    );
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

/// Which API a request is for, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Responses,
    Messages,
    CountTokens,
}

fn api_of(path: &str) -> Api {
    let p = path.split('?').next().unwrap_or("");
    if p.starts_with("/v1/messages/count_tokens") {
        Api::CountTokens
    } else if p.starts_with("/v1/messages") {
        Api::Messages
    } else if p.starts_with("/v1/responses") {
        Api::Responses
    } else {
        Api::Chat
    }
}

/// The usage one answer reports, as the model's name (or its script) chose it.
#[derive(Clone, Copy, Debug, Default)]
struct Numbers {
    input: u64,
    output: u64,
    /// Anthropic: cache writes; OpenAI: cached input tokens (part of `input`).
    third: u64,
    /// Anthropic: 1-hour cache writes (part of `third`); OpenAI: reasoning tokens.
    fourth: u64,
    searches: u64,
}

/// How many tool results the conversation in `json` already carries.
fn tool_results(api: Api, json: &Value) -> usize {
    let items = |key: &str| {
        json.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match api {
        Api::Messages | Api::CountTokens => items("messages")
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("tool_result"))
            .count(),
        Api::Chat => items("messages")
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
            .count(),
        Api::Responses => items("input")
            .iter()
            .filter(|m| m.get("type").and_then(Value::as_str) == Some("function_call_output"))
            .count(),
    }
}

/// How many images `json` holds where its API takes one.
fn images(api: Api, json: &Value) -> u64 {
    let list = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let typed = |v: &Value, t: &str| v.get("type").and_then(Value::as_str) == Some(t);
    let mut n = 0;
    let (items, inner, image) = match api {
        Api::Messages | Api::CountTokens => ("messages", "content", "image"),
        Api::Chat => ("messages", "content", "image_url"),
        Api::Responses => ("input", "content", "input_image"),
    };
    for item in list(json, items) {
        let parts = if typed(&item, "function_call_output") {
            list(&item, "output")
        } else {
            list(&item, inner)
        };
        for part in parts {
            if typed(&part, image) {
                n += 1;
            } else if typed(&part, "tool_result") {
                n += list(&part, "content")
                    .iter()
                    .filter(|c| typed(c, image))
                    .count() as u64;
            }
        }
    }
    n
}

fn has_tools(json: &Value) -> bool {
    json.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
}

/// The numbers after a prefix: `fake-usage-10-5` -> 10, 5, then zeros.
fn numbers_after(model: &str, prefix: &str) -> impl FnMut() -> u64 {
    let mut it = model[prefix.len()..]
        .split('-')
        .map(|n| n.parse::<u64>().unwrap_or(0))
        .collect::<Vec<_>>()
        .into_iter();
    move || it.next().unwrap_or(0)
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

/// The request fields that carry an output limit.
const LIMIT_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// How an answer ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// As the model chose.
    Done,
    /// Cut at the request's output limit.
    AtLimit,
    /// Failed mid-answer (Responses: `response.failed`).
    Failed,
}

/// One answer, in each API's words.
struct Reply<'a> {
    model: &'a str,
    /// The billing tier that served it, said where the request named one.
    tier: Option<&'a str>,
    n: Numbers,
    call: Option<&'a (usize, ToolCall)>,
    text: &'a str,
    /// A script's text is streamed as it is; the models' own answers stream `w0 w1 ...`.
    scripted: bool,
    end: End,
}

/// `text` in `pieces` parts (at least one), as a stream sends it.
fn split(text: &str, pieces: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(pieces.max(1)).max(1);
    let mut out: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

impl Reply<'_> {
    /// The text's deltas, as a stream sends them.
    fn deltas(&self, pieces: usize) -> Vec<String> {
        if self.scripted {
            split(self.text, pieces)
        } else {
            (0..pieces).map(|i| format!("w{i} ")).collect()
        }
    }

    fn arguments(&self) -> String {
        self.call
            .map(|(_, c)| c.input.to_string())
            .unwrap_or_default()
    }

    fn anthropic_usage(&self) -> Value {
        let n = self.n;
        let mut u = json!({"input_tokens": n.input, "output_tokens": n.output});
        if n.third > 0 {
            u["cache_creation_input_tokens"] = json!(n.third);
            u["cache_creation"] = json!({
                "ephemeral_5m_input_tokens": n.third.saturating_sub(n.fourth),
                "ephemeral_1h_input_tokens": n.fourth});
        }
        if n.searches > 0 {
            u["server_tool_use"] = json!({"web_search_requests": n.searches});
        }
        if let Some(t) = self.tier {
            u["service_tier"] = json!(t);
        }
        u
    }

    /// `v` with the top-level `service_tier` OpenAI answers carry, where one is said.
    fn tiered(&self, mut v: Value) -> Value {
        if let Some(t) = self.tier {
            v["service_tier"] = json!(t);
        }
        v
    }

    fn chat_usage(&self) -> Value {
        let n = self.n;
        let mut u = json!({"prompt_tokens": n.input, "completion_tokens": n.output, "total_tokens": n.input + n.output});
        if n.third > 0 {
            u["prompt_tokens_details"] = json!({"cached_tokens": n.third.min(n.input)});
        }
        if n.fourth > 0 {
            u["completion_tokens_details"] = json!({"reasoning_tokens": n.fourth.min(n.output)});
        }
        u
    }

    fn responses_usage(&self) -> Value {
        let n = self.n;
        json!({"input_tokens": n.input,
               "input_tokens_details": {"cached_tokens": n.third.min(n.input)},
               "output_tokens": n.output,
               "output_tokens_details": {"reasoning_tokens": n.fourth.min(n.output)},
               "total_tokens": n.input + n.output})
    }

    /// Anthropic's content block (`tool_use` or `text`) and its stop reason.
    fn block(&self) -> (Value, &'static str) {
        match self.call {
            Some((k, c)) => (
                json!({"type": "tool_use", "id": format!("toolu_fake_{k}"), "name": c.name, "input": c.input}),
                "tool_use",
            ),
            None if self.end == End::AtLimit => {
                (json!({"type": "text", "text": self.text}), "max_tokens")
            }
            None => (json!({"type": "text", "text": self.text}), "end_turn"),
        }
    }

    fn message(&self) -> Value {
        let (block, stop) = self.block();
        json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": self.model,
               "content": [block], "stop_reason": stop, "stop_sequence": null,
               "usage": self.anthropic_usage()})
    }

    fn message_events(&self, pieces: usize) -> Vec<(Option<&'static str>, Value)> {
        // The input (and cache writes) in message_start; the output in the delta.
        let mut start_usage = self.anthropic_usage();
        start_usage["output_tokens"] = json!(1);
        if let Some(u) = start_usage.as_object_mut() {
            u.remove("server_tool_use");
        }
        let (_, stop) = self.block();
        let (opened, deltas) = match self.call {
            Some((k, c)) => (
                json!({"type": "tool_use", "id": format!("toolu_fake_{k}"), "name": c.name, "input": {}}),
                split(&self.arguments(), pieces)
                    .into_iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect::<Vec<_>>(),
            ),
            None => (
                json!({"type": "text", "text": ""}),
                self.deltas(pieces)
                    .into_iter()
                    .map(|t| json!({"type": "text_delta", "text": t}))
                    .collect(),
            ),
        };
        let mut ev = vec![
            (
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
            ),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": opened}),
            ),
            (Some("ping"), json!({"type": "ping"})),
        ];
        for d in deltas {
            ev.push((
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": d}),
            ));
        }
        ev.push((
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}),
        ));
        let mut delta_usage = json!({"output_tokens": self.n.output});
        if self.n.searches > 0 {
            delta_usage["server_tool_use"] = json!({"web_search_requests": self.n.searches});
        }
        ev.push((
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": delta_usage}),
        ));
        ev.push((Some("message_stop"), json!({"type": "message_stop"})));
        ev
    }

    fn completion(&self) -> Value {
        let (message, finish) = match self.call {
            Some((k, c)) => (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_fake_{k}"), "type": "function", "function": {"name": c.name, "arguments": self.arguments()}}]}),
                "tool_calls",
            ),
            None if self.end == End::AtLimit => {
                (json!({"role": "assistant", "content": self.text}), "length")
            }
            None => (json!({"role": "assistant", "content": self.text}), "stop"),
        };
        self.tiered(json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": self.model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "usage": self.chat_usage()}))
    }

    fn completion_chunks(
        &self,
        pieces: usize,
        include_usage: bool,
    ) -> Vec<(Option<&'static str>, Value)> {
        let chunk = |delta: Value, finish: Value| {
            let mut c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": self.model,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let mut ev = Vec::new();
        let finish = match self.call {
            Some((k, c)) => {
                ev.push((None, chunk(json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": format!("call_fake_{k}"), "type": "function", "function": {"name": c.name, "arguments": ""}}]}), Value::Null)));
                for p in split(&self.arguments(), pieces) {
                    ev.push((
                        None,
                        chunk(
                            json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}),
                            Value::Null,
                        ),
                    ));
                }
                "tool_calls"
            }
            None => {
                ev.push((
                    None,
                    chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                ));
                for t in self.deltas(pieces) {
                    ev.push((None, chunk(json!({"content": t}), Value::Null)));
                }
                if self.end == End::AtLimit {
                    "length"
                } else {
                    "stop"
                }
            }
        };
        ev.push((None, chunk(json!({}), json!(finish))));
        if include_usage {
            ev.push((None, self.tiered(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": self.model, "choices": [],
                                  "usage": self.chat_usage()}))));
        }
        ev
    }

    /// The Responses API's output item, complete.
    fn item(&self) -> Value {
        match self.call {
            Some((k, c)) => {
                json!({"type": "function_call", "id": format!("fc_fake_{k}"), "call_id": format!("call_fake_{k}"),
                                   "name": c.name, "arguments": self.arguments(), "status": "completed"})
            }
            None => {
                json!({"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": self.text, "annotations": []}]})
            }
        }
    }

    /// A Responses API `response` object: under way (`in_progress`), with neither output
    /// nor usage; or at its end, with both: `completed`, `incomplete` (cut at the limit:
    /// `incomplete_details.reason` `max_output_tokens`), or `failed` (an `error`, no
    /// output, the usage only where the model's name gives it).
    fn response(&self, done: bool) -> Value {
        let (status, incomplete, error) = match (done, self.end) {
            (false, _) => ("in_progress", Value::Null, Value::Null),
            (true, End::Done) => ("completed", Value::Null, Value::Null),
            (true, End::AtLimit) => (
                "incomplete",
                json!({"reason": "max_output_tokens"}),
                Value::Null,
            ),
            (true, End::Failed) => (
                "failed",
                Value::Null,
                json!({"code": "server_error", "message": "The model failed to generate a response."}),
            ),
        };
        let failed = self.end == End::Failed;
        let usage = if done && !(failed && self.n.input + self.n.output == 0) {
            self.responses_usage()
        } else {
            Value::Null
        };
        let output = if done && !failed {
            json!([self.item()])
        } else {
            json!([])
        };
        self.tiered(
            json!({"id": "resp_fake", "object": "response", "created_at": 1, "status": status,
               "model": self.model, "error": error, "incomplete_details": incomplete,
               "instructions": null, "metadata": {}, "parallel_tool_calls": true,
               "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
               "text": {"format": {"type": "text"}},
               "output": output, "usage": usage}),
        )
    }

    fn response_events(&self, pieces: usize) -> Vec<(Option<&'static str>, Value)> {
        let mut ev: Vec<(&'static str, Value)> = vec![
            (
                "response.created",
                json!({"response": self.response(false)}),
            ),
            (
                "response.in_progress",
                json!({"response": self.response(false)}),
            ),
        ];
        let item = self.item();
        match self.call {
            Some((k, c)) => {
                let id = format!("fc_fake_{k}");
                ev.push(("response.output_item.added", json!({"output_index": 0,
                    "item": {"type": "function_call", "id": id, "call_id": format!("call_fake_{k}"), "name": c.name, "arguments": "", "status": "in_progress"}})));
                for p in split(&self.arguments(), pieces) {
                    ev.push((
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": 0, "delta": p}),
                    ));
                }
                ev.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": 0, "name": c.name, "arguments": self.arguments()}),
                ));
            }
            None => {
                let part =
                    |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
                ev.push(("response.output_item.added", json!({"output_index": 0,
                    "item": {"type": "message", "id": "msg_fake", "status": "in_progress", "role": "assistant", "content": []}})));
                ev.push((
                    "response.content_part.added",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part("")}),
                ));
                for d in split(self.text, pieces) {
                    ev.push((
                        "response.output_text.delta",
                        json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": d, "logprobs": []}),
                    ));
                }
                ev.push((
                    "response.output_text.done",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "text": self.text, "logprobs": []}),
                ));
                ev.push((
                    "response.content_part.done",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part(self.text)}),
                ));
            }
        }
        ev.push((
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        let last = match self.end {
            End::Done => "response.completed",
            End::AtLimit => "response.incomplete",
            End::Failed => "response.failed",
        };
        ev.push((last, json!({"response": self.response(true)})));
        ev.into_iter()
            .enumerate()
            .map(|(i, (name, mut data))| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(i);
                (Some(name), data)
            })
            .collect()
    }
}
