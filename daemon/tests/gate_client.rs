//! `tally_api::GateClient` against the real daemon: it starts a run it does not find,
//! types every refusal (code, field, Retry-After), waits out a `Retry-After` and sends
//! again only when the gate recorded nothing, and says when no daemon is there.

use serde_json::json;
use tally_api::{CheckRequest, GateClient, GateError, Retry, RunAction, StartRequest};
use tally_ledger::Reason;

use crate::common::Daemon;

fn check(run: &str) -> CheckRequest {
    serde_json::from_value(
        json!({"run": run, "tool": "http", "operation": "export.create", "effect": "read"}),
    )
    .expect("a check")
}

fn start(run: &str) -> StartRequest {
    serde_json::from_value(json!({"run": run, "goal": "export the report"})).expect("a start")
}

#[tokio::test]
async fn check_or_start_starts_a_missing_run_once() {
    let d = Daemon::start(|_| {}).await;
    let mut gate = GateClient::new(&d.agent_socket);
    let first = gate
        .check_or_start(&check("r1"), &start("ignored"))
        .await
        .expect("an answer");
    assert!(first.started, "the run was missing: this client started it");
    assert_eq!(first.answer.attempt, Some(1), "{first:?}");
    let second = gate
        .check_or_start(&check("r1"), &start("r1"))
        .await
        .expect("an answer");
    assert!(!second.started, "the run was there: nothing started");
    assert_eq!(second.answer.attempt, Some(2), "{second:?}");
    // The started run is the one the check named, with the start's goal.
    let mut op = GateClient::new(&d.socket);
    let run = op.run("r1").await.expect("the run");
    assert_eq!(run.goal.as_deref(), Some("export the report"), "{run:?}");
    assert!(
        op.run("ignored").await.is_err(),
        "a run named by the start was made"
    );
}

#[tokio::test]
async fn refusals_are_typed() {
    let d = Daemon::start(|_| {}).await;
    let mut gate = GateClient::new(&d.agent_socket);
    let e = gate
        .stop("nobody", Reason::Completed, None)
        .await
        .expect_err("no such run");
    assert!(
        matches!(&e, GateError::Refused { status: 404, code, .. } if code == "run_not_found"),
        "{e:?}"
    );
    // A field the gate cannot read is named.
    let e = gate
        .post::<serde_json::Value>(
            "/v1/runs",
            &json!({"run": "r1", "budget": {"attempts": "5"}}),
        )
        .await
        .expect_err("a string for a number");
    assert!(
        matches!(&e, GateError::Refused { status: 400, code, field: Some(f), .. }
            if code == "invalid_type" && f == "budget.attempts"),
        "{e:?}"
    );
    // The operator's verbs are not the agent socket's.
    gate.start(&start("r2")).await.expect("started");
    let e = gate
        .act("r2", RunAction::Pause)
        .await
        .expect_err("operator only");
    assert!(
        matches!(&e, GateError::Refused { status: 403, code, message, .. }
            if code == "not_authorized" && message.contains("operator socket")),
        "{e:?}"
    );
    let mut op = GateClient::new(&d.socket);
    op.act("r2", RunAction::Pause).await.expect("paused");
    op.act("r2", RunAction::Resume).await.expect("resumed");
    op.act("r2", RunAction::Kill).await.expect("killed");
    let e = gate.check(&check("r2")).await.map(|a| a.decision);
    assert!(
        matches!(&e, Ok(tally_api::Verdict::Deny)) || matches!(&e, Err(GateError::Refused { .. })),
        "a killed run's check: {e:?}"
    );
}

#[tokio::test]
async fn a_daemon_that_is_not_there_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let mut gate = GateClient::new(dir.path().join("no.sock"));
    let e = gate.check(&check("r1")).await.expect_err("no daemon");
    assert!(matches!(e, GateError::Unreachable { .. }), "{e:?}");
}

/// Over the agent socket's rate limit (1 a second) the gate records nothing and says
/// `Retry-After: 1`: without retries the client returns that refusal, typed with the
/// wait; with them it waits and the request goes through, once.
#[tokio::test]
async fn retry_after_is_honoured_and_only_for_what_was_not_recorded() {
    let d = Daemon::start(|o| o.limits.rate_per_sec = Some(1)).await;
    let mut never = GateClient::new(&d.agent_socket).with_retry(Retry::NEVER);
    let mut refused = None;
    for i in 0..5 {
        match never.start(&start(&format!("n{i}"))).await {
            Ok(_) => continue,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("five starts in a row, none refused at 1 a second");
    assert!(
        matches!(&e, GateError::Refused { status: 429, code, retry_after_ms: Some(1000), .. }
            if code == "rate_limited"),
        "{e:?}"
    );
    // With retries: every start goes through, each exactly once.
    let mut patient = GateClient::new(&d.agent_socket);
    for i in 0..3 {
        patient
            .start(&start(&format!("p{i}")))
            .await
            .unwrap_or_else(|e| panic!("start p{i}: {e:?}"));
    }
    let mut op = GateClient::new(&d.socket);
    let runs = op.runs().await.expect("runs");
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r.standing.run.as_str())
        .filter(|r| r.starts_with('p'))
        .collect();
    assert_eq!(names.len(), 3, "{runs:?}");
}
