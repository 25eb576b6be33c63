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

mod desk;
mod log;
mod metrics;
mod page;
mod paging;
mod pg_view;
#[path = "../common/ledger.rs"]
#[allow(dead_code)]
mod recorded;
mod restart;
mod runs;
mod service;
mod spans;
mod tmux;
mod top;

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
    recorded::by_seq(dir)
}

fn python_has(module: &str, fix: &str) -> bool {
    tally_testkit::have("python3", &["-c", &format!("import {module}")], fix)
}
