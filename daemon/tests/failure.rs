//! Fail closed: when the ledger cannot write, nothing is acknowledged.

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use tally_api::client::{receipts, ClientError};
use tally_api::wire::ErrorReply;
use tally_daemon::DaemonError;
use tally_ledger::{Checkpoint, Rotation};

use crate::common::{allow, checkpoint_text, get, walk, Daemon};

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
