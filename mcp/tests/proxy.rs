//! `tally mcp` end to end, with real parts only: the real `tally` binary (`tally serve`
//! on a real socket, `tally mcp` in front of a server), the official MCP Python SDK's
//! server (`python/server.py`) and client (`python/client.py`), and the ledger read back
//! and verified.
//!
//! It needs the `tally` binary, another package's: `tally_testkit::Tally::workspace`
//! has cargo build it (or takes `TALLY_UNDER_TEST`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::{Decision, Effect, Kind, Status};
use tally_testkit::{Daemon, Tally};
use tempfile::TempDir;

mod crafted;
mod session;

/// The workspace's `tally` (built by cargo for this test: it is another package's binary).
fn tally() -> Tally {
    Tally::workspace()
}

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

fn server_py() -> String {
    here().join("server.py").display().to_string()
}

/// Whether python3 has the MCP SDK; if not, the test is SKIPPED (a failure under CI).
fn sdk_available() -> bool {
    tally_testkit::have(
        "python3",
        &["-c", "import mcp.server.fastmcp, mcp.client.stdio"],
        "python3 -m pip install mcp==1.30.0",
    )
}

/// The MCP reference server's command, if it is installed; if not, the test is SKIPPED
/// (a failure under CI).
fn reference_server() -> Option<String> {
    let server = here().join("../node/node_modules/.bin/mcp-server-everything");
    if !server.exists() {
        tally_testkit::skip(
            "the MCP reference server is not installed",
            "npm install --prefix mcp/tests/node --no-audit --no-fund",
        );
        return None;
    }
    Some(server.display().to_string())
}

/// A ledger, a policy and `tally serve` on a socket in a temporary directory.
struct Gate {
    serve: Daemon,
    dir: TempDir,
}

impl Gate {
    fn start(policy: &str) -> Gate {
        let dir = tempfile::tempdir().expect("tempdir");
        tally().init(dir.path(), policy);
        Gate {
            serve: tally().serve(dir.path(), &[]),
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        p(self.dir.path(), name)
    }

    fn socket(&self) -> String {
        self.path("agent.sock")
    }

    /// `tally mcp` in front of the test server, as an argument list.
    fn proxy(&self, run: &str, extra: &[&str]) -> Vec<String> {
        self.proxy_to(run, extra, &["python3".into(), server_py()])
    }

    /// `tally mcp` in front of a server command, as an argument list.
    fn proxy_to(&self, run: &str, extra: &[&str], server: &[String]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            tally().path().display().to_string(),
            "mcp".into(),
            "--socket".into(),
            self.socket(),
            "--run".into(),
            run.into(),
            "--goal".into(),
            format!("test {run}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push("--".into());
        args.extend(server.iter().cloned());
        args
    }

    /// Stop the daemon (it seals the ledger), verify the ledger with the real binary,
    /// and return every decision of `run`.
    fn finish(self, run: &str) -> Vec<Decision> {
        self.finish_all(&[run]).remove(0)
    }

    /// As `finish`, for each of `runs`.
    fn finish_all(mut self, runs: &[&str]) -> Vec<Vec<Decision>> {
        let status = self.serve.stop().expect("tally serve running");
        assert!(status.success(), "tally serve exited with {status}");
        let ledger = self.path("ledger");
        let out = tally()
            .command()
            .args([
                "verify",
                &ledger,
                "--key",
                &self.path("ledger/ledger.pub"),
                "--auditor-key",
                &self.path("auditor.key"),
            ])
            .output()
            .expect("tally verify");
        assert_eq!(
            out.status.code(),
            Some(0),
            "tally verify: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        runs.iter().map(|r| decisions(self.dir.path(), r)).collect()
    }
}

fn p(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// Every decision of `run`, decrypted by the verifier.
fn decisions(dir: &Path, run: &str) -> Vec<Decision> {
    let mut options = tally_verify::Options::new(
        LedgerPublic::read(&dir.join("ledger/ledger.pub")).expect("ledger.pub"),
    );
    options.auditor = Some(AuditorKey::read(&dir.join("auditor.key")).expect("auditor.key"));
    let mut out = Vec::new();
    let frames = tally_verify::walk::ledger_frames(&dir.join("ledger")).expect("log");
    let report = tally_verify::verify(frames, &options, |e| out.push(e), |_| {});
    assert_eq!(
        report.verdict(),
        tally_verify::Verdict::Intact,
        "the ledger verifies"
    );
    out.sort_by_key(|e| e.seq);
    out.into_iter()
        .map(|e| *e.decision)
        .filter(|d| d.run == run)
        .collect()
}

/// Run the SDK client on a scenario against a server command; its JSON.
fn client(scenario: &str, command: &[String], env: &[(&str, &str)]) -> Value {
    let mut c = Command::new("python3");
    c.arg(here().join("client.py"))
        .arg(scenario)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = output_within(c, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "client.py {scenario}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client.py prints JSON")
}

fn output_within(mut c: Command, limit: Duration) -> std::process::Output {
    let mut child = c.spawn().expect("spawn");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{c:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn allows(ds: &[Decision]) -> Vec<&Decision> {
    ds.iter().filter(|d| d.kind == Some(Kind::Allow)).collect()
}

const POLICY: &str = "[ceiling]\nattempts = 5\n[breaker]\nfailures = 50\n";

#[test]
fn a_session_through_the_proxy_is_the_session_with_the_server() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let straight = client("session", &["python3".into(), server_py()], &[]);
    let proxied = client("session", &gate.proxy("s1", &[]), &[]);
    // initialize, every list, reads, prompts, tool results, progress and log
    // notifications: all as the server sent them.
    assert_eq!(proxied, straight);
    assert_eq!(proxied["progress"].as_array().map(Vec::len), Some(3));
    assert_eq!(proxied["log"].as_array().map(Vec::len), Some(3));

    let ds = gate.finish("s1");
    let effects: Vec<(String, Effect)> = allows(&ds)
        .iter()
        .map(|d| (d.tool.clone().unwrap(), d.effect.unwrap()))
        .collect();
    // The effect class comes from each tool's annotations.
    assert_eq!(
        effects,
        vec![
            ("files/lookup".into(), Effect::Read),
            ("files/put".into(), Effect::IdempotentWrite),
            ("files/send".into(), Effect::NonIdempotentWrite),
            ("files/plain".into(), Effect::NonIdempotentWrite),
            ("files/steps".into(), Effect::Read),
        ]
    );
    for d in allows(&ds) {
        assert!(d.args.is_none(), "raw args never enter the ledger");
        assert!(d.args_digest.is_some(), "their digest does");
    }
    let outcomes: Vec<Status> = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome))
        .filter_map(|d| d.status)
        .collect();
    assert_eq!(outcomes, vec![Status::Ok; 5]);
}

#[test]
fn a_looping_client_is_stopped_at_the_cap_and_the_ledger_says_so() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start(POLICY);
    let calls_file = gate.path("calls.txt");
    let out = client(
        "loop",
        &gate.proxy("loop1", &[]),
        &[("TALLY_MCP_TEST_CALLS", &calls_file)],
    );
    let calls = out["calls"].as_array().expect("calls");
    // Five attempts reach the failing tool; the sixth is refused and the agent stops.
    assert_eq!(calls.len(), 6, "{out:#}");
    for c in &calls[..5] {
        assert_eq!(c["is_error"], true);
        assert!(c["gate"].is_null(), "the server's own error: {c}");
        assert!(c["text"].as_str().unwrap().contains("upstream unavailable"));
    }
    let refusal = &calls[5];
    assert_eq!(refusal["is_error"], true);
    assert_eq!(refusal["gate"]["cause"], "attempts_exhausted", "{refusal}");
    assert_eq!(refusal["gate"]["action"], "ask");
    let text = refusal["text"].as_str().unwrap();
    assert!(
        text.contains("files/flaky")
            && text.contains("attempts_exhausted")
            && text.contains("Action: ask"),
        "{text}"
    );
    let reached = std::fs::read_to_string(&calls_file).expect("calls file");
    assert_eq!(
        reached.lines().count(),
        5,
        "the refused call never reached the server"
    );

    let ds = gate.finish("loop1");
    let kinds: Vec<Kind> = ds.iter().filter_map(|d| d.kind).collect();
    assert_eq!(kinds.first(), Some(&Kind::Start));
    assert_eq!(allows(&ds).len(), 5);
    let errors = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome) && d.status == Some(Status::Error))
        .count();
    assert_eq!(
        errors, 5,
        "each failed call is recorded as an error outcome"
    );
    let refused: Vec<&Decision> = ds.iter().filter(|d| d.kind == Some(Kind::Deny)).collect();
    assert_eq!(refused.len(), 1, "{kinds:?}");
    assert_eq!(refused[0].tool.as_deref(), Some("files/flaky"));
}

/// An operation retried past its effect class is refused with its own
/// code (`retries_exhausted`, action stop), and the refusal says so and what the run has
/// left: not "a human must approve more" while the run still has attempts.
#[test]
fn regression_issue_20_a_retried_call_is_told_retries_exhausted_not_to_ask() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[ceiling]\nattempts = 6\n[breaker]\nfailures = 50\n");
    let out = client("retry", &gate.proxy("retry1", &[]), &[]);
    let calls = out["calls"].as_array().expect("calls");
    // A read may be tried three times between two ok outcomes; the fourth is refused.
    assert_eq!(calls.len(), 4, "{out:#}");
    let refusal = &calls[3];
    assert_eq!(refusal["gate"]["reason"], "retries_exhausted", "{refusal}");
    assert_eq!(refusal["gate"]["action"], "stop", "{refusal}");
    let text = refusal["text"].as_str().unwrap();
    assert!(
        text.contains("retried as often as its kind allows"),
        "{text}"
    );
    assert!(text.contains("used 3 of its 6 attempts"), "{text}");
    assert!(!text.contains("approve"), "{text}");
    gate.finish("retry1");
}

/// A raw JSON-RPC session: each line is sent, then the lines that answer it are read
/// (until a line with the request's id, or `quiet` with nothing new).
struct Raw {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Raw {
    fn start(command: &[String], env: &[(&str, &str)]) -> Raw {
        Raw::start_logged(command, env, Stdio::null())
    }

    /// As `start`, with the command's stderr going to `stderr`.
    fn start_logged(command: &[String], env: &[(&str, &str)], stderr: impl Into<Stdio>) -> Raw {
        let mut c = Command::new(&command[0]);
        c.args(&command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Raw { child, lines }
    }

    fn send(&mut self, line: &str) {
        self.send_bytes(line.as_bytes());
    }

    /// Send one line of any bytes (a newline is added).
    fn send_bytes(&mut self, line: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(line).expect("write");
        stdin.write_all(b"\n").expect("write");
        stdin.flush().expect("flush");
    }

    /// Send `line` and collect what comes back until the answer to `id` (or 500 ms of
    /// silence for a notification).
    fn exchange(&mut self, line: &str, id: Option<&Value>) -> Vec<String> {
        self.send(line);
        self.read_until(id, Duration::from_secs(30))
    }

    fn read_until(&mut self, id: Option<&Value>, limit: Duration) -> Vec<String> {
        let mut got = Vec::new();
        let deadline = Instant::now() + limit;
        loop {
            let wait = match id {
                Some(_) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(500),
            };
            match self.lines.recv_timeout(wait) {
                Ok(line) => {
                    let v: Value = serde_json::from_str(&line).expect("a JSON line");
                    let done =
                        id.is_some_and(|id| v.get("id") == Some(id) && v.get("method").is_none());
                    got.push(line);
                    if done {
                        return got;
                    }
                }
                Err(_) => {
                    assert!(id.is_none(), "no answer to {id:?}; got {got:?}");
                    return got;
                }
            }
        }
    }

    fn close(mut self) {
        drop(self.child.stdin.take());
        let started = Instant::now();
        while self.child.try_wait().expect("wait").is_none() {
            if started.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                panic!("did not exit after its stdin closed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn initialize(raw: &mut Raw) -> Vec<String> {
    let mut got = raw.exchange(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true}},"clientInfo":{"name":"raw","version":"1"}}}"#,
        Some(&json!(1)),
    );
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    got.extend(raw.read_until(None, Duration::ZERO));
    got
}

/// The same script, straight to the server and through the proxy.
fn raw_script(command: &[String]) -> Vec<String> {
    let mut raw = Raw::start(command, &[]);
    let mut got = initialize(&mut raw);
    let script: &[(&str, Option<Value>)] = &[
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            Some(json!(2)),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"three","method":"resources/list","params":{}}"#,
            Some(json!("three")),
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"notes://readme"}}"#,
            Some(json!(4)),
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"prompts/get","params":{"name":"review","arguments":{"path":"a.rs"}}}"#,
            Some(json!(5)),
        ),
        // A tools/call whose progress and log notifications come before its answer.
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"steps","arguments":{"count":2},"_meta":{"progressToken":"p6"}}}"#,
            Some(json!(6)),
        ),
        // Methods the server does not implement pass through too, with the bytes as
        // sent (numbers as written, escapes), and their errors come back.
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"review"},"argument":{"name":"path","value":"a\u00e9"},"x":[1,2.50]}}"#,
            Some(json!(7)),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#,
            None,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"none","progress":1}}"#,
            None,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#,
            Some(json!(9)),
        ),
    ];
    for (line, id) in script {
        got.extend(raw.exchange(line, id.as_ref()));
    }
    // Cancellation: a slow call, then its cancellation; the server answers as it does.
    raw.send(r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"slow","arguments":{"seconds":5}}}"#);
    std::thread::sleep(Duration::from_millis(300));
    got.extend(raw.exchange(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":10,"reason":"user"}}"#,
        None,
    ));
    got.extend(raw.exchange(
        r#"{"jsonrpc":"2.0","id":11,"method":"ping"}"#,
        Some(&json!(11)),
    ));
    raw.close();
    got
}

#[test]
fn every_message_passes_through_byte_for_byte() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let straight = raw_script(&["python3".into(), server_py()]);
    let proxied = raw_script(&gate.proxy("raw1", &[]));
    assert!(straight.len() > 10, "{straight:#?}");
    assert_eq!(proxied, straight);
    let ds = gate.finish("raw1");
    let tools: Vec<&str> = allows(&ds)
        .iter()
        .filter_map(|d| d.tool.as_deref())
        .collect();
    assert_eq!(tools, vec!["files/steps", "files/slow"]);
}

/// A tools/call line.
fn call(id: u64, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
        .to_string()
}

/// The answer to `id` among `lines`.
fn answer(lines: &[String], id: u64) -> Value {
    lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
        .find(|v| v["id"] == json!(id) && v.get("method").is_none())
        .unwrap_or_else(|| panic!("no answer to {id} in {lines:#?}"))
}

fn text(result: &Value) -> String {
    result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn with_the_gate_down_no_call_is_made() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let calls_file = gate.path("calls.txt");
    let mut command = gate.proxy("down1", &[]);
    command[3] = gate.path("nobody-listens.sock");
    let mut raw = Raw::start(&command, &[("TALLY_MCP_TEST_CALLS", &calls_file)]);
    initialize(&mut raw);
    // Everything but tools/call still works.
    let list = raw.exchange(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        Some(&json!(2)),
    );
    assert!(answer(&list, 2)["result"]["tools"].is_array());
    let got = raw.exchange(&call(3, "lookup", json!({"key": "a"})), Some(&json!(3)));
    let refused = answer(&got, 3);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let t = text(&refused);
    assert!(
        t.contains("not made (fail closed)")
            && t.contains("cannot reach the gate")
            && t.contains("nobody-listens.sock"),
        "{t}"
    );
    raw.close();
    assert!(
        std::fs::read_to_string(&calls_file)
            .unwrap_or_default()
            .is_empty(),
        "the call never reached the server"
    );
}

#[test]
fn a_call_the_server_never_answers_is_recorded_as_timeout() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[rate]\ncall_timeout_ms = 800\n");
    let mut raw = Raw::start(&gate.proxy("slow1", &[]), &[]);
    initialize(&mut raw);
    let started = Instant::now();
    let got = raw.exchange(&call(2, "slow", json!({"seconds": 5})), Some(&json!(2)));
    let elapsed = started.elapsed();
    let timed_out = answer(&got, 2);
    assert_eq!(timed_out["result"]["isError"], true, "{timed_out}");
    assert!(
        text(&timed_out).contains("did not answer within 800 ms"),
        "{timed_out}"
    );
    assert!(
        elapsed < Duration::from_secs(4),
        "answered at the gate's limit, not the server's: {elapsed:?}"
    );
    // The server was told to cancel; its late answer never reaches the client, which
    // already has one for that id.
    let later = raw.exchange(
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        Some(&json!(3)),
    );
    let more = raw.read_until(None, Duration::ZERO);
    let late: Vec<&String> = later
        .iter()
        .chain(&more)
        .filter(|l| l.contains(r#""id":2"#))
        .collect();
    assert!(late.is_empty(), "a second answer to id 2: {late:?}");
    raw.close();
    let ds = gate.finish("slow1");
    let statuses: Vec<Status> = ds.iter().filter_map(|d| d.status).collect();
    assert_eq!(statuses, vec![Status::Timeout]);
}

#[test]
fn a_refusal_to_retry_says_when() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[rate]\nrun_per_sec = 1\nrun_burst = 1\n");
    let mut raw = Raw::start(&gate.proxy("rate1", &[]), &[]);
    initialize(&mut raw);
    let first = raw.exchange(&call(2, "lookup", json!({"key": "a"})), Some(&json!(2)));
    assert_eq!(answer(&first, 2)["result"]["isError"], false);
    let second = raw.exchange(&call(3, "lookup", json!({"key": "b"})), Some(&json!(3)));
    let refused = answer(&second, 3);
    let meta = &refused["result"]["_meta"]["tally/gate"];
    assert_eq!(meta["reason"], "rate_limit_exceeded", "{refused}");
    assert_eq!(meta["action"], "retry");
    let after = meta["retry_after_ms"].as_u64().expect("retry_after_ms");
    let t = text(&refused);
    assert!(
        t.contains("rate_limit_exceeded")
            && t.contains("Action: retry")
            && t.contains(&format!("Retry after {after} ms")),
        "{t}"
    );
    raw.close();
    let ds = gate.finish("rate1");
    let deny = ds
        .iter()
        .find(|d| d.kind == Some(Kind::Deny))
        .expect("the refusal is recorded");
    assert_eq!(deny.tool.as_deref(), Some("files/lookup"));
}

#[test]
fn the_policy_map_overrides_annotations_and_unlisted_tools_are_looked_up() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let map = gate.path("map.toml");
    std::fs::write(
        &map,
        "[effects]\n\"files/lookup\" = \"non_idempotent_write\"\n",
    )
    .expect("map");
    let mut raw = Raw::start(&gate.proxy("map1", &["--policy-map", &map]), &[]);
    let mut got = initialize(&mut raw);
    // The client never lists tools: the proxy asks the server itself.
    got.extend(raw.exchange(
        &call(2, "put", json!({"key": "k", "value": "v"})),
        Some(&json!(2)),
    ));
    got.extend(raw.exchange(&call(3, "lookup", json!({"key": "k"})), Some(&json!(3))));
    got.extend(raw.exchange(&call(4, "nonesuch", json!({})), Some(&json!(4))));
    raw.close();
    assert!(
        !got.iter().any(|l| l.contains("tally-mcp-")),
        "the proxy's own requests stay between it and the server: {got:#?}"
    );
    let ds = gate.finish("map1");
    let effects: Vec<(String, Effect)> = allows(&ds)
        .iter()
        .map(|d| (d.tool.clone().unwrap(), d.effect.unwrap()))
        .collect();
    assert_eq!(
        effects,
        vec![
            ("files/put".into(), Effect::IdempotentWrite),
            ("files/lookup".into(), Effect::NonIdempotentWrite),
            ("files/nonesuch".into(), Effect::NonIdempotentWrite),
        ]
    );
}

#[test]
fn a_bad_policy_map_stops_tally_mcp_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let map = p(dir.path(), "map.toml");
    std::fs::write(&map, "[effects]\n\"files/put\" = \"write\"\n").expect("map");
    let marker = p(dir.path(), "started");
    let out = tally()
        .command()
        .args([
            "mcp",
            "--socket",
            "/nonexistent.sock",
            "--run",
            "r",
            "--policy-map",
            &map,
            "--",
            "touch",
            &marker,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("tally mcp");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("map.toml")
            && stderr.contains("line 2")
            && stderr.contains("non_idempotent_write"),
        "{stderr}"
    );
    assert!(!Path::new(&marker).exists(), "the server was never started");

    let out = tally()
        .command()
        .args(["mcp", "--socket", "/nonexistent.sock", "--run", "r"])
        .stdin(Stdio::null())
        .output()
        .expect("tally mcp");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SERVER_COMMAND"));
}

#[test]
fn a_server_that_exits_mid_call_leaves_an_unknown_outcome_and_its_exit_code() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let mut raw = Raw::start(&gate.proxy("crash1", &[]), &[]);
    initialize(&mut raw);
    raw.send(&call(2, "crash", json!({"code": 3})));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = raw.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "tally mcp did not exit with its server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        Some(2),
        "a server that failed is tally's exit 2 (its own code is on stderr)"
    );
    let ds = gate.finish("crash1");
    let statuses: Vec<Status> = ds.iter().filter_map(|d| d.status).collect();
    // The write may or may not have happened: the ledger says unknown, not ok or error.
    assert_eq!(statuses, vec![Status::Unknown]);
}

#[test]
fn the_mcp_reference_server_passes_through() {
    if !sdk_available() {
        return;
    }
    let Some(server) = reference_server() else {
        return;
    };
    let gate = Gate::start("");
    let straight = client("everything", std::slice::from_ref(&server), &[]);
    let mut proxied_command = gate.proxy("ref1", &[]);
    proxied_command.truncate(proxied_command.len() - 2);
    proxied_command.push(server);
    let proxied = client("everything", &proxied_command, &[]);
    assert_eq!(proxied, straight);
    assert_eq!(proxied["echo"]["content"][0]["text"], "Echo: hi");
    let name = straight["initialize"]["serverInfo"]["name"]
        .as_str()
        .expect("serverInfo.name")
        .to_string();
    let ds = gate.finish("ref1");
    let tools: Vec<String> = allows(&ds).iter().filter_map(|d| d.tool.clone()).collect();
    assert_eq!(
        tools,
        vec![format!("{name}/echo"), format!("{name}/get-sum")]
    );
    let outcomes = ds.iter().filter(|d| d.status == Some(Status::Ok)).count();
    assert_eq!(outcomes, 2);
}
