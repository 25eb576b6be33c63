//! Approvals (docs/GATE.md): a refusal a human may lift answers `require_approval`; a signed,
//! unexpired, matching grant lifts it once; anything else grants nothing.

use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tally_policy::approval::{digest, sign};
use tally_policy::{Call, Inconsistency, Verdict};
use tally_record::decision::Scope;
use tally_record::{Action, Effect, Reason};

use crate::support::{call, op_call, Sim};

mod denials;

pub fn alice() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The default policy's refusals (its `ask_on`), with alice listed as an approver.
pub fn policy() -> String {
    let key = hex(alice().verifying_key().as_bytes());
    format!("[approvals]\napprovers = {{ alice = \"{key}\" }}\n")
}

/// An override record for run `r1`, signed by `key` as `approver`.
pub fn grant(key: &SigningKey, approver: &str, scope: Value, expires_ms: u64, at: u64) -> Value {
    let s: Scope = serde_json::from_value(scope.clone()).expect("a scope");
    let d = digest("r1", approver, &s, expires_ms);
    json!({
        "run": "r1", "kind": "override", "at_ms": at, "approver": approver,
        "scope": scope, "digest": d, "expires_ms": expires_ms, "signature": sign(key, &d),
        "note": "checked the logs",
    })
}

/// A run with one attempt, used up.
fn exhausted() -> (Sim, Call) {
    let mut sim = Sim::with_run(&policy(), json!({"attempts": 1, "depth": 3}));
    sim.allow(&call("api", Effect::Read, json!({"n": 1})), 10);
    (sim, call("api", Effect::Read, json!({"n": 2})))
}

#[test]
fn a_refusal_in_ask_on_requires_approval_with_its_cause() {
    let (mut sim, next) = exhausted();
    let d = sim.refused(&next, 20, Reason::ApprovalRequired);
    assert_eq!(d.verdict, Verdict::RequireApproval);
    assert_eq!(d.cause, Some(Reason::AttemptsExhausted));
    assert_eq!(Reason::ApprovalRequired.action(), Action::Ask);

    // A refusal no human may lift stays a plain deny.
    let deep = Call {
        depth: Some(9),
        ..next.clone()
    };
    let d = sim.decide(&deep, 30);
    assert_eq!(
        (d.verdict, d.reason(), d.cause),
        (Verdict::Deny, Some(Reason::ChainDepthExceeded), None)
    );

    // An unknown non-idempotent write asks too (default ask_on).
    let mut sim = Sim::with_run(&policy(), json!({}));
    let pay = op_call(
        "pay",
        "pay.invoice:42",
        Effect::NonIdempotentWrite,
        json!({}),
    );
    let a = sim.allow(&pay, 10);
    sim.outcome("r1", a, "unknown", 20, json!({}));
    let d = sim.refused(&pay, 30, Reason::ApprovalRequired);
    assert_eq!(d.cause, Some(Reason::OutcomeUnknownNonIdempotent));
}

#[test]
fn a_signed_grant_allows_the_call_once() {
    let (mut sim, next) = exhausted();
    let g = grant(&alice(), "alice", json!({"attempts": 1}), 100_000, 15);
    assert_eq!(sim.apply_json(g.clone()), vec![]);
    let d = sim.ask(&next, 20);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.cause, None);
    assert_eq!(d.record.grant.as_deref(), g["digest"].as_str());
    assert_eq!(d.record.attempt, Some(2));
    assert!(sim.run("r1").grants[0].used);
    assert_eq!(sim.run("r1").attempts_used, 2);
    assert_eq!(sim.run("r1").attempts_limit(), Some(2));
    // Used: the next call needs another approval.
    let third = call("api", Effect::Read, json!({"n": 3}));
    let d = sim.refused(&third, 30, Reason::ApprovalRequired);
    assert_eq!(d.cause, Some(Reason::AttemptsExhausted));
    // Recording the same approval again grants nothing.
    let mut again = g.clone();
    again["at_ms"] = json!(31);
    let found = sim.apply_json(again);
    assert!(
        matches!(found.as_slice(), [Inconsistency::InvalidApproval { .. }]),
        "{found:?}"
    );
    sim.refused(&third, 40, Reason::ApprovalRequired);
}

#[test]
fn an_expired_grant_is_approval_expired() {
    let (mut sim, next) = exhausted();
    sim.apply_json(grant(&alice(), "alice", json!({"attempts": 1}), 500, 15));
    let d = sim.decide(&next, 499);
    assert_eq!(d.verdict, Verdict::Allow, "valid until its expiry");
    let d = sim.refused(&next, 500, Reason::ApprovalExpired);
    assert_ne!(d.verdict, Verdict::Allow);
    assert_eq!(d.record.grant, None);
    assert_eq!(Reason::ApprovalExpired.action(), Action::Ask);
}

#[test]
fn a_grant_for_another_tool_is_approval_mismatch() {
    let (mut sim, next) = exhausted();
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"attempts": 1, "tool": "other"}),
        100_000,
        15,
    ));
    let d = sim.refused(&next, 20, Reason::ApprovalMismatch);
    assert_eq!(d.record.grant, None);
    // A grant of cents does not cover attempts either.
    let (mut sim, next) = exhausted();
    sim.apply_json(grant(&alice(), "alice", json!({"cents": 100}), 100_000, 15));
    sim.refused(&next, 20, Reason::ApprovalMismatch);
    // The grant for the other tool still works for that tool.
    let (mut sim, _) = exhausted();
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"attempts": 1, "tool": "other"}),
        100_000,
        15,
    ));
    sim.allow(&call("other", Effect::Read, json!({})), 20);
}

#[test]
fn a_forged_or_altered_approval_is_an_inconsistency_and_grants_nothing() {
    let (mut sim, next) = exhausted();
    let mallet = SigningKey::from_bytes(&[8u8; 32]);
    let forged = grant(&mallet, "alice", json!({"attempts": 5}), 100_000, 15);
    let found = sim.apply_json(forged);
    assert!(
        matches!(found.as_slice(), [Inconsistency::InvalidApproval { .. }]),
        "{found:?}"
    );

    // A genuine approval whose scope was changed after signing.
    let mut altered = grant(&alice(), "alice", json!({"attempts": 1}), 100_000, 16);
    altered["scope"] = json!({"attempts": 50});
    let found = sim.apply_json(altered);
    assert!(
        matches!(found.as_slice(), [Inconsistency::InvalidApproval { .. }]),
        "{found:?}"
    );

    // An approver the policy does not list.
    let found = sim.apply_json(grant(
        &mallet,
        "mallet",
        json!({"attempts": 5}),
        100_000,
        17,
    ));
    assert!(
        matches!(found.as_slice(), [Inconsistency::InvalidApproval { .. }]),
        "{found:?}"
    );

    assert!(sim.run("r1").grants.is_empty());
    let d = sim.refused(&next, 20, Reason::ApprovalRequired);
    assert_eq!(d.cause, Some(Reason::AttemptsExhausted));
}

#[test]
fn a_grant_of_a_tool_unblocks_it() {
    let policy = format!("{}[scope]\nblocked = [\"shell\"]\n", policy());
    let mut sim = Sim::with_run(&policy, json!({}));
    let sh = call("shell", Effect::NonIdempotentWrite, json!({"cmd": "make"}));
    let d = sim.refused(&sh, 10, Reason::ApprovalRequired);
    assert_eq!(d.cause, Some(Reason::ToolBlocked));
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"tool": "shell"}),
        100_000,
        15,
    ));
    let d = sim.ask(&sh, 20);
    assert_eq!(d.verdict, Verdict::Allow);
    assert!(d.record.grant.is_some());
}

#[test]
fn a_grant_naming_the_operation_reconciles_an_unknown_write() {
    let mut sim = Sim::with_run(&policy(), json!({}));
    let pay = op_call(
        "pay",
        "pay.invoice:42",
        Effect::NonIdempotentWrite,
        json!({}),
    );
    let a = sim.allow(&pay, 10);
    sim.outcome("r1", a, "unknown", 20, json!({}));
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"operation": "pay.invoice:42"}),
        100_000,
        25,
    ));
    let d = sim.ask(&pay, 30);
    assert_eq!(d.verdict, Verdict::Allow);
}
