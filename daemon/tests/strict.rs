//! Through the real daemon: the gate reads a check's `args` exactly
//! (a duplicate key is a 400; different values get different digests), and a raw batch
//! with a line of non-JSON whitespace is refused, not skipped.

use serde_json::Value;
use tally_policy::Recorded;

use crate::common::{post_json, walk, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_11_check_args_are_read_exactly() {
    let recorded = Recorded::new("").expect("policy");
    let mut d = Daemon::start(move |o| o.policy = recorded).await;
    let mut c = d.agent().await;
    let (status, body) = post_json(
        &mut c,
        "/v1/runs",
        r#"{"run":"r","goal":"pay","budget":{"attempts":10}}"#,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post_json(
        &mut c,
        "/v1/check",
        r#"{"run":"r","tool":"pay","effect":"read","args":{"amount":1,"amount":2}}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "args", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("duplicate key `amount`"), "{body}");
    for amount in ["18446744073709551616", "18446744073709551617"] {
        let (status, body) = post_json(
            &mut c,
            "/v1/check",
            &format!(r#"{{"run":"r","tool":"pay","effect":"read","args":{{"amount":{amount}}}}}"#),
        )
        .await;
        assert_eq!(
            (status, &body["decision"]),
            (200, &Value::from("allow")),
            "{body}"
        );
    }
    drop(c);
    d.shutdown().await.expect("shutdown");
    let digests: Vec<String> = walk(&d.ledger_dir, &d.auditor)
        .entries
        .iter()
        .filter_map(|e| e.decision.as_ref()?.args_digest.clone())
        .collect();
    assert_eq!(digests.len(), 2, "{digests:?}");
    assert_ne!(digests[0], digests[1], "two amounts, one digest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_11_a_line_of_no_break_space_is_refused_not_skipped() {
    let mut d = Daemon::start(|_| {}).await;
    let mut c = d.client().await;
    let body = "{\"run\":\"a\",\"kind\":\"start\"}\n\u{a0}\n{\"run\":\"b\",\"kind\":\"start\"}\n";
    let (status, reply) = post_json(&mut c, "/v1/decisions", body).await;
    assert_eq!(
        (status, &reply["error"]["line"]),
        (400, &Value::from(2)),
        "{reply}"
    );
    let (status, reply) = post_json(
        &mut c,
        "/v1/decisions",
        r#"{"run":"a","kind":"start","goal":null}"#,
    )
    .await;
    assert_eq!(
        (status, &reply["error"]["field"]),
        (400, &Value::from("goal")),
        "{reply}"
    );
    drop(c);
    d.shutdown().await.expect("shutdown");
    let decisions = walk(&d.ledger_dir, &d.auditor)
        .entries
        .iter()
        .filter(|e| e.decision.is_some())
        .count();
    assert_eq!(decisions, 0, "nothing of a refused body is written");
}
