//! kill -9 of the daemon under load loses no acknowledged decision.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_api::client::Client;
use tally_ledger::Receipt;

use crate::common::{allow, new_ledger, tally_load, wait_for_socket, walk};

fn spawn_daemon(ledger: &std::path::Path, socket: &std::path::Path) -> Child {
    spawn(ledger, &socket.with_extension("agent"), socket, None)
}

/// `tally-load serve` in a child process: the agent socket, the operator socket, and a
/// policy file if given.
pub(crate) fn spawn(
    ledger: &std::path::Path,
    agent: &std::path::Path,
    operator: &std::path::Path,
    policy: Option<&std::path::Path>,
) -> Child {
    let mut c = Command::new(tally_load());
    c.arg("serve")
        .arg("--ledger")
        .arg(ledger)
        .arg("--socket")
        .arg(agent)
        .arg("--operator-socket")
        .arg(operator);
    if let Some(p) = policy {
        c.arg("--policy").arg(p);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tally-load serve")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_acknowledged_decision() {
    let (dir, ledger_dir, auditor) = new_ledger(Default::default());
    let socket = dir.path().join("tally.sock");
    let mut acked: Vec<(Receipt, String)> = Vec::new();
    for round in 0..3 {
        let mut child = spawn_daemon(&ledger_dir, &socket);
        wait_for_socket(&socket).await;
        let mut clients = Vec::new();
        for client in 0..16 {
            let socket = socket.clone();
            clients.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                let Ok(mut c) = Client::unix(&socket).await else {
                    return mine;
                };
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    let marker = format!("r{round}c{client}");
                    let lines: Vec<String> = (0..1 + n % 3)
                        .map(|k| allow(&marker, &marker, n * 10 + k))
                        .collect();
                    let result = if lines.len() == 1 {
                        c.append(&lines[0]).await
                    } else {
                        c.append_ndjson(lines.join("\n")).await
                    };
                    // After the kill every call fails: its outcome is unknown, not acknowledged.
                    let Ok(receipts) = result else { break };
                    mine.extend(receipts.into_iter().map(|r| (r, marker.clone())));
                }
                mine
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let before = acked.len();
        for c in clients {
            acked.extend(c.await.expect("client"));
        }
        assert!(
            acked.len() > before + 16,
            "round {round}: load was running when killed ({} acks)",
            acked.len() - before
        );
        assert!(socket.exists(), "kill -9 leaves the socket file behind");
    }

    // The next daemon replaces the stale socket and continues the chain.
    let mut child = spawn_daemon(&ledger_dir, &socket);
    wait_for_socket(&socket).await;
    let mut c = Client::unix(&socket).await.expect("connect");
    let last = c
        .append(&allow("after", "after", 1))
        .await
        .expect("append after restart");
    drop(c);
    let term = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let status = child.wait().expect("wait");
    assert!(status.success(), "SIGTERM exits 0: {status:?}");
    assert!(!socket.exists(), "a clean exit removes the socket");

    let chain = walk(&ledger_dir, &auditor);
    let receipts: Vec<Receipt> = acked.iter().map(|a| a.0).collect();
    chain.assert_holds(&receipts);
    chain.assert_holds(&last);
    for (r, marker) in &acked {
        let d = chain.entries[r.seq as usize]
            .decision
            .as_ref()
            .expect("a decision");
        assert_eq!(&d.run, marker, "seq {}", r.seq);
    }
    assert_eq!(
        last[0].seq + 1,
        chain.entries.len() as u64,
        "the restart appended at the head"
    );
}

fn spawn_gate(
    ledger: &std::path::Path,
    agent: &std::path::Path,
    policy: &std::path::Path,
) -> Child {
    spawn(ledger, agent, &agent.with_extension("op"), Some(policy))
}

/// kill -9 while 16 workers check: every acknowledged decision survives, and the gate's
/// state after the restart counts exactly the allows the chain holds (never behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_checks_loses_no_decision_and_state_is_never_behind() {
    use crate::common::post_json;
    let (dir, ledger_dir, auditor) = new_ledger(Default::default());
    let agent = dir.path().join("agent.sock");
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[ceiling]\nattempts = 1000000\nspend_cents = 100000000\nside_effects = 1000000\n[rate]\nrun_per_sec = 0\ntool_per_sec = 0\ntool_in_flight = 0\n",
    )
    .expect("policy");
    let mut acked: Vec<Receipt> = Vec::new();
    let mut allows_acked = 0u64;
    for round in 0..2 {
        let mut child = spawn_gate(&ledger_dir, &agent, &policy);
        wait_for_socket(&agent).await;
        let run = format!("r{round}");
        let mut c = Client::unix(&agent).await.expect("connect");
        let (status, started) =
            post_json(&mut c, "/v1/runs", &format!(r#"{{"run":"{run}"}}"#)).await;
        assert_eq!(status, 201, "{started}");
        let mut clients = Vec::new();
        for w in 0..16 {
            let (agent, run) = (agent.clone(), run.clone());
            clients.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                let Ok(mut c) = Client::unix(&agent).await else {
                    return mine;
                };
                for n in 0.. {
                    let body = format!(
                        r#"{{"run":"{run}","worker":"w{w}","tool":"t{w}","operation":"o-{w}-{n}","effect":"read","reserve_cents":1}}"#
                    );
                    let reply = c
                        .request(
                            tally_api::client::Method::POST,
                            "/v1/check",
                            Some("application/json"),
                            body,
                        )
                        .await;
                    let Ok(reply) = reply else { break };
                    let Ok(a) = serde_json::from_slice::<serde_json::Value>(&reply.body) else {
                        break;
                    };
                    if a["decision"] != "allow" {
                        break;
                    }
                    let hash = a["hash"].as_str().unwrap_or_default();
                    let mut h = [0u8; 32];
                    for (i, b) in h.iter_mut().enumerate() {
                        *b = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).expect("hex");
                    }
                    mine.push(Receipt {
                        seq: a["seq"].as_u64().expect("seq"),
                        hash: tally_ledger::Hash(h),
                    });
                }
                mine
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let before = acked.len();
        for c in clients {
            acked.extend(c.await.expect("client"));
        }
        let this_round = (acked.len() - before) as u64;
        assert!(
            this_round > 16,
            "round {round}: checks were running when killed"
        );
        allows_acked += this_round;
        drop(c);

        // Restart: the run's state holds at least every acknowledged allow, and exactly
        // the allows the chain holds (state and decisions commit together).
        let mut child = spawn_gate(&ledger_dir, &agent, &policy);
        wait_for_socket(&agent).await;
        let mut c = Client::unix(&agent).await.expect("connect");
        let standing: serde_json::Value = serde_json::from_slice(
            &crate::common::get(&mut c, &format!("/v1/runs/{run}"))
                .await
                .body,
        )
        .expect("json");
        drop(c);
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let chain = walk(&ledger_dir, &auditor);
        let in_chain = chain
            .entries
            .iter()
            .filter_map(|e| e.decision.as_ref())
            .filter(|d| d.run == run && d.kind() == tally_ledger::Kind::Allow)
            .count() as u64;
        let used = standing["limits"]["attempts"]["used"]
            .as_u64()
            .expect("used");
        assert!(
            used >= this_round,
            "state behind the acknowledged allows: {standing}"
        );
        assert_eq!(used, in_chain, "state and chain disagree: {standing}");
        assert_eq!(standing["held_nanos"].as_u64(), Some(in_chain * 10_000_000));
    }
    let chain = walk(&ledger_dir, &auditor);
    chain.assert_holds(&acked);
    assert!(allows_acked > 32);
}
