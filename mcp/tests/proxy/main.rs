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
use tally_record::{Decision, Effect, Kind, Status};
use tally_testkit::{Daemon, Tally};
use tempfile::TempDir;

mod crafted;
mod session;

mod faults;
mod forward;
mod gateway;
mod map;
mod passthrough;
mod sdk;
mod traced;

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

/// Each allowed call's tool and the effect class it was checked under, in order.
fn allowed_effects(ds: &[Decision]) -> Vec<(String, Effect)> {
    allows(ds)
        .iter()
        .map(|d| (d.tool.clone().unwrap(), d.effect.unwrap()))
        .collect()
}

const POLICY: &str = "[ceiling]\nattempts = 5\n[breaker]\nfailures = 50\n";

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
