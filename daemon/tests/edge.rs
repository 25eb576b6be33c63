//! `tally serve` at its edge: what it says at start, at a clean stop and on a
//! failure, through the real binary's `tally_daemon::run` (`tally-load serve`).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tally_api::client::Client;
use tally_daemon::{DaemonError, ServeOptions};

use crate::common::{new_ledger, open_ledger, post_json, wait_for_socket};

fn tally_load() -> Command {
    Command::new(crate::common::tally_load())
}

fn size(ledger: &Path) -> u64 {
    open_ledger(ledger).checkpoint().size
}

// Regression: a missing socket directory gave a cryptic double error that
// named a temporary directory; now one error names the directory and what to do, and
// neither the ledger nor anything else is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_12_a_missing_socket_directory_is_one_clear_error_and_changes_nothing() {
    let (dir, ledger, _) = new_ledger(Default::default());
    let before = size(&ledger);
    let missing = dir.path().join("run").join("tally");
    for (agent, operator) in [
        (missing.join("agent.sock"), None),
        (
            dir.path().join("agent.sock"),
            Some(missing.join("operator.sock")),
        ),
    ] {
        let mut options = ServeOptions::new(&ledger, &agent);
        options.operator_socket = operator;
        let l = Arc::new(open_ledger(&ledger));
        let err = tally_daemon::serve(l, options, async {})
            .await
            .expect_err("a missing socket directory is refused");
        match &err {
            DaemonError::SocketDirMissing { dir, .. } => assert_eq!(dir, &missing),
            other => panic!("expected SocketDirMissing, got {other:?}"),
        }
        assert!(
            std::error::Error::source(&err).is_none(),
            "the cause is in the message, not repeated as a source"
        );
        let text = err.to_string();
        assert!(
            text.contains(&*missing.to_string_lossy()) && text.contains("install -d"),
            "{text}"
        );
        assert!(!agent.exists(), "no socket was created");
    }
    assert_eq!(size(&ledger), before, "nothing was recorded in the ledger");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        1,
        "nothing but the ledger is in the directory"
    );

    // The binary: exit 2 and exactly one line, naming the directory.
    let out = tally_load()
        .arg("serve")
        .arg("--ledger")
        .arg(&ledger)
        .arg("--socket")
        .arg(missing.join("agent.sock"))
        .output()
        .expect("run tally-load serve");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&*missing.to_string_lossy()), "{stderr}");
    assert!(
        !stderr.contains(".d:"),
        "names no temporary directory: {stderr}"
    );
    assert_eq!(size(&ledger), before);
}

// Regression: `tally serve` said nothing at start or stop. Now one line
// when it listens (sockets, ledger, policy digest, limits) and one at a clean stop, and
// neither names what agents sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_12_serve_logs_one_line_at_start_and_one_at_a_clean_stop() {
    let (dir, ledger, _) = new_ledger(Default::default());
    let agent = dir.path().join("agent.sock");
    let operator = dir.path().join("operator.sock");
    let mut child = tally_load()
        .arg("serve")
        .arg("--ledger")
        .arg(&ledger)
        .arg("--socket")
        .arg(&agent)
        .arg("--operator-socket")
        .arg(&operator)
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tally-load serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("the start line");
    for part in [
        "tally serve: listening on",
        &*agent.to_string_lossy(),
        &*operator.to_string_lossy(),
        &*ledger.to_string_lossy(),
        "policy digest",
        "per peer",
    ] {
        assert!(first.contains(part), "{part:?} missing from {first:?}");
    }
    // The read-only view's listener, when asked for, is named with the port it got.
    assert!(
        first.contains("/metrics and the live page (/live) on http://127.0.0.1:")
            && !first.contains("127.0.0.1:0;"),
        "the metrics listener missing from {first:?}"
    );
    wait_for_socket(&agent).await;
    let mut c = Client::unix(&agent).await.expect("connect");
    let (status, body) = post_json(
        &mut c,
        "/v1/runs",
        &json!({"run": "r", "goal": "secret-goal-text"}).to_string(),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post_json(
        &mut c,
        "/v1/check",
        &json!({"run": "r", "tool": "http", "effect": "read", "args": {"token": "secret-arg-value"}}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    drop(c);
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    let rest = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the daemon stops");
    let exit = child.wait().expect("wait");
    assert!(exit.success(), "SIGTERM exits 0: {exit:?}");
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines.len(), 1, "one line at the stop: {rest:?}");
    assert!(
        lines[0].starts_with("tally serve: stopped cleanly on SIGTERM"),
        "{rest:?}"
    );
    for text in [&first, &rest] {
        assert!(
            !text.contains("secret-goal-text") && !text.contains("secret-arg-value"),
            "nothing an agent sent is logged: {text}"
        );
    }
}

// The per-peer rate limit (`--rate-per-sec`) counted only raw decisions on the operator
// socket, so it held no agent back; every gate POST on the agent socket now pays one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds_back_an_agent_s_gate_calls() {
    let clock = std::sync::Arc::new(tally_ledger::clock::ManualClock::new(1_700_000_000_000));
    let moved = std::sync::Arc::clone(&clock) as std::sync::Arc<dyn tally_ledger::clock::Clock>;
    let mut daemon = crate::common::Daemon::start(|o| {
        o.limits.rate_per_sec = Some(5);
        o.clock = moved;
    })
    .await;
    let mut c = daemon.agent().await;
    let (status, body) = post_json(&mut c, "/v1/runs", r#"{"run":"r"}"#).await;
    assert_eq!(status, 201, "{body}");
    let mut limited = 0;
    for i in 0..10 {
        // A 429 closes its connection: a new one each time.
        let mut c = daemon.agent().await;
        let body =
            json!({"run": "r", "tool": "http", "effect": "read", "operation": format!("op-{i}")});
        let reply = c
            .request(
                tally_api::client::Method::POST,
                "/v1/check",
                Some("application/json"),
                body.to_string(),
            )
            .await
            .expect("request");
        match reply.status.as_u16() {
            200 => {}
            429 => {
                let e: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
                assert_eq!(e["error"]["code"], "rate_limited", "{e}");
                limited += 1;
            }
            other => panic!("status {other}"),
        }
    }
    assert!(
        limited >= 4,
        "only {limited} of 10 checks over 5/s were held back"
    );
    // The bucket refills: a second later the agent is let in again.
    clock.advance(1000);
    let mut c = daemon.agent().await;
    let (status, body) = post_json(
        &mut c,
        "/v1/check",
        r#"{"run":"r","tool":"http","effect":"read","operation":"later"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
}
