//! The operator's view, on the real binary and daemon: the metrics parsed by
//! the Prometheus project's own parser and held against the ledger's own counts; the
//! live page in a real headless Chromium; `tally top` in tmux and on a pipe; a span at an
//! OTLP receiver with its trace id on the decision in the ledger; the JSON log.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tally_testkit::daemon::request;
use tally_testkit::{Daemon, Tally};

const POLICY: &str = r#"
[scope]
tools = ["search", "flaky", "write_file"]

[breaker]
failures = 2
open_ms = 600000
"#;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

fn ok(dir: &Path, args: &[&str]) -> String {
    tally().ok(dir, args, "")
}

/// A free loopback port (bound, then released for the daemon).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// What these tests ask of `tally serve` (over `dir/ledger` under [`POLICY`], its stderr
/// in `dir/serve.log`).
trait Gate {
    fn operator_text(&self, path: &str) -> (u16, String);
    fn start_run(&self, run: &str, attempts: u64);
    /// One check; its answer.
    fn check(&self, run: &str, tool: &str, args: Value) -> Value;
    /// A check, and when it is allowed its outcome `ok`: the same call made again and
    /// again is then a loop (`loop_repeated_call`), not a retry.
    fn call(&self, run: &str, tool: &str, args: Value) -> Value;
    fn outcome(&self, run: &str, attempt: u64, status: &str);
}

impl Gate for Daemon {
    fn operator_text(&self, path: &str) -> (u16, String) {
        let (s, b) = request(&self.operator_socket(), "GET", path, None);
        (s, String::from_utf8_lossy(&b).into_owned())
    }

    fn start_run(&self, run: &str, attempts: u64) {
        let (status, v) = self.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "budget": {"attempts": attempts}})),
        );
        assert_eq!(status, 201, "{v}");
    }

    fn check(&self, run: &str, tool: &str, args: Value) -> Value {
        let (status, v) = self.agent(
            "POST",
            "/v1/check",
            Some(json!({"run": run, "tool": tool, "effect": "read", "args": args})),
        );
        assert_eq!(status, 200, "{v}");
        v
    }

    fn call(&self, run: &str, tool: &str, args: Value) -> Value {
        let a = self.check(run, tool, args);
        if let Some(n) = a["attempt"].as_u64() {
            self.outcome(run, n, "ok");
        }
        a
    }

    fn outcome(&self, run: &str, attempt: u64, status: &str) {
        let (s, v) = self.agent(
            "POST",
            "/v1/outcome",
            Some(json!({"run": run, "attempt": attempt, "status": status})),
        );
        assert_eq!(s, 200, "{v}");
    }
}

/// A fresh ledger in `dir/ledger` and [`POLICY`] in `dir/policy.toml`.
fn ledger(dir: &Path) {
    tally().init(dir, POLICY);
}

/// Every decision in `dir/ledger`, decrypted with the auditor key, by seq (the daemon
/// must be stopped).
fn decisions(dir: &Path) -> BTreeMap<u64, Value> {
    let ledger = dir.join("ledger");
    let frames: Vec<tally_ledger::Frame> = tally_ledger::segment::LogReader::open(&ledger)
        .expect("log")
        .frames()
        .map(|f| f.expect("frame"))
        .collect();
    let mut options = tally_verify::Options::new(
        tally_ledger::LedgerPublic::read(&ledger.join("ledger.pub")).expect("ledger.pub"),
    );
    options.auditor = Some(tally_ledger::AuditorKey::read(&dir.join("auditor.key")).expect("key"));
    let mut out = BTreeMap::new();
    let report = tally_verify::verify(
        frames.into_iter().map(Ok),
        &options,
        |e| {
            out.insert(e.seq.seq, serde_json::to_value(&e.decision).expect("json"));
        },
        |_| {},
    );
    assert_eq!(report.verdict(), tally_verify::Verdict::Intact);
    out
}

fn python_has(module: &str, fix: &str) -> bool {
    tally_testkit::have("python3", &["-c", &format!("import {module}")], fix)
}

/// The exposition parsed by prometheus_client's OpenMetrics parser: (name, labels) ->
/// value.
fn parse_metrics(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/observe/metrics.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "the Prometheus parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, BTreeMap<String, String>, f64)> =
        serde_json::from_slice(&out.stdout).expect("samples");
    samples.into_iter().map(|(n, l, v)| ((n, l), v)).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The counters after a scripted load equal the ledger's own counts: checks by decision,
/// reason and tool; outcomes by status; entries. A tool name an agent made up is never a
/// label (`other`), nor is a run name.
#[test]
fn metrics_parse_and_match_the_ledger_after_a_load() {
    if !python_has(
        "prometheus_client",
        "pip install prometheus-client==0.26.0 (README, Development)",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut served = tally().serve(dir, &["--metrics-listen", &addr]);
    for r in 0..4 {
        let run = format!("load-run-{r}");
        served.start_run(&run, 12);
        for i in 0..6 {
            let a = served.check(&run, "search", json!({"q": i}));
            if let Some(n) = a["attempt"].as_u64() {
                served.outcome(&run, n, if i % 2 == 0 { "ok" } else { "error" });
            }
        }
        // Identical calls: the loop rule refuses after the third.
        for _ in 0..5 {
            served.call(&run, "search", json!({"q": "same"}));
        }
        // Tools an agent made up.
        for i in 0..3 {
            served.check(&run, &format!("invented-tool-{r}-{i}"), json!({"i": i}));
        }
    }
    let (status, text) = served.operator_text("/metrics");
    assert_eq!(status, 200, "{text}");
    // The same series on the loopback listener.
    let over_tcp = std::process::Command::new("curl")
        .args(["-sS", "--fail", &format!("http://{addr}/metrics")])
        .output();
    if let Ok(o) = &over_tcp {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("tally_checks_total"));
    } else if tally_testkit::have("curl", &[], "apt-get install curl") {
        panic!("curl failed: {over_tcp:?}");
    }
    let metrics = parse_metrics(&text);
    for (name, l) in metrics.keys() {
        for v in l.values() {
            assert!(
                !v.contains("invented") && !v.contains("load-run"),
                "an agent-chosen string is a label value: {name} {l:?}"
            );
        }
    }
    served.stop();

    // The ledger's own counts.
    let all = decisions(dir);
    let mut checks: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, f64> = BTreeMap::new();
    for d in all.values() {
        let kind = d["kind"].as_str().unwrap_or("");
        let tool = d["tool"].as_str().unwrap_or("");
        let tool = if ["search", "flaky", "write_file"].contains(&tool) {
            tool.to_owned()
        } else {
            "other".to_owned()
        };
        match kind {
            "allow" | "deny" | "require_approval" => {
                let reason = d["reason"].as_str().unwrap_or("none").to_owned();
                *checks.entry((kind.to_owned(), reason, tool)).or_default() += 1.0;
            }
            "outcome" => {
                *outcomes
                    .entry(d["status"].as_str().unwrap_or("").to_owned())
                    .or_default() += 1.0
            }
            _ => {}
        }
    }
    assert!(
        checks.keys().any(|(_, r, _)| r == "loop_repeated_call"),
        "{checks:?}"
    );
    assert!(checks.keys().any(|(_, _, t)| t == "other"), "{checks:?}");
    let mut seen_checks = BTreeMap::new();
    for ((name, l), v) in &metrics {
        if name == "tally_checks_total" {
            seen_checks.insert(
                (
                    l["decision"].clone(),
                    l["reason"].clone(),
                    l["tool"].clone(),
                ),
                *v,
            );
        }
    }
    assert_eq!(seen_checks, checks, "checks by decision, reason and tool");
    for (status, n) in &outcomes {
        assert_eq!(
            metrics.get(&("tally_outcomes_total".into(), labels(&[("status", status)]))),
            Some(n),
            "outcomes {status}"
        );
    }
    let entries = metrics[&("tally_ledger_entries".to_string(), BTreeMap::new())];
    assert_eq!(entries as usize, log_entries(dir), "entries");
    assert_eq!(
        metrics[&("tally_runs".to_string(), labels(&[("state", "running")]))],
        4.0
    );
    assert!(metrics[&("tally_ledger_log_bytes".to_string(), BTreeMap::new())] > 0.0);
    assert!(
        metrics[&(
            "tally_check_duration_seconds_count".to_string(),
            BTreeMap::new()
        )] >= checks.values().sum::<f64>()
    );
    assert!(
        metrics[&(
            "tally_ledger_sync_duration_seconds_count".to_string(),
            BTreeMap::new()
        )] > 0.0
    );
}

/// Entries in the log (genesis, epochs and decisions).
fn log_entries(dir: &Path) -> usize {
    tally_ledger::segment::LogReader::open(&dir.join("ledger"))
        .expect("log")
        .frames()
        .filter(|f| matches!(f, Ok(tally_ledger::Frame::Entry(_))))
        .count()
}

/// A headless Chromium on the CDP driver (cli/tests/observe/cdp.py).
struct Browser {
    child: Child,
    /// Closed first on drop: the driver then kills Chromium itself (killing the driver
    /// alone would leave Chromium running).
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Browser {
    fn start() -> Option<Browser> {
        if !tally_testkit::have(
            "chromium",
            &[],
            "apt-get install chromium (README, Development)",
        ) || !python_has(
            "websocket",
            "pip install websocket-client==1.9.2 (README, Development)",
        ) {
            return None;
        }
        let mut child = Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/observe/cdp.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cdp.py");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        output.read_line(&mut line).expect("ready");
        assert!(
            line.contains("ready"),
            "the CDP driver did not start: {line:?}"
        );
        Some(Browser {
            child,
            input: Some(input),
            output,
        })
    }

    fn send(&mut self, cmd: Value) -> Value {
        writeln!(self.input.as_mut().expect("open"), "{cmd}").expect("send");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("answer");
        let v: Value = serde_json::from_str(&line).expect("json answer");
        assert!(v.get("error").is_none(), "{cmd}: {v}");
        v
    }

    fn eval(&mut self, js: &str) -> Value {
        self.send(json!({ "eval": js }))["value"].clone()
    }

    /// Evaluate `js` until `pred` holds of its value, for at most `within`; how long it
    /// took.
    fn until(&mut self, js: &str, within: Duration, pred: impl Fn(&Value) -> bool) -> Duration {
        let started = Instant::now();
        loop {
            let v = self.eval(js);
            if pred(&v) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "not within {within:?}: {js} is {v}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        drop(self.input.take());
        let started = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

const FIRST_RUN: &str = "(() => { const c = document.querySelector('#runs tbody tr td.run'); return c ? c.textContent : null; })()";

fn row_of(run: &str, col: &str) -> String {
    format!(
        "(() => {{ for (const tr of document.querySelectorAll('#runs tbody tr')) {{ if (tr.querySelector('td.run').textContent === {run}) {{ const c = tr.querySelector('td.{col}'); return c ? c.textContent : null; }} }} return null; }})()",
        run = json!(run)
    )
}

/// The page in a real headless Chromium: the run nearest its attempts is at the top, a
/// loop refusal shows within a second of the check, a breaker opening shows, and a run
/// name made of markup is shown as text and runs nothing. A screenshot under load is
/// written for docs/.
#[test]
fn the_live_page_in_chromium() {
    let Some(mut browser) = Browser::start() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _served = tally().serve(dir, &["--metrics-listen", &addr]);
    let served = &_served;
    let hostile =
        "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>";
    for (run, used) in [("calm", 1u64), ("busy", 3), (hostile, 2), ("nearly-out", 9)] {
        served.start_run(run, 10);
        for i in 0..used {
            served.check(run, "search", json!({"i": i}));
        }
    }
    browser.send(json!({"nav": format!("http://{addr}/live")}));
    browser.until(FIRST_RUN, Duration::from_secs(20), |v| v == "nearly-out");
    let title = browser.eval("document.title");
    assert_eq!(title, "tally: live");
    assert_eq!(browser.eval("typeof window.pwned"), "undefined");
    assert_eq!(
        browser.eval(&format!(
            "[...document.querySelectorAll('#runs td.run')].some(c => c.textContent === {})",
            json!(hostile)
        )),
        true,
        "the hostile run name is shown as text"
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#runs img, #runs script').length"),
        0
    );

    // A loop refusal: shown within a second of the check.
    for _ in 0..3 {
        served.call("calm", "search", json!({"q": "again"}));
    }
    let refused = served.call("calm", "search", json!({"q": "again"}));
    assert_eq!(refused["reason"], "loop_repeated_call", "{refused}");
    let took = browser.until(&row_of("calm", "last"), Duration::from_secs(1), |v| {
        v.as_str()
            .is_some_and(|s| s.starts_with("loop_repeated_call"))
    });
    assert!(took < Duration::from_secs(1), "{took:?}");
    let action = browser.eval(&row_of("calm", "action"));
    assert!(
        action.as_str().is_some_and(|a| a != "-" && !a.is_empty()),
        "{action}"
    );

    // A breaker opening: two failures of `flaky` in a row.
    served.start_run("breaks", 10);
    for i in 0..2 {
        let a = served.check("breaks", "flaky", json!({"i": i}));
        served.outcome("breaks", a["attempt"].as_u64().expect("attempt"), "error");
    }
    browser.until(
        "(() => { const r = document.querySelector('#breakers tbody tr'); return r ? r.textContent : null; })()",
        Duration::from_secs(5),
        |v| v.as_str().is_some_and(|s| s.starts_with("flakyopen")),
    );

    // Load: runs and refusals, then a screenshot for the docs.
    for r in 0..30 {
        let run = format!("agent-{r:02}");
        served.start_run(&run, 20);
        for i in 0..(r % 17) {
            served.check(&run, "search", json!({"i": i}));
        }
        if r % 5 == 0 {
            for _ in 0..5 {
                served.call(&run, "search", json!({"q": "stuck"}));
            }
        }
    }
    browser.until(
        "document.querySelectorAll('#runs tbody tr').length",
        Duration::from_secs(5),
        |v| v.as_u64() == Some(35),
    );
    let shot = std::env::var_os("TALLY_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("live.png"));
    browser.send(json!({"shot": shot}));
    assert!(std::fs::metadata(&shot).expect("screenshot").len() > 10_000);
    // The page on the agent socket: not there.
    let (status, _) = served.agent("GET", "/live", None);
    assert_eq!(status, 403);
}

/// `tally top` in tmux: the table, nearest to a limit first, redrawn as checks come in;
/// `q` quits. On a pipe and under TERM=dumb: one plain table, then exit.
#[test]
fn tally_top_in_tmux_and_on_a_pipe() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let served = tally().serve(dir, &[]);
    served.start_run("far-from-it", 10);
    served.check("far-from-it", "search", json!({"i": 0}));
    served.start_run("close-to-it", 10);
    for i in 0..8 {
        served.check("close-to-it", "search", json!({"i": i}));
    }
    let bin = tally().path().to_path_buf();
    let sock = dir.join("operator.sock");

    // A pipe, and TERM=dumb even on a pipe: one table.
    for term in ["xterm-256color", "dumb"] {
        let out = Command::new(&bin)
            .args(["top", "--operator-socket"])
            .arg(&sock)
            .env("TERM", term)
            .stdin(Stdio::null())
            .output()
            .expect("tally top");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains('\x1b'),
            "escape sequences on a pipe: {text:?}"
        );
        let close = text.find("close-to-it").expect("close-to-it");
        let far = text.find("far-from-it").expect("far-from-it");
        assert!(close < far, "nearest first:\n{text}");
        assert!(text.contains("attempts 80%"), "{text}");
    }
    // `tally runs`: the same order, with the last refusal.
    let runs = ok(dir, &["runs", "--operator-socket", "operator.sock"]);
    assert!(
        runs.find("close-to-it") < runs.find("far-from-it"),
        "{runs}"
    );

    if !tally_testkit::have(
        "tmux",
        &["-V"],
        "apt-get install tmux (README, Development)",
    ) {
        return;
    }
    let session = format!("tally-top-{}", std::process::id());
    let socket = dir.join("tmux.sock");
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux")
    };
    let command = format!(
        "TERM=xterm-256color {} top --operator-socket {}",
        bin.display(),
        sock.display()
    );
    let o = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "40",
        &command,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pane = |want: &dyn Fn(&str) -> bool| -> String {
        let started = Instant::now();
        loop {
            let o = tmux(&["capture-pane", "-p", "-t", &session]);
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            if want(&text) {
                return text;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tally top never showed it:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let text = pane(&|t| t.contains("close-to-it") && t.contains("far-from-it"));
    assert!(
        text.find("close-to-it") < text.find("far-from-it"),
        "{text}"
    );
    assert!(text.contains("runs, nearest to a limit first"), "{text}");
    // A refusal while it runs: redrawn with it.
    for _ in 0..4 {
        served.call("far-from-it", "search", json!({"q": "same"}));
    }
    pane(&|t| t.contains("loop_repeated_call"));
    tmux(&["send-keys", "-t", &session, "q"]);
    let started = Instant::now();
    while tmux(&["has-session", "-t", &session]).status.success() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "q did not quit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = tmux(&["kill-server"]);
}

/// `serve --log-format json`: every line one JSON object, a line per decision with run,
/// tool, decision, reason and seq; never the arguments.
#[test]
fn the_json_log_has_a_line_per_decision_and_no_arguments() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(dir, &["--log-format", "json"]);
    served.start_run("logged", 10);
    let secret = "do-not-log-this-3f9a";
    let mut seqs = Vec::new();
    for _ in 0..4 {
        let a = served.call("logged", "search", json!({ "token": secret }));
        seqs.push(a["seq"].as_u64().expect("seq"));
    }
    // The live page's event stream open on the operator socket: SIGTERM still drains
    // and stops (the stream ends), and the stop line is JSON too.
    let mut page = tally_testkit::have("curl", &[], "apt-get install curl").then(|| {
        Command::new("curl")
            .args(["-sN", "--unix-socket"])
            .arg(dir.join("operator.sock"))
            .arg("http://localhost/v1/live/events")
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl")
    });
    if let Some(p) = &mut page {
        let mut first = String::new();
        BufReader::new(p.stdout.as_mut().expect("stdout"))
            .read_line(&mut first)
            .expect("the stream");
        assert!(first.starts_with("event: snapshot"), "{first:?}");
    }
    let stopping = Instant::now();
    served.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "{:?}",
        stopping.elapsed()
    );
    if let Some(mut p) = page {
        let _ = p.kill();
        let _ = p.wait();
    }
    let log = std::fs::read_to_string(dir.join("serve.log")).expect("log");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(!log.contains(secret), "{log}");
    let decisions: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}"));
            (v["msg"] == "decision").then_some(v)
        })
        .collect();
    let outcomes = decisions.iter().filter(|d| d["kind"] == "outcome").count();
    assert_eq!(outcomes, 3, "{log}");
    let decisions: Vec<&Value> = decisions.iter().filter(|d| d["kind"] == "check").collect();
    assert_eq!(decisions.len(), 4, "{log}");
    for (d, seq) in decisions.iter().zip(&seqs) {
        assert_eq!(d["level"], "info");
        assert_eq!(d["run"], "logged");
        assert_eq!(d["tool"], "search");
        assert_eq!(d["seq"], *seq);
        assert!(d.get("args").is_none());
    }
    assert_eq!(decisions[3]["decision"], "deny");
    assert_eq!(decisions[3]["reason"], "loop_repeated_call");
}

/// An OTLP/HTTP receiver on loopback: every `POST /v1/traces` body decoded with the
/// OpenTelemetry project's protobuf types; its spans as (trace id, parent span id, name,
/// attributes).
struct Receiver {
    addr: std::net::SocketAddr,
    spans: std::sync::Arc<std::sync::Mutex<Vec<ReceivedSpan>>>,
    _rt: tokio::runtime::Runtime,
}

#[derive(Clone, Debug)]
struct ReceivedSpan {
    trace_id: String,
    parent_span_id: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

impl Receiver {
    fn start() -> Receiver {
        use http_body_util::BodyExt;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&spans);
        rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let kept = std::sync::Arc::clone(&kept);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let kept = std::sync::Arc::clone(&kept);
                            async move {
                                let path = req.uri().path().to_owned();
                                let body = req.into_body().collect().await?.to_bytes();
                                if path == "/v1/traces" {
                                    let export = ExportTraceServiceRequest::decode(body)
                                        .expect("an OTLP ExportTraceServiceRequest");
                                    let mut k = kept.lock().unwrap();
                                    for rs in export.resource_spans {
                                        for ss in rs.scope_spans {
                                            for s in ss.spans {
                                                k.push(ReceivedSpan {
                                                    trace_id: hex::encode(&s.trace_id),
                                                    parent_span_id: hex::encode(&s.parent_span_id),
                                                    name: s.name,
                                                    attributes: s
                                                        .attributes
                                                        .into_iter()
                                                        .map(|kv| {
                                                            (kv.key, format!("{:?}", kv.value))
                                                        })
                                                        .collect(),
                                                });
                                            }
                                        }
                                    }
                                }
                                Ok::<_, hyper::Error>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::new()),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            spans,
            _rt: rt,
        }
    }
}

/// A check's span reaches an OTLP receiver the test started, under the GenAI
/// conventions, and its trace id is on the decision in the ledger; an agent's
/// `traceparent` makes the span its child and its trace id the decision's.
#[test]
fn a_span_per_check_reaches_the_collector_and_its_trace_id_is_on_the_decision() {
    if !tally_testkit::have("curl", &[], "apt-get install curl") {
        return;
    }
    let receiver = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let endpoint = format!("http://{}", receiver.addr);
    let mut served = tally().serve(dir, &["--otlp-endpoint", &endpoint]);
    served.start_run("traced", 10);
    let own = served.check("traced", "search", json!({"i": 0}));
    // With the agent's traceparent (curl: a header the test client does not send).
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(dir.join("agent.sock"))
        .args([
            "-H",
            &format!("traceparent: {parent}"),
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"run":"traced","tool":"search","effect":"read","args":{"i":1}}"#,
            "http://localhost/v1/check",
        ])
        .output()
        .expect("curl");
    let child: Value = serde_json::from_slice(&out.stdout).expect("answer");
    assert_eq!(child["decision"], "allow", "{child}");
    // A malformed traceparent is ignored, never an error.
    let bad = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(dir.join("agent.sock"))
        .args([
            "-H",
            "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"run":"traced","tool":"search","effect":"read","args":{"i":2}}"#,
            "http://localhost/v1/check",
        ])
        .output()
        .expect("curl");
    let bad: Value = serde_json::from_slice(&bad.stdout).expect("answer");
    assert_eq!(bad["decision"], "allow", "{bad}");
    // Stopping flushes the batch.
    served.stop();
    let started = Instant::now();
    while receiver.spans.lock().unwrap().len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the receiver got {:?}",
            receiver.spans.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let spans = receiver.spans.lock().unwrap().clone();
    let all = decisions(dir);
    let on = |seq: &Value| all[&seq.as_u64().expect("seq")]["trace_id"].clone();
    for s in &spans {
        assert_eq!(s.name, "execute_tool search");
        assert!(
            s.attributes["gen_ai.operation.name"].contains("execute_tool"),
            "{s:?}"
        );
        assert!(s.attributes["gen_ai.tool.name"].contains("search"), "{s:?}");
        assert!(s.attributes["tally.decision"].contains("allow"), "{s:?}");
    }
    // The agent's trace: the decision carries it, the span is the child of its parent.
    assert_eq!(on(&child["seq"]), "4bf92f3577b34da6a3ce929d0e0e4736");
    let theirs = spans
        .iter()
        .find(|s| s.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736")
        .expect("the span in the agent's trace");
    assert_eq!(theirs.parent_span_id, "00f067aa0ba902b7");
    // The daemon's own traces: each decision's trace id is its span's.
    for answer in [&own, &bad] {
        let id = on(&answer["seq"]);
        let id = id.as_str().expect("a trace id on the decision");
        assert_eq!(id.len(), 32);
        assert_ne!(id, "00000000000000000000000000000000");
        let span = spans.iter().find(|s| s.trace_id == id).expect("its span");
        assert!(span.parent_span_id.is_empty(), "{span:?}");
    }
}

/// `dist/`: the sample policy is valid, and the systemd unit is one systemd accepts, with
/// the hardening README promises.
#[test]
fn the_service_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = tempfile::tempdir().expect("tmp");
    ok(
        tmp.path(),
        &[
            "policy",
            "check",
            root.join("dist/policy.toml").to_str().expect("path"),
        ],
    );
    let unit = std::fs::read_to_string(root.join("dist/tally.service")).expect("unit");
    for line in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "StateDirectory=tally",
        "RuntimeDirectory=tally",
        "--socket-group tally-agents",
        "--operator-socket",
        "--metrics-listen 127.0.0.1:9464",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    if !tally_testkit::have(
        "systemd-analyze",
        &["--version"],
        "apt-get install systemd (README, Development)",
    ) {
        return;
    }
    let bin = tally().path().to_path_buf();
    let here = tmp.path().join("tally.service");
    std::fs::write(
        &here,
        unit.replace("/usr/local/bin/tally", bin.to_str().expect("path")),
    )
    .expect("unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .expect("systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    // It may warn of things outside the unit (this machine's other units); never of ours.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("tally.service"))
        .collect();
    assert!(out.status.success() && ours.is_empty(), "{said}");
}

/// Ten thousand runs: the snapshot is paged on the server, every run is on exactly one
/// page, and across the pages runs come nearest to a limit first.
#[test]
fn ten_thousand_runs_are_paged_in_order() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    std::fs::write(
        dir.join("policy.toml"),
        format!("max_open_runs_per_uid = 20000\n{POLICY}\n[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n"),
    )
    .expect("policy");
    let served = tally().serve(dir, &[]);
    const RUNS: usize = 10_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let socket = dir.join("agent.sock");
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..16 {
            let socket = socket.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = tally_api::client::Client::unix(&socket)
                    .await
                    .expect("connect");
                for i in (t..RUNS).step_by(16) {
                    let run = format!("run-{i:05}");
                    // One check each: every run's nearest limit is its attempts (at
                    // least 47 per mille), which the passing of time does not move, so
                    // the order is the same at every page asked (a run's deadline would
                    // be nearer by a per mille every 3.6 s).
                    let body = json!({"run": run, "budget": {"attempts": 2 + (i % 20)}});
                    let r = c
                        .request(
                            "POST".parse().unwrap(),
                            "/v1/runs",
                            Some("application/json"),
                            body.to_string(),
                        )
                        .await
                        .expect("start");
                    assert_eq!(r.status.as_u16(), 201);
                    {
                        let body = json!({"run": run, "tool": "search", "effect": "read", "args": {"i": i}});
                        let r = c
                            .request(
                                "POST".parse().unwrap(),
                                "/v1/check",
                                Some("application/json"),
                                body.to_string(),
                            )
                            .await
                            .expect("check");
                        assert_eq!(r.status.as_u16(), 200);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    let mut last = u64::MAX;
    let mut page = 0;
    loop {
        let (status, text) = served.operator_text(&format!("/v1/live?page={page}"));
        assert_eq!(status, 200, "{text}");
        let snap: Value = serde_json::from_str(&text).expect("snapshot");
        assert_eq!(snap["total_runs"], RUNS);
        let runs = snap["runs"].as_array().expect("runs");
        if runs.is_empty() {
            break;
        }
        assert!(runs.len() <= 50);
        for r in runs {
            let p = r["closeness"]["permille"].as_u64().expect("permille");
            assert!(
                p <= last,
                "not nearest first at page {page}: {p} after {last}"
            );
            last = p;
            assert!(
                seen.insert(r["run"].as_str().expect("run").to_owned()),
                "{r}"
            );
        }
        page += 1;
    }
    assert_eq!(seen.len(), RUNS);
    assert_eq!(page, RUNS / 50);
    // The first is a run of two attempts that used one: half way.
    let (_, first) = served.operator_text("/v1/live?page=0");
    let first: Value = serde_json::from_str(&first).expect("snapshot");
    assert_eq!(first["runs"][0]["closeness"]["permille"], 500);
    // A page past the end is empty, and a bad parameter is a typed error.
    let (status, text) = served.operator_text("/v1/live?page=x");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_query"), "{text}");
}
