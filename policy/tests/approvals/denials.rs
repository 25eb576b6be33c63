//! Denials (docs/APPROVALS.md): an approver's signed no to one approval request; that
//! exact call is then refused `denied_by_approver` (Rule::Denied), with the note.

use serde_json::{json, Value};
use tally_policy::approval::{denial_digest, digest, sign, DeniedCall};
use tally_policy::{Call, Inconsistency, Verdict};
use tally_record::decision::Scope;
use tally_record::{Action, Effect, Reason};

use super::{alice, policy};
use crate::support::{call, Sim};

/// The denial by alice of request `id` (the call `c`), signed.
fn denial(c: &Call, id: &str, note: &str, at: u64) -> Value {
    let d = denial_digest(
        "r1",
        "alice",
        id,
        DeniedCall {
            tool: &c.tool,
            operation: c.operation.as_deref(),
            args_digest: c.args_digest.as_deref(),
        },
        note,
    );
    json!({
        "run": "r1", "kind": "override", "at_ms": at, "approver": "alice",
        "reason": "denied_by_approver", "answers": id, "tool": c.tool,
        "args_digest": c.args_digest, "note": note, "digest": d,
        "signature": sign(&alice(), &d),
    })
}

/// A run with one attempt, used up, and the call it then asks about: its request id.
fn asked() -> (Sim, Call, String) {
    let mut sim = Sim::with_run(&policy(), json!({"attempts": 1}));
    sim.allow(&call("api", Effect::Read, json!({"n": 1})), 10);
    let next = call("email.send", Effect::NonIdempotentWrite, json!({"to": "x"}));
    let asked = sim.refused(&next, 20, Reason::ApprovalRequired);
    let id = asked.record.request.expect("a request").id;
    (sim, next, id)
}

#[test]
fn a_denied_call_is_refused_with_the_note_and_another_call_still_asks() {
    let (mut sim, next, id) = asked();
    assert_eq!(sim.apply_json(denial(&next, &id, "not to x", 30)), vec![]);
    let d = sim.refused(&next, 40, Reason::DeniedByApprover);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(Reason::DeniedByApprover.action(), Action::Stop);
    let denied = d.denied.expect("the denial");
    assert_eq!(
        (denied.approver.as_str(), denied.note.as_str()),
        ("alice", "not to x")
    );
    assert_eq!(denied.request, id);
    // The same tool with other arguments is another call: it asks again.
    let other = call("email.send", Effect::NonIdempotentWrite, json!({"to": "y"}));
    let d = sim.refused(&other, 50, Reason::ApprovalRequired);
    assert_eq!(d.denied, None);
}

#[test]
fn a_denial_is_judged_like_an_approval_and_never_one() {
    let (mut sim, next, id) = asked();
    let invalid = |found: Vec<Inconsistency>| {
        assert!(
            matches!(found.as_slice(), [Inconsistency::InvalidApproval { .. }]),
            "{found:?}"
        );
    };
    // An approval's signature replayed as a denial: its digest is in another domain.
    let scope = Scope {
        attempts: Some(1),
        ..Scope::default()
    };
    let approval = digest("r1", "alice", &scope, 1_000);
    let mut forged = denial(&next, &id, "no", 30);
    forged["digest"] = json!(approval);
    forged["signature"] = json!(sign(&alice(), &approval));
    invalid(sim.apply_json(forged));
    // A denial's signature replayed as an approval.
    let no = denial(&next, &id, "no", 30);
    let mut replayed = super::grant(&alice(), "alice", json!({"attempts": 1}), 1_000, 30);
    replayed["digest"] = no["digest"].clone();
    replayed["signature"] = no["signature"].clone();
    invalid(sim.apply_json(replayed));
    // The note changed after signing.
    let mut changed = denial(&next, &id, "no", 30);
    changed["note"] = json!("yes");
    invalid(sim.apply_json(changed));
    assert!(sim.run("r1").denied.is_empty() && sim.run("r1").grants.is_empty());
    assert_eq!(
        sim.decide(&next, 40).reason(),
        Some(Reason::ApprovalRequired)
    );
    // Denied once; a second denial of the same request is a finding.
    assert_eq!(sim.apply_json(denial(&next, &id, "no", 50)), vec![]);
    invalid(sim.apply_json(denial(&next, &id, "no again", 60)));
    assert_eq!(sim.run("r1").denied.len(), 1);
}

#[test]
fn a_run_remembers_its_latest_64_denials() {
    let (mut sim, _, _) = asked();
    let calls: Vec<Call> = (0..65)
        .map(|n| call("email.send", Effect::NonIdempotentWrite, json!({"n": n})))
        .collect();
    for (n, c) in calls.iter().enumerate() {
        let id = format!("{n:016x}");
        assert_eq!(sim.apply_json(denial(c, &id, "no", 30)), vec![]);
    }
    assert_eq!(sim.run("r1").denied.len(), tally_policy::state::MAX_DENIED);
    assert_eq!(
        sim.decide(&calls[0], 40).reason(),
        Some(Reason::ApprovalRequired)
    );
    assert_eq!(
        sim.decide(&calls[1], 40).reason(),
        Some(Reason::DeniedByApprover)
    );
    assert_eq!(
        sim.decide(&calls[64], 40).reason(),
        Some(Reason::DeniedByApprover)
    );
}

/// A continuation is not a way around a human's no: the denied call stays denied in the
/// run that continues the one it was denied in, and the carried list stays bounded.
#[test]
fn a_continuation_carries_the_denials_over() {
    let (mut sim, next, id) = asked();
    assert_eq!(sim.apply_json(denial(&next, &id, "not to x", 30)), vec![]);
    // The new run, with a fresh allocation: its state as the start folds it.
    let mut fresh = Sim::with_run(&policy(), json!({"attempts": 5}));
    let new = fresh.runs.get_mut("r1").expect("the new run");
    tally_policy::carry_over(new, sim.run("r1"));
    tally_policy::carry_over(new, sim.run("r1"));
    assert_eq!(new.denied.len(), 1, "carried once, however often");
    let d = fresh.refused(&next, 10, Reason::DeniedByApprover);
    assert_eq!(d.denied.expect("the denial").note, "not to x");
    let other = call("email.send", Effect::NonIdempotentWrite, json!({"to": "y"}));
    fresh.allow(&other, 20);
}

/// A child run its parent starts carries the parent's denials too.
#[test]
fn a_child_run_carries_its_parents_denials() {
    let (mut sim, next, id) = asked();
    assert_eq!(sim.apply_json(denial(&next, &id, "not to x", 30)), vec![]);
    // The parent has no attempt left to hand down: the child's refusal is the denial,
    // which comes before its budget in the order of the rules.
    let start = crate::support::record(&json!({"run": "c1", "kind": "start", "at_ms": 40,
        "parent": "r1", "budget": {"attempts": 0}}));
    let mut child = tally_policy::RunState::new("c1");
    let parent = sim.runs.get_mut("r1").expect("the parent");
    let view = tally_policy::ViewMut {
        run: &mut child,
        tool: None,
        credential: None,
        principal: None,
        parent: Some(parent),
        continued: None,
    };
    let found = tally_policy::apply(&sim.policy, view, &start, crate::support::now(40));
    assert_eq!(found, vec![]);
    sim.runs.insert("c1".into(), child);
    let mut in_child = next.clone();
    in_child.run = "c1".into();
    let d = sim.refused(&in_child, 50, Reason::DeniedByApprover);
    assert_eq!(d.denied.expect("the denial").note, "not to x");
}
