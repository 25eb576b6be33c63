//! Regression tests for what an adversarial review of the gate found, each attacking the
//! core the way the review did.

use serde_json::json;
use tally_record::{Effect, Reason};

use crate::approvals::{alice, grant};
use crate::support::{call, op_call, Sim, NO_ASK};

/// A poll's outcome named the next "remote operation", so every read could be a free
/// poll: one attempt bought unlimited calls.
#[test]
fn a_polls_outcome_cannot_register_the_next_free_poll() {
    let mut sim = Sim::with_run(NO_ASK, json!({"attempts": 1}));
    let first = sim.allow(&call("fetch", Effect::Read, json!({"u": 0})), 0);
    sim.outcome("r1", first, "ok", 1, json!({"remote_ref": "r0"}));
    let mut poll = op_call("fetch", "status:r0", Effect::Read, json!({"u": 1}));
    let p = sim.allow(&poll, 2000);
    sim.outcome("r1", p, "ok", 2001, json!({"remote_ref": "r1"}));
    // `r1` came from a poll's outcome: reading it is an ordinary call, and the run's one
    // attempt is spent.
    poll = op_call("fetch", "status:r1", Effect::Read, json!({"u": 2}));
    sim.refused(&poll, 4000, Reason::AttemptsExhausted);
}

/// A tool approval unblocked the tool for good, past its one use and its expiry.
#[test]
fn a_tool_approval_is_used_by_one_call() {
    let policy = format!(
        "{}[scope]\nblocked = [\"danger\"]\n",
        crate::approvals::policy()
    );
    let mut sim = Sim::with_run(&policy, json!({}));
    let c = call("danger", Effect::Read, json!({"n": 1}));
    assert_eq!(sim.decide(&c, 1).reason(), Some(Reason::ApprovalRequired));
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"tool": "danger"}),
        60_000,
        2,
    ));
    sim.allow(&c, 3);
    let again = call("danger", Effect::Read, json!({"n": 2}));
    assert_ne!(sim.decide(&again, 4).verdict, tally_policy::Verdict::Allow);
}

/// Children were bounded by their parent's side effects left, but never carved out of
/// them: a parent and its children wrote more than the parent's budget.
#[test]
fn a_childs_side_effects_are_carved_out_of_its_parent() {
    let mut sim = Sim::with_run(NO_ASK, json!({"side_effects": 3}));
    let child = tally_policy::grant_budget(
        &sim.policy,
        Some(&tally_record::decision::Budget {
            side_effects: Some(2),
            ..Default::default()
        }),
        None,
        Some(sim.run("r1")),
    );
    assert_eq!(child.side_effects, Some(2));
    tally_policy::delegate(sim.runs.get_mut("r1").expect("parent"), &child);
    let write = |n: u64| call("db", Effect::IdempotentWrite, json!({"n": n}));
    sim.allow(&write(1), 1);
    sim.refused(&write(2), 2, Reason::SideEffectLimitExceeded);
}

/// A continuation carried over only writes reported unknown: one allowed with no outcome
/// at all (the worker died mid-call) was allowed again in the new run.
#[test]
fn a_continuation_refuses_a_write_that_never_reported() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    let pay = op_call(
        "payments",
        "charge",
        Effect::NonIdempotentWrite,
        json!({"i": 8}),
    );
    sim.allow(&pay, 1);
    let mut new = tally_policy::RunState::new("r2");
    tally_policy::carry_over(&mut new, sim.run("r1"));
    assert_eq!(
        new.unknown.len(),
        1,
        "the write with no outcome is carried over"
    );
}
