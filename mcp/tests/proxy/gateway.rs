//! The HTTP gateway (`tally serve --mcp-listen`) end to end, real parts only: the real
//! `tally serve`, the official MCP Python SDK's Streamable HTTP client, and behind the
//! gateway at once the SDK's test server on stdio (tapped) and the same server on
//! Streamable HTTP; the ledger read back and verified. Raw requests are HTTP/1.0 (the
//! answer ends when the connection closes: no chunked framing to read).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use super::crafted::{mark, passing, variants, Target};
use super::*;

mod failing;
mod https;
mod redirects;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_port(port: u16) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing listens on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The test server on Streamable HTTP, killed when dropped.
struct Remote {
    child: Child,
    port: u16,
}

impl Remote {
    fn start(calls: &str) -> Remote {
        let port = free_port();
        let child = Command::new("python3")
            .args([&server_py(), "--http", &port.to_string()])
            .env("TALLY_MCP_TEST_CALLS", calls)
            .env("TALLY_MCP_TEST_ARGS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 server.py --http");
        wait_port(port);
        Remote { child, port }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tally serve --mcp-listen` in front of the stdio server (`local`, its stdin tapped
/// into `local-stdin.log`, its calls in `local-calls.txt`) and the HTTP one (`remote`).
struct Gateway {
    gate: Gate,
    addr: SocketAddr,
    _remote: Remote,
}

impl Gateway {
    fn start(policy: &str) -> Gateway {
        Gateway::start_via(policy, |port| port)
    }

    /// [`Gateway::start`], the gateway told to reach the HTTP server at `via(its port)`.
    fn start_via(policy: &str, via: impl FnOnce(u16) -> u16) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |n: &str| p(dir.path(), n);
        let remote = Remote::start(&path("remote-calls.txt"));
        let port = free_port();
        let local = json!([
            "bash",
            "-c",
            r#"exec "$@" < <(exec tee -a "$0")"#,
            path("local-stdin.log"),
            "env",
            format!("TALLY_MCP_TEST_CALLS={}", path("local-calls.txt")),
            format!("TALLY_MCP_TEST_PID={}", path("local-pid.txt")),
            "TALLY_MCP_TEST_ARGS=1",
            "python3",
            server_py(),
        ]);
        let policy = format!(
            "{policy}\n[mcp.local]\ncommand = {local}\n\n[mcp.remote]\nurl = \"http://127.0.0.1:{}/mcp\"\n",
            via(remote.port)
        );
        tally().init(dir.path(), &policy);
        let listen = format!("127.0.0.1:{port}");
        let serve = tally().serve(dir.path(), &["--mcp-listen", &listen]);
        wait_port(port);
        Gateway {
            gate: Gate { serve, dir },
            addr: listen.parse().expect("an address"),
            _remote: remote,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Start a run on the agent socket; its token.
    fn run(&self, run: &str) -> String {
        let (status, v) = self.gate.serve.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "gateway test"})),
        );
        assert_eq!(status, 201, "{v}");
        v["token"].as_str().expect("a token").to_owned()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.gate.path(name)).unwrap_or_default()
    }

    /// The SDK client on a scenario; its JSON.
    fn client(&self, scenario: &str, token: &str) -> Value {
        let mut c = Command::new("python3");
        c.arg(here().join("gateway_client.py"))
            .args([scenario, &self.url(), token])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(Stdio::piped());
        let out = output_within(c, Duration::from_secs(90));
        assert!(
            out.status.success(),
            "gateway_client.py {scenario}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("gateway_client.py prints JSON")
    }
}

/// An answer to a raw request: its status, headers (lower-case names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages in the body: one JSON body, or an SSE stream's events.
    fn messages(&self) -> Vec<Value> {
        if let Ok(v) = serde_json::from_str::<Value>(&self.body) {
            return vec![v];
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }

    /// The message answering `id`.
    fn answer_to(&self, id: u64) -> Option<Value> {
        self.messages()
            .into_iter()
            .find(|m| m["id"] == json!(id) && m.get("method").is_none())
    }
}

/// One HTTP/1.0 request to the gateway.
fn send(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect to the gateway");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!(
        "{method} /mcp HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body).expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A raw session: initialized, its id.
struct RawSession {
    addr: SocketAddr,
    bearer: String,
    id: String,
}

impl RawSession {
    fn open(addr: SocketAddr, token: &str) -> RawSession {
        let bearer = format!("Bearer {token}");
        let init = send(
            addr,
            "POST",
            &[("Authorization", &bearer)],
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        );
        assert_eq!(init.status, 200, "initialize: {}", init.body);
        let id = init
            .header("mcp-session-id")
            .unwrap_or_else(|| panic!("no session id: {:?}", init.headers))
            .to_owned();
        let s = RawSession { addr, bearer, id };
        let note = s.post(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(note.status, 202, "initialized: {}", note.body);
        s
    }

    fn post(&self, body: &[u8]) -> Answer {
        send(
            self.addr,
            "POST",
            &[
                ("Authorization", &self.bearer),
                ("Mcp-Session-Id", &self.id),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            body,
        )
    }

    fn delete(&self) -> Answer {
        send(
            self.addr,
            "DELETE",
            &[
                ("Authorization", &self.bearer),
                ("Mcp-Session-Id", &self.id),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            b"",
        )
    }
}

#[test]
fn the_sdk_client_reaches_a_stdio_and_an_http_server_through_the_gateway_gated_and_recorded() {
    if !sdk_available() {
        return;
    }
    let gw = Gateway::start("");
    let token = gw.run("g1");
    let out = gw.client("session", &token);
    assert_eq!(out["server"], "tally-mcp-gateway", "{out:#}");
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in [
        "local__lookup",
        "local__send",
        "remote__lookup",
        "remote__put",
    ] {
        assert!(tools.contains(&t), "{t} in {tools:?}");
    }
    let calls = &out["calls"];
    assert_eq!(calls["local__lookup"]["text"], "value of a", "{out:#}");
    assert_eq!(calls["remote__lookup"]["text"], "value of b");
    assert_eq!(calls["remote__put"]["text"], "a = 1");
    assert_eq!(calls["local__send"]["text"], "sent to bob");
    assert_eq!(calls["remote__flaky"]["is_error"], true);
    assert!(gw.read("local-calls.txt").contains("send bob"));
    assert!(gw.read("remote-calls.txt").contains("flaky"));

    let ds = gw.gate.finish("g1");
    let effects = allowed_effects(&ds);
    assert_eq!(
        effects,
        vec![
            ("local/lookup".into(), Effect::Read),
            ("remote/lookup".into(), Effect::Read),
            ("remote/put".into(), Effect::IdempotentWrite),
            ("local/send".into(), Effect::NonIdempotentWrite),
            ("remote/flaky".into(), Effect::Read),
        ]
    );
    for d in allows(&ds) {
        assert!(d.args.is_none() && d.args_digest.is_some(), "digests only");
    }
    let outcomes: Vec<Status> = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome))
        .filter_map(|d| d.status)
        .collect();
    assert_eq!(
        outcomes,
        vec![
            Status::Ok,
            Status::Ok,
            Status::Ok,
            Status::Ok,
            Status::Error
        ]
    );
}

#[test]
fn calls_to_an_http_server_behind_reuse_the_gateways_connection_to_it() {
    if !sdk_available() {
        return;
    }
    // rmcp's client lets go of a POST's SSE answer once it has the JSON-RPC answer; read
    // to its end (gateway/keeps.rs), the body gives its connection back for the next
    // call. Counted, not timed: the connections the server behind accepted, each
    // answer's end held back until the gateway has answered the call (the end then
    // comes after rmcp let go of it, whatever the timing).
    let mut forward = None;
    let gw = Gateway::start_via("", |port| {
        let f = super::forward::Forward::to(port);
        let port = f.port;
        forward = Some(f);
        port
    });
    let forward = forward.expect("a forwarder");
    let token = gw.run("kept");
    let session = RawSession::open(gw.addr, &token);
    let call = |i: usize| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"remote__lookup","arguments":{{"key":"k{i}"}}}}}}"#,
            i + 2
        );
        let answer = session.post(body.as_bytes());
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            answer.body.contains(&format!("value of k{i}")),
            "{}",
            answer.body
        );
    };
    // The first call connects (initialize, the listing); then the ends are held.
    call(0);
    let before = forward.accepted();
    forward.hold();
    let calls = 10;
    for i in 1..=calls {
        call(i);
        forward.release();
    }
    // With reqwest's client as rmcp uses it, 9 of the 10 calls opened one (each
    // connection closed with its body unread).
    let opened = forward.accepted() - before;
    assert!(
        opened <= 2,
        "{opened} connections to the server behind for {calls} calls"
    );
}

#[test]
fn a_server_behind_that_closes_after_each_answer_still_answers_every_call() {
    if !sdk_available() {
        return;
    }
    // A kept connection is not assumed: a server that closes its connection after each
    // answer (saying `Connection: close`) gets a new one for each call, and every call
    // is answered.
    let mut forward = None;
    let gw = Gateway::start_via("", |port| {
        let f = super::forward::Forward::closing(port);
        let port = f.port;
        forward = Some(f);
        port
    });
    let forward = forward.expect("a forwarder");
    let token = gw.run("closed");
    let session = RawSession::open(gw.addr, &token);
    let calls = 10;
    for i in 0..calls {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"remote__lookup","arguments":{{"key":"k{i}"}}}}}}"#,
            i + 2
        );
        let answer = session.post(body.as_bytes());
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            answer.body.contains(&format!("value of k{i}")),
            "call {i}: {}",
            answer.body
        );
    }
    // Each call's POST on a connection of its own (and the session's setup on more).
    let opened = forward.accepted();
    assert!(
        opened > calls,
        "{opened} connections to the server behind for {calls} calls"
    );
}

#[test]
fn a_missing_or_bad_credential_is_refused_and_no_server_is_contacted() {
    if !sdk_available() {
        return;
    }
    let gw = Gateway::start("");
    let token = gw.run("g2");
    // A token of another tally's key: the right shape, the wrong MAC.
    let forged = format!("{}0", &token[..token.len() - 1]);
    let forged = if forged == token {
        format!("{}1", &token[..token.len() - 1])
    } else {
        forged
    };
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let call = call(2, "local__send", json!({"to": "mallory"}));
    for headers in [
        vec![],
        vec![("Authorization", "Bearer nonsense".to_owned())],
        vec![("Authorization", format!("Bearer {forged}"))],
        vec![("Authorization", format!("Basic {token}"))],
        vec![("Authorization", "Bearer tlk_0011223344556677.00".to_owned())],
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        for (method, body) in [
            ("POST", &init[..]),
            ("POST", call.as_bytes()),
            ("GET", b""),
            ("DELETE", b""),
        ] {
            let a = send(gw.addr, method, &h, body);
            assert_eq!(a.status, 401, "{method} with {headers:?}: {}", a.body);
            assert_eq!(a.header("www-authenticate"), Some("Bearer"));
        }
    }
    let out = gw.client("refused", &forged);
    assert!(
        out["error"].as_str().is_some_and(|e| e.contains("401")),
        "{out:#}"
    );
    assert!(
        !std::path::Path::new(&gw.gate.path("local-stdin.log")).exists(),
        "the stdio server was started"
    );
    assert_eq!(gw.read("remote-calls.txt"), "");
    // Nothing was checked: the run has no decision but its start.
    let ds = gw.gate.finish("g2");
    assert!(allows(&ds).is_empty(), "{ds:?}");
}

#[test]
fn crafted_messages_over_http_get_tally_mcps_verdicts_and_never_reach_a_server() {
    if !sdk_available() {
        return;
    }
    let gw = Gateway::start("");
    let token = gw.run("g3");
    let s = RawSession::open(gw.addr, &token);
    let t = Target {
        tool: "local__send",
        arg: "to",
    };
    let variants = variants(&t);
    let mut failures = Vec::new();
    for v in &variants {
        let a = s.post(&v.line);
        match v.answer {
            Some((id, code)) => match a.answer_to(id) {
                Some(m)
                    if a.status == 200
                        && m["error"]["code"] == json!(code)
                        && m["error"]["data"]["tally/refused"]["reason"].is_string() => {}
                other => failures.push(format!(
                    "{}: expected error {code} under id {id}, got {} {other:?}",
                    v.name, a.status
                )),
            },
            None => {
                let answered: Vec<Value> = a
                    .messages()
                    .into_iter()
                    .filter(|m| !m["id"].is_null())
                    .collect();
                if a.status != 400 || !answered.is_empty() {
                    failures.push(format!(
                        "{}: expected 400 and no answer under an id, got {} {}",
                        v.name, a.status, a.body
                    ));
                }
            }
        }
    }
    for (id, line) in passing(&t) {
        let a = s.post(line.as_bytes());
        match a.answer_to(id) {
            Some(m) if m["result"]["isError"] != json!(true) && m.get("error").is_none() => {}
            other => failures.push(format!("passing call {id}: {} {other:?}", a.status)),
        }
    }
    let tapped = gw.read("local-stdin.log");
    let reached = format!("{tapped}\n{}", gw.read("local-calls.txt"));
    for v in &variants {
        if reached.contains(&mark(v.name)) {
            failures.push(format!("{}: reached the server", v.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} crafted messages failed:\n{}",
        failures.len(),
        variants.len(),
        failures.join("\n")
    );
    // The passing calls reached it, each checked: four allows, in the ledger.
    assert!(reached.contains("pass-plain") && reached.contains("pass-escaped-t"));
    let ds = gw.gate.finish("g3");
    assert_eq!(allows(&ds).len(), 4, "{ds:#?}");
}

#[test]
fn deleting_a_session_stops_the_run_it_started_and_only_that() {
    if !sdk_available() {
        return;
    }
    let uid = rustix::process::getuid().as_raw();
    let gw = Gateway::start(&format!("[principals.uid.{uid}]\nruns = 10\n"));
    let (status, created) = gw.gate.serve.operator(
        "POST",
        "/v1/keys",
        Some(json!({"principal": uid, "label": "gateway test"})),
    );
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().expect("a key").to_owned();
    let id = created["info"]["id"].as_str().expect("an id").to_owned();

    // A key's session: the gateway starts the key's run under its principal...
    let s = RawSession::open(gw.addr, &key);
    let a = s.post(call(2, "local__lookup", json!({"key": "k"})).as_bytes());
    assert_eq!(
        a.answer_to(2)
            .map(|m| m["result"]["content"][0]["text"].clone()),
        Some(json!("value of k")),
        "{}",
        a.body
    );
    let (_, runs) = gw.gate.serve.operator("GET", "/v1/runs", None);
    let run = runs
        .as_array()
        .and_then(|r| {
            r.iter()
                .filter_map(|r| r["run"].as_str())
                .find(|r| r.starts_with(&format!("key-{id}-")))
        })
        .unwrap_or_else(|| panic!("the key's run in {runs}"))
        .to_owned();
    let standing = |run: &str| {
        gw.gate
            .serve
            .operator("GET", &format!("/v1/runs/{run}"), None)
            .1
    };
    assert_eq!(standing(&run)["state"], "running");
    // ... and its DELETE stops it.
    let d = s.delete();
    assert_eq!(d.status, 200, "{}", d.body);
    let started = Instant::now();
    while standing(&run)["state"] != "stopped" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            standing(&run)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(standing(&run)["stop_reason"], "completed");
    // The session is gone.
    let after = s.post(br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
    assert_eq!(after.status, 404, "{}", after.body);

    // A run token's session joins the agent's run: its DELETE leaves the run open.
    let token = gw.run("g4");
    let s = RawSession::open(gw.addr, &token);
    let a = s.post(call(2, "remote__lookup", json!({"key": "k"})).as_bytes());
    assert!(a.answer_to(2).is_some(), "{}", a.body);
    assert_eq!(s.delete().status, 200);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(standing("g4")["state"], "running");
    // Another credential cannot drive a session it did not open.
    let other = gw.run("g5");
    let s5 = RawSession::open(gw.addr, &other);
    let hijack = RawSession {
        addr: gw.addr,
        bearer: format!("Bearer {token}"),
        id: s5.id.clone(),
    };
    let a = hijack.post(call(9, "local__send", json!({"to": "x"})).as_bytes());
    assert_eq!(a.status, 403, "{}", a.body);
    gw.gate.finish_all(&["g4", "g5"]);
}

/// The process ids a server wrote to `file`, one a line.
fn pids(gw: &Gateway, file: &str) -> Vec<u32> {
    gw.read(file)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether process `pid` is gone: killed and reaped (a zombie still has its /proc entry).
fn gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_hung_stdio_server_is_killed_and_reaped_and_never_hangs_the_gateway() {
    if !sdk_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let hung_pids = p(dir.path(), "hung-pid.txt");
    // `hung` never answers initialize (sleep speaks no MCP, and ignores its stdin);
    // calls get 1.5 s.
    let gw = Gateway::start(&format!(
        "[rate]\ncall_timeout_ms = 1500\n\n[mcp.hung]\ncommand = [\"sh\", \"-c\", \"echo $$ >> {hung_pids}; exec sleep 600\"]\n"
    ));
    let token = gw.run("hung");
    let s = RawSession::open(gw.addr, &token);
    s.post(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    // The list is answered (the other servers' tools) within the list's bound; the
    // hung server is left out, its process killed and reaped.
    let started = Instant::now();
    let list = s.post(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    let tools = list.answer_to(2).expect("the list");
    assert!(tools.to_string().contains("local__lookup"), "{tools}");
    assert!(!tools.to_string().contains("hung__"), "{tools}");
    let read = |f: &str| -> Vec<u32> {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let hung = read(&hung_pids);
    assert_eq!(hung.len(), 1, "{hung:?}");
    assert!(gone(hung[0]), "the hung server {} is still there", hung[0]);
    // A call that times out: the stdio server that did not answer is killed and reaped
    // before the client reads the timeout; the next call starts a new one.
    let local = pids(&gw, "local-pid.txt");
    assert_eq!(local.len(), 1, "{local:?}");
    let a = s.post(call(3, "local__slow", json!({"seconds": 600})).as_bytes());
    let m = a.answer_to(3).expect("an answer");
    assert_eq!(m["result"]["isError"], true, "{m}");
    assert!(m.to_string().contains("did not answer within"), "{m}");
    assert!(
        gone(local[0]),
        "the timed-out server {} is still there",
        local[0]
    );
    let a = s.post(call(4, "local__lookup", json!({"key": "k"})).as_bytes());
    assert_eq!(
        a.answer_to(4)
            .map(|m| m["result"]["content"][0]["text"].clone()),
        Some(json!("value of k")),
        "{}",
        a.body
    );
    let local = pids(&gw, "local-pid.txt");
    assert_eq!(local.len(), 2, "a new server: {local:?}");
    // The gateway stops while the hung server is starting: it is killed too.
    let addr = gw.addr;
    let id = s.id.clone();
    let bearer = s.bearer.clone();
    let lister = std::thread::spawn(move || {
        let s = RawSession { addr, bearer, id };
        s.post(br#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#)
    });
    let started = Instant::now();
    while read(&hung_pids).len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "hung was not started again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let again = read(&hung_pids)[1];
    assert!(!gone(again));
    let Gateway { gate, _remote, .. } = gw;
    gate.finish("hung");
    let _ = lister.join();
    assert!(gone(again), "the hung server {again} outlived the gateway");
    assert!(
        gone(local[1]),
        "the local server {} outlived the gateway",
        local[1]
    );
}
