//! `judge`: what is inconsistent about one record, against the state before it. Pure:
//! it reads the state and changes nothing. [`crate::apply`] calls it before it folds,
//! the gate calls it before it records what an agent reports (and refuses what it finds,
//! never recording it), and replay and every report only turn its verdicts into text.
//! So a ledger the gate wrote always verifies, and an agent alone cannot make one verify
//! inconsistent.

use serde::{Deserialize, Serialize};
use tally_record::{Decision, Effect, Kind, Reason, Status};

use crate::config::Policy;
use crate::decide::{counts, grant_fits, grant_live, Call, View};
use crate::start::{judge_start, StartRefusal};
use crate::state::{op_key, Grant, RunState};
use crate::Now;

/// A budget dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Attempts.
    Attempts,
    /// Spend, cents.
    SpendCents,
    /// Side effects.
    SideEffects,
    /// Polls of one remote operation.
    Polls,
    /// Run time, ms.
    DeadlineMs,
    /// Chain depth.
    Depth,
}

impl Dimension {
    /// The dimension's name as it appears in JSON and in `limits` snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Attempts => "attempts",
            Dimension::SpendCents => "spend_cents",
            Dimension::SideEffects => "side_effects",
            Dimension::Polls => "polls",
            Dimension::DeadlineMs => "deadline_ms",
            Dimension::Depth => "depth",
        }
    }
}

/// Something a record does that its run's own history does not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Inconsistency {
    /// An allow beyond a limit in force (the budget, with the grants used, less what was
    /// carved out for child runs).
    AllowBeyondLimit {
        /// Which limit.
        dimension: Dimension,
        /// Used, with this allow.
        used: u64,
        /// The limit in force.
        limit: u64,
    },
    /// An allow after an overrun (an outcome settled above its reservation), with no
    /// human grant of cents since: no call is free then, as its outcome could settle any
    /// amount.
    AllowAfterOverrun,
    /// A record after the run's stop (outcomes of calls still open are not this: they
    /// report what happened).
    AfterStop {
        /// The record's kind.
        record: Kind,
        /// The stop's reason.
        stop: Reason,
    },
    /// A second start of the same run.
    SecondStart,
    /// A start showing more than the rule grants: beyond the policy's ceiling (a start
    /// the gate wrote), or beyond what its parent had left.
    StartBeyondGrant {
        /// Which dimension.
        dimension: Dimension,
        /// What the start shows (`u64::MAX`: no limit).
        granted: u64,
        /// The most that could be granted.
        most: u64,
    },
    /// A start the gate would have refused.
    StartRefused {
        /// Why.
        refusal: StartRefusal,
    },
    /// An outcome for an attempt that was never allowed.
    OutcomeWithoutAllow {
        /// The attempt named.
        attempt: u64,
    },
    /// An outcome for an attempt that already had its final outcome (`ok`, `error`,
    /// `rejected`), or a second settlement (`settled_cents`) of one attempt.
    DuplicateOutcome {
        /// The attempt.
        attempt: u64,
    },
    /// A refund of an attempt never allowed.
    RefundWithoutAttempt {
        /// The attempt named.
        of: u64,
    },
    /// A second refund of one attempt.
    RefundedTwice {
        /// The attempt.
        of: u64,
    },
    /// A non-idempotent write repeated while an earlier identical one's outcome was
    /// unknown, with no approval.
    RepeatedUnknownWrite {
        /// The earlier attempt (0: one of the run it continues).
        attempt: u64,
    },
    /// An approval whose signature, digest or approver does not check out, or that was
    /// recorded twice.
    InvalidApproval {
        /// Why.
        why: String,
    },
    /// An allow that names an approval the run does not hold unused.
    GrantNotHeld {
        /// The digest named.
        digest: String,
    },
    /// An allow that names an approval for another tool or operation.
    GrantMismatch {
        /// The digest named.
        digest: String,
    },
    /// An allow that names an approval past its expiry.
    GrantExpired {
        /// The digest named.
        digest: String,
        /// When it expired, run time ms.
        expires_ms: u64,
        /// The allow's run time, ms.
        at_ms: u64,
    },
    /// An allow naming an attempt number already allowed (nothing is counted for it).
    DuplicateAllow {
        /// The attempt.
        attempt: u64,
    },
    /// A gate-governed run's allow skips attempt numbers no record shows: the gate's
    /// state issued them and no ledger given records them (a networked gate killed
    /// between committing its state and recording; or a ledger of the fleet not given).
    /// They are counted as used and never settled, as the state counted them.
    AttemptsUnrecorded {
        /// The first attempt skipped.
        from: u64,
        /// The last attempt skipped.
        to: u64,
    },
    /// A number that would overflow u64.
    Overflow {
        /// What overflowed.
        field: &'static str,
    },
}

impl Inconsistency {
    /// The finding's kind as it appears in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Inconsistency::AllowBeyondLimit { .. } => "allow_beyond_limit",
            Inconsistency::AllowAfterOverrun => "allow_after_overrun",
            Inconsistency::AfterStop { .. } => "after_stop",
            Inconsistency::SecondStart => "second_start",
            Inconsistency::StartBeyondGrant { .. } => "start_beyond_grant",
            Inconsistency::StartRefused { .. } => "start_refused",
            Inconsistency::OutcomeWithoutAllow { .. } => "outcome_without_allow",
            Inconsistency::DuplicateOutcome { .. } => "duplicate_outcome",
            Inconsistency::RefundWithoutAttempt { .. } => "refund_without_attempt",
            Inconsistency::RefundedTwice { .. } => "refunded_twice",
            Inconsistency::RepeatedUnknownWrite { .. } => "repeated_unknown_write",
            Inconsistency::InvalidApproval { .. } => "invalid_approval",
            Inconsistency::GrantNotHeld { .. } => "grant_not_held",
            Inconsistency::GrantMismatch { .. } => "grant_mismatch",
            Inconsistency::GrantExpired { .. } => "grant_expired",
            Inconsistency::DuplicateAllow { .. } => "duplicate_allow",
            Inconsistency::AttemptsUnrecorded { .. } => "attempts_unrecorded",
            Inconsistency::Overflow { .. } => "overflow",
        }
    }
}

/// What is inconsistent about `record` against the state in `view` before it, under
/// `policy` (its exempt tools, its approvers). Empty: the record is consistent.
pub fn judge(policy: &Policy, view: View<'_>, record: &Decision, now: Now) -> Vec<Inconsistency> {
    let run = view.run;
    let kind = record.kind();
    let mut found = Vec::new();
    if let Some(stop) = run.stop {
        if kind != Kind::Outcome {
            found.push(Inconsistency::AfterStop { record: kind, stop });
        }
    }
    match kind {
        Kind::Start => found.extend(judge_start(policy, record, run, &view.family)),
        Kind::Allow => allow(policy, run, record, now, &mut found),
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
            } else if run
                .grants
                .iter()
                .any(|g| Some(&g.digest) == record.digest.as_ref())
            {
                found.push(Inconsistency::InvalidApproval {
                    why: "the same approval was recorded twice (each is used once)".into(),
                });
            }
        }
        Kind::Deny | Kind::Stop | Kind::Policy | Kind::Pause | Kind::Resume => {}
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
    now: Now,
) -> Option<&'a Grant> {
    let g = held_grant(run, record)?;
    let call = Call::from_record(record);
    (grant_fits(g, &call) && grant_live(g, run.run_ms(now))).then_some(g)
}

fn allow(policy: &Policy, run: &RunState, d: &Decision, now: Now, found: &mut Vec<Inconsistency>) {
    let attempt = d.attempt.unwrap_or(run.last_attempt.saturating_add(1));
    if run.allowed.contains(attempt) {
        found.push(Inconsistency::DuplicateAllow { attempt });
        return;
    }
    let call = Call::from_record(d);
    let run_ms = run.run_ms(now);
    let grant = match (&d.grant, held_grant(run, d)) {
        (Some(digest), None) => {
            found.push(Inconsistency::GrantNotHeld {
                digest: digest.clone(),
            });
            None
        }
        (Some(digest), Some(g)) if !grant_fits(g, &call) => {
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
    };
    let op = op_key(
        d.tool.as_deref(),
        d.operation.as_deref(),
        d.args_digest.as_deref(),
    );
    // A grant naming the tool or operation is a human's reconciliation of it.
    let reconciled = grant.is_some_and(|g| g.scope.tool.is_some() || g.scope.operation.is_some());
    if d.effect == Some(Effect::NonIdempotentWrite) && !reconciled {
        if let Some(&earlier) = run.unknown.get(&op) {
            found.push(Inconsistency::RepeatedUnknownWrite { attempt: earlier });
        }
    }
    let poll = run.poll_of(d.effect, d.remote_ref.as_deref(), d.operation.as_deref());
    let counted = counts(policy, &call.tool, poll.is_some());
    let write = matches!(
        d.effect,
        Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
    );
    let reserve = d.reserve_cents.unwrap_or(0);
    let extra_attempts = grant.and_then(|g| g.scope.attempts).unwrap_or(0);
    let extra_cents = grant.and_then(|g| g.scope.cents).unwrap_or(0);
    let with_extra = |limit: Option<u64>, extra: u64| limit.map(|l| l.saturating_add(extra));

    let Some(attempts_used) = run.attempts_used.checked_add(u64::from(counted)) else {
        found.push(Inconsistency::Overflow { field: "attempts" });
        return;
    };
    let Some(side_effects_used) = run.side_effects_used.checked_add(u64::from(write)) else {
        found.push(Inconsistency::Overflow {
            field: "side_effects",
        });
        return;
    };
    if run.held_cents.checked_add(reserve).is_none() {
        found.push(Inconsistency::Overflow {
            field: "held_cents",
        });
        return;
    }
    let spent = run.spent_cents().saturating_add(reserve);
    let polls_used = poll.map(|r| run.refs[&r].polls.saturating_add(1));
    let dims = [
        (
            Dimension::Attempts,
            counted,
            attempts_used,
            with_extra(run.attempts_limit(), extra_attempts),
        ),
        (
            Dimension::SideEffects,
            write,
            side_effects_used,
            with_extra(run.side_effects_limit(), extra_attempts),
        ),
        (
            Dimension::SpendCents,
            reserve > 0,
            spent,
            with_extra(run.spend_limit(), extra_cents),
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
    if run.overrun && extra_cents == 0 && run.spend_limit().is_some() {
        found.push(Inconsistency::AllowAfterOverrun);
    }
}

fn outcome(run: &RunState, d: &Decision, found: &mut Vec<Inconsistency>) {
    let Some(attempt) = d.attempt.filter(|_| d.status.is_some()) else {
        return;
    };
    if !run.allowed.contains(attempt) {
        found.push(Inconsistency::OutcomeWithoutAllow { attempt });
        return;
    }
    match run.open.get(&attempt) {
        // Forgotten beyond the bound on open attempts: counted, not judged.
        None if attempt <= run.forgotten_to => {}
        None => found.push(Inconsistency::DuplicateOutcome { attempt }),
        Some(a) => {
            if a.settled && d.settled_cents.is_some() {
                found.push(Inconsistency::DuplicateOutcome { attempt });
            } else if let Some(c) = d.settled_cents {
                if run.settled_cents.checked_add(c).is_none() {
                    found.push(Inconsistency::Overflow {
                        field: "settled_cents",
                    });
                }
            }
        }
    }
}

/// Whether an outcome with `status` ends its attempt (no further outcome for it).
pub fn is_final(status: Status) -> bool {
    matches!(status, Status::Ok | Status::Error | Status::Rejected)
}
