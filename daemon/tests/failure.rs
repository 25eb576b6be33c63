//! Fail closed: when the ledger cannot write, nothing is acknowledged.

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use tally_api::client::{receipts, ClientError};
use tally_api::wire::ErrorReply;
use tally_daemon::DaemonError;
use tally_ledger::{Checkpoint, Rotation};

use crate::common::{allow, checkpoint_text, get, post_json, walk, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_cannot_write_answers_503_and_acknowledges_nothing() {
    // Rotation is due at the third decision; a directory where the next epoch's key file
    // must go makes that commit fail before anything is stored.
    let rotation = Rotation {
        records: 3,
        ms: 3_600_000,
    };
    let mut daemon = Daemon::start_with(rotation, |_| {}).await;
    let blocker = daemon.ledger_dir.join("writer.key.next");
    std::fs::create_dir(&blocker).expect("mkdir");
    std::fs::write(blocker.join("keep"), b"x").expect("write");

    let mut c = daemon.client().await;
    let first = c.append(&allow("r", "w", 1)).await.expect("first append");
    let second = c.append(&allow("r", "w", 2)).await.expect("second append");
    assert_eq!((first[0].seq, second[0].seq), (1, 2));
    let before = checkpoint_text(&mut c).await;

    for at in 3..5 {
        let reply = c
            .request(
                Method::POST,
                "/v1/decisions",
                Some("application/json"),
                Bytes::from(allow("r", "w", at)),
            )
            .await
            .expect("reply");
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        match receipts(reply) {
            Err(ClientError::Refused { error, .. }) => assert_eq!(error.code, "ledger_unavailable"),
            other => panic!("expected 503 ledger_unavailable, got {other:?}"),
        }
    }
    let health = get(&mut c, "/v1/health").await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
    let e: ErrorReply = serde_json::from_slice(&health.body).expect("typed error");
    assert_eq!(e.error.code, "ledger_unavailable");
    assert_eq!(
        checkpoint_text(&mut c).await,
        before,
        "nothing sealed after the failure"
    );
    drop(c);

    match daemon.shutdown().await {
        Err(DaemonError::LedgerFailed(_)) => {}
        other => panic!("serve must report the failed ledger, got {other:?}"),
    }
    std::fs::remove_dir_all(&blocker).expect("rm blocker");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    assert_eq!(
        chain.entries.len(),
        3,
        "genesis and the two acknowledged decisions only"
    );
    chain.assert_holds(&[first[0], second[0]]);
    assert_eq!(
        chain.checkpoint,
        Checkpoint::from_text(before.as_bytes()).expect("checkpoint")
    );
}

/// The ledger's disk fills up (a 4 MiB tmpfs, filled): `/v1/check` answers promptly with
/// the gate's refusal (`503 gate_unavailable`, a deny), never an allow and never a hang,
/// also after space comes back (the daemon does not resume on its own); it stops, and
/// every check it allowed is in the ledger with its receipt's hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_checks_promptly_and_keeps_every_allowed_one() {
    let Some(fs) = tally_testkit::tmpfs::Tmpfs::mount(4 << 20) else {
        return;
    };
    let mut daemon = Daemon::start_in(fs.path(), Rotation::default(), |_| {}).await;
    let bound = std::time::Duration::from_secs(20);
    let check = |run: &str, n: u64| {
        let body = serde_json::json!({"run": run, "tool": "t", "effect": "read", "args": {"n": n}});
        let daemon = &daemon;
        async move {
            let mut c = daemon.agent().await;
            tokio::time::timeout(bound, post_json(&mut c, "/v1/check", &body.to_string()))
                .await
                .unwrap_or_else(|_| {
                    panic!("check {n} did not answer within {bound:?} on a full disk")
                })
        }
    };
    let mut agent = daemon.agent().await;
    let (status, body) = post_json(&mut agent, "/v1/runs", r#"{"run":"r"}"#).await;
    assert_eq!(status, 201, "{body}");
    let mut allowed = Vec::new();
    let (status, first) = check("r", 0).await;
    assert_eq!(
        (status, first["decision"].as_str()),
        (200, Some("allow")),
        "{first}"
    );
    allowed.push(first);
    fs.fill(0);
    let mut refused = None;
    for n in 1..5000 {
        let (status, answer) = check("r", n).await;
        match (status, answer["decision"].as_str()) {
            (200, Some("allow")) => allowed.push(answer),
            _ => {
                refused = Some((status, answer));
                break;
            }
        }
    }
    let (status, answer) = refused.expect("5000 checks allowed on a full disk");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["decision"], "deny", "{answer}");
    assert_eq!(answer["reason"], "gate_unavailable", "{answer}");
    assert_eq!(answer["error"]["code"], "gate_unavailable", "{answer}");
    fs.free();
    let (status, again) = check("r", 9999).await;
    assert_eq!(
        (status, again["reason"].as_str()),
        (503, Some("gate_unavailable")),
        "{again}"
    );
    drop(agent);
    match daemon.shutdown().await {
        Err(DaemonError::LedgerFailed(_)) => {}
        other => panic!("serve must report the failed ledger, got {other:?}"),
    }
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    for a in &allowed {
        let seq = a["seq"].as_u64().expect("an allowed check's seq");
        let entry = chain
            .entries
            .get(seq as usize)
            .expect("an allowed check is kept");
        let hex: String = entry.hash.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(Some(hex.as_str()), a["hash"].as_str(), "seq {seq}");
    }
}
