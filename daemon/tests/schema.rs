//! The agent API against its OpenAPI document (`docs/openapi.yaml`), by schemathesis.
//!
//! Starts the real daemon (`tally-load serve`) on a fresh ledger with a loopback TCP
//! listener, pre-seeds two runs, and runs schemathesis over every operation tagged
//! `agent` (only the agent API is on TCP; the operator socket is a Unix socket, which
//! schemathesis cannot reach). Every phase runs (examples, coverage, fuzzing, stateful)
//! with every check except the two that cannot apply (see [`EXCLUDED_CHECKS`]): no 5xx,
//! every status, content type, header and body inside the spec, schema-violating
//! requests refused, schema-valid ones accepted, undeclared methods answered 405.
//!
//! Needs `schemathesis` on `PATH` (`pip install schemathesis`). Without it the test
//! fails under CI (env `CI` set) and is skipped, loudly, elsewhere.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::tally_load;

/// Runs started before schemathesis, so the operations on an existing run are exercised:
/// the spec's examples name them (`r` for check, outcome and `GET /v1/runs/{run}`;
/// `r-stop` for `POST /v1/runs/{run}/stop`, so that `r` stays open for the checks).
const SEEDED_RUNS: &[&str] = &["r", "r-stop"];

/// Checks that cannot apply to this API, excluded explicitly:
/// * `ignored_auth`: the spec declares no security scheme, because the API has no
///   authentication to ignore: identity is the socket peer (`SO_PEERCRED`), and every
///   loopback TCP peer is one identity by design (docs/DAEMON.md).
/// * `object_level_authorization`: needs two identities; over TCP there is only one.
///   Per-uid run ownership is a Unix-socket property, tested by `ownership.rs`.
///
/// (`use_after_free` stays on: the API has no DELETE, so it has nothing to find unless
/// one appears.)
const EXCLUDED_CHECKS: &str = "ignored_auth,object_level_authorization";

/// Generous: the run takes about 10 s alone on the 2-core machine.
const SCHEMATHESIS_TIMEOUT: Duration = Duration::from_secs(240);

/// The daemon, killed when dropped.
struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on loopback that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// One HTTP/1.1 request over a fresh connection: the status and the body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(body) = body {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body.unwrap_or(""));
    stream.write_all(request.as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn start_daemon(dir: &Path, addr: SocketAddr) -> Serve {
    let ledger = dir.join("ledger");
    let init = Command::new(tally_load())
        .arg("init")
        .arg("--ledger")
        .arg(&ledger)
        .output()
        .expect("run tally-load init");
    assert!(
        init.status.success(),
        "tally-load init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    // The daemon refuses a ledger directory other users can enter.
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o700))
        .expect("chmod ledger");
    let log = dir.join("serve.log");
    let child = Command::new(tally_load())
        .arg("serve")
        .arg("--ledger")
        .arg(&ledger)
        .arg("--socket")
        .arg(dir.join("agent.sock"))
        .arg("--operator-socket")
        .arg(dir.join("operator.sock"))
        .arg("--listen")
        .arg(addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create serve.log"))
        .spawn()
        .expect("spawn tally-load serve");
    let mut serve = Serve { child, log };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = http(addr, "GET", "/v1/health", None) {
            return serve;
        }
        if let Ok(Some(status)) = serve.child.try_wait() {
            panic!(
                "tally-load serve exited ({status}) before answering:\n{}",
                serve.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "tally-load serve did not answer on {addr}:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `schemathesis` can be run at all.
/// Run `command` to its end, or kill it after `limit`: its exit status, its output
/// (stdout and stderr, interleaved), and whether it ended by itself.
fn run_bounded(mut command: Command, limit: Duration, dir: &Path) -> (ExitStatus, String, bool) {
    let out = dir.join("schemathesis.out");
    let file = std::fs::File::create(&out).expect("create schemathesis.out");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup schemathesis.out"))
        .stderr(file)
        .spawn()
        .expect("spawn schemathesis");
    let deadline = Instant::now() + limit;
    let (status, ended) = loop {
        if let Some(status) = child.try_wait().expect("wait for schemathesis") {
            break (status, true);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break (child.wait().expect("reap schemathesis"), false);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = String::from_utf8_lossy(&std::fs::read(&out).unwrap_or_default()).into_owned();
    (status, text, ended)
}

#[test]
fn schemathesis_finds_no_5xx_and_nothing_outside_the_schema() {
    if !tally_testkit::have(
        "schemathesis",
        &[],
        "python3 -m pip install 'schemathesis==4.32.5'",
    ) {
        return;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = crate_dir.join("../docs/openapi.yaml");
    let config = crate_dir.join("tests/schemathesis/schemathesis.toml");
    assert!(spec.is_file(), "{} is missing", spec.display());

    let dir = tempfile::tempdir().expect("tempdir");
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let serve = start_daemon(dir.path(), addr);
    for run in SEEDED_RUNS {
        let body = format!(r#"{{"run":"{run}","goal":"seeded for schemathesis"}}"#);
        let (status, reply) = http(addr, "POST", "/v1/runs", Some(&body)).expect("seed a run");
        assert_eq!(status, 201, "seeding run `{run}`: {reply}");
    }

    let mut command = Command::new("schemathesis");
    command
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(&spec)
        .arg("--url")
        .arg(format!("http://{addr}"))
        .args(["--include-tag", "agent"])
        .args(["--checks", "all"])
        .args(["--exclude-checks", EXCLUDED_CHECKS])
        .args(["--max-examples", "30"])
        .args(["--seed", "1"])
        .args(["--workers", "1"])
        .args(["--request-timeout", "20"])
        // No example database: every run starts from the seed alone (repeatable), and
        // nothing is written outside the temporary directory.
        .args(["--generation-database", "none"])
        .current_dir(dir.path())
        .env("PYTHONIOENCODING", "utf-8")
        .env("NO_COLOR", "1");
    let started = Instant::now();
    let (status, text, ended) = run_bounded(command, SCHEMATHESIS_TIMEOUT, dir.path());
    let daemon_alive = http(addr, "GET", "/v1/health", None).map(|(s, _)| s);
    assert!(
        ended,
        "schemathesis did not finish within {SCHEMATHESIS_TIMEOUT:?}:\n{text}\n--- daemon log ---\n{}",
        serve.log()
    );
    assert!(
        status.success(),
        "schemathesis failed ({status}):\n{text}\n--- daemon health after the run: {daemon_alive:?}\n--- daemon log ---\n{}",
        serve.log()
    );
    assert!(
        matches!(daemon_alive, Ok(200)),
        "the daemon is not healthy after the run: {daemon_alive:?}\n{}",
        serve.log()
    );
    let summary: Vec<&str> = text.lines().rev().take(12).collect();
    eprintln!(
        "schemathesis passed in {:.1} s:\n{}",
        started.elapsed().as_secs_f64(),
        summary.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Without schemathesis the test above says SKIPPED where a person running `cargo test`
/// sees it (not in the harness's captured output), and fails under `CI`: it is never a
/// quiet `ok`.
#[test]
fn without_schemathesis_the_schema_test_says_skipped_and_fails_under_ci() {
    let empty = tempfile::tempdir().expect("tempdir");
    let run = |ci: bool| {
        let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
        cmd.args([
            "--exact",
            "schema::schemathesis_finds_no_5xx_and_nothing_outside_the_schema",
            "--test-threads=1",
        ])
        // No schemathesis on this PATH.
        .env("PATH", empty.path())
        .env_remove("CI");
        if ci {
            cmd.env("CI", "1");
        }
        let out = cmd.output().expect("run the schema test");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, stderr) = run(false);
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains(
            "SKIPPED schema::schemathesis_finds_no_5xx_and_nothing_outside_the_schema: \
             `schemathesis` cannot be run"
        ) && stderr.contains("pip install 'schemathesis==4.32.5'"),
        "{stderr}"
    );
    let (status, output) = run(true);
    assert!(
        !status.success(),
        "passed under CI without schemathesis: {output}"
    );
}
