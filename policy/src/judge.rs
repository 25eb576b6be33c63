//! `judge`: what is inconsistent about one record, against the state before it. Pure:
//! it reads the state and changes nothing. [`crate::apply`] calls it before it folds,
//! the gate calls it before it records what an agent reports (and refuses what it finds,
//! never recording it), and replay and every report only turn its verdicts into text.
//! So a ledger the gate wrote always verifies, and an agent alone cannot make one verify
//! inconsistent.

use tally_record::{Decision, Effect, Kind};

use crate::call::{counts, grant_fits, grant_live, Call, Keyed, View};
use crate::config::Policy;
pub use crate::inconsistency::{Dimension, Inconsistency};
use crate::start::judge_start;
use crate::state::Now;
use crate::state::{Grant, RunState};

/// What is inconsistent about `record` against the state in `view` before it, under
/// `policy` (its exempt tools, its approvers). Empty: the record is consistent.
pub fn judge(policy: &Policy, view: View<'_>, record: &Decision, now: Now) -> Vec<Inconsistency> {
    judge_keyed(policy, view, record, None, now)
}

/// [`judge`], with the allow's call and keys when the caller has them already.
pub(crate) fn judge_keyed(
    policy: &Policy,
    view: View<'_>,
    record: &Decision,
    keyed: Option<&Keyed>,
    now: Now,
) -> Vec<Inconsistency> {
    let run = view.run;
    let kind = record.kind();
    let mut found = Vec::new();
    // A continuation grant on a stopped run is what it is for: it starts a new run, and
    // never revives this one.
    let continuation =
        kind == Kind::Override && record.scope.as_ref().is_some_and(|s| s.new_run.is_some());
    if let Some(stop) = run.stop {
        if kind != Kind::Outcome && !continuation {
            found.push(Inconsistency::AfterStop { record: kind, stop });
        }
    }
    match kind {
        Kind::Start => found.extend(judge_start(policy, record, run, &view.family)),
        Kind::Allow => match keyed {
            Some(k) => allow(policy, run, record, k, now, &mut found),
            None => allow(
                policy,
                run,
                record,
                &Keyed::from_record(record),
                now,
                &mut found,
            ),
        },
        Kind::Outcome => outcome(run, record, &mut found),
        Kind::Refund => {
            if let Some(of) = record.of {
                if !run.allowed.contains(of) {
                    found.push(Inconsistency::RefundWithoutAttempt { of });
                } else if run.refunded.contains(of) {
                    found.push(Inconsistency::RefundedTwice { of });
                }
            }
        }
        Kind::Override => {
            if let Err(e) = crate::approval::check(policy, record) {
                found.push(Inconsistency::InvalidApproval { why: e.to_string() });
            } else if crate::approval::is_denial(record) {
                if run
                    .denied
                    .iter()
                    .any(|d| Some(&d.request) == record.answers.as_ref())
                {
                    found.push(Inconsistency::InvalidApproval {
                        why: "the same request was denied twice".into(),
                    });
                }
            } else if run
                .grants
                .iter()
                .map(|g| &g.digest)
                .chain(run.continuations.iter().map(|c| &c.digest))
                .any(|d| Some(d) == record.digest.as_ref())
            {
                found.push(Inconsistency::InvalidApproval {
                    why: "the same approval was recorded twice (each is used once)".into(),
                });
            }
        }
        // A lease record is no run's: the lease audit judges it (`crate::leased`).
        Kind::Deny | Kind::Stop | Kind::Policy | Kind::Pause | Kind::Resume | Kind::Lease => {}
    }
    found
}

/// The grant an allow names, if the run holds it unused.
fn held_grant<'a>(run: &'a RunState, record: &Decision) -> Option<&'a Grant> {
    let digest = record.grant.as_ref()?;
    run.grants.iter().find(|g| !g.used && &g.digest == digest)
}

/// The grant an allow names, if it is in force for it: held unused, for this call, not
/// expired. The one grant the fold puts in force.
pub(crate) fn grant_in_force<'a>(
    run: &'a RunState,
    record: &Decision,
    call: &Call,
    run_ms: u64,
) -> Option<&'a Grant> {
    let g = held_grant(run, record)?;
    (grant_fits(g, call) && grant_live(g, run_ms)).then_some(g)
}

/// The grant an allow names, if the run holds it, it fits the call and it is live; each
/// way it does not is a finding.
fn recorded_grant<'r>(
    run: &'r RunState,
    d: &Decision,
    call: &Call,
    run_ms: u64,
    found: &mut Vec<Inconsistency>,
) -> Option<&'r Grant> {
    match (&d.grant, held_grant(run, d)) {
        (Some(digest), None) => {
            found.push(Inconsistency::GrantNotHeld {
                digest: digest.clone(),
            });
            None
        }
        (Some(digest), Some(g)) if !grant_fits(g, call) => {
            found.push(Inconsistency::GrantMismatch {
                digest: digest.clone(),
            });
            None
        }
        (Some(digest), Some(g)) if !grant_live(g, run_ms) => {
            found.push(Inconsistency::GrantExpired {
                digest: digest.clone(),
                expires_ms: g.expires_ms,
                at_ms: run_ms,
            });
            None
        }
        (_, g) => g,
    }
}

fn allow(
    policy: &Policy,
    run: &RunState,
    d: &Decision,
    keyed: &Keyed,
    now: Now,
    found: &mut Vec<Inconsistency>,
) {
    let attempt = d.attempt.unwrap_or(run.last_attempt.saturating_add(1));
    if run.allowed.contains(attempt) {
        found.push(Inconsistency::DuplicateAllow { attempt });
        return;
    }
    let call = &keyed.call;
    let run_ms = run.run_ms(now);
    let grant = recorded_grant(run, d, call, run_ms, found);
    // A grant naming the tool or operation is a human's reconciliation of it.
    let reconciled = grant.is_some_and(|g| g.scope.tool.is_some() || g.scope.operation.is_some());
    if d.effect == Some(Effect::NonIdempotentWrite) && !reconciled {
        if let Some(&earlier) = run.unknown.get(&keyed.op) {
            found.push(Inconsistency::RepeatedUnknownWrite { attempt: earlier });
        }
    }
    let poll = keyed.poll(run);
    let uses = Uses {
        counted: counts(policy, &call.tool, poll.is_some()),
        write: matches!(
            d.effect,
            Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
        ),
        reserve: d.reserve().map_or(0, |n| n.0),
        poll,
    };
    if let Some(price) = policy.tool_price(&call.tool).filter(|p| p.0 > uses.reserve) {
        found.push(Inconsistency::ReserveBelowPrice {
            reserved: uses.reserve,
            price: price.0,
        });
    }
    beyond_limits(run, d, &uses, grant, run_ms, found);
}

/// What an allowed call uses of its run's limits.
struct Uses {
    /// It uses an attempt.
    counted: bool,
    /// It is a write (a side effect).
    write: bool,
    /// What it reserves.
    reserve: u64,
    /// The remote operation it polls.
    poll: Option<u64>,
}

/// Each limit in force (with what the grant adds) an allow goes beyond, and an allow
/// after an overrun with no spend granted since.
fn beyond_limits(
    run: &RunState,
    d: &Decision,
    uses: &Uses,
    grant: Option<&Grant>,
    run_ms: u64,
    found: &mut Vec<Inconsistency>,
) {
    let extra_attempts = grant.and_then(|g| g.scope.attempts).unwrap_or(0);
    let extra_nanos = grant.and_then(|g| g.scope.spend()).map_or(0, |n| n.0);
    let with_extra = |limit: Option<u64>, extra: u64| limit.map(|l| l.saturating_add(extra));
    let Some((attempts_used, side_effects_used)) = counted_uses(run, uses, found) else {
        return;
    };
    let spent = run.spent_nanos().saturating_add(uses.reserve);
    let polls_used = uses.poll.map(|r| run.refs[&r].polls.saturating_add(1));
    let dims = [
        (
            Dimension::Attempts,
            uses.counted,
            attempts_used,
            with_extra(run.attempts_limit(), extra_attempts),
        ),
        (
            Dimension::SideEffects,
            uses.write,
            side_effects_used,
            with_extra(run.side_effects_limit(), extra_attempts),
        ),
        (
            Dimension::SpendNanos,
            uses.reserve > 0,
            spent,
            with_extra(run.spend_limit(), extra_nanos),
        ),
        (
            Dimension::DeadlineMs,
            true,
            run_ms,
            run.budget.deadline_ms.map(|d| d.saturating_sub(1)),
        ),
        (
            Dimension::Depth,
            true,
            d.depth.unwrap_or(0),
            run.budget.depth,
        ),
        (
            Dimension::Polls,
            polls_used.is_some(),
            polls_used.unwrap_or(0),
            run.budget.polls,
        ),
    ];
    for (dimension, applies, used, limit) in dims {
        if let Some(limit) = limit.filter(|&l| applies && used > l) {
            found.push(Inconsistency::AllowBeyondLimit {
                dimension,
                used,
                limit,
            });
        }
    }
    if run.overrun && extra_nanos == 0 && run.spend_limit().is_some() {
        found.push(Inconsistency::AllowAfterOverrun);
    }
}

/// The attempts and side effects used with the call counted, and whether what it
/// reserves can be held; a count that would overflow is a finding (and `None`).
fn counted_uses(run: &RunState, uses: &Uses, found: &mut Vec<Inconsistency>) -> Option<(u64, u64)> {
    let Some(attempts_used) = run.attempts_used.checked_add(u64::from(uses.counted)) else {
        found.push(Inconsistency::Overflow {
            field: Dimension::Attempts.as_str(),
        });
        return None;
    };
    let Some(side_effects_used) = run.side_effects_used.checked_add(u64::from(uses.write)) else {
        found.push(Inconsistency::Overflow {
            field: Dimension::SideEffects.as_str(),
        });
        return None;
    };
    if run.held_nanos.checked_add(uses.reserve).is_none() {
        found.push(Inconsistency::Overflow {
            field: "held_nanos",
        });
        return None;
    }
    Some((attempts_used, side_effects_used))
}

fn outcome(run: &RunState, d: &Decision, found: &mut Vec<Inconsistency>) {
    let Some(attempt) = d.attempt.filter(|_| d.status.is_some()) else {
        return;
    };
    if !run.allowed.contains(attempt) {
        found.push(Inconsistency::OutcomeWithoutAllow { attempt });
        return;
    }
    // The proxy's attempts are the proxy's, settled or not: nobody else reports on them.
    if run.proxied.contains(attempt) && d.proxied != Some(true) && d.operator != Some(true) {
        found.push(Inconsistency::OutcomeOwnedByProxy { attempt });
        return;
    }
    match run.open.get(&attempt) {
        // Forgotten beyond the bound on open attempts: counted, not judged.
        None if attempt <= run.forgotten_to => {}
        None => found.push(Inconsistency::DuplicateOutcome { attempt }),
        Some(a) => {
            if a.settled && d.settled().is_some() {
                found.push(Inconsistency::DuplicateOutcome { attempt });
            } else if let Some(c) = d.settled() {
                if run.settled_nanos.checked_add(c.0).is_none() {
                    found.push(Inconsistency::Overflow {
                        field: "settled_nanos",
                    });
                }
            }
        }
    }
    // The overrun the outcome records is the core's count of it, or none at all (a
    // writer from before the field); never another amount.
    if let Some(recorded) = d.overrun_nanos {
        let counted = crate::overrun::overrun(run, d).map(|o| o.excess().0);
        if counted != Some(recorded) {
            found.push(Inconsistency::OverrunMisrecorded { recorded, counted });
        }
    }
}

pub use crate::status::is_final;
