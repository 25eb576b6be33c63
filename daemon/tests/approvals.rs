//! Approval requests against the real daemon on real sockets (docs/APPROVALS.md): each
//! `require_approval` is listed on the operator socket with its context, and expires
//! with its run's deadline on the gate's clock (a `ManualClock` the test moves).

use std::sync::Arc;

use serde_json::{json, Value};
use tally_api::{GateClient, RequestState};
use tally_ledger::clock::{Clock, ManualClock};
use tally_policy::Recorded;

use crate::common::{get, post_json, Daemon};

/// A daemon whose gate reads the time from `clock`, under `policy`.
async fn gated_on(policy: &str, clock: &Arc<ManualClock>) -> Daemon {
    let recorded = Recorded::new(policy).expect("policy");
    let clock = Arc::clone(clock) as Arc<dyn Clock>;
    Daemon::start(move |o| {
        o.policy = recorded;
        o.clock = clock;
    })
    .await
}

async fn agent_post(d: &Daemon, path: &str, body: Value) -> (u16, Value) {
    let mut c = d.agent().await;
    post_json(&mut c, path, &body.to_string()).await
}

/// A run with one attempt and a one-minute deadline, its attempt used, and a second
/// call refused `require_approval`: the answer.
async fn asked(d: &Daemon) -> Value {
    let (s, b) = agent_post(
        d,
        "/v1/runs",
        json!({"run": "r", "goal": "g", "budget": {"attempts": 1, "deadline_ms": 60_000}}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let first =
        json!({"run": "r", "tool": "search", "operation": "q1", "effect": "read", "worker": "w1"});
    let (s, a) = agent_post(d, "/v1/check", first).await;
    assert_eq!((s, a["decision"].as_str()), (200, Some("allow")), "{a}");
    let second = json!({"run": "r", "worker": "w2", "tool": "email.send", "operation": "send:42",
        "effect": "non_idempotent_write", "target": "smtp", "args": {"to": "x@example.com"},
        "args_preview": "to x@example.com", "reserve_nanos": 5_000_000});
    let (s, a) = agent_post(d, "/v1/check", second).await;
    assert_eq!(
        (s, a["decision"].as_str()),
        (200, Some("require_approval")),
        "{a}"
    );
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_is_listed_with_its_context_and_expires_with_the_run() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on("", &clock).await;
    clock.advance(1_000);
    asked(&d).await;
    let mut op = GateClient::new(&d.socket);
    let list = op.approval_requests().await.expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    let r = &list[0];
    assert_eq!(r.state, RequestState::Pending);
    assert_eq!(r.id.len(), 16);
    assert_eq!((r.run.as_str(), r.tool.as_str()), ("r", "email.send"));
    assert_eq!(r.operation.as_deref(), Some("send:42"));
    assert_eq!(r.effect, Some(tally_ledger::Effect::NonIdempotentWrite));
    assert_eq!(r.target.as_deref(), Some("smtp"));
    assert_eq!(r.args_preview.as_deref(), Some("to x@example.com"));
    assert_eq!(
        r.args_digest.as_deref(),
        Some(tally_ledger::decision::args_digest(&json!({"to": "x@example.com"})).as_str())
    );
    assert_eq!(r.reason, tally_ledger::Reason::ApprovalRequired);
    assert_eq!(r.cause, tally_ledger::Reason::AttemptsExhausted);
    // Exactly this call: one attempt, for its tool and operation.
    assert_eq!(r.cost.attempts, Some(1));
    assert_eq!(r.cost.tool.as_deref(), Some("email.send"));
    assert_eq!(r.cost.operation.as_deref(), Some("send:42"));
    assert_eq!(
        (r.limits["attempts"].used, r.limits["attempts"].limit),
        (1, 1)
    );
    assert_eq!(r.calls, 1);
    let at = r.at_ms;
    assert_eq!(r.left_ms, Some(60_000 - at));
    assert_eq!(r.expires_in_ms, Some(60_000 - at));
    assert_eq!(r.uid, Some(rustix_uid()));
    assert_eq!(r.worker.as_deref(), Some("w2"));
    assert!(r.seq > 0 && r.answered_by.is_none());
    assert_eq!(op.approval_request(&r.id).await.expect("one"), *r);
    // An unknown id is a typed 404.
    let e = op.approval_request("0000000000000000").await.unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::RequestNotFound), "{e}");
    // The agent never reads (or answers) requests.
    let mut agent = d.agent().await;
    for path in ["/v1/approvals", &format!("/v1/approvals/{}", r.id)] {
        let reply = get(&mut agent, path).await;
        assert_eq!(reply.status.as_u16(), 403, "{path}");
    }
    // Past the run's deadline the request is expired, no longer pending.
    clock.advance(60_000);
    let list = op.approval_requests().await.expect("list");
    assert_eq!(list[0].state, RequestState::Expired);
    assert_eq!(list[0].expires_in_ms, None);
    d.shutdown().await.expect("shutdown");
}

/// This process's uid, as the daemon reads it from the socket.
fn rustix_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| std::os::unix::fs::MetadataExt::uid(&m))
}

/// An approval answering request `id`, signed by `key` as `approver`, for `scope`.
fn answer(
    key: &tally_ledger::keys::ApproverKey,
    run: &str,
    id: &str,
    scope: tally_ledger::decision::Scope,
    expires_ms: u64,
) -> tally_api::Approval {
    let digest = tally_policy::approval::answer_digest(run, "dana", &scope, expires_ms, Some(id));
    tally_api::Approval {
        run: run.into(),
        approver: "dana".into(),
        signature: tally_policy::approval::sign(key.signing_key(), &digest),
        scope,
        expires_ms,
        digest,
        note: None,
        request: Some(id.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lets_exactly_that_call_through_once_and_a_late_one_is_expired() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on(&policy, &clock).await;
    let asked_call = asked(&d).await;
    assert_eq!(asked_call["cause"], "attempts_exhausted");
    let mut op = GateClient::new(&d.socket);
    let r = op.approval_requests().await.expect("list").remove(0);
    // A scope wider than the request's cost, or the id of another run's request: refused.
    let mut wide = r.cost.clone();
    wide.attempts = Some(5);
    let e = op
        .approve(&answer(&dana, "r", &r.id, wide, 30_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalRefused), "{e}");
    let e = op
        .approve(&answer(
            &dana,
            "r",
            "0123456789abcdef",
            r.cost.clone(),
            30_000,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::RequestNotFound), "{e}");
    // A signature over another request's id does not carry over to this one.
    let mut swapped = answer(&dana, "r", "0123456789abcdef", r.cost.clone(), 30_000);
    swapped.request = Some(r.id.clone());
    let e = op.approve(&swapped).await.unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalRefused), "{e}");
    assert!(e.to_string().contains("digest"), "{e}");
    // The request's own cost, signed for it: recorded, and the request is approved.
    op.approve(&answer(&dana, "r", &r.id, r.cost.clone(), 30_000))
        .await
        .expect("approved");
    let now = op.approval_request(&r.id).await.expect("one");
    assert_eq!(now.state, RequestState::Approved);
    assert_eq!(now.answered_by.as_deref(), Some("dana"));
    assert!(op
        .approval_requests()
        .await
        .expect("list")
        .iter()
        .all(|x| x.state != RequestState::Pending));
    // Exactly that call goes through, once; a different one asks again.
    let again = json!({"run": "r", "worker": "w2", "tool": "email.send", "operation": "send:42",
        "effect": "non_idempotent_write", "target": "smtp", "args": {"to": "x@example.com"},
        "args_preview": "to x@example.com", "reserve_nanos": 5_000_000});
    let (_, a) = agent_post(&d, "/v1/check", again).await;
    assert_eq!(a["decision"], "allow", "{a}");
    let other = json!({"run": "r", "tool": "search", "operation": "q2", "effect": "read"});
    let (_, a) = agent_post(&d, "/v1/check", other).await;
    assert_eq!(a["decision"], "require_approval", "{a}");
    let second = op
        .approval_requests()
        .await
        .expect("list")
        .into_iter()
        .find(|x| x.state == RequestState::Pending)
        .expect("a new request");
    assert_eq!(second.tool, "search");
    // Answered after the run's deadline: refused `approval_expired`, listed as expired.
    clock.advance(61_000);
    let e = op
        .approve(&answer(&dana, "r", &second.id, second.cost.clone(), 90_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalExpired), "{e}");
    let listed = op.approval_request(&second.id).await.expect("one");
    assert_eq!(listed.state, RequestState::Expired);
    d.shutdown().await.expect("shutdown");
}

/// A denial of request `r` by `approver`, signed with `key`, with `note`.
fn denial(
    key: &tally_ledger::keys::ApproverKey,
    approver: &str,
    run: &str,
    r: &tally_api::ApprovalRequest,
    note: &str,
) -> tally_api::Denial {
    let call = tally_policy::approval::DeniedCall {
        tool: &r.tool,
        operation: r.operation.as_deref(),
        args_digest: r.args_digest.as_deref(),
    };
    let digest = tally_policy::approval::denial_digest(run, approver, &r.id, call, note);
    tally_api::Denial {
        run: run.into(),
        request: r.id.clone(),
        approver: approver.into(),
        note: note.into(),
        signature: tally_policy::approval::sign(key.signing_key(), &digest),
        digest,
    }
}

/// The call `asked` makes second (the one refused `require_approval`).
fn the_asked_call() -> Value {
    json!({"run": "r", "worker": "w2", "tool": "email.send", "operation": "send:42",
        "effect": "non_idempotent_write", "target": "smtp", "args": {"to": "x@example.com"},
        "args_preview": "to x@example.com", "reserve_nanos": 5_000_000})
}

/// The ledger in `d`'s directory verifies intact, and replay finds nothing.
fn verifies(d: &mut Daemon) {
    use tally_ledger::keys::{AuditorKey, LedgerPublic};
    let public = LedgerPublic::read(&d.ledger_dir.join("ledger.pub")).expect("ledger.pub");
    let mut options = tally_verify::Options::new(public);
    options.auditor = Some(std::mem::replace(&mut d.auditor, AuditorKey::generate()));
    let mut analysis =
        tally_verify::analysis::Analysis::new(tally_verify::analysis::Config::default());
    let frames: Vec<_> = tally_verify::walk::ledger_frames(&d.ledger_dir)
        .expect("log")
        .collect();
    let report = tally_verify::verify(frames.into_iter(), &options, |e| analysis.push(&e), |_| {});
    assert_eq!(
        report.verdict(),
        tally_verify::Verdict::Intact,
        "{}",
        report.to_text()
    );
    let replay = analysis.finish().replay;
    assert!(replay.replayed > 0);
    assert!(replay.findings.is_empty(), "{}", replay.to_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_stops_exactly_that_call_with_the_note_across_a_restart() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let mallory = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on(&policy, &clock).await;
    asked(&d).await;
    let mut op = GateClient::new(&d.socket);
    let r = op.approval_requests().await.expect("list").remove(0);
    let refused = |e: tally_api::GateError, code| assert_eq!(e.code(), Some(code), "{e}");
    use tally_api::ErrorCode::{ApprovalRefused, RequestNotFound};
    // Signed by a key the policy does not list.
    let e = op.deny(&denial(&mallory, "mallory", "r", &r, "no")).await;
    refused(e.unwrap_err(), ApprovalRefused);
    let e = op.deny(&denial(&mallory, "dana", "r", &r, "no")).await;
    refused(e.unwrap_err(), ApprovalRefused);
    // An approval's signature sent as a denial, and a denial's as an approval.
    let approval = answer(&dana, "r", &r.id, r.cost.clone(), 30_000);
    let mut forged = denial(&dana, "dana", "r", &r, "no");
    (forged.digest, forged.signature) = (approval.digest.clone(), approval.signature.clone());
    let e = op.deny(&forged).await.unwrap_err();
    assert!(e.to_string().contains("digest"), "{e}");
    refused(e, ApprovalRefused);
    let no = denial(&dana, "dana", "r", &r, "no");
    let mut replayed = approval.clone();
    (replayed.digest, replayed.signature) = (no.digest.clone(), no.signature.clone());
    refused(op.approve(&replayed).await.unwrap_err(), ApprovalRefused);
    // An id the gate does not hold; a note that says nothing.
    let mut unknown = r.clone();
    unknown.id = "0123456789abcdef".into();
    let e = op.deny(&denial(&dana, "dana", "r", &unknown, "no")).await;
    refused(e.unwrap_err(), RequestNotFound);
    let e = op.deny(&denial(&dana, "dana", "r", &r, " ")).await;
    refused(e.unwrap_err(), ApprovalRefused);
    // Nothing of those was recorded: the request is still pending.
    let still = op.approval_request(&r.id).await.expect("one");
    assert_eq!(still.state, RequestState::Pending);

    let note = "not to this address \u{1b}[31m";
    op.deny(&denial(&dana, "dana", "r", &r, note))
        .await
        .expect("denied");
    let now = op.approval_request(&r.id).await.expect("one");
    assert_eq!(now.state, RequestState::Denied);
    assert_eq!(now.answered_by.as_deref(), Some("dana"));
    assert_eq!(now.note.as_deref(), Some(note));
    // Answered: denying again, or approving it now, is refused.
    let e = op.deny(&denial(&dana, "dana", "r", &r, "again")).await;
    refused(e.unwrap_err(), ApprovalRefused);
    refused(op.approve(&approval).await.unwrap_err(), ApprovalRefused);

    // The agent's next try of exactly that call: a deny to stop at, with the note.
    let (s, a) = agent_post(&d, "/v1/check", the_asked_call()).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(
        (&a["decision"], &a["reason"], &a["action"]),
        (&json!("deny"), &json!("denied_by_approver"), &json!("stop")),
        "{a}"
    );
    assert_eq!(
        (&a["denied_by"], &a["note"]),
        (&json!("dana"), &json!(note))
    );
    // A different call asks, as any other; the agent cannot deny for itself.
    let other = json!({"run": "r", "tool": "email.send", "operation": "send:43",
        "effect": "non_idempotent_write", "args": {"to": "y@example.com"}});
    let (_, a) = agent_post(&d, "/v1/check", other).await;
    assert_eq!(a["decision"], "require_approval", "{a}");
    let (s, _) = agent_post(&d, "/v1/approvals/denials", json!({})).await;
    assert_eq!(s, 403);

    // After a restart the denial still holds: it is the run's state, from the ledger.
    d.shutdown().await.expect("shutdown");
    let recorded = Recorded::new(&policy).expect("policy");
    let again = Arc::clone(&clock) as Arc<dyn Clock>;
    d.restart(move |o| {
        o.policy = recorded;
        o.clock = again;
    })
    .await;
    let (_, a) = agent_post(&d, "/v1/check", the_asked_call()).await;
    assert_eq!(a["reason"], "denied_by_approver", "{a}");
    // The listing was read back from the ledger: the request is still denied, by dana.
    let mut op = GateClient::new(&d.socket);
    let read_back = op.approval_request(&r.id).await.expect("read back");
    assert_eq!(read_back.state, RequestState::Denied);
    assert_eq!(read_back.answered_by.as_deref(), Some("dana"));
    assert_eq!(read_back.note.as_deref(), Some(note));
    d.shutdown().await.expect("shutdown");
    verifies(&mut d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_answers_its_own_runs_pending_request_only() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on(&policy, &clock).await;
    asked(&d).await;
    let mut op = GateClient::new(&d.socket);
    let r = op.approval_requests().await.expect("list").remove(0);
    // Another run's request, signed for this run: refused.
    let (s, b) = agent_post(
        &d,
        "/v1/runs",
        json!({"run": "r2", "budget": {"attempts": 1}}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let e = op
        .deny(&denial(&dana, "dana", "r2", &r, "no"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalRefused), "{e}");
    assert!(e.to_string().contains("another run"), "{e}");
    // Past the run's deadline: expired.
    clock.advance(61_000);
    let e = op
        .deny(&denial(&dana, "dana", "r", &r, "no"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalExpired), "{e}");
    assert_eq!(
        op.approval_request(&r.id).await.expect("one").state,
        RequestState::Expired
    );
    d.shutdown().await.expect("shutdown");
}

/// A daemon in a child process, killed with SIGKILL when dropped (a failed test leaves
/// none behind).
struct Child(std::process::Child);

impl Child {
    /// `kill -9`, and the child reaped.
    fn kill_9(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reap");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tally-load serve` over `ledger` under `policy` in a child process, once its agent and
/// operator sockets answer.
async fn child(
    ledger: &std::path::Path,
    agent: &std::path::Path,
    operator: &std::path::Path,
    policy: &std::path::Path,
) -> Child {
    let c = Child(crate::kill::spawn(ledger, agent, operator, Some(policy)));
    crate::common::wait_for_socket(agent).await;
    crate::common::wait_for_socket(operator).await;
    c
}

/// POST `body` to `path` on the agent socket `agent`: the status and the answer.
async fn agent_at(agent: &std::path::Path, path: &str, body: &Value) -> (u16, Value) {
    let mut c = tally_api::client::Client::unix(agent)
        .await
        .expect("connect");
    post_json(&mut c, path, &body.to_string()).await
}

/// The email to `to`, as the agent asks for it.
fn send(op: &str) -> Value {
    json!({"run": "r", "worker": "w2", "tool": "email.send", "operation": op,
        "effect": "non_idempotent_write", "target": "smtp", "args": {"to": op},
        "args_preview": format!("to {op}")})
}

/// A request as listed, without what changes with the time it is read at.
fn at_rest(mut r: tally_api::ApprovalRequest) -> tally_api::ApprovalRequest {
    r.expires_in_ms = None;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_their_answers_survive_a_kill_9() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let (dir, ledger, _auditor) = crate::common::new_ledger(Default::default());
    let policy = dir.path().join("policy.toml");
    let text = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    std::fs::write(&policy, text).expect("policy");
    let (agent, operator) = (dir.path().join("agent.sock"), dir.path().join("op.sock"));
    let mut daemon = child(&ledger, &agent, &operator, &policy).await;
    let run = json!({"run": "r", "goal": "g", "budget": {"attempts": 1, "deadline_ms": 600_000}});
    assert_eq!(agent_at(&agent, "/v1/runs", &run).await.0, 201);
    let (_, a) = agent_at(&agent, "/v1/check", &send("first")).await;
    assert_eq!(a["decision"], "allow", "{a}");
    for op in ["a", "b"] {
        let (_, a) = agent_at(&agent, "/v1/check", &send(op)).await;
        assert_eq!(a["decision"], "require_approval", "{a}");
    }
    let mut gate = GateClient::new(&operator);
    let before = gate.approval_requests().await.expect("list");
    let find = |list: &[tally_api::ApprovalRequest], op: &str| {
        let r = list.iter().find(|r| r.operation.as_deref() == Some(op));
        r.cloned().expect("listed")
    };
    let (pending, answered) = (find(&before, "a"), find(&before, "b"));
    gate.approve(&answer(
        &dana,
        "r",
        &answered.id,
        answered.cost.clone(),
        30_000,
    ))
    .await
    .expect("approved");
    daemon.kill_9();

    let mut daemon = child(&ledger, &agent, &operator, &policy).await;
    let mut gate = GateClient::new(&operator);
    let after = gate.approval_requests().await.expect("list");
    assert_eq!(after.len(), 2, "{after:?}");
    let again = find(&after, "a");
    assert_eq!(again.state, RequestState::Pending);
    assert!(again.expires_in_ms.is_some_and(|ms| ms > 0), "{again:?}");
    assert_eq!(at_rest(again.clone()), at_rest(pending.clone()));
    let b = find(&after, "b");
    assert_eq!(b.state, RequestState::Approved);
    assert_eq!(b.answered_by.as_deref(), Some("dana"));
    // Still answerable: its call goes through once, then asks again.
    gate.approve(&answer(&dana, "r", &again.id, again.cost.clone(), 30_000))
        .await
        .expect("approved after the restart");
    let (_, a) = agent_at(&agent, "/v1/check", &send("a")).await;
    assert_eq!(a["decision"], "allow", "{a}");
    // Once: the same write again is not allowed (a retry of a write whose outcome is
    // unknown, refused).
    let (_, a) = agent_at(&agent, "/v1/check", &send("a")).await;
    assert_ne!(a["decision"], "allow", "{a}");
    daemon.kill_9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_asked_again_leaves_one_pending_request_and_any_of_them_takes_one_answer() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let mut d = gated_on(&policy, &clock).await;
    asked(&d).await;
    // The same call twice more, each a moment later: a request each.
    let same = json!({"run": "r", "worker": "w2", "tool": "email.send", "operation": "send:42",
        "effect": "non_idempotent_write", "target": "smtp", "args": {"to": "x@example.com"},
        "args_preview": "to x@example.com", "reserve_nanos": 5_000_000});
    for _ in 0..2 {
        clock.advance(1_000);
        let (_, a) = agent_post(&d, "/v1/check", same.clone()).await;
        assert_eq!(a["decision"], "require_approval", "{a}");
    }
    // Another call of the same tool is a request of its own.
    let other = json!({"run": "r", "tool": "email.send", "operation": "send:43",
        "effect": "non_idempotent_write", "args": {"to": "y@example.com"}});
    let (_, a) = agent_post(&d, "/v1/check", other).await;
    assert_eq!(a["decision"], "require_approval", "{a}");
    let states = |list: &[tally_api::ApprovalRequest]| {
        let mut s: Vec<_> = list
            .iter()
            .map(|r| (r.operation.clone().unwrap_or_default(), r.state, r.seq))
            .collect();
        s.sort_by_key(|x| x.2);
        s.into_iter().map(|(o, st, _)| (o, st)).collect::<Vec<_>>()
    };
    let want = vec![
        ("send:42".to_owned(), RequestState::Moot),
        ("send:42".to_owned(), RequestState::Moot),
        ("send:42".to_owned(), RequestState::Pending),
        ("send:43".to_owned(), RequestState::Pending),
    ];
    let mut op = GateClient::new(&d.socket);
    let list = op.approval_requests().await.expect("list");
    assert_eq!(states(&list), want, "{list:?}");
    // An older one may still be answered: the agent's asking again does not outrun the
    // human who read it first.
    let mut by_seq = list.clone();
    by_seq.sort_by_key(|r| r.seq);
    let approve =
        |r: &tally_api::ApprovalRequest| answer(&dana, "r", &r.id, r.cost.clone(), 30_000);
    op.approve(&approve(&by_seq[0]))
        .await
        .expect("the oldest is answered");
    // The call has its answer: a request of it asked before takes no other.
    let e = op.approve(&approve(&by_seq[2])).await.unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalRefused), "{e}");
    let answered = vec![
        ("send:42".to_owned(), RequestState::Approved),
        ("send:42".to_owned(), RequestState::Moot),
        ("send:42".to_owned(), RequestState::Moot),
        ("send:43".to_owned(), RequestState::Pending),
    ];
    let list = op.approval_requests().await.expect("list");
    assert_eq!(states(&list), answered, "{list:?}");
    // The same after a restart: the book is read back from the ledger.
    d.shutdown().await.expect("shutdown");
    let (recorded, c) = (Recorded::new(&policy).expect("policy"), Arc::clone(&clock));
    d.restart(move |o| {
        o.policy = recorded;
        o.clock = c as Arc<dyn Clock>;
    })
    .await;
    let mut op = GateClient::new(&d.socket);
    let list = op.approval_requests().await.expect("list");
    assert_eq!(states(&list), answered, "{list:?}");
    let e = op.approve(&approve(&by_seq[1])).await.unwrap_err();
    assert_eq!(e.code(), Some(tally_api::ErrorCode::ApprovalRefused), "{e}");
    // The other call's request is its own.
    op.approve(&approve(&by_seq[3]))
        .await
        .expect("the other call is answered");
    d.shutdown().await.expect("shutdown");
}
