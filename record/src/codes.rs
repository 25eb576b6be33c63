//! The closed vocabularies of a record: its kind, the reason codes and the action each
//! carries, effect classes, outcome statuses and channels.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a decision record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A run begins: its goal and budget.
    Start,
    /// The gate allowed a call.
    Allow,
    /// The gate refused a call.
    Deny,
    /// What happened to an allowed call.
    Outcome,
    /// Attempt slots or reserved cents given back.
    Refund,
    /// A human approved going beyond the budget.
    Override,
    /// The run ended.
    Stop,
    /// The policy in force from here on (its TOML text and digest); not about a run.
    Policy,
    /// The operator paused the run: its calls are refused (`run_paused`) until a
    /// `resume`. Written by the gate.
    Pause,
    /// The operator resumed a paused run. Written by the gate.
    Resume,
    /// An event of a leased budget slice (grant, renewal, return, reclaim) in its
    /// holder's ledger; not about a run. Written by the gate.
    Lease,
}

impl Kind {
    /// Every kind, in the documented order.
    pub const ALL: &'static [Kind] = &[
        Kind::Start,
        Kind::Allow,
        Kind::Deny,
        Kind::Outcome,
        Kind::Refund,
        Kind::Override,
        Kind::Stop,
        Kind::Policy,
        Kind::Pause,
        Kind::Resume,
        Kind::Lease,
    ];

    /// The kind's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Start => "start",
            Kind::Allow => "allow",
            Kind::Deny => "deny",
            Kind::Outcome => "outcome",
            Kind::Refund => "refund",
            Kind::Override => "override",
            Kind::Stop => "stop",
            Kind::Policy => "policy",
            Kind::Pause => "pause",
            Kind::Resume => "resume",
            Kind::Lease => "lease",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a caller must do when it meets a reason code: each code has exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// This run must not make the call again: retrying cannot succeed within its budget
    /// (or the run is over).
    Stop,
    /// Back off for `retry_after_ms` (where given), then ask again.
    Retry,
    /// A human may grant more: only an approval (or a human check of remote state)
    /// can unblock it.
    Ask,
}

impl Action {
    /// The action's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Stop => "stop",
            Action::Retry => "retry",
            Action::Ask => "ask",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal => $action:ident, )*) => {
        /// A typed reason code (docs/GATE.md, reason codes).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            /// Every reason code, in the documented order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The code as it appears in JSON.
            pub fn as_str(self) -> &'static str {
                match self { $( Reason::$variant => $name, )* }
            }

            /// What the caller must do: stop, retry after backing off, or ask a human.
            pub fn action(self) -> Action {
                match self { $( Reason::$variant => Action::$action, )* }
            }
        }
    };
}

reasons! {
    /// The run used all its attempts.
    AttemptsExhausted = "attempts_exhausted" => Stop,
    /// The run's (or the credential's) spend limit is reached, or spend overran its
    /// reservation: no further spend until a human grants more.
    BudgetExceeded = "budget_exceeded" => Ask,
    /// The call needs more cents than remain to reserve; an override can grant them.
    ReservationInsufficient = "reservation_insufficient" => Ask,
    /// The run's deadline has passed.
    RunDeadlineExhausted = "run_deadline_exhausted" => Stop,
    /// The gate's own rate limit: retry later.
    RateLimitExceeded = "rate_limit_exceeded" => Retry,
    /// The upstream asked us to back off (429/503 with Retry-After).
    UpstreamBackoff = "upstream_backoff" => Retry,
    /// The same call was repeated: a loop.
    LoopRepeatedCall = "loop_repeated_call" => Stop,
    /// The run polled a remote operation more often than allowed.
    PollAllowanceExhausted = "poll_allowance_exhausted" => Stop,
    /// Agent-calls-agent chain went too deep.
    ChainDepthExceeded = "chain_depth_exceeded" => Stop,
    /// Too many side-effecting calls; a human may allow more.
    SideEffectLimitExceeded = "side_effect_limit_exceeded" => Ask,
    /// The tool's circuit breaker is open: retry after it half-opens.
    CircuitOpen = "circuit_open" => Retry,
    /// Policy blocks this tool; an override can grant it.
    ToolBlocked = "tool_blocked" => Ask,
    /// The call is outside the run's scope.
    ScopeViolation = "scope_violation" => Stop,
    /// The call needs a human's approval first.
    ApprovalRequired = "approval_required" => Ask,
    /// The approval that would allow this call has expired.
    ApprovalExpired = "approval_expired" => Ask,
    /// The call differs from what was approved.
    ApprovalMismatch = "approval_mismatch" => Ask,
    /// A non-idempotent write's outcome is unknown: a human must check before any retry.
    OutcomeUnknownNonIdempotent = "outcome_unknown_non_idempotent" => Ask,
    /// An operator killed the run.
    KilledByOperator = "killed_by_operator" => Stop,
    /// An operator paused the run: ask again after it is resumed.
    RunPaused = "run_paused" => Retry,
    /// One logical operation was retried past its effect class's retries (`read` 3,
    /// `idempotent_write` 2, `non_idempotent_write` 1, between two `ok` outcomes): this
    /// run must not retry it again. The run's own attempt budget may have room left.
    RetriesExhausted = "retries_exhausted" => Stop,
    /// The uid that owns the run (for a run token, the uid that started its run) used
    /// its principal budget for the period: runs started, attempts or spend across all
    /// its runs (`[principals]` in the policy). Starting another run does not help; a
    /// human may raise the policy's allowance, or the period ends.
    PrincipalBudgetExceeded = "principal_budget_exceeded" => Ask,
    /// The gate cannot decide durably (its ledger or its state store is down): the
    /// call does not proceed (fail closed); ask again later.
    GateUnavailable = "gate_unavailable" => Retry,
    /// tally's proxy refused the request as it was sent, before any budget rule: a body
    /// it cannot read exactly (not strict JSON, a duplicate key, a field of the wrong
    /// type), input it cannot price (an image, audio or file part), or a body over the
    /// upstream's `max_request_bytes`. Nothing was forwarded; the same request is
    /// refused again.
    RequestRefused = "request_refused" => Stop,
    /// A run continuing a run that a `stop`-action refusal stopped, beyond the policy's
    /// `approvals.max_unapproved_continuations`: a budget is never refilled by
    /// restarting. The cause of an `approval_required` start: a human decides.
    RefillWithoutApproval = "refill_without_approval" => Ask,
    /// The run completed its task (stop only).
    Completed = "completed" => Stop,
    /// A human denied the approval request this exact call made (`tally deny`): the
    /// same tool, operation and arguments are refused, with the approver's note. Last,
    /// so the codes before it keep their places in stored state.
    DeniedByApprover = "denied_by_approver" => Stop,
}

impl Reason {
    /// What the code means, in a sentence a person (or a model) acts on.
    pub fn meaning(self) -> &'static str {
        match self {
            Reason::AttemptsExhausted => "the run used every attempt its budget allows",
            Reason::BudgetExceeded => {
                "the run's spend is used up (or the upstream billed more than was reserved)"
            }
            Reason::ReservationInsufficient => {
                "the cents this call reserves do not fit in what is left of the spend budget"
            }
            Reason::RunDeadlineExhausted => "the run is past its deadline",
            Reason::RateLimitExceeded => "too many calls too fast, or too many in flight",
            Reason::UpstreamBackoff => {
                "this poll comes before the upstream's Retry-After (or the poll interval)"
            }
            Reason::LoopRepeatedCall => {
                "the same call again with nothing changed in between: a loop"
            }
            Reason::PollAllowanceExhausted => {
                "this remote operation was polled as often as allowed, or its state stopped changing"
            }
            Reason::ChainDepthExceeded => "the agent chain is deeper than the budget allows",
            Reason::SideEffectLimitExceeded => "the run made every write its budget allows",
            Reason::CircuitOpen => "the tool keeps failing; its breaker is open for every run",
            Reason::ToolBlocked => "the policy blocks this tool",
            Reason::ScopeViolation => "this tool or target is outside the run's scope",
            Reason::ApprovalRequired => "going on needs a human's approval",
            Reason::ApprovalExpired => "the approval that would allow this call has expired",
            Reason::ApprovalMismatch => "the run's approvals are for other calls",
            Reason::OutcomeUnknownNonIdempotent => {
                "an earlier identical write may have taken effect (its outcome is unknown)"
            }
            Reason::KilledByOperator => "an operator killed the run",
            Reason::RunPaused => "an operator paused the run",
            Reason::RetriesExhausted => {
                "this operation was retried as often as its kind allows since it last succeeded (the run may have attempts left for other work)"
            }
            Reason::PrincipalBudgetExceeded => {
                "this uid used its runs, attempts or spend for the period across all its runs"
            }
            Reason::GateUnavailable => "the gate cannot record decisions right now",
            Reason::RequestRefused => {
                "the proxy cannot read or price this request as sent (its body, its size or a part that is not text); nothing was forwarded"
            }
            Reason::RefillWithoutApproval => {
                "this run continues a chain of runs stopped by the same kind of refusal beyond what the policy allows without a human: a new run is not a new budget"
            }
            Reason::Completed => "the run completed its task",
            Reason::DeniedByApprover => {
                "a human denied this exact call (same tool, operation and arguments); do not make it again"
            }
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The side-effect class of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// No side effect.
    Read,
    /// Repeating it is harmless.
    IdempotentWrite,
    /// Repeating it does the thing twice.
    NonIdempotentWrite,
}

/// What happened to an allowed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Succeeded.
    Ok,
    /// Failed with an error response (the tool may have done work).
    Error,
    /// The tool refused before doing anything: the attempt is refunded by itself.
    Rejected,
    /// No response in time.
    Timeout,
    /// Accepted; the remote work is still running.
    Running,
    /// Unknown: the response was lost.
    Unknown,
}

impl Status {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Rejected => "rejected",
            Status::Timeout => "timeout",
            Status::Running => "running",
            Status::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the proxy did not believe the usage an upstream reported (an outcome's
/// `usage_refused`): the call is then an `error` settled at its reservation, never at a
/// number it cannot price or that cannot be true, and `tally verify` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageRefused {
    /// Not a usage that can be true: a count negative, not a whole number, or beyond
    /// what the model can take in and put out (its context plus its output limit).
    Implausible,
    /// A class of usage the policy has no price for (cache writes without
    /// `cache_write_per_mtok`, a server tool without its per-use price).
    Unpriced,
}

impl UsageRefused {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageRefused::Implausible => "implausible",
            UsageRefused::Unpriced => "unpriced",
        }
    }
}

/// How the call reaches its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// An HTTP request.
    Http,
    /// A command over SSH.
    Ssh,
    /// A local tool.
    Tool,
    /// A model call.
    Model,
}
