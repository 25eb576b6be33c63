//! The MCP gateway's calls per second, side by side in one run: an MCP server on
//! Streamable HTTP written with rmcp (the official Rust SDK; one tool, `lookup`, answered at
//! once) called (a) directly and (b) through `tally serve --mcp-listen` (this build's
//! `tally`, the server named `[mcp.remote]`), by rmcp Streamable HTTP clients, 1 and 64
//! sessions, each a closed loop of `tools/call`, spread over this bench's tokio runtime;
//! and (c) the gate's own check + outcome pairs per second on the same daemon's agent
//! socket with as many clients (what the gateway asks the gate per call).
//!
//! ```text
//! cargo bench -p tally-cli --bench mcp_gateway            # TALLY_BENCH_SECS=3 per line
//! TALLY_BENCH_ONLY=64 TALLY_BENCH_SECS=5 cargo bench -p tally-cli --bench mcp_gateway
//! ```
//! Each session is its own reqwest client (its own connections), opened and listed before
//! the loops start; through the gateway each session is its own run (its run's token as
//! the bearer credential). Latency: `tools/call` sent to its result read. The daemon's CPU
//! is read from `/proc/PID/stat` (user + system, in the kernel's 100 Hz ticks) before and
//! after each line.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

mod common;

use common::{only, runs, secs, us, Daemon};

struct Lookup;

impl ServerHandler for Lookup {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bench-lookup", "1"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"key": {"type": "string"}}});
        let serde_json::Value::Object(schema) = schema else {
            unreachable!("an object")
        };
        let tool = Tool::new("lookup", "look a key up", schema)
            .annotate(ToolAnnotations::new().read_only(true));
        Ok(ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let key = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("key"))
            .and_then(|k| k.as_str())
            .unwrap_or("");
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![
            ContentBlock::text(format!("value of {key}")),
        ])))
    }
}

/// Serve [`Lookup`] on Streamable HTTP (rmcp's service, rmcp's default configuration) on
/// a free port of 127.0.0.1, HTTP/1.1 over hyper as rmcp's examples do; its address.
async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = StreamableHttpService::new(
        || Ok(Lookup),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

type Session = RunningService<RoleClient, ()>;

/// Open a session at `url` (with `token` as its bearer credential), initialized and its
/// tools listed.
async fn open(url: String, token: Option<String>) -> Session {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(t) = token {
        config = config.auth_header(t);
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client");
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let session = ().serve(transport).await.expect("initialize");
    session.list_tools(None).await.expect("tools/list");
    session
}

/// What a line of the benchmark measured.
struct Measured {
    latencies: Vec<Duration>,
    elapsed: Duration,
    failures: u64,
    /// The daemon's CPU over the line, in seconds (none for the direct line).
    cpu: Option<f64>,
}

impl Measured {
    fn new(per_client: Vec<(Vec<Duration>, u64)>, elapsed: Duration) -> Measured {
        let mut latencies = vec![];
        let mut failures = 0;
        for (l, f) in per_client {
            latencies.extend(l);
            failures += f;
        }
        latencies.sort();
        Measured {
            latencies,
            elapsed,
            failures,
            cpu: None,
        }
    }
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
    /// The daemon's CPU per call, in µs.
    fn cpu_per_call(&self) -> String {
        match self.cpu {
            Some(c) if !self.latencies.is_empty() => {
                format!("{:.0}", c * 1e6 / self.latencies.len() as f64)
            }
            _ => "-".into(),
        }
    }
}

/// Every session a closed loop of `tools/call` of `tool` for `secs()`, all started
/// together once every session is open.
async fn calls(sessions: Vec<Session>, tool: &'static str) -> Measured {
    let start = Instant::now();
    let deadline = start + secs();
    let mut tasks = vec![];
    for (c, session) in sessions.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut failures, mut n) = (vec![], 0u64, 0u64);
            while Instant::now() < deadline {
                n += 1;
                let mut args = serde_json::Map::new();
                args.insert("key".into(), json!(format!("s{c}-{n}")));
                let t = Instant::now();
                match session
                    .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
                    .await
                {
                    Ok(r) if r.is_error != Some(true) => lat.push(t.elapsed()),
                    _ => failures += 1,
                }
            }
            let _ = session.cancel().await;
            (lat, failures)
        }));
    }
    let mut per_client = vec![];
    for t in tasks {
        per_client.push(t.await.expect("session"));
    }
    Measured::new(per_client, start.elapsed())
}

/// The gate's own checks: closed loops of a check and its outcome on the agent socket,
/// each client its own run (as the proxy bench does).
async fn checks(socket: &Path, runs: &[String]) -> Measured {
    let (per_client, elapsed) = common::check_pairs(socket, runs).await;
    Measured::new(per_client.into_iter().map(|l| (l, 0)).collect(), elapsed)
}

/// The daemon's user + system CPU so far, in seconds (`/proc/PID/stat`'s utime and
/// stime, in USER_HZ ticks: 100 a second on Linux).
fn cpu(daemon: &Daemon) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", daemon.child.id())).ok()?;
    // Fields after the command's closing parenthesis: state is field 3, utime 14.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn daemon(server: SocketAddr) -> Daemon {
    let dir = common::ledger_dir();
    let d = dir.path();
    // Nothing but the budget in the way: rates off, loop bars and the breaker out of reach.
    let policy = format!(
        "max_open_runs_per_uid = 100000\n\
         [ceiling]\nattempts = 1000000000\nside_effects = 1000000000\nspend_cents = 1000000000\n\
         [loops]\ntool_calls = 1000000000\nidentical_in_window = 1000000\n\
         [rate]\nrun_per_sec = 0\nrun_burst = 0\ntool_per_sec = 0\ntool_burst = 0\ntool_in_flight = 0\n\
         [breaker]\nfailures = 1000000\n\
         [mcp.remote]\nurl = \"http://{server}/mcp\"\n"
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    Daemon::serve(dir, "--mcp-listen", &["--max-connections-per-peer", "1024"])
}

/// One count of sessions: direct, through the gateway, then the gate's checks.
fn line(rt: &tokio::runtime::Runtime, daemon: &Daemon, server: SocketAddr, n: usize) {
    let direct_url = format!("http://{server}/mcp");
    let sessions = rt.block_on(futures::future::join_all(
        (0..n).map(|_| open(direct_url.clone(), None)),
    ));
    let d = rt.block_on(calls(sessions, "lookup"));

    let tokens = rt.block_on(runs(&daemon.socket, &format!("m{n}"), n));
    let gateway_url = format!("http://{}/mcp", daemon.addr);
    let sessions = rt.block_on(futures::future::join_all(
        tokens
            .iter()
            .map(|(_, t)| open(gateway_url.clone(), Some(t.clone()))),
    ));
    let before = cpu(daemon);
    let mut g = rt.block_on(calls(sessions, "remote__lookup"));
    g.cpu = before.zip(cpu(daemon)).map(|(b, a)| a - b);

    let names: Vec<String> = rt
        .block_on(runs(&daemon.socket, &format!("g{n}"), n))
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let before = cpu(daemon);
    let mut c = rt.block_on(checks(&daemon.socket, &names));
    c.cpu = before.zip(cpu(daemon)).map(|(b, a)| a - b);

    println!(
        "| {n} | {:.0} | {:.0} | {:.0} | {:.2} | {:.3} | {}/{} | {}/{} | {}/{} | {} | {} | {} |",
        d.rate(),
        g.rate(),
        c.rate(),
        g.rate() / d.rate(),
        g.rate() / c.rate(),
        us(d.pct(0.5)),
        us(d.pct(0.99)),
        us(g.pct(0.5)),
        us(g.pct(0.99)),
        us(c.pct(0.5)),
        us(c.pct(0.99)),
        g.cpu_per_call(),
        c.cpu_per_call(),
        d.failures + g.failures,
    );
}

fn main() {
    // reqwest is built with rustls and no crypto provider of its own (as the gateway's):
    // the process-wide one, ring, as tally's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt.block_on(server());
    let daemon = daemon(server);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "one run, {:?} per line; latencies in µs; load average at the start: {}",
        secs(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!("| sessions | direct calls/s | gateway calls/s | gate check+outcome/s | gateway / direct | gateway / gate | direct p50/p99 | gateway p50/p99 | check p50/p99 | daemon CPU µs per gateway call | per check+outcome | failures |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in only().unwrap_or_else(|| vec![1, 64]) {
        line(&rt, &daemon, server, n);
    }
}
