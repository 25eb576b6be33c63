//! Consistency audit: decisions that break the run's own budget or history.

use crate::event::Seq;
use serde::Serialize;
use tally_ledger::decision::Scope;
use tally_ledger::{Kind, Status};

/// A budget dimension the audit can recompute from the run's budget and history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Allowed calls, less refunded slots, against `budget.attempts`.
    Attempts,
    /// Settled cents plus reservations not yet settled, against `budget.spend_cents`.
    SpendCents,
    /// Allowed `idempotent_write` and `non_idempotent_write` calls, against
    /// `budget.side_effects`.
    SideEffects,
    /// Allowed status checks of remote operations, against `budget.polls`.
    Polls,
    /// The call's `depth`, against `budget.depth`.
    Depth,
    /// The call's run time, against `budget.deadline_ms`.
    DeadlineMs,
}

impl Dimension {
    /// The dimension's name as it appears in JSON and in `limits` snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Attempts => "attempts",
            Dimension::SpendCents => "spend_cents",
            Dimension::SideEffects => "side_effects",
            Dimension::Polls => "polls",
            Dimension::Depth => "depth",
            Dimension::DeadlineMs => "deadline_ms",
        }
    }
}

/// The part of an override a call did not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mismatch {
    /// The approved digest is not the call's `args_digest`.
    Digest,
    /// The approved `scope.tool` is not the call's tool.
    Tool,
    /// The approved `scope.operation` is not the call's operation.
    Operation,
}

/// What is wrong, with the facts that show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AuditKind {
    /// An allow beyond a limit, and no override in the run that could cover it.
    AllowBeyondLimit {
        /// The first dimension exceeded.
        dimension: Dimension,
        /// Its use with this call.
        used: u64,
        /// Its limit, with the overrides used so far.
        limit: u64,
    },
    /// An allow beyond a limit, covered only by an override that had expired.
    OverrideExpired {
        /// The first dimension exceeded.
        dimension: Dimension,
        /// Its use with this call.
        used: u64,
        /// Its limit, with the overrides used so far.
        limit: u64,
        /// The override's seq.
        override_seq: Seq,
        /// When it expired (run time).
        expires_ms: u64,
        /// When the call was allowed (run time).
        at_ms: u64,
    },
    /// An allow beyond a limit, covered only by an override already used up (used
    /// beyond what it approved).
    OverrideReused {
        /// The first dimension exceeded.
        dimension: Dimension,
        /// Its use with this call.
        used: u64,
        /// Its limit, with the overrides used so far.
        limit: u64,
        /// The override's seq.
        override_seq: Seq,
    },
    /// An allow beyond a limit, covered only by an override approving something else.
    OverrideMismatch {
        /// The first dimension exceeded.
        dimension: Dimension,
        /// Its use with this call.
        used: u64,
        /// Its limit, with the overrides used so far.
        limit: u64,
        /// The override's seq.
        override_seq: Seq,
        /// What did not match.
        field: Mismatch,
    },
    /// An override with no approver: nobody is accountable for it, so it grants nothing.
    OverrideWithoutApprover,
    /// A refund of an attempt that was never allowed (e.g. one the gate refused).
    RefundWithoutAttempt {
        /// The attempt named by `of`.
        of: u64,
    },
    /// A second refund of the same attempt.
    RefundedTwice {
        /// The attempt named by `of`.
        of: u64,
    },
    /// An outcome settled more cents than its call reserved.
    SettledAboveReservation {
        /// The attempt.
        attempt: u64,
        /// Cents the allow reserved.
        reserved_cents: u64,
        /// Cents settled for it so far.
        settled_cents: u64,
    },
    /// A non-idempotent write allowed again after an earlier identical write's outcome
    /// was unknown or timed out, with no human override in between.
    NonIdempotentRepeatedAfterUnknown {
        /// The repeated call's attempt.
        attempt: Option<u64>,
        /// The earlier call's attempt.
        earlier_attempt: Option<u64>,
        /// The seq of the earlier call's unknown outcome.
        earlier_seq: Seq,
        /// The earlier outcome's status (`unknown` or `timeout`).
        status: Status,
    },
    /// A record of a run after that run's stop.
    DecisionAfterStop {
        /// The stop record's seq.
        stop_seq: Seq,
        /// The late record's kind.
        record: Kind,
    },
    /// An outcome for an attempt the run never allowed.
    OutcomeWithoutAllow {
        /// The attempt named by the outcome.
        attempt: u64,
    },
    /// A second final outcome for an attempt already settled (a late outcome after a
    /// `timeout` or `unknown` one is legitimate and not this).
    DuplicateOutcome {
        /// The attempt.
        attempt: u64,
    },
    /// An allow naming an attempt number already allowed.
    DuplicateAllow {
        /// The attempt.
        attempt: u64,
    },
    /// A second start of the run.
    SecondStart,
    /// An amount that would overflow: counted as the largest number, never wrapped.
    AmountOverflow {
        /// What overflowed.
        field: &'static str,
    },
}

/// The audit finding for what the policy core's fold found, where the audit reports it
/// from the core (budget arithmetic); the rest the audit checks itself, with overrides.
pub(crate) fn from_core(found: tally_policy::Inconsistency) -> Option<AuditKind> {
    use tally_policy::Inconsistency as I;
    Some(match found {
        I::RefundWithoutAttempt { of } => AuditKind::RefundWithoutAttempt { of },
        I::RefundedTwice { of } => AuditKind::RefundedTwice { of },
        I::SettledAboveReservation {
            attempt,
            reserved_cents,
            settled_cents,
        } => AuditKind::SettledAboveReservation {
            attempt,
            reserved_cents,
            settled_cents,
        },
        I::OutcomeWithoutAllow { attempt } => AuditKind::OutcomeWithoutAllow { attempt },
        I::DuplicateOutcome { attempt } => AuditKind::DuplicateOutcome { attempt },
        I::DuplicateAllow { attempt } => AuditKind::DuplicateAllow { attempt },
        I::SecondStart => AuditKind::SecondStart,
        I::Overflow { field } => AuditKind::AmountOverflow { field },
        // Polls are counted per remote operation, which only the core tracks.
        I::AllowBeyondLimit {
            dimension: tally_policy::Dimension::Polls,
            used,
            limit,
        } => AuditKind::AllowBeyondLimit {
            dimension: Dimension::Polls,
            used,
            limit,
        },
        _ => return None,
    })
}

impl AuditKind {
    /// The finding's kind as it appears in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            AuditKind::AllowBeyondLimit { .. } => "allow_beyond_limit",
            AuditKind::OverrideExpired { .. } => "override_expired",
            AuditKind::OverrideReused { .. } => "override_reused",
            AuditKind::OverrideMismatch { .. } => "override_mismatch",
            AuditKind::OverrideWithoutApprover => "override_without_approver",
            AuditKind::RefundWithoutAttempt { .. } => "refund_without_attempt",
            AuditKind::RefundedTwice { .. } => "refunded_twice",
            AuditKind::SettledAboveReservation { .. } => "settled_above_reservation",
            AuditKind::NonIdempotentRepeatedAfterUnknown { .. } => {
                "non_idempotent_repeated_after_unknown"
            }
            AuditKind::DecisionAfterStop { .. } => "decision_after_stop",
            AuditKind::OutcomeWithoutAllow { .. } => "outcome_without_allow",
            AuditKind::DuplicateOutcome { .. } => "duplicate_outcome",
            AuditKind::DuplicateAllow { .. } => "duplicate_allow",
            AuditKind::SecondStart => "second_start",
            AuditKind::AmountOverflow { .. } => "amount_overflow",
        }
    }
}

/// One inconsistency, at the record that shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditFinding {
    /// The record's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// What is wrong.
    #[serde(flatten)]
    pub kind: AuditKind,
}

/// The first limit an allow exceeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Excess {
    pub dimension: Dimension,
    pub used: u64,
    pub limit: u64,
}

impl Excess {
    pub fn finding(self, problem: Option<OverrideProblem>) -> AuditKind {
        let Excess {
            dimension,
            used,
            limit,
        } = self;
        match problem {
            None => AuditKind::AllowBeyondLimit {
                dimension,
                used,
                limit,
            },
            Some(OverrideProblem::Mismatch { seq, field }) => AuditKind::OverrideMismatch {
                dimension,
                used,
                limit,
                override_seq: seq,
                field,
            },
            Some(OverrideProblem::Expired {
                seq,
                expires_ms,
                at_ms,
            }) => AuditKind::OverrideExpired {
                dimension,
                used,
                limit,
                override_seq: seq,
                expires_ms,
                at_ms,
            },
            Some(OverrideProblem::Reused { seq }) => AuditKind::OverrideReused {
                dimension,
                used,
                limit,
                override_seq: seq,
            },
        }
    }
}

/// Why no override covered a call, most telling first when ordered descending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum OverrideProblem {
    Mismatch {
        seq: Seq,
        field: Mismatch,
    },
    Expired {
        seq: Seq,
        expires_ms: u64,
        at_ms: u64,
    },
    Reused {
        seq: Seq,
    },
}

/// The call an override is checked against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Approvable<'a> {
    pub tool: Option<&'a str>,
    pub operation: Option<&'a str>,
    pub args_digest: Option<&'a str>,
}

/// A human's approval: `scope.attempts` calls (default one) and `scope.cents` cents
/// (default none) for calls matching its tool, operation and digest, until `expires_ms`.
#[derive(Clone, Debug)]
pub(crate) struct Override {
    pub seq: Seq,
    pub approved: bool,
    pub scope: Scope,
    pub digest: Option<String>,
    pub expires_ms: Option<u64>,
    pub uses_left: u64,
    pub cents_left: u64,
}

impl Override {
    pub fn new(
        seq: Seq,
        approver: Option<&str>,
        scope: Option<&Scope>,
        digest: Option<&str>,
        expires_ms: Option<u64>,
    ) -> Override {
        let scope = scope.cloned().unwrap_or_default();
        Override {
            seq,
            approved: approver.is_some_and(|a| !a.trim().is_empty()),
            uses_left: scope.attempts.unwrap_or(1),
            cents_left: scope.cents.unwrap_or(0),
            scope,
            digest: digest.map(str::to_owned),
            expires_ms,
        }
    }

    /// What about `call` this override did not approve, if anything.
    pub fn mismatch(&self, call: &Approvable<'_>) -> Option<Mismatch> {
        if self.digest.is_some() && self.digest.as_deref() != call.args_digest {
            Some(Mismatch::Digest)
        } else if self.scope.tool.is_some() && self.scope.tool.as_deref() != call.tool {
            Some(Mismatch::Tool)
        } else if self.scope.operation.is_some()
            && self.scope.operation.as_deref() != call.operation
        {
            Some(Mismatch::Operation)
        } else {
            None
        }
    }
}

/// Consume one use (if `need_use`) and `need_cents` cents from the oldest override that
/// covers `call` at run time `at_ms`; otherwise say why none did (`None`: there was no
/// approved override at all).
pub(crate) fn use_override(
    overrides: &mut [Override],
    call: &Approvable<'_>,
    at_ms: u64,
    need_use: bool,
    need_cents: u64,
) -> Result<(), Option<OverrideProblem>> {
    let mut problem: Option<OverrideProblem> = None;
    for o in overrides.iter_mut().filter(|o| o.approved) {
        let this = if let Some(field) = o.mismatch(call) {
            OverrideProblem::Mismatch { seq: o.seq, field }
        } else if let Some(expires_ms) = o.expires_ms.filter(|e| at_ms > *e) {
            OverrideProblem::Expired {
                seq: o.seq,
                expires_ms,
                at_ms,
            }
        } else if (need_use && o.uses_left == 0) || o.cents_left < need_cents {
            OverrideProblem::Reused { seq: o.seq }
        } else {
            o.uses_left -= u64::from(need_use);
            o.cents_left -= need_cents;
            return Ok(());
        };
        problem = problem.max(Some(this));
    }
    Err(problem)
}
