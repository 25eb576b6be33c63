//! Refill chains: a budget is never refilled by restarting. A run continuing a run that
//! a `stop`-action refusal stopped (a loop, retries, attempts or the deadline used up)
//! is a continuation of that refusal; a chain of them may make the policy's
//! `approvals.max_unapproved_continuations` without a human, and beyond it the start is
//! refused for a human to decide. A human says yes with a continuation grant: an
//! approver's `override` on the stopped run whose scope names the new run
//! ([`crate::approval`]); the link from that run to the new one is approved, and the
//! count starts again there.
//!
//! The gate asks [`refill`] before a start ([`crate::start`] refuses it
//! `refill_without_approval`), `tally verify` asks [`judge`] of a recorded one, and the
//! handoff shows the [`chain`]. Other runs are looked up by name through the caller
//! (as each stood when its successor started: the gate starts a continuation only of
//! a stopped run; `tally verify` drops a link named before its run had stopped); the
//! walk is bounded, and never revisits a run.

use std::collections::BTreeSet;

use tally_record::{Action, Decision, Kind, Reason};

use crate::config::Policy;
use crate::inconsistency::Inconsistency;
use crate::state::RunState;

/// Whether a run was stopped by a `stop`-action refusal: not completed, not killed by
/// an operator.
pub fn stopped_by_refusal(run: &RunState) -> bool {
    run.stop.is_some_and(|r| {
        r.action() == Action::Stop && !matches!(r, Reason::Completed | Reason::KilledByOperator)
    })
}

/// Whether `run` holds a continuation grant for `new_run`: the new run's start,
/// continuing `run`, is approved.
pub fn granted(run: &RunState, new_run: &str) -> bool {
    run.continuations.iter().any(|c| c.new_run == new_run)
}

/// A chain of runs each continuing the one before after a `stop`-action refusal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The runs, the last first (the run the chain was asked of), then each one it
    /// continued.
    pub runs: Vec<RunState>,
    /// Continuations between them (`runs.len() - 1`).
    pub unapproved: u64,
}

/// The chain ending at `last`: `last`, the run it continued if that was stopped by a
/// refusal, and so on, at most `most` links back.
/// `lookup` finds a run by name; a name it does not know, a run that never started,
/// a run seen already (a cycle), or a link a continuation grant approved ends the chain.
pub fn chain(
    last: &RunState,
    most: u64,
    mut lookup: impl FnMut(&str) -> Option<RunState>,
) -> Chain {
    let mut seen = BTreeSet::from([last.run.clone()]);
    let mut runs = vec![last.clone()];
    let mut unapproved = 0u64;
    while unapproved < most {
        let cur = &runs[runs.len() - 1];
        let Some(prev) = cur.continues.as_deref().and_then(&mut lookup) else {
            break;
        };
        if !prev.started
            || !stopped_by_refusal(&prev)
            || granted(&prev, &cur.run)
            || !seen.insert(prev.run.clone())
        {
            break;
        }
        unapproved += 1;
        runs.push(prev);
    }
    Chain { runs, unapproved }
}

/// A start continuing `continued` beyond the policy's allowance: the continuations
/// along the chain, this one included, and the allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refill {
    /// Unapproved continuations along the chain, the new one included.
    pub continuations: u64,
    /// The policy's `approvals.max_unapproved_continuations`.
    pub allowance: u64,
}

/// Whether a start of `new_run` (where known) continuing `continued` refills a budget
/// beyond the policy's allowance. `None`: it may start (the continued run was not
/// stopped by a refusal, holds a continuation grant for `new_run`, or the chain is
/// within the allowance).
pub fn refill(
    policy: &Policy,
    continued: &RunState,
    new_run: Option<&str>,
    lookup: impl FnMut(&str) -> Option<RunState>,
) -> Option<Refill> {
    if !stopped_by_refusal(continued) || new_run.is_some_and(|n| granted(continued, n)) {
        return None;
    }
    let allowance = policy.approvals.max_unapproved_continuations;
    // The new start is one continuation; the chain before it, at most `allowance` more.
    let before = chain(continued, allowance, lookup).unapproved;
    let continuations = before.saturating_add(1);
    (continuations > allowance).then_some(Refill {
        continuations,
        allowance,
    })
}

/// What is inconsistent about a recorded start as a refill: one continuing a run stopped
/// by a refusal beyond the allowance. `lookup`
/// finds runs as they stood before the record.
pub fn judge(
    policy: &Policy,
    record: &Decision,
    mut lookup: impl FnMut(&str) -> Option<RunState>,
) -> Option<Inconsistency> {
    if record.kind() != Kind::Start {
        return None;
    }
    let predecessor = record.continues.as_deref()?;
    let continued = lookup(predecessor).filter(|c| c.started)?;
    let r = refill(policy, &continued, Some(&record.run), lookup)?;
    Some(Inconsistency::RefillWithoutApproval {
        predecessor: predecessor.to_owned(),
        continuations: r.continuations,
        allowance: r.allowance,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn policy(allowance: u64) -> Policy {
        let mut p = Policy::default();
        p.approvals.max_unapproved_continuations = allowance;
        p
    }

    /// A run started at `at` (wall ms), run for 10 ms, stopped for `stop`.
    fn run(name: &str, continues: Option<&str>, stop: Option<Reason>, at: u64) -> RunState {
        RunState {
            started: true,
            continues: continues.map(str::to_owned),
            stop,
            start_wall_ms: at,
            last_ms: 10,
            ..RunState::new(name)
        }
    }

    fn looped(name: &str, continues: Option<&str>, at: u64) -> RunState {
        run(name, continues, Some(Reason::LoopRepeatedCall), at)
    }

    fn lookup(runs: &[RunState]) -> impl FnMut(&str) -> Option<RunState> + '_ {
        let by: BTreeMap<&str, &RunState> = runs.iter().map(|r| (r.run.as_str(), r)).collect();
        move |n| by.get(n).map(|r| (*r).clone())
    }

    #[test]
    fn the_first_continuation_is_within_the_default_allowance_the_second_is_not() {
        let runs = [looped("a", None, 0), looped("b", Some("a"), 100)];
        let p = policy(1);
        assert_eq!(Policy::default().approvals.max_unapproved_continuations, 1);
        assert_eq!(refill(&p, &runs[0], None, lookup(&runs)), None);
        let r = refill(&p, &runs[1], None, lookup(&runs)).expect("beyond the allowance");
        assert_eq!((r.continuations, r.allowance), (2, 1));
        // None without a human at all, under an allowance of 0.
        assert!(refill(&policy(0), &runs[0], None, lookup(&runs)).is_some());
    }

    #[test]
    fn a_completed_or_killed_run_breaks_the_chain() {
        for end in [Reason::Completed, Reason::KilledByOperator] {
            let runs = [run("a", None, Some(end), 0), looped("b", Some("a"), 100)];
            assert!(!stopped_by_refusal(&runs[0]));
            assert_eq!(chain(&runs[1], 10, lookup(&runs)).unapproved, 0);
            assert_eq!(refill(&policy(1), &runs[1], None, lookup(&runs)), None);
        }
        // A run that has not stopped, or stopped on an `ask` refusal, is no refill.
        assert!(!stopped_by_refusal(&run("x", None, None, 0)));
        assert!(!stopped_by_refusal(&run(
            "x",
            None,
            Some(Reason::BudgetExceeded),
            0
        )));
        for stop in [
            Reason::RetriesExhausted,
            Reason::AttemptsExhausted,
            Reason::RunDeadlineExhausted,
        ] {
            assert!(stopped_by_refusal(&run("x", None, Some(stop), 0)));
        }
    }

    #[test]
    fn a_chain_of_six_counts_every_link_up_to_its_bound() {
        let names = ["r1", "r2", "r3", "r4", "r5", "r6"];
        let runs: Vec<RunState> = names
            .iter()
            .enumerate()
            .map(|(i, n)| looped(n, i.checked_sub(1).map(|j| names[j]), 100 * i as u64))
            .collect();
        let whole = chain(&runs[5], 100, lookup(&runs));
        assert_eq!(whole.unapproved, 5);
        let order: Vec<&str> = whole.runs.iter().map(|r| r.run.as_str()).collect();
        assert_eq!(order, ["r6", "r5", "r4", "r3", "r2", "r1"]);
        assert_eq!(chain(&runs[5], 2, lookup(&runs)).unapproved, 2);
        assert_eq!(
            refill(&policy(3), &runs[5], None, lookup(&runs)).map(|r| r.continuations),
            Some(4)
        );
    }

    #[test]
    fn hostile_links_end_the_walk() {
        // A cycle, however large the allowance.
        let cycle = [looped("a", Some("b"), 100), looped("b", Some("a"), 100)];
        assert!(chain(&cycle[0], u64::MAX, lookup(&cycle)).unapproved <= 1);
        let own = [looped("a", Some("a"), 100)];
        assert_eq!(chain(&own[0], u64::MAX, lookup(&own)).unapproved, 0);
        // A name no run has, or a run that never started.
        let ghost = [looped("b", Some("ghost"), 100)];
        assert_eq!(chain(&ghost[0], 10, lookup(&ghost)).unapproved, 0);
        let unstarted = [RunState::new("a"), looped("b", Some("a"), 100)];
        assert_eq!(chain(&unstarted[1], 10, lookup(&unstarted)).unapproved, 0);
    }

    fn start(run: &str, continues: &str) -> Decision {
        Decision {
            run: run.into(),
            kind: Some(Kind::Start),
            at_ms: Some(0),
            continues: Some(continues.into()),
            ..Decision::default()
        }
    }

    #[test]
    fn a_recorded_start_beyond_the_allowance_is_judged() {
        let runs = [looped("a", None, 0), looped("b", Some("a"), 100)];
        let p = policy(1);
        assert_eq!(judge(&p, &start("b", "a"), lookup(&runs)), None);
        let found = judge(&p, &start("c", "b"), lookup(&runs));
        assert_eq!(
            found,
            Some(Inconsistency::RefillWithoutApproval {
                predecessor: "b".into(),
                continuations: 2,
                allowance: 1,
            })
        );
        // A run that is not known, or never started, is no predecessor.
        assert_eq!(judge(&p, &start("c", "ghost"), lookup(&runs)), None);
        let unstarted = [RunState::new("a")];
        assert_eq!(judge(&p, &start("b", "a"), lookup(&unstarted)), None);
        // Only a start is judged.
        let mut stop = start("c", "b");
        stop.kind = Some(Kind::Stop);
        assert_eq!(judge(&p, &stop, lookup(&runs)), None);
    }

    /// `run` holding a continuation grant for `new_run`.
    fn grant(mut run: RunState, new_run: &str) -> RunState {
        run.continuations.push(crate::state::Continuation {
            new_run: new_run.into(),
            digest: "d".repeat(64),
            approver: "ana".into(),
        });
        run
    }

    #[test]
    fn a_continuation_grant_approves_its_new_run_and_the_count_starts_again() {
        // a looped; b continued it (the allowance, 1); b looped; c is granted on b.
        let b = grant(looped("b", Some("a"), 100), "c");
        let runs = [
            looped("a", None, 0),
            b,
            looped("c", Some("b"), 200),
            looped("d", Some("c"), 300),
        ];
        let p = policy(1);
        assert!(granted(&runs[1], "c"));
        // Without its name, a start continuing b is beyond the allowance; as c, it is granted.
        assert!(refill(&p, &runs[1], None, lookup(&runs)).is_some());
        assert!(refill(&p, &runs[1], Some("x"), lookup(&runs)).is_some());
        assert_eq!(refill(&p, &runs[1], Some("c"), lookup(&runs)), None);
        assert_eq!(judge(&p, &start("c", "b"), lookup(&runs)), None);
        // The count starts again at c: d (continuing c) is the one allowed, the next is not.
        assert_eq!(chain(&runs[2], 10, lookup(&runs)).unapproved, 0);
        assert_eq!(judge(&p, &start("d", "c"), lookup(&runs)), None);
        assert_eq!(chain(&runs[3], 10, lookup(&runs)).unapproved, 1);
        assert_eq!(
            refill(&p, &runs[3], Some("e"), lookup(&runs)).map(|r| r.continuations),
            Some(2)
        );
        // Another run continuing b without the grant is still judged.
        assert!(judge(&p, &start("x", "b"), lookup(&runs)).is_some());
    }

    #[test]
    fn the_allowance_is_read_from_the_policy_and_checked() {
        let p = crate::Recorded::new("[approvals]\nmax_unapproved_continuations = 3\n")
            .expect("policy");
        assert_eq!(p.policy.approvals.max_unapproved_continuations, 3);
        let bad = crate::Recorded::new("[approvals]\nmax_unapproved_continuations = \"3\"\n")
            .expect_err("a string is no count");
        assert!(
            bad.to_string().contains("max_unapproved_continuations"),
            "{bad}"
        );
    }
}
