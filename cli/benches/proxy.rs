//! The model proxy's cost, side by side in one run: the same fake upstream (testkit's)
//! called directly and through `tally serve --proxy-listen` (this build's `tally`), at 1,
//! 8 and 64 clients, plain and streaming, for four request shapes: a short Chat
//! Completions call, a short Responses call (the OpenAI Agents SDK's default API), a
//! short Bedrock Converse call (the proxy signs it with SigV4; its stream is AWS
//! event-stream frames; the fake answers it unsigned when called directly), and a
//! Claude Code-sized Messages call (its recorded first turn, 12 tools and three
//! `cache_control` markers, padded to 76 KB); and proxied calls per second against the
//! gate's own checks per second (a check and its outcome, the two decisions a proxied
//! call records) on the agent socket, same daemon, same clients.
//!
//! ```text
//! cargo bench -p tally-cli --bench proxy                  # TALLY_BENCH_SECS=3 per line
//! TALLY_BENCH_ONLY=1,8 cargo bench -p tally-cli --bench proxy
//! TALLY_BENCH_SHAPES=responses,messages,converse cargo bench -p tally-cli --bench proxy
//! ```
//! Each client is a closed loop on one keep-alive connection. Latency of a plain call:
//! request sent to the whole answer read; of a streaming call: to the first byte of the
//! body (time to first byte). "added" is proxied minus direct at the same percentile.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tally_testkit::upstream::{FakeOptions, FakeUpstream};

mod common;

use common::{only, runs, secs, us, Daemon};

const KEY: &str = "sk-bench-real-key";

/// Where a client sends its calls: an address, the path prefix and the key it sends.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    prefix: String,
    key: String,
}

/// What one call is: an API and a body size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// A short Chat Completions call (`/openai/v1/chat/completions`).
    Chat,
    /// A short Responses call (`/openai/v1/responses`), the Agents SDK's default.
    Responses,
    /// Claude Code's recorded turn padded to [`MESSAGES_BYTES`] (`/anthropic/v1/messages`).
    Messages,
    /// A short Bedrock Converse call (`/bedrock/model/fake-ok/converse`, or
    /// `converse-stream`).
    Converse,
}

/// A Claude Code-sized Messages body: its system prompt and tools grow with the session.
const MESSAGES_BYTES: usize = 76 * 1024;

/// Claude Code 2.1.332's first turn of `claude -p hello`, as the proxy's unit tests hold it.
const CLAUDE_CODE: &[u8] = include_bytes!("../../proxy/testdata/claude-code-2.1.332-messages.json");

impl Shape {
    fn all() -> Vec<Shape> {
        let named = std::env::var("TALLY_BENCH_SHAPES").ok();
        [
            Shape::Chat,
            Shape::Responses,
            Shape::Messages,
            Shape::Converse,
        ]
        .into_iter()
        .filter(|s| {
            named
                .as_deref()
                .is_none_or(|n| n.split(',').any(|x| x == s.name()))
        })
        .collect()
    }

    fn name(self) -> &'static str {
        match self {
            Shape::Chat => "chat",
            Shape::Responses => "responses",
            Shape::Messages => "messages",
            Shape::Converse => "converse",
        }
    }

    /// The upstream's name in the policy, which is the proxy's path prefix.
    fn upstream(self) -> &'static str {
        match self {
            Shape::Chat | Shape::Responses => "openai",
            Shape::Messages => "anthropic",
            Shape::Converse => "bedrock",
        }
    }

    fn path(self, stream: bool) -> &'static str {
        match self {
            Shape::Chat => "/v1/chat/completions",
            Shape::Responses => "/v1/responses",
            Shape::Messages => "/v1/messages",
            Shape::Converse if stream => "/model/fake-ok/converse-stream",
            Shape::Converse => "/model/fake-ok/converse",
        }
    }

    /// The body of client `c`'s `n`-th call; every call differs (no loop bar is near).
    fn body(self, c: usize, n: u64, stream: bool, messages: &serde_json::Value) -> Bytes {
        let text = format!("client {c} call {n}");
        let body = match self {
            Shape::Chat => json!({"model": "fake-ok", "max_tokens": 100, "stream": stream,
                "messages": [{"role": "user", "content": text}]}),
            Shape::Responses => json!({"model": "fake-ok", "max_output_tokens": 100,
                "stream": stream, "input": text}),
            Shape::Converse => json!({"inferenceConfig": {"maxTokens": 100},
                "messages": [{"role": "user", "content": [{"text": text}]}]}),
            Shape::Messages => {
                let mut b = messages.clone();
                b["stream"] = json!(stream);
                b["messages"][0]["content"][1]["text"] = json!(text);
                b
            }
        };
        Bytes::from(body.to_string())
    }

    /// The key header: Anthropic's clients send `x-api-key`, OpenAI's a bearer token.
    fn key_header(self, key: &str) -> (hyper::header::HeaderName, String) {
        match self {
            Shape::Messages => (
                hyper::header::HeaderName::from_static("x-api-key"),
                key.to_owned(),
            ),
            _ => (hyper::header::AUTHORIZATION, format!("Bearer {key}")),
        }
    }
}

/// Claude Code's turn for `fake-ok`, at most 100 output tokens, its system prompt padded
/// so that the body is [`MESSAGES_BYTES`] long.
fn messages_body() -> serde_json::Value {
    let mut b: serde_json::Value = serde_json::from_slice(CLAUDE_CODE).expect("the recorded turn");
    b["model"] = json!("fake-ok");
    b["max_tokens"] = json!(100);
    let short = b.to_string().len();
    let pad = MESSAGES_BYTES.saturating_sub(short + 40);
    b["system"]
        .as_array_mut()
        .expect("a system prompt in blocks")
        .push(json!({"type": "text", "text": "x".repeat(pad)}));
    b
}

/// What a line of the benchmark measured.
struct Measured {
    latencies: Vec<Duration>,
    calls: u64,
    elapsed: Duration,
    failures: u64,
}

impl Measured {
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// One closed loop per target for `secs()`, each on its own connection (through the
/// proxy each client has its own run's token).
async fn load(targets: Vec<Target>, shape: Shape, stream: bool) -> Measured {
    let deadline = Instant::now() + secs();
    let messages = Arc::new(messages_body());
    let failures = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = vec![];
    for (c, target) in targets.into_iter().enumerate() {
        let failures = Arc::clone(&failures);
        let messages = Arc::clone(&messages);
        tasks.push(tokio::spawn(async move {
            let mut lat = vec![];
            let (key_name, key_value) = shape.key_header(&target.key);
            let tcp = tokio::net::TcpStream::connect(target.addr)
                .await
                .expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
                    .await
                    .expect("handshake");
            tokio::spawn(conn);
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = shape.body(c, n, stream, &messages);
                let req = Request::post(format!("{}{}", target.prefix, shape.path(stream)))
                    .header(hyper::header::HOST, "127.0.0.1")
                    .header(&key_name, &key_value)
                    .header("anthropic-version", "2023-06-01")
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(body))
                    .expect("request");
                let t = Instant::now();
                if sender.ready().await.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                let Ok(response) = sender.send_request(req).await else {
                    failures.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                if !response.status().is_success() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                let mut body = response.into_body();
                let mut first = None;
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    if first.is_none() {
                        first = Some(t.elapsed());
                    }
                }
                lat.push(if stream {
                    first.unwrap_or_else(|| t.elapsed())
                } else {
                    t.elapsed()
                });
            }
            lat
        }));
    }
    let mut latencies = vec![];
    for t in tasks {
        latencies.extend(t.await.expect("client"));
    }
    let elapsed = start.elapsed();
    latencies.sort();
    Measured {
        calls: latencies.len() as u64,
        latencies,
        elapsed,
        failures: failures.load(Ordering::Relaxed),
    }
}

/// The gate's own checks: `clients` closed loops of a check and its outcome on the agent
/// socket, each client its own run.
async fn checks(socket: &Path, runs: &[String]) -> Measured {
    let (per_client, elapsed) = common::check_pairs(socket, runs).await;
    let mut latencies: Vec<Duration> = per_client.into_iter().flatten().collect();
    latencies.sort();
    Measured {
        calls: latencies.len() as u64,
        latencies,
        elapsed,
        failures: 0,
    }
}

fn daemon(upstream: &FakeUpstream) -> Daemon {
    let dir = common::ledger_dir();
    let d = dir.path();
    // Nothing but the budget in the way: rates off, loop bars out of reach.
    let policy = format!(
        "max_open_runs_per_uid = 100000\n\
         [ceiling]\nattempts = 1000000000\nspend_cents = 1000000000\n\
         [loops]\ntool_calls = 1000000000\nidentical_in_window = 1000000\n\
         [rate]\nrun_per_sec = 0\nrun_burst = 0\ntool_per_sec = 0\ntool_burst = 0\ntool_in_flight = 0\n\
         [upstreams.openai]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"real\"\n\
         paths = [\"/v1/chat/completions\", \"/v1/responses\"]\n\
         [upstreams.anthropic]\nurl = \"{url}\"\nkind = \"anthropic\"\ncredential = \"real\"\n\
         paths = [\"/v1/messages\"]\nmax_request_bytes = 1048576\n\
         [upstreams.bedrock]\nurl = \"{url}\"\nkind = \"bedrock\"\ncredential = \"aws\"\n\
         aws_region = \"{region}\"\npaths = [\"/model\"]\n\
         [prices.bedrock.\"fake-ok\"]\ninput_per_mtok = \"0.80\"\noutput_per_mtok = \"4\"\n\
         max_output_tokens = 8192\n\
         [prices.openai.\"fake-ok\"]\ninput_per_mtok = \"0.15\"\noutput_per_mtok = \"0.60\"\n\
         max_output_tokens = 16384\n\
         [prices.anthropic.\"fake-ok\"]\ninput_per_mtok = \"5\"\noutput_per_mtok = \"25\"\n\
         cache_write_per_mtok = \"6.25\"\ncached_input_per_mtok = \"0.50\"\n\
         tool_prompt_tokens = 346\nmax_output_tokens = 128000\n",
        url = upstream.url(),
        region = tally_testkit::upstream::AWS_REGION,
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    for (file, secret) in [
        ("real.key", KEY),
        ("aws.key", tally_testkit::upstream::AWS_CREDENTIAL),
    ] {
        std::fs::write(d.join(file), secret).expect("key");
        std::fs::set_permissions(
            d.join(file),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
    }
    Daemon::serve(
        dir,
        "--proxy-listen",
        &[
            "--credential",
            "real=real.key",
            "--credential",
            "aws=aws.key",
        ],
    )
}

fn added(a: Duration, b: Duration) -> String {
    format!("{:.0}", (a.as_secs_f64() - b.as_secs_f64()) * 1e6)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let upstream = FakeUpstream::start(FakeOptions {
        tls: false,
        key: KEY.into(),
    });
    upstream.accept_unsigned_bedrock();
    let daemon = daemon(&upstream);
    let direct_addr: SocketAddr = upstream
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the fake upstream's address");
    let clients = only().unwrap_or_else(|| vec![1, 8, 64]);
    println!(
        "one run, {:?} per line; latencies in µs; messages bodies of {} bytes",
        secs(),
        messages_body().to_string().len()
    );
    println!();
    println!("| clients | call | response | direct p50 | proxied p50 | added p50 | direct p99 | proxied p99 | added p99 | direct calls/s | proxied calls/s | failures |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rates = std::collections::BTreeMap::new();
    for &n in &clients {
        for (shape, stream) in Shape::all()
            .into_iter()
            .flat_map(|s| [(s, false), (s, true)])
        {
            let direct = vec![
                Target {
                    addr: direct_addr,
                    prefix: String::new(),
                    key: KEY.into(),
                };
                n
            ];
            let tokens = rt.block_on(runs(
                &daemon.socket,
                &format!("p{n}{}{}", shape.name(), if stream { "s" } else { "" }),
                n,
            ));
            let proxied: Vec<Target> = tokens
                .iter()
                .map(|(_, t)| Target {
                    addr: daemon.addr,
                    prefix: format!("/{}", shape.upstream()),
                    key: t.clone(),
                })
                .collect();
            let d = rt.block_on(load(direct, shape, stream));
            let p = rt.block_on(load(proxied, shape, stream));
            println!(
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} |",
                shape.name(),
                if stream { "stream (TTFB)" } else { "plain" },
                us(d.pct(0.5)),
                us(p.pct(0.5)),
                added(p.pct(0.5), d.pct(0.5)),
                us(d.pct(0.99)),
                us(p.pct(0.99)),
                added(p.pct(0.99), d.pct(0.99)),
                d.rate(),
                p.rate(),
                d.failures + p.failures,
            );
            if !stream && shape == Shape::Chat {
                // The gate's own checks right after, same clients, same daemon.
                let runs: Vec<String> = rt
                    .block_on(runs(&daemon.socket, &format!("g{n}"), n))
                    .into_iter()
                    .map(|(r, _)| r)
                    .collect();
                let g = rt.block_on(checks(&daemon.socket, &runs));
                rates.insert(n, (g.rate(), p.rate()));
            }
        }
    }
    println!();
    println!("| clients | gate checks/s (check + outcome) | proxied calls/s (plain) | ratio |");
    println!("|---|---|---|---|");
    for (n, (g, p)) in rates {
        println!("| {n} | {g:.0} | {p:.0} | {:.2} |", p / g);
    }
}
