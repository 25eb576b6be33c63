//! Principal budgets on the real binary and daemon over its real Unix socket (31 runs in
//! a row from one uid stop at the principal budget): one uid starting run
//! after run draws from one budget; its runs and attempts of the period are counted
//! across them, a refused start says `principal_budget_exceeded` (action ask), the
//! budget survives the loss of the index, and `tally verify` replays the ledger clean.
//!
//! `TALLY_UNDER_TEST` runs these against another build (they fail against one from
//! before principal budgets: every new run was a fresh budget).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn tally() -> Command {
    Command::new(
        std::env::var_os("TALLY_UNDER_TEST")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tally"))),
    )
}

fn run(dir: &Path, args: &[&str]) -> Output {
    tally()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("tally")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "tally {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tally serve` over `dir/ledger` under `dir/policy.toml`; stopped (SIGTERM) on drop.
struct Served {
    dir: PathBuf,
    child: Option<Child>,
}

impl Served {
    fn start(dir: &Path) -> Served {
        let _ = std::fs::remove_file(dir.join("agent.sock"));
        let _ = std::fs::remove_file(dir.join("operator.sock"));
        let child = tally()
            .args([
                "serve",
                "--ledger",
                "ledger",
                "--socket",
                "agent.sock",
                "--operator-socket",
                "operator.sock",
                "--policy",
                "policy.toml",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tally serve");
        let started = Instant::now();
        while !(dir.join("agent.sock").exists() && dir.join("operator.sock").exists()) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tally serve did not open its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Served {
            dir: dir.to_path_buf(),
            child: Some(child),
        }
    }

    fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        request(&self.dir.join("agent.sock"), method, path, body)
    }

    /// The decision on one read by `run`, and its reason.
    fn check(&self, run: &str) -> (String, String) {
        let (status, v) = self.agent(
            "POST",
            "/v1/check",
            Some(json!({"run": run, "tool": "search", "effect": "read", "args": {"q": rand()}})),
        );
        assert_eq!(status, 200, "{v}");
        (
            v["decision"].as_str().unwrap_or("?").to_owned(),
            v["reason"].as_str().unwrap_or("").to_owned(),
        )
    }

    /// Stop the daemon cleanly (SIGTERM) and wait for it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::TERM,
            );
            let started = Instant::now();
            while child.try_wait().expect("wait").is_none() {
                if started.elapsed() > Duration::from_secs(20) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Distinct arguments for each call (no loop rule fires).
fn rand() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn request(socket: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
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
    })
}

/// A fresh ledger in `dir/ledger` and `policy` in `dir/policy.toml`.
fn ledger(dir: &Path, policy: &str) {
    ok(dir, &["keygen", "--out", "auditor.key"]);
    ok(
        dir,
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
    );
    std::fs::write(dir.join("policy.toml"), policy).expect("policy");
}

/// `tally verify` with the auditor key: INTACT, and replay finds nothing.
fn verifies(dir: &Path) -> Value {
    let out = run(
        dir,
        &[
            "verify",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.key",
            "--json",
        ],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "{report}");
    assert_eq!(report["replay"]["findings"], json!([]), "{report}");
    report
}

#[test]
fn thirty_one_runs_in_a_row_from_one_uid_stop_at_the_principal_budget() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    // 30 runs of 5 calls would be 150 allows; the uid's budget is 30 runs and 148
    // attempts a day, whatever each run's own budget says.
    ledger(
        d,
        "[principals.default]\nruns = 30\nattempts = 148\nperiod_ms = 86400000\n",
    );
    let mut s = Served::start(d);
    let mut allowed = 0;
    let mut denied = Vec::new();
    let mut refused_at = None;
    for i in 1..=31 {
        let run = format!("run-{i}");
        let (status, v) = s.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "one more try", "budget": {"attempts": 10}})),
        );
        if status != 201 {
            assert_eq!(status, 403, "{v}");
            assert_eq!(v["error"]["code"], "principal_budget_exceeded", "{v}");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(msg.contains("action ask"), "{v}");
            refused_at = Some(i);
            break;
        }
        for _ in 0..5 {
            match s.check(&run) {
                (d, _) if d == "allow" => allowed += 1,
                (d, r) => {
                    assert_eq!(
                        (d.as_str(), r.as_str()),
                        ("deny", "principal_budget_exceeded")
                    );
                    denied.push(i);
                }
            }
        }
        let (status, v) = s.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
    }
    assert_eq!(allowed, 148, "the uid's attempts, across its runs");
    assert_eq!(denied, vec![30, 30], "the 30th run's last two calls");
    assert_eq!(refused_at, Some(31), "the 31st run does not start");
    // The uid's usage, as the gate counts it, in every run's standing (GET /v1/runs and
    // `tally runs`) and in a run's own (GET /v1/runs/RUN).
    let runs: Value = serde_json::from_str(&ok(
        d,
        &["runs", "--operator-socket", "operator.sock", "--json"],
    ))
    .expect("runs json");
    let runs = runs.as_array().expect("a list");
    assert!(!runs.is_empty());
    for r in runs {
        assert_eq!(
            r["limits"]["principal_runs"],
            json!({"used": 30, "limit": 30}),
            "{r}"
        );
        assert_eq!(
            r["limits"]["principal_attempts"],
            json!({"used": 148, "limit": 148}),
            "{r}"
        );
        assert!(r["limits"].get("principal_spend_nanos").is_none(), "{r}");
    }
    let text = ok(d, &["runs", "--operator-socket", "operator.sock"]);
    // The nearest limit of every run is the uid's attempts, used up.
    assert_eq!(
        text.lines()
            .skip(1)
            .filter(|l| l.contains("principal_attempts 100%"))
            .count(),
        runs.len(),
        "{text}"
    );
    let (status, v) = s.agent("GET", "/v1/runs/run-30", None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["limits"]["principal_attempts"]["used"], 148, "{v}");
    s.stop();

    // The budget is state with the decisions: the index lost, it comes back from the log.
    std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index");
    let mut s = Served::start(d);
    let (status, v) = s.agent("POST", "/v1/runs", Some(json!({"run": "after-restart"})));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("principal_budget_exceeded")),
        "{v}"
    );
    s.stop();

    let report = verifies(d);
    assert_eq!(
        report["replay"]["replayed"].as_u64(),
        Some(150),
        "every allow and deny decided again: {report}"
    );
}
