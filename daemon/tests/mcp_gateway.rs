//! The MCP gateway (`--mcp-listen`) on the real daemon, its time on a `ManualClock`:
//! only an `initialize` opens a session and starts (or continues) a key's run; other
//! requests without a session, or with one the gateway does not hold, start and spend
//! nothing; the bound on open sessions; idle sessions closed on the clock, the runs they
//! started stopped; bodies over the bound refused unread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tally_ledger::clock::{Clock, ManualClock};
use tally_mcp::gateway::GatewayLimits;
use tally_policy::Recorded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{free_loopback_addr, post_json, Daemon};

pub(crate) const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
pub(crate) const IDLE: Duration = Duration::from_secs(60);

pub(crate) struct Gw {
    pub(crate) daemon: Daemon,
    pub(crate) addr: SocketAddr,
    pub(crate) clock: Arc<ManualClock>,
}

/// A daemon with the gateway on, bounded to `max_sessions` sessions idle at most
/// [`IDLE`], bodies of at most 4096 bytes; one stdio server behind it.
pub(crate) async fn gateway(max_sessions: usize) -> Gw {
    gateway_under("", max_sessions).await
}

/// [`gateway`], `top` (top-level keys) at the head of its policy.
async fn gateway_under(top: &str, max_sessions: usize) -> Gw {
    gateway_with(top, GatewayLimits::new(max_sessions, IDLE, 4096)).await
}

/// [`gateway_under`], with `limits`.
pub(crate) async fn gateway_with(top: &str, limits: GatewayLimits) -> Gw {
    let uid = rustix::process::getuid().as_raw();
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/../mcp/tests/python/server.py");
    let policy = format!(
        "{top}\n[principals.uid.{uid}]\nruns = 100\n\n[mcp.local]\ncommand = [\"python3\", \"{server}\"]\n"
    );
    let recorded = Recorded::new(&policy).expect("policy");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let moved = Arc::clone(&clock) as Arc<dyn Clock>;
    let addr = free_loopback_addr();
    let daemon = Daemon::start(move |o| {
        o.policy = recorded;
        o.clock = moved;
        o.mcp_listen = Some(addr);
        o.mcp_limits = limits;
    })
    .await;
    Gw {
        daemon,
        addr,
        clock,
    }
}

impl Gw {
    /// A key of this uid with `runs_per_day`: the key.
    pub(crate) async fn key(&self, runs_per_day: u64) -> String {
        let uid = rustix::process::getuid().as_raw();
        let mut c = self.daemon.client().await;
        let body = json!({"principal": uid, "label": "gw", "runs_per_day": runs_per_day});
        let (status, created) = post_json(&mut c, "/v1/keys", &body.to_string()).await;
        assert_eq!(status, 201, "{created}");
        created["key"].as_str().expect("a key").to_owned()
    }

    /// A run on the agent socket: its token.
    pub(crate) async fn token(&self, run: &str) -> String {
        let mut c = self.daemon.agent().await;
        let body = json!({"run": run, "goal": "gateway test"});
        let (status, v) = post_json(&mut c, "/v1/runs", &body.to_string()).await;
        assert_eq!(status, 201, "{v}");
        v["token"].as_str().expect("a token").to_owned()
    }

    /// The runs the gate holds, by name, with their state.
    pub(crate) async fn runs(&self) -> Vec<(String, String)> {
        let mut c = self.daemon.client().await;
        let reply = c
            .request(
                axum::http::Method::GET,
                "/v1/runs",
                None,
                bytes::Bytes::new(),
            )
            .await
            .expect("runs");
        let v: Value = serde_json::from_slice(&reply.body).expect("json");
        v.as_array()
            .expect("a list")
            .iter()
            .map(|r| {
                (
                    r["run"].as_str().unwrap_or_default().to_owned(),
                    r["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Wait (bounded) until the gate shows `run` stopped: the session's end stops it
    /// in a task of its own.
    pub(crate) async fn stopped(&self, run: &str) {
        for _ in 0..200 {
            if self
                .runs()
                .await
                .iter()
                .any(|(r, s)| r == run && s == "stopped")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{run} was not stopped: {:?}", self.runs().await);
    }
}

/// The headers every request of [`send`] carries.
pub(crate) const USUAL: [(&str, &str); 3] = [
    ("Host", "127.0.0.1"),
    ("Content-Type", "application/json"),
    ("Accept", "application/json, text/event-stream"),
];

/// One HTTP/1.0 request to the gateway: its status, session header and body.
pub(crate) async fn send(
    addr: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Option<String>, String) {
    let all: Vec<(&str, &str)> = USUAL.iter().chain(headers).copied().collect();
    send_only(addr, method, &all, body).await
}

/// [`send`] with only `headers` (and `Content-Length`).
pub(crate) async fn send_only(
    addr: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Option<String>, String) {
    let mut head = format!(
        "{method} /mcp HTTP/1.0\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    raw(addr, format!("{head}{body}").as_bytes()).await
}

/// Bytes written as they are; the answer read to the end of the connection.
pub(crate) async fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, Option<String>, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("an answer within 30 s")
        .ok();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let session = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case("mcp-session-id"))
        .map(|(_, v)| v.trim().to_owned());
    (status, session, body.to_owned())
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// An `initialize` with `token` (and `task`): the new session's id.
pub(crate) async fn open(addr: SocketAddr, token: &str, task: Option<&str>) -> String {
    let auth = bearer(token);
    let mut h = vec![("Authorization", auth.as_str())];
    if let Some(t) = task {
        h.push(("x-tally-task", t));
    }
    let (status, session, body) = send(addr, "POST", &h, INIT).await;
    assert_eq!(status, 200, "initialize: {body}");
    session.expect("a session id")
}

#[tokio::test]
async fn a_key_starts_its_run_only_on_initialize_and_nothing_else_starts_or_spends() {
    let gw = gateway(16).await;
    // One run a day: a request that started one (or counted it) would leave none.
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"local__lookup","arguments":{"key":"k"}}}"#;
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
    let ping = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;
    for body in [call, list, ping] {
        for _ in 0..3 {
            let (status, _, answer) =
                send(gw.addr, "POST", &[("Authorization", &auth)], body).await;
            assert_eq!(status, 400, "no session: {answer}");
            assert!(answer.contains("initialize"), "{answer}");
            let unknown = [
                ("Authorization", auth.as_str()),
                ("Mcp-Session-Id", "not-a-session"),
            ];
            let (status, _, answer) = send(gw.addr, "POST", &unknown, body).await;
            assert_eq!(status, 404, "unknown session: {answer}");
        }
    }
    for method in ["GET", "DELETE"] {
        let (status, _, answer) = send(gw.addr, method, &[("Authorization", &auth)], "").await;
        assert_eq!(status, 400, "{method} without a session: {answer}");
    }
    assert!(
        gw.runs().await.is_empty(),
        "nothing started: {:?}",
        gw.runs().await
    );
    // The initialize starts the key's one run of the day; a second session continues it.
    let first = open(gw.addr, &key, None).await;
    let second = open(gw.addr, &key, None).await;
    assert_ne!(first, second);
    let runs = gw.runs().await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].0.starts_with("key-"), "{runs:?}");
    // A new task is a new run: past the key's one run a day, refused, nothing started.
    let auth_task = [("Authorization", auth.as_str()), ("x-tally-task", "other")];
    let (status, session, answer) = send(gw.addr, "POST", &auth_task, INIT).await;
    assert_eq!((status, session), (429, None), "{answer}");
    // The key's day (RunsExceeded), not the principal's open runs (TooManyRuns).
    assert!(
        answer.contains("may start 1 runs per day") && !answer.contains("open runs"),
        "{answer}"
    );
    assert_eq!(gw.runs().await.len(), 1);
    // The session answers calls, in the key's run.
    let in_first = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", first.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (status, _, _) = send(
        gw.addr,
        "POST",
        &in_first,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!(status, 202);
    let (status, _, answer) = send(gw.addr, "POST", &in_first, call).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("value of k"), "{answer}");
}

#[tokio::test]
async fn an_initialize_rmcp_would_refuse_starts_no_run_and_leaves_the_keys_day() {
    let gw = gateway(4).await;
    // One run a day: a refused initialize that started (or counted) one leaves none.
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let with = |name: &'static str, value: &'static str| -> Vec<(&'static str, &'static str)> {
        USUAL
            .iter()
            .copied()
            .filter(|(n, _)| *n != name)
            .chain([(name, value)])
            .collect()
    };
    let refused = [
        (with("Accept", "application/json"), 406),
        (with("Accept", "text/event-stream"), 406),
        (with("Content-Type", "text/plain"), 415),
        (with("Host", "evil.example"), 403),
        (with("MCP-Protocol-Version", "2099-01-01"), 400),
        (with("MCP-Protocol-Version", "2026-07-28"), 400),
    ];
    for (mut headers, expected) in refused {
        headers.push(("Authorization", auth.as_str()));
        for _ in 0..3 {
            let (status, session, answer) = send_only(gw.addr, "POST", &headers, INIT).await;
            assert_eq!((status, session), (expected, None), "{headers:?}: {answer}");
        }
    }
    assert!(
        gw.runs().await.is_empty(),
        "nothing started: {:?}",
        gw.runs().await
    );
    // The key's one run of the day is still there to start.
    let session = open(gw.addr, &key, None).await;
    assert_eq!(gw.runs().await.len(), 1, "{:?}", gw.runs().await);
    // A call naming the revision without initialize in its _meta: refused, in a session
    // or not (rmcp would serve it outside the session).
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"local__lookup","arguments":{"key":"k"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let in_session = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session.as_str()),
    ];
    for headers in [&in_session[..], &in_session[..1]] {
        let (status, _, answer) = send(gw.addr, "POST", headers, call).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains("_meta"), "{answer}");
    }
}

#[tokio::test]
async fn a_run_started_for_an_initialize_that_opened_no_session_is_stopped() {
    let gw = gateway(4).await;
    let key = gw.key(2).await;
    let auth = bearer(&key);
    // The front's check passes it, the transport refuses it (a weight of 0): the run
    // the initialize started has no session to stop it, so the front stops it.
    let headers = [
        ("Host", "127.0.0.1"),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream;q=0"),
        ("Authorization", auth.as_str()),
    ];
    let (status, session, answer) = send_only(gw.addr, "POST", &headers, INIT).await;
    assert_eq!((status, session), (406, None), "{answer}");
    let runs = gw.runs().await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    gw.stopped(&runs[0].0).await;
}

#[tokio::test]
async fn an_initialize_whose_client_leaves_still_opens_its_session_and_its_run_stops_with_it() {
    let gw = gateway(1).await;
    let key = gw.key(2).await;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{INIT}",
        bearer(&key),
        INIT.len()
    );
    let mut s = tokio::net::TcpStream::connect(gw.addr)
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    drop(s);
    // The run starts although no one reads the answer ...
    let mut run = None;
    for _ in 0..500 {
        run = gw.runs().await.into_iter().next().map(|(r, _)| r);
        if run.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = run.expect("the key's run started");
    // ... and its session holds the one place (from before the run started): the gateway
    // knows it, so the idle bound closes it and stops the run; then the place is free.
    let token = gw.token("t").await;
    let (status, _, answer) =
        send(gw.addr, "POST", &[("Authorization", &bearer(&token))], INIT).await;
    assert_eq!(
        status, 503,
        "the left session holds the one place: {answer}"
    );
    gw.clock.advance(IDLE.as_millis() as u64 + 1);
    gw.stopped(&run).await;
    open(gw.addr, &token, None).await;
}

#[tokio::test]
async fn one_credential_holds_at_most_its_bound_of_sessions() {
    let gw = gateway_with(
        "",
        GatewayLimits::new(16, IDLE, 4096).with_sessions_per_credential(2),
    )
    .await;
    let key = gw.key(2).await;
    let token = gw.token("t").await;
    let first = open(gw.addr, &key, None).await;
    let second = open(gw.addr, &key, None).await;
    let auth = bearer(&key);
    let refused = |bound: &'static str| {
        let name = format!("tally_mcp_refused_sessions_total{{bound=\"{bound}\"}}");
        let daemon = &gw.daemon;
        async move { crate::mcp_connections::metric(daemon, &name).await }
    };
    assert_eq!(refused("credential").await, Some(0));
    let (status, session, answer) = send(gw.addr, "POST", &[("Authorization", &auth)], INIT).await;
    assert_eq!((status, session), (429, None), "{answer}");
    assert!(
        answer.contains("--mcp-max-sessions-per-credential"),
        "{answer}"
    );
    // Counted by its bound, in `/metrics`.
    assert_eq!(refused("credential").await, Some(1));
    assert_eq!(refused("gateway").await, Some(0));
    // Another credential still opens its own.
    open(gw.addr, &token, None).await;
    // A session the key closes gives it its place back; the run goes on in the other.
    let delete = |id: String| {
        let auth = auth.clone();
        async move {
            let h = [
                ("Authorization", auth.as_str()),
                ("Mcp-Session-Id", id.as_str()),
            ];
            let (status, _, answer) = send(gw.addr, "DELETE", &h, "").await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    delete(first).await;
    let third = open(gw.addr, &key, None).await;
    // Its run stopped with the last session on it: not continued, refused clearly.
    delete(second).await;
    delete(third).await;
    let run = gw
        .runs()
        .await
        .into_iter()
        .find(|(r, _)| r.starts_with("key-"))
        .expect("the key's run")
        .0;
    gw.stopped(&run).await;
    let (status, session, answer) = send(gw.addr, "POST", &[("Authorization", &auth)], INIT).await;
    assert_eq!((status, session), (409, None), "{answer}");
    assert!(
        answer.contains("is stopped") && answer.contains("x-tally-task"),
        "{answer}"
    );
    let task = [("Authorization", auth.as_str()), ("x-tally-task", "next")];
    let (status, session, answer) = send(gw.addr, "POST", &task, INIT).await;
    assert_eq!(status, 200, "{answer}");
    assert!(session.is_some());
}

#[tokio::test]
async fn a_body_bound_above_four_mib_holds_past_the_transport() {
    let gw = gateway_with("", GatewayLimits::new(4, IDLE, 8 << 20)).await;
    let token = gw.token("big").await;
    let session = open(gw.addr, &token, None).await;
    let auth = bearer(&token);
    let in_session = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (status, _, _) = send(
        gw.addr,
        "POST",
        &in_session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!(status, 202);
    // 5 MiB: over rmcp's own default bound, within the gateway's.
    let pad = "x".repeat(5 << 20);
    let ping = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"_meta":{{"pad":"{pad}"}}}}}}"#
    );
    let (status, _, answer) = send(gw.addr, "POST", &in_session, &ping).await;
    assert_eq!(status, 200, "{}", &answer[..answer.len().min(300)]);
    assert!(answer.contains(r#""id":7"#), "{answer}");
}

#[tokio::test]
async fn sessions_are_bounded_and_idle_ones_close_on_the_clock_stopping_the_runs_they_started() {
    let gw = gateway(2).await;
    let key = gw.key(10).await;
    let token = gw.token("by-token").await;
    let a = open(gw.addr, &key, Some("a")).await;
    let _t = open(gw.addr, &token, None).await;
    // Full: a third initialize opens nothing and starts nothing.
    let auth = bearer(&key);
    let task_b = [("Authorization", auth.as_str()), ("x-tally-task", "b")];
    let (status, session, answer) = send(gw.addr, "POST", &task_b, INIT).await;
    assert_eq!((status, session), (503, None), "{answer}");
    let runs = gw.runs().await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    let run_a = runs
        .iter()
        .map(|(r, _)| r.clone())
        .find(|r| r.starts_with("key-"))
        .expect("the key's run");
    // Half the idle bound: session a is used, the token's is not.
    gw.clock.advance(IDLE.as_millis() as u64 / 2);
    let in_a = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", a.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (status, _, answer) = send(
        gw.addr,
        "POST",
        &in_a,
        r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Past the bound for the token's session only: it is closed, its place free.
    gw.clock.advance(IDLE.as_millis() as u64 / 2 + 1);
    let b = open(gw.addr, &key, Some("b")).await;
    let t = bearer(&token);
    let in_t = [
        ("Authorization", t.as_str()),
        ("Mcp-Session-Id", _t.as_str()),
    ];
    let (status, _, _) = send(
        gw.addr,
        "POST",
        &in_t,
        r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#,
    )
    .await;
    assert_eq!(status, 404, "the idle session is closed");
    // A run token's run is the agent's: left running.
    assert!(gw
        .runs()
        .await
        .contains(&("by-token".to_owned(), "running".to_owned())));
    // Past the bound for a: closed on the timer (no request needed), its run stopped.
    gw.clock.advance(IDLE.as_millis() as u64 + 1);
    gw.stopped(&run_a).await;
    let (status, _, _) = send(
        gw.addr,
        "POST",
        &in_a,
        r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
    )
    .await;
    assert_eq!(status, 404);
    let _ = b;
}

#[tokio::test]
async fn a_body_over_the_bound_is_refused_unread_and_oversized_headers_are_not_read() {
    let gw = gateway(4).await;
    let token = gw.token("bodies").await;
    let auth = bearer(&token);
    // A Content-Length over the bound with no body sent: answered at once, 413 (a
    // gateway that waited to read it would time the client out).
    let head = format!(
        "POST /mcp HTTP/1.0\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 50000000\r\n\r\n"
    );
    let (status, _, answer) = raw(gw.addr, head.as_bytes()).await;
    assert_eq!(status, 413, "{answer}");
    // A body over the bound with no length (chunked) is cut at the bound: 413.
    let chunk = "x".repeat(8000);
    let chunked = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let (status, _, answer) = raw(gw.addr, chunked.as_bytes()).await;
    assert_eq!(status, 413, "{answer}");
    // Headers past the bound are not read: 431, nothing opened.
    let big = "y".repeat(100 * 1024);
    let (status, session, _) = send(
        gw.addr,
        "POST",
        &[("Authorization", &auth), ("X-Big", &big)],
        INIT,
    )
    .await;
    assert_eq!((status, session), (431, None));
    // Within the bounds, a session opens.
    open(gw.addr, &token, None).await;
}

#[tokio::test]
async fn a_key_run_the_gate_refuses_to_start_gives_its_days_slot_back_once() {
    // The key's uid may hold one open run, and holds one: the key's start is refused.
    let gw = gateway_under("max_open_runs_per_uid = 1", 4).await;
    let key = gw.key(1).await;
    let _held = gw.token("held").await;
    let auth = bearer(&key);
    for _ in 0..3 {
        let (status, session, answer) =
            send(gw.addr, "POST", &[("Authorization", &auth)], INIT).await;
        assert_eq!((status, session), (429, None), "{answer}");
        assert!(
            answer.contains("open runs") || answer.contains("max_open_runs"),
            "{answer}"
        );
    }
    assert_eq!(gw.runs().await.len(), 1, "{:?}", gw.runs().await);
    // Its run ends: the key's one run of the day was never taken by the refused starts.
    let mut c = gw.daemon.agent().await;
    let (status, body) = post_json(&mut c, "/v1/runs/held/stop", "{}").await;
    assert_eq!(status, 200, "{body}");
    open(gw.addr, &key, None).await;
    assert!(gw
        .runs()
        .await
        .iter()
        .any(|(r, s)| r.starts_with("key-") && s == "running"));
    // And that one counted: a second task's run is past the day's one.
    let task = [("Authorization", auth.as_str()), ("x-tally-task", "two")];
    let (status, _, answer) = send(gw.addr, "POST", &task, INIT).await;
    assert_eq!(status, 429, "{answer}");
}
