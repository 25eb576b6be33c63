//! What `judge` finds: an [`Inconsistency`] (a record its run's own history does not
//! allow), the budget [`Dimension`] it names, and why a start is refused
//! ([`StartRefusal`]). Below `start` and `judge`, which both report them.

use serde::{Deserialize, Serialize};
use tally_record::decision::LeaseScope;
use tally_record::{Kind, Reason};

pub use tally_record::Dimension;

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
    /// human grant of spend since: no call is free then, as its outcome could settle any
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
    /// `rejected`), or a second settlement (`settled_nanos` or `settled_cents`) of one attempt.
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
    /// An allow reserving less than the policy's price for its tool
    /// (`[tool_prices]`): the gate reserves at least the price, whatever the agent
    /// declares.
    ReserveBelowPrice {
        /// What the allow reserved, nanodollars.
        reserved: u64,
        /// The tool's price, nanodollars.
        price: u64,
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
    /// An outcome for an attempt the proxy made (its allow says `proxied`) that the
    /// proxy did not report: the proxy observes those outcomes, the agent cannot report
    /// them.
    OutcomeOwnedByProxy {
        /// The attempt.
        attempt: u64,
    },
    /// An outcome whose `overrun_nanos` is not the overrun its settlement makes against
    /// the attempt's reservation (`tally_policy::overrun`).
    OverrunMisrecorded {
        /// What the outcome records.
        recorded: u64,
        /// What the core counts (`None`: no overrun).
        counted: Option<u64>,
    },
    /// A number that would overflow u64.
    Overflow {
        /// What overflowed.
        field: &'static str,
    },
    /// A start continuing a run stopped by a `stop`-action refusal, beyond the policy's
    /// `approvals.max_unapproved_continuations`: a budget refilled by restarting
    /// ([`crate::refill`]).
    RefillWithoutApproval {
        /// The stopped run it continues.
        predecessor: String,
        /// Unapproved continuations along the chain, this one included.
        continuations: u64,
        /// The policy's allowance.
        allowance: u64,
    },
    /// The decisions a host made on a leased slice used more of a dimension than the
    /// slice bounds ([`crate::leased`]).
    LeaseOverspent {
        /// The slice's id.
        lease: u64,
        /// The dimension (`attempts`, `nanos`, `side_effects`, `polls`).
        dimension: String,
        /// Used, with this decision.
        used: u64,
        /// The slice's bound.
        bound: u64,
    },
    /// The slices of one scope open at one moment (from every ledger given) bound more
    /// than the scope's cap: the fleet leased out more than the budget.
    SlicesOverCap {
        /// The scope's kind (`run`, `principal`, `credential`, `bucket`).
        scope_kind: LeaseScope,
        /// Which one.
        scope_key: String,
        /// The dimension.
        dimension: String,
        /// The sum of the open slices' bounds, with this grant or renewal.
        leased: u64,
        /// The scope's cap.
        cap: u64,
        /// The slice whose grant or renewal passed the cap.
        lease: u64,
    },
    /// A decision names a slice it may not be decided on.
    DecisionOutsideLease {
        /// The slice it names.
        lease: u64,
        /// Why it may not.
        why: OutsideLease,
    },
    /// A lease record that does not follow from the slice's history: a renewal, return
    /// or reclaim of a slice never granted, a second grant of one id, an event after the
    /// slice closed, or one whose holder, scope or bounds differ from its grant's.
    LeaseMisrecorded {
        /// The slice's id.
        lease: u64,
        /// What is wrong.
        why: String,
    },
}

/// Why a decision may not be decided on the slice it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutsideLease {
    /// No ledger given records its grant (before the decision, in its ledger).
    Unknown,
    /// Its grant is in another host's ledger: the slice is another holder's.
    OtherHolder,
    /// It was returned or reclaimed before the decision.
    Closed,
    /// The decision's time is past the slice's expiry.
    Expired,
    /// An outcome or refund giving back an attempt's reservation names another slice
    /// than the one its allow took it on (or its allow named none): what is given back
    /// is credited only to the slice that took it.
    NotTheAllows,
    /// The decision's run is outside the slice's scope: another run than a run
    /// slice's, a run another uid owns than a principal slice's, a run under another
    /// credential than a credential slice's.
    OtherScope,
}

impl OutsideLease {
    /// As it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            OutsideLease::Unknown => "unknown",
            OutsideLease::OtherHolder => "other_holder",
            OutsideLease::Closed => "closed",
            OutsideLease::Expired => "expired",
            OutsideLease::NotTheAllows => "not_the_allows",
            OutsideLease::OtherScope => "other_scope",
        }
    }
}

impl Inconsistency {
    /// The finding's kind as it appears in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Inconsistency::AllowBeyondLimit { .. } => "allow_beyond_limit",
            Inconsistency::AllowAfterOverrun => "allow_after_overrun",
            Inconsistency::ReserveBelowPrice { .. } => "reserve_below_price",
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
            Inconsistency::OutcomeOwnedByProxy { .. } => "outcome_owned_by_proxy",
            Inconsistency::OverrunMisrecorded { .. } => "overrun_misrecorded",
            Inconsistency::Overflow { .. } => "overflow",
            Inconsistency::RefillWithoutApproval { .. } => "refill_without_approval",
            Inconsistency::LeaseOverspent { .. } => "lease_overspent",
            Inconsistency::SlicesOverCap { .. } => "slices_over_cap",
            Inconsistency::DecisionOutsideLease { .. } => "decision_outside_lease",
            Inconsistency::LeaseMisrecorded { .. } => "lease_misrecorded",
        }
    }
}

/// Why a run may not start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StartRefusal {
    /// The uid holds `max_open_runs_per_uid` open runs already.
    #[error("the uid already holds {max} open runs (the policy's max_open_runs_per_uid)")]
    TooManyRuns {
        /// The policy's bound.
        max: u64,
    },
    /// The parent has stopped: a child draws from a live parent only.
    #[error("the parent run has stopped")]
    ParentStopped,
    /// The parent is paused: so are its new children.
    #[error("the parent run is paused")]
    ParentPaused,
    /// The parent has not started.
    #[error("the parent run has not started")]
    ParentNotStarted,
    /// The run it continues has not stopped.
    #[error("the run it continues has not stopped: stop it first")]
    ContinuedNotStopped,
    /// The credential's `uids` do not include the starting uid.
    #[error(
        "the credential is not this uid's to start runs under (the policy's credentials.NAME.uids)"
    )]
    CredentialNotAllowed,
    /// The starting uid used its principal budget for the period (runs, attempts or
    /// spend across its runs).
    #[error("the uid used its principal budget for the period (the policy's principals)")]
    PrincipalBudgetExceeded,
    /// The run it continues was stopped by a `stop`-action refusal, and the chain it
    /// ends has made the policy's unapproved continuations already
    /// (`approvals.max_unapproved_continuations`): an approver must grant it.
    #[error("continuing a run stopped by a refusal: {continuations} unapproved continuations in a row, beyond the {allowance} allowed (approvals.max_unapproved_continuations): a human decides whether this goes on (fix the cause, or raise the allowance)")]
    RefillWithoutApproval {
        /// Unapproved continuations along the chain, this one included.
        continuations: u64,
        /// The policy's allowance.
        allowance: u64,
    },
    /// The starting agent is deeper than the granted depth.
    #[error("chain depth {depth} is beyond the {limit} granted")]
    DepthExceeded {
        /// The depth given.
        depth: u64,
        /// The depth granted.
        limit: u64,
    },
}
