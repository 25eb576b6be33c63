//! Handoff summaries (docs/REPORTS.md): where a run stands, for the human or the next run.

use crate::event::Seq;
use serde::Serialize;
use tally_ledger::{Action, Effect, Reason, Status, Usage, UsageRefused};

/// A moment on both clocks: the run's own, and the ledger's wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct When {
    /// Run time, ms (the run's `at_ms` clock).
    pub run_ms: u64,
    /// Wall time, ms since the Unix epoch.
    pub wall_ms: u64,
}

/// How a run ended, if it did: its last state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopStatus {
    /// The run wrote a stop record.
    Stopped,
    /// No stop record, and the run's last call was refused: the run is open, and the
    /// refusal (its reason, action and cause) says why it cannot go on as it was.
    Refused,
    /// No stop record, and the run's last call was allowed (or it made none): the run
    /// may still be running.
    Running,
}

/// How the run ended: the stop record's reason, else the refusal of its last call, else
/// still running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StopReason {
    /// Which of the three it is.
    pub status: StopStatus,
    /// The reason code (absent while running).
    pub reason: Option<Reason>,
    /// What the code tells a caller to do.
    pub action: Option<Action>,
    /// For a refusal asking a human (`approval_required`): the limit a grant would lift
    /// (`reservation_insufficient`, `side_effect_limit_exceeded`, ...), as the policy
    /// core decides it again.
    pub cause: Option<Reason>,
    /// The stop record's (or refusal's) seq.
    pub seq: Option<Seq>,
    /// When it was written.
    pub at: Option<When>,
}

/// A call the run completed: its outcome was `ok` (reads too, and a late `ok` after a
/// timeout), with what it settled; a job a poll found done is listed under the call that
/// started it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Completed {
    /// The seq of the `ok` outcome.
    pub seq: Seq,
    /// The attempt that started it.
    pub attempt: Option<u64>,
    /// Its tool.
    pub tool: Option<String>,
    /// Its logical operation.
    pub operation: Option<String>,
    /// The digest of its arguments, as its allow recorded it.
    pub args_digest: Option<String>,
    /// Its side-effect class.
    pub effect: Option<Effect>,
    /// The remote operation id.
    pub remote_ref: Option<String>,
    /// The remote state observed when it completed.
    pub observed: Option<String>,
    /// What it settled, nanodollars (what it cost).
    pub settled_nanos: u64,
    /// When it completed.
    pub at: When,
}

/// A model call tally's proxy made for the run and observed to its end (an outcome of
/// an attempt on channel `model`): which model, what the upstream reported and what it
/// cost. Upstream errors are here too, with their status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelCall {
    /// The seq of its outcome.
    pub seq: Seq,
    /// Its attempt.
    pub attempt: u64,
    /// The upstream (its tool).
    pub upstream: Option<String>,
    /// The model it asked for (its allow's preview: the proxy writes the model there).
    pub model: Option<String>,
    /// How it ended.
    pub status: Status,
    /// The tokens and server tool uses the upstream reported (none when it reported
    /// nothing: an error, a cut answer).
    pub usage: Option<Usage>,
    /// What it settled, nanodollars.
    pub settled_nanos: u64,
    /// How far that was above its reservation (the upstream billed more than the gate
    /// reserved), nanodollars.
    pub overrun_nanos: Option<u64>,
    /// Why the usage the upstream reported was not believed (settled at the
    /// reservation).
    pub usage_refused: Option<UsageRefused>,
    /// When it ended.
    pub at: When,
}

/// A call the gate refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RefusedCall {
    /// The deny's seq.
    pub seq: Seq,
    /// Its tool (a proxied call's upstream).
    pub tool: Option<String>,
    /// Its logical operation.
    pub operation: Option<String>,
    /// Its preview (a proxied call's model).
    pub preview: Option<String>,
    /// The reason code.
    pub reason: Reason,
    /// What the code tells a caller to do.
    pub action: Action,
    /// For `approval_required`: the limit a grant would lift.
    pub cause: Option<Reason>,
    /// When it was refused.
    pub at: When,
}

/// What is known about external work not yet resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingStatus {
    /// Accepted, still running remotely.
    Running,
    /// The response was lost.
    Unknown,
    /// No response in time.
    Timeout,
    /// A write was allowed and no outcome was ever recorded.
    NoOutcome,
}

/// External work started and not resolved by a later outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pending {
    /// The seq of the latest record about it.
    pub seq: Seq,
    /// The attempt that started it.
    pub attempt: Option<u64>,
    /// Its tool.
    pub tool: Option<String>,
    /// Its logical operation.
    pub operation: Option<String>,
    /// Its side-effect class.
    pub effect: Option<Effect>,
    /// The remote operation id.
    pub remote_ref: Option<String>,
    /// What is known.
    pub status: PendingStatus,
    /// The last observed remote state.
    pub observed: Option<String>,
    /// When that was last learned.
    pub since: When,
    /// The upstream's Retry-After for it, as a moment.
    pub not_before: Option<When>,
}

/// The last remote state the run observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// The state.
    pub state: String,
    /// The remote operation it is about.
    pub remote_ref: Option<String>,
    /// The outcome's seq.
    pub seq: Seq,
    /// When it was observed.
    pub at: When,
}

/// Attempts used of the limit in force, as the policy core counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Attempts {
    /// Allowed calls less refunded slots (polls and exempt calls use none).
    pub used: u64,
    /// The limit in force: `budget.attempts`, plus what approvals granted, less what was
    /// carved out for child runs (`null`: no limit).
    pub limit: Option<u64>,
    /// Attempts granted by approvals the run used.
    pub approved_extra: u64,
    /// Slots given back by refunds and `rejected` outcomes.
    pub refunded: u64,
    /// Attempts carved out for child runs.
    pub carved_out: u64,
}

/// Spend reserved and settled, as the policy core counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Spend {
    /// Nanodollars held: reserved by allowed calls not yet settled.
    pub reserved_nanos: u64,
    /// Nanodollars settled by outcomes.
    pub settled_nanos: u64,
    /// The limit in force: the budget's spend, plus what approvals granted, less what
    /// was carved out for child runs (`null`: no limit).
    pub limit_nanos: Option<u64>,
    /// Nanodollars granted by approvals the run used.
    pub approved_extra_nanos: u64,
    /// Nanodollars settled above their calls' reservations (the upstream billed more than was
    /// reserved). After an overrun the gate allows no call until a human grants spend.
    pub overrun_nanos: u64,
    /// Nanodollars carved out for child runs.
    pub carved_out_nanos: u64,
}

/// Polls of one remote operation against the allowance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PollsUsed {
    /// The remote operation.
    pub remote_ref: String,
    /// Polls allowed of it.
    pub used: u64,
    /// The run's allowance per remote operation (`budget.polls`).
    pub allowance: Option<u64>,
}

/// What a resume step asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeAction {
    /// The run never wrote a stop: make sure none of its workers still runs.
    ConfirmStopped,
    /// Check a remote operation before doing anything that depends on it.
    CheckRemote,
    /// A human must decide (approve, or check remote state) first.
    AskHuman,
    /// Retry the refused call, not before `not_before`.
    Retry,
    /// This run's budget is spent: continue in a new run with a new budget.
    NewRun,
    /// The run completed; nothing to resume.
    Nothing,
}

/// One thing that is safe to do next, and not before when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResumeStep {
    /// What kind of step.
    pub action: ResumeAction,
    /// The step in words.
    pub what: String,
    /// The tool concerned.
    pub tool: Option<String>,
    /// The operation concerned.
    pub operation: Option<String>,
    /// The remote operation concerned.
    pub remote_ref: Option<String>,
    /// The reason code that calls for it.
    pub reason: Option<Reason>,
    /// Not before this moment (an upstream Retry-After or a refusal's back-off).
    pub not_before: Option<When>,
    /// The record that calls for it.
    pub seq: Option<Seq>,
}

/// Why an action must not be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnsafeKind {
    /// A non-idempotent write whose outcome is unknown: repeating may do it twice.
    OutcomeUnknownWrite,
    /// A non-idempotent write that completed: repeating does it twice.
    AlreadyDone,
    /// The remote job a write started is still running: do not start it again.
    RemoteJobRunning,
    /// The call looped: repeating it unchanged will loop again.
    LoopedCall,
}

/// Something the next run must not repeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnsafeAction {
    /// Why.
    pub kind: UnsafeKind,
    /// The warning in words.
    pub what: String,
    /// The tool.
    pub tool: Option<String>,
    /// The operation.
    pub operation: Option<String>,
    /// The attempt concerned.
    pub attempt: Option<u64>,
    /// The remote operation concerned.
    pub remote_ref: Option<String>,
    /// The record that shows it.
    pub seq: Seq,
}

/// Whether a signed checkpoint covers the run's last record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Coverage {
    /// Not yet determined (the verifier did not say).
    Unknown,
    /// A checkpoint over the first `size` entries covers every record of the run.
    Covered {
        /// Entries the checkpoint seals.
        size: u64,
        /// The chain head it signs, hex.
        head: String,
        /// The key epoch that signed it.
        epoch: u32,
    },
    /// The run's last record is in the unsealed tail: not yet covered by a checkpoint.
    NotYetSealed {
        /// Entries the latest checkpoint seals.
        sealed_size: u64,
    },
    /// A merged audit: in each ledger that has records of the run, whether a checkpoint
    /// covers them.
    Ledgers {
        /// One per ledger with records of the run, in the order the ledgers were given.
        ledgers: Vec<LedgerCoverage>,
    },
}

/// Whether one ledger's checkpoint covers a run's records in that ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerCoverage {
    /// The ledger, from 1 in the order given.
    pub ledger: u16,
    /// The run's last seq in it.
    pub last_seq: u64,
    /// Whether the ledger's latest checkpoint covers it.
    pub covered: bool,
    /// Entries that checkpoint seals.
    pub size: u64,
    /// The chain head it signs, hex (none if the ledger has no valid checkpoint).
    pub head: Option<String>,
    /// The key epoch that signed it.
    pub epoch: Option<u32>,
}

/// Where a run stands: what a careful operator would write for the next person, and
/// what the next run loads to continue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Handoff {
    /// The run.
    pub run: String,
    /// Whether the ledger holds the run's start record.
    pub started: bool,
    /// Its goal, from its start record (`null` without a start record, or a start
    /// record that gives none).
    pub goal: Option<String>,
    /// Its parent run.
    pub parent: Option<String>,
    /// Workers that wrote for it (at most 16 named).
    pub workers: Vec<String>,
    /// Its first record.
    pub first_seq: Seq,
    /// Its last record.
    pub last_seq: Seq,
    /// Its last seq in each ledger that has it (a merged audit's coverage).
    #[serde(skip)]
    pub last_in: Vec<(u16, u64)>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Attempts used of the limit.
    pub attempts: Attempts,
    /// Spend reserved and settled.
    pub spend: Spend,
    /// Polls used of each remote operation the run polled.
    pub polls: Vec<PollsUsed>,
    /// Completed calls (the latest 50).
    pub completed: Vec<Completed>,
    /// All completed calls, listed or not.
    pub completed_total: u64,
    /// Model calls the proxy observed to their end (the latest 50).
    pub model_calls: Vec<ModelCall>,
    /// All such model calls, listed or not.
    pub model_calls_total: u64,
    /// Calls the gate refused (the latest 50).
    pub refused: Vec<RefusedCall>,
    /// All refused calls, listed or not.
    pub refused_total: u64,
    /// External work not resolved.
    pub pending: Vec<Pending>,
    /// The last remote state observed.
    pub last_observed: Option<Observed>,
    /// What is safe to do next.
    pub safe_resume: Vec<ResumeStep>,
    /// What must not be repeated.
    pub unsafe_actions: Vec<UnsafeAction>,
    /// Loops found in the run.
    pub loops: u64,
    /// Audit findings about the run.
    pub findings: u64,
    /// The checkpoint that covers the run.
    pub checkpoint: Coverage,
    /// The refill chain the run ends, where continuing it needs an approver (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<RefillChain>,
}

/// Runs each continuing the one before after a `stop`-action refusal, with no approval
/// between them, ending at the handoff's run: continuing it is a human's decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RefillChain {
    /// The runs, oldest first (at most 65).
    pub runs: Vec<String>,
    /// Attempts they used, in all.
    pub attempts_used: u64,
    /// Nanodollars they spent (settled and held), in all.
    pub spent_nanos: u64,
    /// The refusal every one of them stopped on, where it is one.
    pub failure: Option<Reason>,
    /// The tool of the run's last refused call.
    pub tool: Option<String>,
    /// Unapproved continuations a new run would make, itself included.
    pub continuations: u64,
    /// The policy's `approvals.max_unapproved_continuations`.
    pub allowance: u64,
}
