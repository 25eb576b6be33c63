//! Refill chains: a budget is never refilled by restarting. A run continuing a run that
//! a `stop`-action refusal stopped (a loop, retries, attempts or the deadline used up)
//! is a continuation of that refusal; a chain of them may make the policy's
//! `approvals.max_unapproved_continuations` without a human, and beyond it needs an
//! approver's continuation grant naming the stopped run ([`crate::approval`]).
//!
//! The gate asks [`refill`] before a start ([`crate::start`] refuses it
//! `refill_without_approval`), `tally verify` asks [`judge`] of a recorded one, and the
//! handoff shows the [`chain`]. Other runs are looked up by name through the caller
//! (as each stood when its successor started: the gate starts a continuation only of
//! a stopped run; `tally verify` drops a link named before its run had stopped); the
//! walk is bounded, and never revisits a run.

use std::collections::BTreeSet;

use tally_record::{Action, Decision, Kind, Reason};

use crate::approval::continuation_digest;
use crate::config::Policy;
use crate::inconsistency::Inconsistency;
use crate::state::{Grant, RunState};

/// Whether a run was stopped by a `stop`-action refusal: not completed, not killed by
/// an operator.
pub fn stopped_by_refusal(run: &RunState) -> bool {
    run.stop.is_some_and(|r| {
        r.action() == Action::Stop && !matches!(r, Reason::Completed | Reason::KilledByOperator)
    })
}

/// Whether a run's start was granted by an approver's continuation grant naming the run
/// it continues (the grant is folded into its grants, used, at its start).
pub fn approved(run: &RunState) -> bool {
    let Some(predecessor) = run.continues.as_deref() else {
        return false;
    };
    run.grants.iter().any(|g| {
        g.used && continuation_digest(predecessor, &g.approver, &g.scope, g.expires_ms) == g.digest
    })
}

/// A chain of runs each continuing the one before after a `stop`-action refusal, with
/// no approval between them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The runs, the last first (the run the chain was asked of), then each one it
    /// continued.
    pub runs: Vec<RunState>,
    /// Continuations between them made without an approval (`runs.len() - 1`).
    pub unapproved: u64,
}

/// The chain ending at `last`: `last`, the run it continued if that was stopped by a
/// refusal and `last`'s start was not approved, and so on, at most `most` links back.
/// `lookup` finds a run by name; a name it does not know, a run that never started,
/// or a run seen already (a cycle) ends the chain.
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
        if approved(cur) {
            break;
        }
        let Some(prev) = cur.continues.as_deref().and_then(&mut lookup) else {
            break;
        };
        if !prev.started || !stopped_by_refusal(&prev) || !seen.insert(prev.run.clone()) {
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

/// Whether an unapproved start continuing `continued` refills a budget beyond the
/// policy's allowance. `None`: it may start (the continued run was not stopped by a
/// refusal, or the chain is within the allowance).
pub fn refill(
    policy: &Policy,
    continued: &RunState,
    lookup: impl FnMut(&str) -> Option<RunState>,
) -> Option<Refill> {
    if !stopped_by_refusal(continued) {
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
/// by a refusal beyond the allowance, with no continuation grant on record. `lookup`
/// finds runs as they stood before the record.
pub fn judge(
    policy: &Policy,
    record: &Decision,
    mut lookup: impl FnMut(&str) -> Option<RunState>,
) -> Option<Inconsistency> {
    if record.kind() != Kind::Start || granted(policy, record) {
        return None;
    }
    let predecessor = record.continues.as_deref()?;
    let continued = lookup(predecessor).filter(|c| c.started)?;
    let r = refill(policy, &continued, lookup)?;
    Some(Inconsistency::RefillWithoutApproval {
        predecessor: predecessor.to_owned(),
        continuations: r.continuations,
        allowance: r.allowance,
    })
}

/// Whether a start record carries a valid continuation grant naming the run it
/// continues.
pub fn granted(policy: &Policy, record: &Decision) -> bool {
    let (Some(p), Some(a), Some(s), Some(e), Some(d), Some(sig)) = (
        record.continues.as_deref(),
        record.approver.as_deref(),
        record.scope.as_ref(),
        record.expires_ms,
        record.digest.as_deref(),
        record.signature.as_deref(),
    ) else {
        return false;
    };
    crate::approval::check_continuation(policy, p, a, s, e, d, sig).is_ok()
}

/// Fold a start's continuation grant, if it carries a valid one: kept in the run's
/// grants, used (its allocation is the run's budget), so [`approved`] knows the run's
/// start was approved.
pub fn fold_grant(policy: &Policy, run: &mut RunState, record: &Decision) {
    if !granted(policy, record) {
        return;
    }
    let (Some(approver), Some(scope), Some(expires_ms), Some(digest)) = (
        record.approver.clone(),
        record.scope.clone(),
        record.expires_ms,
        record.digest.clone(),
    ) else {
        return;
    };
    run.grants.push(Grant {
        digest,
        approver,
        scope,
        expires_ms,
        used: true,
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ed25519_dalek::SigningKey;
    use tally_record::decision::Scope;

    use super::*;
    use crate::approval::sign;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[9u8; 32])
    }

    fn policy(allowance: u64) -> Policy {
        let mut p = Policy::default();
        p.approvals.max_unapproved_continuations = allowance;
        p.approvals
            .approvers
            .insert("ana".into(), hex::encode(key().verifying_key().to_bytes()));
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

    fn scope() -> Scope {
        Scope {
            attempts: Some(5),
            ..Scope::default()
        }
    }

    /// `run`'s start approved by a continuation grant naming its predecessor.
    fn approve(run: &mut RunState) {
        let p = run.continues.clone().unwrap_or_default();
        let digest = continuation_digest(&p, "ana", &scope(), 1_000);
        run.grants.push(Grant {
            digest,
            approver: "ana".into(),
            scope: scope(),
            expires_ms: 1_000,
            used: true,
        });
    }

    #[test]
    fn the_first_continuation_is_within_the_default_allowance_the_second_is_not() {
        let runs = [looped("a", None, 0), looped("b", Some("a"), 100)];
        let p = policy(1);
        assert_eq!(Policy::default().approvals.max_unapproved_continuations, 1);
        assert_eq!(refill(&p, &runs[0], lookup(&runs)), None);
        let r = refill(&p, &runs[1], lookup(&runs)).expect("beyond the allowance");
        assert_eq!((r.continuations, r.allowance), (2, 1));
        // None without a human at all, under an allowance of 0.
        assert!(refill(&policy(0), &runs[0], lookup(&runs)).is_some());
    }

    #[test]
    fn an_approved_continuation_starts_the_count_again() {
        let mut b = looped("b", Some("a"), 100);
        approve(&mut b);
        let runs = [looped("a", None, 0), b, looped("c", Some("b"), 200)];
        let p = policy(1);
        assert!(approved(&runs[1]));
        assert_eq!(refill(&p, &runs[1], lookup(&runs)), None);
        assert_eq!(
            refill(&p, &runs[2], lookup(&runs)).map(|r| r.continuations),
            Some(2)
        );
        assert_eq!(chain(&runs[2], 10, lookup(&runs)).unapproved, 1);
    }

    #[test]
    fn a_grant_for_another_run_or_tampered_approves_nothing() {
        let mut b = looped("b", Some("a"), 100);
        approve(&mut b);
        b.continues = Some("z".into());
        assert!(!approved(&b));
        let mut c = looped("c", Some("a"), 100);
        approve(&mut c);
        c.grants[0].scope.attempts = Some(500);
        assert!(!approved(&c));
        let mut d = looped("d", Some("a"), 100);
        approve(&mut d);
        d.grants[0].used = false;
        assert!(!approved(&d));
    }

    #[test]
    fn a_completed_or_killed_run_breaks_the_chain() {
        for end in [Reason::Completed, Reason::KilledByOperator] {
            let runs = [run("a", None, Some(end), 0), looped("b", Some("a"), 100)];
            assert!(!stopped_by_refusal(&runs[0]));
            assert_eq!(chain(&runs[1], 10, lookup(&runs)).unapproved, 0);
            assert_eq!(refill(&policy(1), &runs[1], lookup(&runs)), None);
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
            refill(&policy(3), &runs[5], lookup(&runs)).map(|r| r.continuations),
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
    fn a_recorded_start_beyond_the_allowance_is_judged_unless_granted() {
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
        let mut granted = start("c", "b");
        let digest = continuation_digest("b", "ana", &scope(), 1_000);
        granted.signature = Some(sign(&key(), &digest));
        granted.digest = Some(digest);
        granted.approver = Some("ana".into());
        granted.scope = Some(scope());
        granted.expires_ms = Some(1_000);
        assert_eq!(judge(&p, &granted, lookup(&runs)), None);
        let mut folded = RunState::new("c");
        folded.continues = Some("b".into());
        fold_grant(&p, &mut folded, &granted);
        assert!(approved(&folded));
        // The same grant for another predecessor, or tampered, is none.
        let mut other = granted.clone();
        let for_a = continuation_digest("a", "ana", &scope(), 1_000);
        other.signature = Some(sign(&key(), &for_a));
        other.digest = Some(for_a);
        assert!(judge(&p, &other, lookup(&runs)).is_some());
        let mut tampered = granted;
        tampered.scope = Some(Scope {
            attempts: Some(50),
            ..Scope::default()
        });
        assert!(judge(&p, &tampered, lookup(&runs)).is_some());
    }
}
