//! kill -9 of the daemon under load loses no acknowledged decision.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_daemon::client::Client;
use tally_ledger::Receipt;

use crate::common::{allow, new_ledger, wait_for_socket, walk};

fn spawn_daemon(ledger: &std::path::Path, socket: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tally-load"))
        .arg("serve")
        .arg("--ledger")
        .arg(ledger)
        .arg("--socket")
        .arg(socket.with_extension("agent"))
        .arg("--operator-socket")
        .arg(socket)
        .stdin(Stdio::null())
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
