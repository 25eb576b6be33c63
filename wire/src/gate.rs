//! The gate's requests and answers: what an agent or the operator sends, and what the gate
//! says back (the daemon's JSON bodies, docs/GATE.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::decision::{Args, Budget, Channel, Limit, Scope};
use tally_record::{
    Action, Closeness, Effect, LimitKey, Reason, Status, Usage, UsageRefused, Verdict,
};

use crate::{ErrorCode, ErrorDetail};

/// `POST /v1/runs`: start a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The run's name (a new task is a new run).
    pub run: String,
    /// The task.
    #[serde(default)]
    pub goal: Option<String>,
    /// What the agent asks for; it gets no more than the policy's ceiling.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// The parent run (its remaining budget bounds this one's).
    #[serde(default)]
    pub parent: Option<String>,
    /// The stopped run this one continues.
    #[serde(default)]
    pub continues: Option<String>,
    /// Agent chain depth.
    #[serde(default)]
    pub depth: Option<u64>,
    /// The worker starting it.
    #[serde(default)]
    pub worker: Option<String>,
    /// The credential it runs under.
    #[serde(default)]
    pub credential: Option<String>,
}

/// `POST /v1/check`: one intended call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The run.
    pub run: String,
    /// The worker asking.
    #[serde(default)]
    pub worker: Option<String>,
    /// The tool.
    pub tool: String,
    /// The logical operation (e.g. `export.status:ea91`).
    #[serde(default)]
    pub operation: Option<String>,
    /// The call's arguments, exactly as sent (a duplicate key is refused): only their
    /// digest is kept.
    #[serde(default)]
    pub args: Option<Args>,
    /// A bounded preview of the arguments to keep.
    #[serde(default)]
    pub args_preview: Option<String>,
    /// `read`, `idempotent_write` or `non_idempotent_write`.
    pub effect: Effect,
    /// The caller's idempotency key.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Destination host.
    #[serde(default)]
    pub target: Option<String>,
    /// `http`, `ssh`, `tool` or `model`.
    #[serde(default)]
    pub channel: Option<Channel>,
    /// Agent chain depth.
    #[serde(default)]
    pub depth: Option<u64>,
    /// Cents to reserve (as `reserve_nanos`; give one of the two).
    #[serde(default)]
    pub reserve_cents: Option<u64>,
    /// Nanodollars (10⁻⁹ USD) to reserve. The gate reserves at least the policy's price
    /// for the tool (`[tool_prices]`), whatever is declared.
    #[serde(default)]
    pub reserve_nanos: Option<u64>,
    /// The remote operation a status read polls.
    #[serde(default)]
    pub remote_ref: Option<String>,
    /// The credential.
    #[serde(default)]
    pub credential: Option<String>,
    /// The call's own time limit, ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The trace the check belongs to (a W3C trace-id), recorded on the decision. Never
    /// read from the body: the daemon takes it from the span it makes for the check (or
    /// the agent's valid `traceparent` header); an invalid one is dropped, never an error.
    #[serde(skip)]
    pub trace_id: Option<String>,
    /// The proxy refused the request as sent (`request_refused`, or `scope_violation`
    /// for a method, path, upstream or model outside the policy): the gate records that
    /// refusal as the decision, and only then is it answered. Honoured for the proxy's
    /// own checks alone; never read from a body.
    #[serde(skip)]
    pub refused: Option<Reason>,
}

/// `POST /v1/outcome`: what an allowed call did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeRequest {
    /// The run.
    pub run: String,
    /// The attempt the gate gave the call.
    pub attempt: u64,
    /// `ok`, `error`, `rejected`, `timeout`, `running` or `unknown`.
    pub status: Status,
    /// Actual spend, cents (as `settled_nanos`; give one of the two).
    #[serde(default)]
    pub settled_cents: Option<u64>,
    /// Actual spend, nanodollars (10⁻⁹ USD).
    #[serde(default)]
    pub settled_nanos: Option<u64>,
    /// Remote operation id.
    #[serde(default)]
    pub remote_ref: Option<String>,
    /// Last observed remote state.
    #[serde(default)]
    pub observed: Option<String>,
    /// Upstream Retry-After, ms.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// A digest of the call's result (64 lowercase hex: BLAKE3, SHA-256, any 32-byte
    /// digest the reporter computes the same way each time): identical calls whose results
    /// differ are progress, not a loop. The result itself is never sent.
    #[serde(default)]
    pub result_digest: Option<String>,
    /// The worker reporting.
    #[serde(default)]
    pub worker: Option<String>,
    /// Tally's proxy only (never on the wire): why it did not believe the usage the
    /// upstream reported; the outcome is an `error` settled at its reservation.
    #[serde(skip)]
    pub usage_refused: Option<UsageRefused>,
    /// Tally's proxy only (never on the wire): the usage the upstream reported, recorded
    /// on the outcome beside what it settled.
    #[serde(skip)]
    pub usage: Option<Usage>,
}

/// `POST /v1/runs/{run}/stop`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Why (default `completed`).
    #[serde(default)]
    pub reason: Option<Reason>,
    /// The worker stopping it.
    #[serde(default)]
    pub worker: Option<String>,
}

/// `POST /v1/runs/{run}/settle` (operator socket only): settle what an attempt holds
/// when nobody observed how it ended (a cut stream, a daemon killed mid-call), from the
/// upstream's own figure (its console, its invoice). Recorded as the attempt's outcome,
/// `unknown` (what happened is still not known; what it cost is), with `operator`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    /// The attempt whose reservation is held.
    pub attempt: u64,
    /// What it cost, nanodollars (0 releases what it held: it cost nothing).
    pub settled_nanos: u64,
}

/// An approval, signed by an approver the policy lists (`tally approve` makes one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// The run.
    pub run: String,
    /// The approver's name in the policy.
    pub approver: String,
    /// What is granted.
    pub scope: Scope,
    /// Run time after which it is void, ms.
    pub expires_ms: u64,
    /// `tally_policy::approval::digest` of the above.
    pub digest: String,
    /// The approver's Ed25519 signature over the digest, hex.
    pub signature: String,
    /// Free text.
    #[serde(default)]
    pub note: Option<String>,
    /// The approval request it answers (`GET /v1/approvals`): its `scope` is then the
    /// request's `cost`, and the digest covers the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// A denial of an approval request, signed by an approver the policy lists (`tally deny`
/// makes one; `POST /v1/approvals/denials`). The gate names the denied call from the
/// request; the digest (`tally_policy::approval::denial_digest`) covers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Denial {
    /// The run.
    pub run: String,
    /// The approval request it answers.
    pub request: String,
    /// The approver's name in the policy.
    pub approver: String,
    /// Why: the agent is told it (1 to 500 bytes).
    pub note: String,
    /// The denial digest of the above and the request's call, hex.
    pub digest: String,
    /// The approver's Ed25519 signature over the digest, hex.
    pub signature: String,
}

/// The gate's answer to a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAnswer {
    /// `allow`, `deny` or `require_approval`.
    pub decision: Verdict,
    /// The reason code (not for an allow).
    pub reason: Option<Reason>,
    /// What the caller must do: `stop`, `retry` or `ask` (not for an allow).
    pub action: Option<Action>,
    /// For `require_approval`: the limit that was reached.
    pub cause: Option<Reason>,
    /// For `denied_by_approver`: the approver who denied this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_by: Option<String>,
    /// For `denied_by_approver`: the approver's note, why (a human's words: escape them
    /// before showing them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Back off this long before asking again.
    pub retry_after_ms: Option<u64>,
    /// For an allow: the call must end within this many ms.
    pub timeout_ms: Option<u64>,
    /// For an allow: the attempt number to report the outcome under.
    pub attempt: Option<u64>,
    /// For an allow: the nanodollars reserved: what was declared, or the policy's price
    /// for the tool (`[tool_prices]`) if that is more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_nanos: Option<u64>,
    /// Every dimension, used and limit (spend as `spend_nanos`).
    pub limits: BTreeMap<LimitKey, Limit>,
    /// The decision's seq in the ledger (`None`: nothing was recorded, the run is over).
    pub seq: Option<u64>,
    /// Its chain hash.
    pub hash: Option<String>,
}

/// `POST /v1/check`'s `503` when the gate cannot record decisions: a deny shaped as a
/// [`CheckAnswer`] (`gate_unavailable`, action `retry`, nothing recorded), so a client
/// reads one shape, with the error reply's detail beside it. Its fields are in the
/// order the daemon has always sent them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckUnavailable {
    /// `retry`.
    pub action: Action,
    /// None: nothing was allowed.
    pub attempt: Option<u64>,
    /// None.
    pub cause: Option<Reason>,
    /// `deny`.
    pub decision: Verdict,
    /// `gate_unavailable`, and what a person should read.
    pub error: ErrorDetail,
    /// None: nothing was recorded.
    pub hash: Option<String>,
    /// Empty: the run's state was not read.
    pub limits: BTreeMap<LimitKey, Limit>,
    /// `gate_unavailable`.
    pub reason: Reason,
    /// Back off this long before asking again.
    pub retry_after_ms: u64,
    /// None: nothing was recorded.
    pub seq: Option<u64>,
    /// None.
    pub timeout_ms: Option<u64>,
}

impl CheckUnavailable {
    /// The answer, with `message` for a person.
    pub fn new(message: impl Into<String>) -> CheckUnavailable {
        CheckUnavailable {
            action: Reason::GateUnavailable.action(),
            attempt: None,
            cause: None,
            decision: Verdict::Deny,
            error: ErrorDetail {
                code: ErrorCode::GateUnavailable,
                message: message.into(),
                field: None,
                line: None,
                column: None,
                cause: None,
            },
            hash: None,
            limits: BTreeMap::new(),
            reason: Reason::GateUnavailable,
            retry_after_ms: 1000,
            seq: None,
            timeout_ms: None,
        }
    }
}

/// The answer to a start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// The run.
    pub run: String,
    /// The budget granted.
    pub budget: Budget,
    /// The policy's digest.
    pub policy: String,
    /// The start record's seq.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
    /// The run token, when `tally serve` runs the proxy: the agent's API key for the
    /// upstreams it forwards to (docs/PROXY.md). It spends this run only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A recorded decision's receipt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logged {
    /// Its seq.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
    /// The run's limits after it.
    pub limits: BTreeMap<LimitKey, Limit>,
    /// An outcome's overrun: how far it settled above its attempt's reservation,
    /// nanodollars (the record's `overrun_nanos`); absent when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrun_nanos: Option<u64>,
}

/// Whether a run is running, paused or stopped ([`Standing::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunState {
    /// Its checks are decided.
    Running,
    /// An operator paused it: its checks are refused until it is resumed.
    Paused,
    /// It stopped ([`Standing::stop_reason`] says why): nothing more is decided for it.
    Stopped,
}

impl RunState {
    /// The state as it is on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Stopped => "stopped",
        }
    }
}

/// Where a run stands (`GET /v1/runs/{run}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// The run.
    pub run: String,
    /// `running`, `paused` or `stopped`.
    pub state: RunState,
    /// Why it stopped.
    pub stop_reason: Option<Reason>,
    /// Its goal.
    pub goal: Option<String>,
    /// The budget granted.
    pub budget: Budget,
    /// Every dimension, used and limit.
    pub limits: BTreeMap<LimitKey, Limit>,
    /// Nanodollars held by calls not yet settled.
    pub held_nanos: u64,
    /// Nanodollars settled.
    pub settled_nanos: u64,
    /// Attempts allowed (numbers issued), including exempt calls and polls.
    pub calls_allowed: u64,
    /// The run's clock now, ms since its start.
    pub at_ms: u64,
    /// Approvals recorded and not yet used.
    pub grants_unused: usize,
    /// The uid that started it.
    pub owner_uid: Option<u32>,
}

/// One run of `GET /v1/runs`: where it stands (as `GET /v1/runs/{run}`), how close it is
/// to a limit, and its last refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedRun {
    /// Where it stands.
    #[serde(flatten)]
    pub standing: Standing,
    /// How close it is to each limit, nearest first.
    pub closeness: Closeness,
    /// The last refusal it was given since the daemon started (none yet: `null`).
    pub last_refusal: Option<LastRefusal>,
}

/// The last refusal a run was given, as the live view keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRefusal {
    /// The reason code (`none` for a refusal that named none).
    pub reason: String,
    /// What the caller was told to do (`stop`, `retry`, `ask`).
    pub action: Option<String>,
    /// The tool refused.
    pub tool: String,
    /// The refusal's seq in the ledger (none: nothing was recorded).
    pub seq: Option<u64>,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
}
