//! Many clients at once: interleaved runs, shared group commits, nothing lost, no gap.

use tally_ledger::Receipt;

use std::time::Duration;

use crate::common::{allow, raw, walk, Daemon};

const CLIENTS: usize = 32;
const REQUESTS: usize = 30;
const RUNS: usize = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_clients_interleave_many_runs_with_no_gap_and_no_loss() {
    let mut daemon = Daemon::start(|o| o.limits.max_in_flight = 16).await;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let socket = daemon.socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = tally_api::client::Client::unix(&socket)
                .await
                .expect("connect");
            let mut acked: Vec<(Receipt, String, String, u64)> = Vec::new();
            let mut n = 0u64;
            for request in 0..REQUESTS {
                // Alternate single decisions and NDJSON batches of 2..=5.
                let size = if request % 2 == 0 { 1 } else { 2 + request % 4 };
                let sent: Vec<(String, String, u64)> = (0..size)
                    .map(|_| {
                        n += 1;
                        let run = format!("run-{}", (client * 7 + n as usize) % RUNS);
                        (run, format!("c{client}"), n)
                    })
                    .collect();
                let lines: Vec<String> = sent.iter().map(|(r, w, at)| allow(r, w, *at)).collect();
                let receipts = if size == 1 {
                    c.append(&lines[0]).await
                } else {
                    c.append_ndjson(lines.join("\n")).await
                }
                .expect("append acknowledged");
                assert_eq!(receipts.len(), size);
                for w in receipts.windows(2) {
                    assert_eq!(w[1].seq, w[0].seq + 1, "a batch gets consecutive seqs");
                }
                for (r, (run, worker, at)) in receipts.into_iter().zip(sent) {
                    acked.push((r, run, worker, at));
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.expect("client task"));
    }
    let total = acked.len();
    assert_eq!(
        total,
        CLIENTS
            * (REQUESTS / 2
                + (0..REQUESTS)
                    .filter(|r| r % 2 == 1)
                    .map(|r| 2 + r % 4)
                    .sum::<usize>())
    );

    daemon.shutdown().await.expect("clean shutdown");

    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    assert_eq!(
        chain.entries.len(),
        total + 1,
        "exactly the acknowledged decisions after genesis"
    );
    let receipts: Vec<Receipt> = acked.iter().map(|a| a.0).collect();
    chain.assert_holds(&receipts);
    for (receipt, run, worker, at) in &acked {
        let d = chain.entries[receipt.seq as usize]
            .decision
            .as_ref()
            .unwrap_or_else(|| panic!("seq {} is not a decision", receipt.seq));
        assert_eq!(
            (&d.run, d.worker.as_deref(), d.at_ms),
            (run, Some(worker.as_str()), Some(*at)),
            "seq {}",
            receipt.seq
        );
        assert!(
            d.args.is_none() && d.args_digest.is_some(),
            "raw args never stored"
        );
    }
}

/// Bodies over 32 KiB are parsed on the daemon's parse threads (four): more clients than
/// threads, a client that hangs up right after sending, and a bad line deep in a big body
/// all get exact answers, and the chain holds exactly the acknowledged batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_batches_parse_on_parse_threads_and_hang_ups_change_nothing() {
    const LINES: usize = 400;
    const CLIENTS: usize = 6;
    let mut daemon = Daemon::start(|_| {}).await;
    let batch = |client: usize, round: usize| -> String {
        let lines: Vec<String> = (0..LINES)
            .map(|i| allow(&format!("big-{client}"), "w", (round * LINES + i) as u64))
            .collect();
        lines.join("\n")
    };
    assert!(batch(0, 0).len() > 32 * 1024, "over the inline-parse size");

    // A client that sends a big batch and hangs up at once: its parse runs on, and its
    // decisions are appended (the request was whole), or not; either way no other
    // request is affected, and the walk below accounts for it.
    let body = batch(99, 0);
    let request = format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    drop(raw(&daemon.socket, request.as_bytes(), Duration::from_millis(0)).await);

    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let socket = daemon.socket.clone();
        let bodies: Vec<String> = (0..3).map(|round| batch(client, round)).collect();
        tasks.push(tokio::spawn(async move {
            let mut c = tally_api::client::Client::unix(&socket)
                .await
                .expect("connect");
            let mut acked = Vec::new();
            for body in bodies {
                let receipts = c.append_ndjson(body).await.expect("big batch acknowledged");
                assert_eq!(receipts.len(), LINES);
                for w in receipts.windows(2) {
                    assert_eq!(w[1].seq, w[0].seq + 1, "a batch gets consecutive seqs");
                }
                acked.extend(receipts);
            }
            acked
        }));
    }
    // A bad line deep in a big body: refused whole, with its line.
    let mut lines: Vec<String> = (0..LINES)
        .map(|i| allow("big-bad", "w", i as u64))
        .collect();
    lines[349] = r#"{"run":"big-bad","kind":"allow","reserve_cents":"two"}"#.into();
    let mut c = daemon.client().await;
    match c.append_ndjson(lines.join("\n")).await {
        Err(tally_api::client::ClientError::Refused { status, error }) => {
            assert_eq!(status, 400);
            assert_eq!(error.line, Some(350), "{error:?}");
            assert_eq!(error.field.as_deref(), Some("reserve_cents"), "{error:?}");
        }
        other => panic!("expected a typed 400, got {other:?}"),
    }
    let mut acked: Vec<Receipt> = Vec::new();
    for t in tasks {
        acked.extend(t.await.expect("client task"));
    }
    assert_eq!(acked.len(), CLIENTS * 3 * LINES);
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");

    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    chain.assert_holds(&acked);
    let hung_up = chain.entries.len() - 1 - acked.len();
    assert!(
        hung_up == 0 || hung_up == LINES,
        "the hung-up batch is in whole or not at all ({hung_up} extra entries)"
    );
    assert!(chain
        .entries
        .iter()
        .all(|e| e.decision.as_ref().is_none_or(|d| d.run != "big-bad")));
}
