//! What the benchmarks that start this build's `tally serve` share: their knobs, a
//! ledger and a daemon in a temporary directory, runs started on the agent socket, and
//! the gate's own check-and-outcome loop that each line is compared with.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

/// How long each line runs: `TALLY_BENCH_SECS`, 3 s by default.
pub fn secs() -> Duration {
    Duration::from_secs_f64(
        std::env::var("TALLY_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3.0),
    )
}

/// The client counts to run (`TALLY_BENCH_ONLY=1,64`), or all of them.
pub fn only() -> Option<Vec<usize>> {
    std::env::var("TALLY_BENCH_ONLY")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
}

/// A duration in whole µs.
pub fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

/// `tally ARGS` in `dir`, which must succeed.
pub fn tally(dir: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("tally");
    assert!(out.status.success(), "tally {args:?}: {out:?}");
}

/// A temporary directory with an auditor key and a ledger in it.
pub fn ledger_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    tally(d, &["keygen", "--out", "auditor.key"]);
    tally(
        d,
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
    );
    dir
}

/// A loopback address with a free port.
pub fn free_addr() -> SocketAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    ([127, 0, 0, 1], port).into()
}

/// `tally serve` on the ledger and `policy.toml` of a [`ledger_dir`], killed on drop.
pub struct Daemon {
    _dir: tempfile::TempDir,
    pub child: Child,
    /// The agent socket.
    pub socket: PathBuf,
    /// Where its listener (`LISTEN_FLAG` of [`Daemon::serve`]) listens.
    pub addr: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// `tally serve` in `dir` with `listen_flag ADDR` and `extra` flags, once its agent
    /// socket exists and `ADDR` takes connections (at most 30 s).
    pub fn serve(dir: tempfile::TempDir, listen_flag: &str, extra: &[&str]) -> Daemon {
        let addr = free_addr();
        let listen = addr.to_string();
        let mut args = vec![
            "serve",
            "--ledger",
            "ledger",
            "--socket",
            "agent.sock",
            "--operator-socket",
            "operator.sock",
            "--policy",
            "policy.toml",
            listen_flag,
            &listen,
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(&args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tally serve");
        let socket = dir.path().join("agent.sock");
        let t = Instant::now();
        while !socket.exists() || std::net::TcpStream::connect(addr).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "tally serve did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            _dir: dir,
            child,
            socket,
            addr,
        }
    }
}

/// Start `n` runs named `PREFIX-i`; their names and tokens.
pub async fn runs(socket: &Path, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut c = tally_api::client::Client::unix(socket)
        .await
        .expect("connect");
    let mut out = vec![];
    for i in 0..n {
        let run = format!("{prefix}-{i}");
        let r = c
            .request(
                hyper::Method::POST,
                "/v1/runs",
                Some("application/json"),
                json!({"run": run, "budget": {"spend_cents": 1000000000u64, "attempts": 1000000000u64}})
                    .to_string(),
            )
            .await
            .expect("start");
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
        let token = v["token"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"))
            .to_string();
        out.push((run, token));
    }
    out
}

/// The gate's own checks: a closed loop of a check and its outcome on the agent socket
/// for [`secs`], one client per run; each client's latencies, and the time it took.
pub async fn check_pairs(socket: &Path, runs: &[String]) -> (Vec<Vec<Duration>>, Duration) {
    let start = Instant::now();
    let deadline = start + secs();
    let mut tasks = vec![];
    for run in runs {
        let (socket, run) = (socket.to_path_buf(), run.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = tally_api::client::Client::unix(&socket)
                .await
                .expect("connect");
            let (mut lat, mut n) = (vec![], 0u64);
            while Instant::now() < deadline {
                n += 1;
                let t = Instant::now();
                let check = json!({"run": run, "tool": "bench", "effect": "read",
                                   "args": {"n": n}, "reserve_cents": 0});
                let a = c
                    .request(
                        hyper::Method::POST,
                        "/v1/check",
                        Some("application/json"),
                        check.to_string(),
                    )
                    .await
                    .expect("check");
                let a: serde_json::Value = serde_json::from_slice(&a.body).expect("JSON");
                assert_eq!(a["decision"], "allow", "{a}");
                let outcome = json!({"run": run, "attempt": a["attempt"], "status": "ok"});
                c.request(
                    hyper::Method::POST,
                    "/v1/outcome",
                    Some("application/json"),
                    outcome.to_string(),
                )
                .await
                .expect("outcome");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut per_client = vec![];
    for t in tasks {
        per_client.push(t.await.expect("client"));
    }
    (per_client, start.elapsed())
}
