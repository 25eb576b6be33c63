//! The MCP gateway against what an adversarial client tries, on the real daemon and
//! real HTTP: a protocol version hidden in `params._meta` behind JSON escapes or in a
//! batch; protocol-version headers that disagree with the body or the session (refused
//! before a key's run starts); two sessions on one run (the first to end does not stop
//! it under the other; the last stops it, exactly once); the gateway's stop (the runs
//! its sessions started stopped before it returns); stdio servers that start processes
//! of their own (killed with them).

use std::time::Duration;

use tally_mcp::gateway::GatewayLimits;

use crate::common::walk;
use crate::mcp_gateway::{
    bearer, gateway, gateway_with, open, raw, send, send_only, Gw, IDLE, INIT, USUAL,
};

const CALL: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"local__lookup","arguments":{"key":"k"}}}"#;

/// The stop decisions of `run` in the ledger, after the daemon has stopped.
fn stops(gw: &Gw, run: &str) -> usize {
    walk(&gw.daemon.ledger_dir, &gw.daemon.auditor)
        .entries
        .iter()
        .filter_map(|e| e.decision.as_ref())
        .filter(|d| d.run == run && d.kind() == tally_ledger::Kind::Stop)
        .count()
}

/// The key's run (`key-...`), by name.
async fn key_run(gw: &Gw) -> String {
    gw.runs()
        .await
        .into_iter()
        .map(|(r, _)| r)
        .find(|r| r.starts_with("key-"))
        .expect("the key's run")
}

/// `run`'s state.
async fn state(gw: &Gw, run: &str) -> String {
    gw.runs()
        .await
        .into_iter()
        .find(|(r, _)| r == run)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// A session's request headers: the credential, the session, the version.
fn within<'a>(auth: &'a str, session: &'a str, version: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("Authorization", auth),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", version),
    ]
}

/// One request in a session at the version it negotiated (`2025-06-18`), with the
/// `Authorization` header's value and the session's id.
async fn in_session(
    addr: std::net::SocketAddr,
    method: &str,
    (auth, session): (&str, &str),
    body: &str,
) -> (u16, Option<String>, String) {
    send(addr, method, &within(auth, session, "2025-06-18"), body).await
}

#[tokio::test]
async fn a_protocol_version_in_meta_is_refused_however_its_key_is_written() {
    let gw = gateway(4).await;
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let session = open(gw.addr, &key, None).await;
    let meta = |key: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"local__lookup","arguments":{{"key":"k"}},"_meta":{{{key}:"2026-07-28"}}}}}}"#
        )
    };
    let escaped = [
        r#""io.modelcontextprotocol\u002fprotocolVersion""#,
        r#""io.modelcontextprotocol\/protocolVersion""#,
        r#""\u0069o.modelcontextprotocol\u002FprotocolVersion""#,
    ];
    let mut bodies: Vec<String> = escaped.iter().map(|k| meta(k)).collect();
    bodies.push(format!(
        r#"[{{"jsonrpc":"2.0","id":4,"method":"ping"}},{}]"#,
        meta(escaped[0])
    ));
    let in_session = within(&auth, &session, "2025-06-18");
    for body in &bodies {
        for headers in [&in_session[..], &in_session[..1]] {
            let (status, opened, answer) = send(gw.addr, "POST", headers, body).await;
            assert_eq!((status, opened), (400, None), "{body}: {answer}");
            assert!(answer.contains("_meta"), "{answer}");
            assert!(
                !answer.contains("value of k"),
                "it reached the server: {answer}"
            );
        }
    }
    // A body that is not JSON is refused before anything reads it.
    for body in ["{", "\u{feff}{}", "not json"] {
        let (status, _, answer) = send(gw.addr, "POST", &in_session, body).await;
        assert_eq!(status, 400, "{body:?}: {answer}");
        assert!(answer.contains("not_json"), "{answer}");
    }
    // Nothing else started; the session still answers.
    assert_eq!(gw.runs().await.len(), 1, "{:?}", gw.runs().await);
    let (status, _, answer) = send(gw.addr, "POST", &in_session, CALL).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("value of k"), "{answer}");
}

#[tokio::test]
async fn a_batch_of_two_calls_is_refused_whole_and_neither_reaches_the_server() {
    // A POST's SSE answer is ended with its requests' answers (counted from the body):
    // a batch would hold two, but none is passed on at all.
    let gw = gateway(4).await;
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let session = open(gw.addr, &key, None).await;
    let in_session = within(&auth, &session, "2025-06-18");
    let batch = format!("[{CALL},{}]", CALL.replace(r#""id":2"#, r#""id":3"#));
    let (status, _, answer) = send(gw.addr, "POST", &in_session, &batch).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("batch"), "{answer}");
    assert!(
        !answer.contains("value of k"),
        "it reached the server: {answer}"
    );
    let (status, _, answer) = send(gw.addr, "POST", &in_session, CALL).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("value of k"), "{answer}");
}

#[tokio::test]
async fn a_version_header_other_than_the_initializes_or_the_sessions_spends_nothing() {
    let gw = gateway(4).await;
    // One run a day: a refused request that started (or counted) one would leave none.
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let older = INIT.replace("2025-06-18", "2025-03-26");
    let unreadable = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#;
    let header = [
        ("Authorization", auth.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    for (headers, body) in [(&header[..], older.as_str()), (&header[..1], unreadable)] {
        for _ in 0..3 {
            let (status, session, answer) = send(gw.addr, "POST", headers, body).await;
            assert_eq!((status, session), (400, None), "{answer}");
        }
    }
    assert!(gw.runs().await.is_empty(), "{:?}", gw.runs().await);
    // The key's one run of the day is still there; its session negotiated 2025-06-18.
    let session = open(gw.addr, &key, None).await;
    let run = key_run(&gw).await;
    for other in ["2025-03-26", "2025-11-25"] {
        for (method, body) in [("POST", CALL), ("GET", ""), ("DELETE", "")] {
            let (status, _, answer) =
                send(gw.addr, method, &within(&auth, &session, other), body).await;
            assert_eq!(status, 400, "{method} as {other}: {answer}");
            assert!(answer.contains("negotiated"), "{answer}");
        }
    }
    assert_eq!(gw.runs().await, vec![(run.clone(), "running".to_owned())]);
    let (status, _, answer) = in_session(gw.addr, "POST", (&auth, &session), CALL).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("value of k"), "{answer}");
}

#[tokio::test]
async fn sessions_sharing_a_run_stop_it_once_when_the_last_ends() {
    let mut gw = gateway(8).await;
    let key = gw.key(1).await;
    let auth = bearer(&key);
    let first = open(gw.addr, &key, None).await;
    let second = open(gw.addr, &key, None).await;
    let run = key_run(&gw).await;
    let (status, _, answer) = in_session(gw.addr, "DELETE", (&auth, &first), "").await;
    assert_eq!(status, 200, "{answer}");
    // The session that started the run ended; the other still acts in it.
    let (status, _, answer) = in_session(gw.addr, "POST", (&auth, &second), CALL).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("value of k"), "{answer}");
    assert_eq!(state(&gw, &run).await, "running");
    let (status, _, _) = in_session(gw.addr, "DELETE", (&auth, &second), "").await;
    assert_eq!(status, 200);
    gw.stopped(&run).await;
    // A run token's sessions: the agent's run, never stopped by the gateway.
    let token = gw.token("shared").await;
    let t = bearer(&token);
    let a = open(gw.addr, &token, None).await;
    let b = open(gw.addr, &token, None).await;
    for s in [&a, &b] {
        let (status, _, answer) = in_session(gw.addr, "POST", (&t, s), CALL).await;
        assert!(status == 200 && answer.contains("value of k"), "{answer}");
        let (status, _, _) = in_session(gw.addr, "DELETE", (&t, s), "").await;
        assert_eq!(status, 200);
    }
    assert_eq!(state(&gw, "shared").await, "running");
    gw.daemon.shutdown().await.expect("shutdown");
    assert_eq!(stops(&gw, &run), 1, "the key's run is stopped exactly once");
}

#[tokio::test]
async fn every_run_the_gateway_started_is_stopped_once_before_it_stops() {
    let mut gw = gateway_with("", GatewayLimits::new(8, IDLE, 4096)).await;
    let key = gw.key(3).await;
    let auth = bearer(&key);
    // Refused by the transport after its run started (a weight of 0): stopped at once.
    let zero: Vec<(&str, &str)> = USUAL
        .iter()
        .copied()
        .filter(|(n, _)| *n != "Accept")
        .chain([
            ("Accept", "application/json, text/event-stream;q=0"),
            ("Authorization", auth.as_str()),
            ("x-tally-task", "refused"),
        ])
        .collect();
    let (status, session, answer) = send_only(gw.addr, "POST", &zero, INIT).await;
    assert_eq!((status, session), (406, None), "{answer}");
    let refused = key_run(&gw).await;
    gw.stopped(&refused).await;
    // Two sessions on one run, and one on another, open when the gateway stops.
    open(gw.addr, &key, Some("a")).await;
    open(gw.addr, &key, Some("a")).await;
    open(gw.addr, &key, Some("b")).await;
    let runs: Vec<String> = gw.runs().await.into_iter().map(|(r, _)| r).collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    gw.daemon.shutdown().await.expect("shutdown");
    for run in &runs {
        assert_eq!(stops(&gw, run), 1, "{run} is stopped exactly once");
    }
}

/// The pids written to `file`, one a line.
fn pids(file: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether `pid` is dead: gone, or a zombie no one reaped yet (its parent killed too).
fn dead(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Whether `pid` dies within five seconds (it is killed as the answer goes, and may be
/// reaped just after).
async fn dies(pid: u32) -> bool {
    for _ in 0..250 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_stdio_servers_own_processes_die_with_it_on_a_timeout_and_at_the_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("grandchildren");
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/../mcp/tests/python/server.py");
    // The server starts a process of its own (in its process group) before it serves.
    let top = format!(
        "[rate]\ncall_timeout_ms = 1500\n\n[mcp.forker]\ncommand = [\"sh\", \"-c\", \"sleep 600 & echo $! >> {}; exec python3 {server}\"]\n",
        file.display()
    );
    let mut gw = gateway_with(&top, GatewayLimits::new(8, IDLE, 4096)).await;
    let token = gw.token("forks").await;
    let auth = bearer(&token);
    let session = open(gw.addr, &token, None).await;
    let slow = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"forker__slow","arguments":{"seconds":600}}}"#;
    let (status, _, answer) = in_session(gw.addr, "POST", (&auth, &session), slow).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("did not answer within"), "{answer}");
    let first = pids(&file);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        dies(first[0]).await,
        "the timed-out server's process {} lives",
        first[0]
    );
    // The next call starts the server again, with its own process; the stop kills it.
    let lookup = CALL.replace("local__", "forker__");
    let (_, _, answer) = in_session(gw.addr, "POST", (&auth, &session), &lookup).await;
    assert!(answer.contains("value of k"), "{answer}");
    let both = pids(&file);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(!dead(both[1]));
    gw.daemon.shutdown().await.expect("shutdown");
    assert!(
        dies(both[1]).await,
        "the server's process {} outlived the gateway",
        both[1]
    );
}

#[tokio::test]
async fn a_body_that_never_arrives_is_cut_at_its_time_bound() {
    let limits = GatewayLimits::new(8, IDLE, 4096).with_body_timeout(Duration::from_millis(300));
    let gw = gateway_with("", limits).await;
    let token = gw.token("slow").await;
    let auth = bearer(&token);
    // Twenty clients announce a body and send one byte of it: each is answered 408 and
    // let go, none holds the gateway.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{"
    );
    let stalled: Vec<_> = (0..20)
        .map(|_| {
            let head = head.clone();
            let addr = gw.addr;
            tokio::spawn(async move { raw(addr, head.as_bytes()).await })
        })
        .collect();
    for s in stalled {
        let (status, session, answer) = s.await.expect("a client");
        assert_eq!((status, session), (408, None), "{answer}");
        assert!(answer.contains("did not arrive"), "{answer}");
    }
    // One trickles its body, a byte every 50 ms (well within any bound on one read):
    // the whole body would take 5 s, and it is cut at the bound on the whole, while
    // bytes still arrive (a bound on each read would let it go on to the end).
    let (status, answer, dripped) =
        trickle(gw.addr, head.as_bytes(), Duration::from_millis(50)).await;
    assert_eq!(status, 408, "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    assert!(
        dripped < DRIPS,
        "answered only once the bytes stopped: {dripped}"
    );
    assert!(gw.runs().await.iter().all(|(r, _)| r == "slow"));
    open(gw.addr, &token, None).await;
}

/// How many bytes [`trickle`] sends at most: never the whole body.
const DRIPS: usize = 98;

/// `head` written, then one byte of the body every `every` (at most [`DRIPS`]) until the
/// gateway answers: its status, its answer, and how many bytes were sent by then.
async fn trickle(addr: std::net::SocketAddr, head: &[u8], every: Duration) -> (u16, String, usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut read, mut write) = s.into_split();
    write.write_all(head).await.expect("write");
    let mut dripped = 0;
    let dripping = async {
        while dripped < DRIPS {
            tokio::time::sleep(every).await;
            if write.write_all(b" ").await.is_err() {
                break;
            }
            dripped += 1;
        }
        // Never the whole body: only the gateway's bound ends this.
        std::future::pending::<()>().await;
    };
    let mut out = Vec::new();
    let answered = async {
        let _ = read.read_to_end(&mut out).await;
    };
    tokio::select! {
        () = dripping => {}
        _ = tokio::time::timeout(Duration::from_secs(30), answered) => {}
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text, dripped)
}

/// An `initialize` with `key` (and `task`): its status, session and answer.
async fn initialize(gw: &Gw, key: &str, task: &str) -> (u16, Option<String>, String) {
    let auth = bearer(key);
    let h = [("Authorization", auth.as_str()), ("x-tally-task", task)];
    send(gw.addr, "POST", &h, INIT).await
}

#[tokio::test]
async fn a_session_opened_as_its_runs_last_session_ends_never_acts_in_the_stopped_run() {
    let mut gw = gateway(8).await;
    let key = gw.key(50).await;
    let auth = bearer(&key);
    for i in 0..12 {
        let task = format!("t{i}");
        let first = open(gw.addr, &key, Some(&task)).await;
        let (status, _, _) = in_session(gw.addr, "DELETE", (&auth, &first), "").await;
        assert_eq!(status, 200);
        // At once: the run's stop may still be under way. The run it ended is stopped:
        // a new session is refused (409) rather than opened on it.
        let (status, session, answer) = initialize(&gw, &key, &task).await;
        if status == 200 {
            let session = session.expect("a session id");
            let (_, _, answer) = in_session(gw.addr, "POST", (&auth, &session), CALL).await;
            panic!("a session opened on a run stopped under it (task {task}): {answer}");
        }
        assert_eq!(status, 409, "{answer}");
        assert!(answer.contains("is stopped"), "{answer}");
    }
    // A new task: a new run, its calls answered.
    let fresh = open(gw.addr, &key, Some("fresh")).await;
    let (status, _, answer) = in_session(gw.addr, "POST", (&auth, &fresh), CALL).await;
    assert!(status == 200 && answer.contains("value of k"), "{answer}");
    gw.daemon.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn two_initializes_of_one_task_on_the_keys_last_run_of_the_day_share_it() {
    let gw = gateway(16).await;
    for _ in 0..3 {
        // One run a day: the second initialize finds it started by the first.
        let key = gw.key(1).await;
        let (a, b) = tokio::join!(initialize(&gw, &key, "same"), initialize(&gw, &key, "same"));
        assert_eq!(a.0, 200, "{}", a.2);
        assert_eq!(b.0, 200, "{}", b.2);
    }
}

#[tokio::test]
async fn an_initialize_inside_a_session_is_refused_and_the_session_goes_on() {
    let gw = gateway(8).await;
    let token = gw.token("twice").await;
    let auth = bearer(&token);
    let session = open(gw.addr, &token, None).await;
    let (status, again, answer) = in_session(gw.addr, "POST", (&auth, &session), INIT).await;
    assert_eq!((status, again), (400, None), "{answer}");
    assert!(answer.contains("initialized already"), "{answer}");
    let (status, _, answer) = in_session(gw.addr, "POST", (&auth, &session), CALL).await;
    assert!(status == 200 && answer.contains("value of k"), "{answer}");
}
