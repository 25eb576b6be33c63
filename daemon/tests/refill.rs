//! Refill chains against the real daemon: a chain of runs, each continuing one a
//! `stop`-action refusal ended, may continue `approvals.max_unapproved_continuations`
//! times (default 1) without a human; the next start is refused `approval_required`,
//! cause `refill_without_approval`, and nothing is recorded.

use serde_json::{json, Value};
use tally_policy::Recorded;

use crate::common::{get, post_json, walk, Daemon};

async fn gated(policy: &str) -> Daemon {
    let recorded = Recorded::new(policy).expect("policy");
    Daemon::start(move |o| o.policy = recorded).await
}

/// Start `run` (continuing `continues`, if any): the status and the reply.
async fn start(d: &Daemon, run: &str, continues: Option<&str>) -> (u16, Value) {
    let mut body = json!({"run": run, "goal": "fix the build", "budget": {"attempts": 20}});
    if let Some(c) = continues {
        body["continues"] = json!(c);
    }
    let mut c = d.agent().await;
    post_json(&mut c, "/v1/runs", &body.to_string()).await
}

/// Call the same tool, to the same result, until the loop rule refuses it, then stop the run with
/// the refusal's reason, as an agent does.
async fn loop_and_stop(d: &Daemon, run: &str) {
    let same = json!({"run": run, "tool": "make", "effect": "read", "args": {"t": "all"}});
    let mut c = d.agent().await;
    let mut reason = Value::Null;
    for _ in 0..6 {
        let (status, a) = post_json(&mut c, "/v1/check", &same.to_string()).await;
        assert_eq!(status, 200, "{a}");
        if a["decision"] != "allow" {
            reason = a["reason"].clone();
            break;
        }
        let done = json!({"run": run, "attempt": a["attempt"], "status": "ok",
            "result_digest": "0".repeat(64)});
        let (status, o) = post_json(&mut c, "/v1/outcome", &done.to_string()).await;
        assert_eq!(status, 200, "{o}");
    }
    assert_eq!(reason, "loop_repeated_call");
    let stop = json!({"reason": reason});
    let (status, s) = post_json(&mut c, &format!("/v1/runs/{run}/stop"), &stop.to_string()).await;
    assert_eq!(status, 200, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_unapproved_continuation_of_a_refusal_is_refused() {
    let mut d = gated("").await;
    assert_eq!(start(&d, "r1", None).await.0, 201);
    loop_and_stop(&d, "r1").await;
    // The first continuation is within the default allowance.
    let (status, body) = start(&d, "r2", Some("r1")).await;
    assert_eq!(status, 201, "{body}");
    loop_and_stop(&d, "r2").await;
    let (status, body) = start(&d, "r3", Some("r2")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "approval_required", "{body}");
    assert_eq!(body["error"]["cause"], "refill_without_approval", "{body}");
    assert_eq!(body["error"]["field"], "continues", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("2 unapproved continuations"), "{message}");
    // Nothing recorded for the refused start.
    let mut c = d.agent().await;
    assert_eq!(get(&mut c, "/v1/runs/r3").await.status.as_u16(), 404);
    // A run that completed starts the count again.
    assert_eq!(start(&d, "c1", None).await.0, 201);
    let (status, s) = post_json(
        &mut c,
        "/v1/runs/c1/stop",
        &json!({"reason": "completed"}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(start(&d, "c2", Some("c1")).await.0, 201);
    drop(c);
    d.shutdown().await.expect("shutdown");
    let chain = walk(&d.ledger_dir, &d.auditor);
    let started: Vec<String> = chain
        .entries
        .iter()
        .filter_map(|e| e.decision.as_ref())
        .filter(|d| d.kind() == tally_ledger::Kind::Start)
        .map(|d| d.run.clone())
        .collect();
    assert_eq!(started, ["r1", "r2", "c1", "c2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowance_is_the_policys() {
    let mut d = gated("[approvals]\nmax_unapproved_continuations = 0\n").await;
    assert_eq!(start(&d, "r1", None).await.0, 201);
    loop_and_stop(&d, "r1").await;
    let (status, body) = start(&d, "r2", Some("r1")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["cause"], "refill_without_approval", "{body}");
    d.shutdown().await.expect("shutdown");
}
