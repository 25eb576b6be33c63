//! The gate against the real daemon on real sockets: the field's checklist.

use std::sync::Arc;

use serde_json::{json, Value};
use tally_ledger::clock::{Clock, ManualClock};
use tally_policy::Recorded;

use crate::common::{post_json, walk, Daemon};

async fn gated(policy: &str) -> Daemon {
    let recorded = Recorded::new(policy).expect("policy");
    Daemon::start(move |o| o.policy = recorded).await
}

/// A daemon whose gate reads the time from `clock` (the test moves it; nothing sleeps).
async fn gated_on(policy: &str, clock: &Arc<ManualClock>) -> Daemon {
    let recorded = Recorded::new(policy).expect("policy");
    let clock = Arc::clone(clock) as Arc<dyn Clock>;
    Daemon::start(move |o| {
        o.policy = recorded;
        o.clock = clock;
    })
    .await
}

async fn start(d: &Daemon, run: &str, budget: Value) -> Value {
    let mut c = d.agent().await;
    let (status, body) = post_json(
        &mut c,
        "/v1/runs",
        &json!({"run": run, "goal": "test", "budget": budget}).to_string(),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body
}

async fn check(d: &Daemon, body: Value) -> Value {
    let mut c = d.agent().await;
    let (status, answer) = post_json(&mut c, "/v1/check", &body.to_string()).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

async fn outcome(d: &Daemon, run: &str, attempt: u64, status: &str, extra: Value) -> Value {
    let mut body = json!({"run": run, "attempt": attempt, "status": status});
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    let mut c = d.agent().await;
    let (code, reply) = post_json(&mut c, "/v1/outcome", &body.to_string()).await;
    assert_eq!(code, 200, "{reply}");
    reply
}

fn decision(a: &Value) -> (&str, Option<&str>, Option<&str>) {
    (
        a["decision"].as_str().unwrap_or("?"),
        a["reason"].as_str(),
        a["action"].as_str(),
    )
}

/// Checks in parallel, each on its own connection; the answers.
async fn race(d: &Daemon, bodies: Vec<Value>) -> Vec<Value> {
    let mut tasks = Vec::new();
    for body in bodies {
        let socket = d.agent_socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = tally_api::client::Client::unix(&socket)
                .await
                .expect("connect");
            let (status, answer) = post_json(&mut c, "/v1/check", &body.to_string()).await;
            assert_eq!(status, 200, "{answer}");
            answer
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

fn allows(answers: &[Value]) -> usize {
    answers.iter().filter(|a| a["decision"] == "allow").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_checks_against_five_attempts_give_exactly_five() {
    let mut d = gated("").await;
    start(&d, "r", json!({"attempts": 5})).await;
    let bodies = (0..64)
        .map(|i| json!({"run": "r", "worker": format!("w{}", i % 8), "tool": "http", "operation": format!("op-{i}"), "effect": "read", "args": {"i": i}}))
        .collect();
    let answers = race(&d, bodies).await;
    assert_eq!(allows(&answers), 5);
    // The default policy lets a human grant more attempts: the others ask.
    for a in answers.iter().filter(|a| a["decision"] != "allow") {
        assert_eq!(
            decision(a),
            ("require_approval", Some("approval_required"), Some("ask")),
            "{a}"
        );
        assert_eq!(a["cause"], "attempts_exhausted", "{a}");
    }
    let mut attempts: Vec<u64> = answers
        .iter()
        .filter_map(|a| a["attempt"].as_u64())
        .collect();
    attempts.sort_unstable();
    assert_eq!(attempts, vec![1, 2, 3, 4, 5]);
    d.shutdown().await.expect("shutdown");
    // Every answer is in the chain: the policy, the start, 64 decisions.
    let chain = walk(&d.ledger_dir, &d.auditor);
    assert_eq!(chain.entries.len(), 1 + 1 + 1 + 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_racing_for_the_last_cents_never_overspend() {
    let mut d = gated("").await;
    start(&d, "r", json!({"spend_cents": 100})).await;
    let bodies = (0..8)
        .map(|i| json!({"run": "r", "worker": format!("w{i}"), "tool": "llm", "operation": format!("gen-{i}"), "effect": "read", "reserve_cents": 30}))
        .collect();
    let answers = race(&d, bodies).await;
    assert_eq!(allows(&answers), 3, "3 x 30 fit in 100, a fourth does not");
    for a in answers.iter().filter(|a| a["decision"] != "allow") {
        assert_eq!(decision(a).1, Some("approval_required"), "{a}");
        assert_eq!(decision(a).2, Some("ask"), "{a}");
        assert_eq!(a["limits"]["spend_nanos"]["used"], 900_000_000u64, "{a}");
    }
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_from_eight_workers_is_stopped_at_the_shared_cap() {
    let mut d = gated("").await;
    start(&d, "storm", json!({})).await;
    let mut allowed = 0;
    for round in 0..4 {
        let bodies = (0..8)
            .map(|i| json!({"run": "storm", "worker": format!("w{i}"), "tool": "payments", "operation": "charge.status", "effect": "read", "args": {"order": 7}}))
            .collect();
        let answers = race(&d, bodies).await;
        for a in &answers {
            if a["decision"] == "allow" {
                allowed += 1;
                let attempt = a["attempt"].as_u64().expect("attempt");
                outcome(&d, "storm", attempt, "error", json!({})).await;
            } else {
                let reason = decision(a).1.unwrap_or("?");
                assert!(
                    matches!(reason, "retries_exhausted" | "loop_repeated_call"),
                    "round {round}: {a}"
                );
                assert_eq!(decision(a).2, Some("stop"));
            }
        }
    }
    assert_eq!(
        allowed, 3,
        "a read is retried at most 3 times in all, across workers"
    );
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_refuses_other_workers_and_half_open_admits_one_probe() {
    let policy = "[breaker]\nfailures = 2\nopen_ms = 400\nprobe_timeout_ms = 400\n";
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on(policy, &clock).await;
    start(&d, "a", json!({})).await;
    start(&d, "b", json!({})).await;
    for i in 0..2 {
        let a = check(
            &d,
            json!({"run": "a", "tool": "search", "operation": format!("q{i}"), "effect": "read"}),
        )
        .await;
        assert_eq!(decision(&a).0, "allow");
        outcome(&d, "a", a["attempt"].as_u64().unwrap(), "error", json!({})).await;
    }
    // Another worker of another run never touches the sick tool.
    let b = check(
        &d,
        json!({"run": "b", "tool": "search", "operation": "x", "effect": "read"}),
    )
    .await;
    assert_eq!(decision(&b), ("deny", Some("circuit_open"), Some("retry")));
    assert!(b["retry_after_ms"].as_u64().unwrap() > 0);
    clock.advance(450);
    let probes = race(
        &d,
        (0..4)
            .map(|i| json!({"run": "b", "tool": "search", "operation": format!("p{i}"), "effect": "read"}))
            .collect(),
    )
    .await;
    assert_eq!(allows(&probes), 1, "half-open admits exactly one probe");
    // The probe never reports: after its deadline the breaker opens again, then admits
    // a new probe (a stuck probe cannot wedge it).
    clock.advance(450 + 450);
    let next = check(
        &d,
        json!({"run": "b", "tool": "search", "operation": "p9", "effect": "read"}),
    )
    .await;
    assert_eq!(decision(&next).0, "allow", "{next}");
    outcome(&d, "b", next["attempt"].as_u64().unwrap(), "ok", json!({})).await;
    let closed = check(
        &d,
        json!({"run": "b", "tool": "search", "operation": "p10", "effect": "read"}),
    )
    .await;
    assert_eq!(
        decision(&closed).0,
        "allow",
        "an ok probe closes the breaker"
    );
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_that_honours_retry_after_completes_unflagged() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on("", &clock).await;
    start(&d, "p", json!({"polls": 12})).await;
    let create = check(&d, json!({"run": "p", "tool": "export", "operation": "export.create", "effect": "idempotent_write", "idempotency_key": "k1"})).await;
    assert_eq!(decision(&create).0, "allow");
    outcome(
        &d,
        "p",
        create["attempt"].as_u64().unwrap(),
        "running",
        json!({"remote_ref": "ea91", "observed": "queued", "retry_after_ms": 1100}),
    )
    .await;
    // Too early: before Retry-After less the tolerance (max 1 s, 10 %).
    let early = check(
        &d,
        json!({"run": "p", "tool": "export", "operation": "export.status:ea91", "effect": "read"}),
    )
    .await;
    assert_eq!(
        decision(&early),
        ("deny", Some("upstream_backoff"), Some("retry"))
    );
    // Eight polls, each after the hint: far more than any loop window, never refused.
    for i in 0..8 {
        clock.advance(150);
        let poll = check(&d, json!({"run": "p", "tool": "export", "operation": "export.status:ea91", "effect": "read"})).await;
        assert_eq!(decision(&poll).0, "allow", "poll {i}: {poll}");
        assert_eq!(poll["limits"]["polls"]["used"], i);
        let state = if i == 7 { "done" } else { "running" };
        outcome(
            &d,
            "p",
            poll["attempt"].as_u64().unwrap(),
            "ok",
            json!({"observed": state, "retry_after_ms": 1100}),
        )
        .await;
    }
    let mut c = d.agent().await;
    let standing = crate::common::get(&mut c, "/v1/runs/p").await;
    let standing: Value = serde_json::from_slice(&standing.body).expect("json");
    assert_eq!(
        standing["limits"]["attempts"]["used"], 1,
        "polls use no attempt: {standing}"
    );
    drop(c);
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_rate_and_budget_refusals_are_told_apart_by_code_and_action() {
    let policy = "[rate]\nrun_per_sec = 1\nrun_burst = 6\n";
    let mut d = gated(policy).await;
    start(&d, "l", json!({"spend_cents": 10})).await;
    let same = json!({"run": "l", "tool": "http", "effect": "read", "args": {"u": "/x"}});
    for _ in 0..3 {
        let a = check(&d, same.clone()).await;
        assert_eq!(decision(&a).0, "allow");
        outcome(&d, "l", a["attempt"].as_u64().unwrap(), "ok", json!({})).await;
    }
    let looped = check(&d, same.clone()).await;
    assert_eq!(
        decision(&looped),
        ("deny", Some("loop_repeated_call"), Some("stop"))
    );
    let pricey = check(
        &d,
        json!({"run": "l", "tool": "llm", "effect": "read", "reserve_cents": 50}),
    )
    .await;
    assert_eq!(
        decision(&pricey),
        ("require_approval", Some("approval_required"), Some("ask"))
    );
    assert_eq!(pricey["cause"], "reservation_insufficient");
    let mut last = Value::Null;
    for i in 0..6 {
        last = check(
            &d,
            json!({"run": "l", "tool": format!("t{i}"), "effect": "read"}),
        )
        .await;
        if last["decision"] != "allow" {
            break;
        }
    }
    assert_eq!(
        decision(&last),
        ("deny", Some("rate_limit_exceeded"), Some("retry"))
    );
    assert!(last["retry_after_ms"].as_u64().unwrap() > 0);
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_run_holds_its_next_call_from_any_worker() {
    let mut d = gated("").await;
    start(&d, "r", json!({})).await;
    let mut op = d.client().await;
    let (status, paused) = post_json(&mut op, "/v1/runs/r/pause", "").await;
    assert_eq!(
        (status, paused["state"].as_str()),
        (200, Some("paused")),
        "{paused}"
    );
    for w in ["w1", "w2"] {
        let a = check(
            &d,
            json!({"run": "r", "worker": w, "tool": "t", "effect": "read"}),
        )
        .await;
        assert_eq!(decision(&a), ("deny", Some("run_paused"), Some("retry")));
    }
    let (status, _) = post_json(&mut op, "/v1/runs/r/resume", "").await;
    assert_eq!(status, 200);
    let a = check(&d, json!({"run": "r", "tool": "t", "effect": "read"})).await;
    assert_eq!(decision(&a).0, "allow");
    // A kill stops it for every worker; nothing more is recorded for it.
    let (status, _) = post_json(&mut op, "/v1/runs/r/kill", "").await;
    assert_eq!(status, 200);
    let after = check(&d, json!({"run": "r", "tool": "t", "effect": "read"})).await;
    assert_eq!(
        decision(&after),
        ("deny", Some("killed_by_operator"), Some("stop"))
    );
    assert!(
        after["seq"].is_null(),
        "a stopped run's checks are not recorded"
    );
    drop(op);
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_cannot_append_decisions_nor_revive_a_run() {
    let mut d = gated("").await;
    start(&d, "r", json!({"attempts": 1})).await;
    let mut c = d.agent().await;
    for kind in ["allow", "override", "refund", "deny"] {
        let (status, body) = post_json(
            &mut c,
            "/v1/decisions",
            &json!({"run": "r", "kind": kind}).to_string(),
        )
        .await;
        assert_eq!(status, 403, "{kind}: {body}");
    }
    // The operator's raw appends are refused for a run the gate governs.
    let mut op = d.client().await;
    let refused = op
        .append(r#"{"run":"r","kind":"allow","tool":"t","attempt":9}"#)
        .await;
    assert!(refused.is_err(), "{refused:?}");
    // A run the gate never started is refused, not given a fresh budget.
    let (status, body) = post_json(
        &mut c,
        "/v1/check",
        r#"{"run":"never-started","tool":"t","effect":"read"}"#,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("run_not_found"))
    );
    // Starting a run again is refused: no reset of a budget by name.
    let (status, _) = post_json(&mut c, "/v1/runs", r#"{"run":"r"}"#).await;
    assert_eq!(status, 409);
    // An agent asking for more than the ceiling gets the ceiling.
    let started = start(&d, "greedy", json!({"attempts": 1_000_000})).await;
    assert_eq!(started["budget"]["attempts"], 50);
    drop((c, op));
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart_and_is_never_behind_the_ledger() {
    let mut d = gated("").await;
    start(&d, "r", json!({"attempts": 4, "spend_cents": 100})).await;
    for i in 0..3 {
        let a = check(&d, json!({"run": "r", "tool": "t", "operation": format!("o{i}"), "effect": "read", "reserve_cents": 20})).await;
        assert_eq!(decision(&a).0, "allow");
    }
    d.shutdown().await.expect("shutdown");
    d.restart(|o| o.policy = Recorded::new("").expect("policy"))
        .await;
    let mut c = d.agent().await;
    let standing: Value =
        serde_json::from_slice(&crate::common::get(&mut c, "/v1/runs/r").await.body).expect("json");
    assert_eq!(standing["limits"]["attempts"]["used"], 3, "{standing}");
    assert_eq!(standing["held_nanos"], 600_000_000u64);
    let answers = race(
        &d,
        (0..4)
            .map(|i| json!({"run": "r", "tool": "t", "operation": format!("p{i}"), "effect": "read", "reserve_cents": 20}))
            .collect(),
    )
    .await;
    assert_eq!(allows(&answers), 1, "one attempt was left");
    drop(c);
    d.shutdown().await.expect("shutdown");
}

fn approval(
    key: &tally_ledger::keys::ApproverKey,
    approver: &str,
    run: &str,
    scope: Value,
    expires_ms: u64,
) -> Value {
    let s: tally_ledger::decision::Scope = serde_json::from_value(scope.clone()).expect("scope");
    let digest = tally_policy::approval::digest(run, approver, &s, expires_ms);
    let signature = tally_policy::approval::sign(key.signing_key(), &digest);
    json!({"run": run, "approver": approver, "scope": scope, "expires_ms": expires_ms,
           "digest": digest, "signature": signature})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_are_signed_bound_used_once_and_never_revive_a_run() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let mallory = tally_ledger::keys::ApproverKey::generate();
    let policy = format!(
        "[ceiling]\nattempts = 1\n[approvals.approvers]\ndana = \"{}\"\n",
        dana.public_hex()
    );
    let mut d = gated(&policy).await;
    start(&d, "r", json!({})).await;
    let first = check(
        &d,
        json!({"run": "r", "tool": "t", "operation": "a", "effect": "read"}),
    )
    .await;
    assert_eq!(decision(&first).0, "allow");
    let asked = check(
        &d,
        json!({"run": "r", "tool": "t", "operation": "b", "effect": "read"}),
    )
    .await;
    assert_eq!(
        decision(&asked),
        ("require_approval", Some("approval_required"), Some("ask"))
    );
    let mut op = d.client().await;
    // An unlisted key, a forged signature, a digest for something else: refused.
    let forged = approval(&mallory, "dana", "r", json!({"attempts": 1}), 600_000);
    let (status, body) = post_json(&mut op, "/v1/approvals", &forged.to_string()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("approval_refused")),
        "{body}"
    );
    let mut widened = approval(&dana, "dana", "r", json!({"attempts": 1}), 600_000);
    widened["scope"]["attempts"] = json!(100);
    let (status, _) = post_json(&mut op, "/v1/approvals", &widened.to_string()).await;
    assert_eq!(status, 403, "a scope changed after signing is refused");
    // An agent cannot approve for itself: the route is the operator socket's.
    let mut agent = d.agent().await;
    let good = approval(
        &dana,
        "dana",
        "r",
        json!({"attempts": 1, "operation": "b"}),
        600_000,
    );
    let (status, _) = post_json(&mut agent, "/v1/approvals", &good.to_string()).await;
    assert_eq!(status, 403);
    // The real one: recorded once, used by exactly one call.
    let (status, body) = post_json(&mut op, "/v1/approvals", &good.to_string()).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post_json(&mut op, "/v1/approvals", &good.to_string()).await;
    assert_eq!(status, 403, "the same approval twice is refused");
    let mismatch = check(
        &d,
        json!({"run": "r", "tool": "t", "operation": "c", "effect": "read"}),
    )
    .await;
    assert_eq!(
        decision(&mismatch),
        ("deny", Some("approval_mismatch"), Some("ask"))
    );
    let used = check(
        &d,
        json!({"run": "r", "tool": "t", "operation": "b", "effect": "read"}),
    )
    .await;
    assert_eq!(decision(&used).0, "allow", "{used}");
    let again = check(
        &d,
        json!({"run": "r", "tool": "t", "operation": "b", "effect": "read", "args": {"x": 1}}),
    )
    .await;
    assert_ne!(decision(&again).0, "allow", "one use: {again}");
    // After a stop, an approval does not revive the run.
    let (status, _) = post_json(&mut agent, "/v1/runs/r/stop", "{}").await;
    assert_eq!(status, 200);
    let late = approval(&dana, "dana", "r", json!({"attempts": 5}), 600_000);
    let (status, body) = post_json(&mut op, "/v1/approvals", &late.to_string()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("run_stopped")),
        "{body}"
    );
    drop((op, agent));
    d.shutdown().await.expect("shutdown");
}

/// Found by the Python client's author: serde also reads a struct from a JSON array by
/// position, so `["r9"]` started a run. Every gate body is one object, its `budget` too,
/// and every refusal names its field, the stop's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_gate_bodies_are_objects_and_errors_name_the_field() {
    let mut d = gated("").await;
    let mut c = d.agent().await;
    for (path, body) in [
        ("/v1/runs", r#"["r9"]"#),
        ("/v1/runs", r#"{"run":"r9","budget":[5]}"#),
        ("/v1/check", r#"["r9",null,"t"]"#),
        ("/v1/outcome", r#"["r9",1,"ok"]"#),
    ] {
        let (status, reply) = post_json(&mut c, path, body).await;
        assert_eq!(
            (status, reply["error"]["code"].as_str()),
            (400, Some("invalid_type")),
            "{path} {body}: {reply}"
        );
    }
    start(&d, "r", json!({})).await;
    let (status, reply) = post_json(&mut c, "/v1/runs/r/stop", r#"{"run":"r"}"#).await;
    assert_eq!(
        (status, reply["error"]["field"].as_str()),
        (400, Some("run")),
        "{reply}"
    );
    let (status, reply) = post_json(&mut c, "/v1/runs/r/stop", r#"["completed"]"#).await;
    assert_eq!(status, 400, "{reply}");
    let (status, _) = post_json(&mut c, "/v1/runs/r/stop", "").await;
    assert_eq!(status, 200, "an empty stop body is a plain `completed`");
    drop(c);
    d.shutdown().await.expect("shutdown");
}

/// Review findings: a check named another credential than its run's (escaping that
/// credential's backstop), and an agent could start, and so take over, a run name the
/// operator writes raw decisions for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_check_keeps_its_runs_credential_and_raw_names_stay_raw() {
    let mut d = gated("[credentials.small]\nspend_cents_per_period = 100\n").await;
    let mut c = d.agent().await;
    let (status, _) = post_json(&mut c, "/v1/runs", r#"{"run":"r","credential":"small"}"#).await;
    assert_eq!(status, 201);
    let (status, body) = post_json(
        &mut c,
        "/v1/check",
        r#"{"run":"r","tool":"pay","effect":"read","reserve_cents":90,"credential":"other"}"#,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("not_authorized")),
        "{body}"
    );
    let mut op = d.client().await;
    op.append(r#"{"run":"ext-1","kind":"start","budget":{"attempts":3}}"#)
        .await
        .expect("raw start");
    let (status, body) = post_json(&mut c, "/v1/runs", r#"{"run":"ext-1"}"#).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("run_exists")),
        "{body}"
    );
    op.append(r#"{"run":"ext-1","kind":"allow","tool":"t","attempt":1}"#)
        .await
        .expect("the operator's raw run goes on");
    drop((c, op));
    d.shutdown().await.expect("shutdown");
}

/// Review finding: a loopback TCP peer (uid unknown) could read, check and stop runs a
/// Unix-socket uid started: ownership is exact, TCP peers being one identity of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_tcp_peers_cannot_act_on_a_unix_uids_run() {
    let addr = crate::common::free_loopback_addr();
    let recorded = Recorded::new("").expect("policy");
    let mut d = Daemon::start(move |o| {
        o.policy = recorded;
        o.listen = Some(addr);
    })
    .await;
    start(&d, "mine", json!({})).await;
    let mut tcp = tally_api::client::Client::tcp(addr).await.expect("tcp");
    let (status, _) = post_json(
        &mut tcp,
        "/v1/check",
        r#"{"run":"mine","tool":"t","effect":"read"}"#,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = post_json(&mut tcp, "/v1/runs/mine/stop", "{}").await;
    assert_eq!(status, 403);
    drop(tcp);
    d.shutdown().await.expect("shutdown");
}

/// Review finding: a run's calls without outcomes held a shared tool's in-flight slots
/// even after the run stopped. Stopping it gives them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_stopped_run_releases_its_tools_in_flight_slots() {
    let mut d = gated("[rate]\ntool_in_flight = 2\n").await;
    start(&d, "hog", json!({})).await;
    start(&d, "other", json!({})).await;
    for i in 0..2 {
        let a = check(
            &d,
            json!({"run": "hog", "tool": "t", "operation": format!("o{i}"), "effect": "read"}),
        )
        .await;
        assert_eq!(decision(&a).0, "allow");
    }
    let held = check(
        &d,
        json!({"run": "other", "tool": "t", "operation": "x", "effect": "read"}),
    )
    .await;
    assert_eq!(
        decision(&held),
        ("deny", Some("rate_limit_exceeded"), Some("retry"))
    );
    let mut c = d.agent().await;
    let (status, _) = post_json(&mut c, "/v1/runs/hog/stop", "{}").await;
    assert_eq!(status, 200);
    let freed = check(
        &d,
        json!({"run": "other", "tool": "t", "operation": "y", "effect": "read"}),
    )
    .await;
    assert_eq!(decision(&freed).0, "allow", "{freed}");
    drop(c);
    d.shutdown().await.expect("shutdown");
}

/// Review finding: killing a run left its children running on the budget carved from
/// it. A kill stops every open descendant too, in the same commit, before the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_kill_stops_the_runs_descendants() {
    let mut d = gated("").await;
    start(&d, "p", json!({"attempts": 20})).await;
    let mut c = d.agent().await;
    for (run, parent) in [("c1", "p"), ("c2", "p"), ("g", "c1")] {
        let body = json!({"run": run, "parent": parent, "budget": {"attempts": 4}});
        let (status, reply) = post_json(&mut c, "/v1/runs", &body.to_string()).await;
        assert_eq!(status, 201, "{reply}");
    }
    start(&d, "u", json!({})).await;
    // c2 finished by itself before the kill: it is not stopped again.
    let (status, _) = post_json(&mut c, "/v1/runs/c2/stop", "{}").await;
    assert_eq!(status, 200);
    let mut op = d.client().await;
    let (status, answer) = post_json(&mut op, "/v1/runs/p/kill", "").await;
    assert_eq!(status, 200, "{answer}");
    for run in ["p", "c1", "g"] {
        let a = check(&d, json!({"run": run, "tool": "t", "effect": "read"})).await;
        assert_eq!(
            decision(&a),
            ("deny", Some("killed_by_operator"), Some("stop")),
            "{run}: {a}"
        );
    }
    let a = check(&d, json!({"run": "u", "tool": "t", "effect": "read"})).await;
    assert_eq!(decision(&a).0, "allow", "an unrelated run goes on: {a}");
    drop((c, op));
    d.shutdown().await.expect("shutdown");
    let chain = walk(&d.ledger_dir, &d.auditor);
    let stops: Vec<(&str, Option<tally_ledger::Reason>)> = chain
        .entries
        .iter()
        .filter_map(|e| e.decision.as_ref())
        .filter(|d| d.kind() == tally_ledger::Kind::Stop)
        .map(|d| (d.run.as_str(), d.reason))
        .collect();
    let killed = Some(tally_ledger::Reason::KilledByOperator);
    assert_eq!(
        stops,
        vec![
            ("c2", Some(tally_ledger::Reason::Completed)),
            ("g", killed),
            ("c1", killed),
            ("p", killed)
        ]
    );
    // The kill's answer is the killed run's own stop record.
    let p_stop = chain.entries.iter().position(|e| {
        e.decision
            .as_ref()
            .is_some_and(|d| d.run == "p" && d.kind() == tally_ledger::Kind::Stop)
    });
    assert_eq!(answer["seq"].as_u64(), p_stop.map(|s| s as u64), "{answer}");
}
