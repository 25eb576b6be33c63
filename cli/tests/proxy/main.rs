//! The HTTP/model proxy end to end: the real `tally serve` with
//! `--proxy-listen`, a real agent socket, and the fake upstream (testkit) over HTTP and
//! HTTPS; every ledger verifies clean afterwards.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tally_testkit::upstream::{
    assert_bill, open_reservations, FakeOptions, FakeUpstream, Ledger, Price, Unbilled,
};
use tally_testkit::{Daemon, Tally};

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

/// $10 per million input tokens, $1,000 per million output tokens ($0.001 each), at most
/// 100 output tokens: `fake-ok` (100 in, 50 out) costs $0.051 (51,000,000 nanodollars),
/// where its request is at least 100 bytes (the input bound).
fn policy(upstream: &FakeUpstream, spend_cents: u64) -> String {
    let ca = upstream
        .ca_pem()
        .map(|p| format!("ca_file = {:?}\n", p.display().to_string()))
        .unwrap_or_default();
    let mut text = format!(
        r#"
[ceiling]
spend_cents = {spend_cents}
attempts = 1000
side_effects = 1000
[loops]
identical_consecutive = 1000
identical_in_window = 1000
tool_calls = 1000
[rate]
run_per_sec = 0
tool_per_sec = 0
tool_in_flight = 0

[upstreams.openai]
url = "{url}"
kind = "openai"
credential = "openai"
paths = ["/v1/chat/completions"]
max_request_bytes = 4096
{ca}
[upstreams.anthropic]
url = "{url}"
kind = "anthropic"
credential = "anthropic"
paths = ["/v1/messages"]
{ca}
"#,
        url = upstream.url()
    );
    for up in ["openai", "anthropic"] {
        for model in [
            "fake-ok",
            "fake-cut",
            "fake-slow",
            "fake-redirect",
            "fake-redirect-same",
            "fake-crafted-redirect",
            "fake-500",
            "fake-429",
        ] {
            text.push_str(&format!(
                "[prices.{up}.\"{model}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n"
            ));
        }
    }
    text
}

/// The prices [`policy`] gives every model, for [`assert_bill`].
fn prices() -> Vec<(&'static str, Price)> {
    [
        "fake-ok",
        "fake-cut",
        "fake-slow",
        "fake-redirect",
        "fake-redirect-same",
        "fake-crafted-redirect",
        "fake-500",
        "fake-429",
    ]
    .into_iter()
    .map(|m| (m, Price::usd(10, 1000)))
    .collect()
}

/// `tally serve` (testkit's [`Daemon`]) with the proxy on a loopback port and on
/// `proxy.sock`; killed on drop.
/// One request on the daemon's Unix socket `socket`: its status and JSON body (`null` if
/// it is not JSON).
async fn on_socket(socket: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut client = tally_api::client::Client::unix(socket)
        .await
        .expect("connect");
    let reply = client
        .request(
            method.parse().expect("method"),
            path,
            body.as_ref().map(|_| "application/json"),
            body.map(|b| b.to_string()).unwrap_or_default(),
        )
        .await
        .expect("request");
    let v = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    (reply.status.as_u16(), v)
}

struct Served {
    daemon: Daemon,
    proxy: SocketAddr,
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

impl Served {
    /// A fresh ledger in `dir`, the policy, the credential files, and the daemon.
    fn new(dir: &Path, policy: &str) -> Served {
        Served::new_with(dir, policy, &[])
    }

    /// [`Served::new`], the daemon given `extra` arguments.
    fn new_with(dir: &Path, policy: &str, extra: &[&str]) -> Served {
        tally().init(dir, policy);
        for (name, secret) in [("openai", "sk-real\n"), ("anthropic", "sk-real")] {
            let f = dir.join(format!("{name}.secret"));
            std::fs::write(&f, secret).expect("secret");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        Served::start_with(dir, extra)
    }

    fn start(dir: &Path) -> Served {
        Served::start_with(dir, &[])
    }

    fn start_with(dir: &Path, extra: &[&str]) -> Served {
        let proxy = free_port();
        let listen = proxy.to_string();
        let mut args = vec![
            "--proxy-listen",
            &listen,
            "--proxy-socket",
            "proxy.sock",
            "--credential",
            "openai=openai.secret",
            "--credential",
            "anthropic=anthropic.secret",
        ];
        args.extend_from_slice(extra);
        let mut daemon = tally().serve(dir, &args);
        // The proxy's socket is bound after the agent's; its TCP port before.
        daemon.wait_for_socket("proxy.sock");
        Served { daemon, proxy }
    }

    fn dir(&self) -> &Path {
        self.daemon.dir()
    }

    async fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        on_socket(&self.daemon.agent_socket(), method, path, body).await
    }

    /// Starts `run`; its token.
    async fn start_run(&self, run: &str) -> String {
        let (status, v) = self
            .agent("POST", "/v1/runs", Some(json!({"run": run})))
            .await;
        assert_eq!(status, 201, "{v}");
        v["token"]
            .as_str()
            .expect("a token in the start answer")
            .to_owned()
    }

    async fn standing(&self, run: &str) -> Value {
        let (status, v) = self.agent("GET", &format!("/v1/runs/{run}"), None).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// The run's standing once nothing is held. An answer read to its end has its outcome
    /// applied before the end reaches the client; an answer the client drops, or one cut
    /// by the proxy, has it applied after, so this waits for that (at most 10 s), never
    /// for a fixed time.
    async fn settled(&self, run: &str) -> Value {
        self.held_back_to(run, 0).await
    }

    /// The run's standing once what it holds is back to `held` nanodollars (the calls
    /// made since have had their outcomes recorded), as [`Served::settled`] waits.
    async fn held_back_to(&self, run: &str, held: u64) -> Value {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.standing(run).await;
            if v["held_nanos"] == held || std::time::Instant::now() > until {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill9(&mut self) {
        self.daemon.kill_9();
    }

    /// A stream of `fake-slow` under way on `token`'s run (the upstream got it), then
    /// the daemon killed with `kill -9` and started again: the new daemon. The client's
    /// stream ends with the old one.
    async fn killed_mid_stream(mut self, upstream: &FakeUpstream, token: &str) -> Served {
        let (addr, auth) = (self.proxy, bearer(token));
        let streaming = tokio::spawn(async move {
            call(
                addr,
                "/openai/v1/chat/completions",
                &[("authorization", &auth)],
                chat("fake-slow", json!({"stream": true, "max_tokens": 50})),
            )
            .await
        });
        let started = Instant::now();
        while upstream.seen().is_empty() {
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Some of the stream has reached the client.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.kill9();
        assert!(
            streaming.await.expect("task").cut,
            "the client's stream ends with the daemon"
        );
        let dir = self.dir().to_owned();
        drop(self);
        Served::start(&dir)
    }

    /// Stops the daemon; `tally verify` finds the ledger intact and replay nothing; the
    /// report.
    fn verifies(&mut self) -> Value {
        self.daemon.stop();
        tally().verifies(self.dir())
    }

    /// [`Served::verifies`], and the upstream's bill is the ledger's, as [`assert_bill`]
    /// compares them: what `upstream` billed at `prices`, plus `settled_unbilled` (what
    /// the ledger settled with no bill: an operator's figure, an error at its
    /// reservation), is what the ledger settled (`tally handoff --json`, every run); what it holds is what the calls no
    /// outcome settled reserved, each run's decisions read back. The report.
    fn verifies_the_bill(
        &mut self,
        upstream: &FakeUpstream,
        prices: &[(&str, Price)],
        settled_unbilled: u64,
    ) -> Value {
        let report = self.verifies();
        let (out, handoffs) = tally().report(self.dir(), "handoff", &[]);
        assert!(out.status.success(), "{handoffs}");
        let held = handoffs["handoffs"]
            .as_array()
            .expect("handoffs")
            .iter()
            .map(|h| open_reservations(&self.decisions(h["run"].as_str().expect("run"))))
            .sum();
        assert_bill(
            &[upstream],
            prices,
            Ledger::handed_off(&handoffs),
            Unbilled {
                held_nanos: held,
                settled_nanos: settled_unbilled,
            },
        );
        report
    }

    /// The decisions of `run`, decrypted (the daemon stopped): each `{seq, decision}`.
    fn decisions(&self, run: &str) -> Vec<Value> {
        tally().decisions(self.dir(), run)
    }

    fn handoff(&self, run: &str) -> Value {
        let (out, v) = tally().report(self.dir(), "handoff", &["--run", run]);
        assert!(out.status.success(), "{v}");
        v["handoffs"][0].clone()
    }
}

/// An answer of the proxy: status, headers, body chunks as received, and whether the
/// body was cut.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    chunks: Vec<Bytes>,
    cut: bool,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.chunks.concat()).unwrap_or(Value::Null)
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.chunks.concat()).into_owned()
    }
}

async fn call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the proxy");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = send
        .send_request(req.body(Full::new(body.into())).expect("request"))
        .await
        .expect("response");
    let (parts, mut body) = response.into_parts();
    let mut chunks = Vec::new();
    let mut cut = false;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    chunks.push(d);
                }
            }
            Some(Err(_)) => {
                cut = true;
                break;
            }
        }
    }
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        chunks,
        cut,
    }
}

/// A chat request for `model` with `extra` members. Its prompt is long enough (over 100
/// bytes) that the fake's usual 100 input tokens fit the input bound: the request the
/// tests make is one the worst case covers, unless a test says otherwise.
fn chat(model: &str, extra: Value) -> Vec<u8> {
    let mut v = json!({"model": model, "messages": [{"role": "user", "content": PROMPT}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v.to_string().into_bytes()
}

/// The tests' prompt: 120 bytes.
const PROMPT: &str = "Summarise the open incidents in the payments queue and list, for each one, its owner, its age and the next step to take.";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

mod bills;
mod bodies;
mod cache;
mod clamp;
mod endpoints;
mod keys;
mod observed;
mod peers;
mod priced;
mod race;
mod responses;
mod sequenced;
mod streams;
mod traced;
mod usage;
mod virtual_keys;
