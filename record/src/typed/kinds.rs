//! One struct per kind, holding exactly the fields that kind may carry: a required field
//! is not an `Option`, a field of another kind has no place, and a rule between two
//! fields (one unit per amount, who observed an outcome) is a type. Each lists its
//! fields by their JSON names in `FIELDS` ([`super::fields`] refuses any other).

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use crate::args::Args;
use crate::codes::{Channel, Effect, Reason, Status, UsageRefused};
use crate::decision::{Budget, Limit, Request, Scope, Slice, Usage};
use crate::money::Nanos;
use crate::LimitKey;

/// What every record of a run carries (every kind but `policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head<'a> {
    /// The run, never empty.
    pub run: &'a str,
    /// Which worker/process wrote it.
    pub worker: Option<&'a str>,
    /// The writer's monotonic elapsed ms since run start.
    pub at_ms: Option<u64>,
    /// Digest of the policy text the gate decided under (64 lowercase hex).
    pub policy: Option<&'a str>,
    /// The Unix uid of the process that asked.
    pub uid: Option<u32>,
    /// The version of the gate's state the decision was decided at.
    pub state_version: Option<u64>,
    /// The seq of the run's previous decision in this ledger.
    pub prev_seq: Option<u64>,
}

impl Head<'_> {
    /// The JSON names of the fields every record of a run may carry (with `run`, `kind`
    /// and `reason`, which each kind holds itself).
    pub const FIELDS: &'static [&'static str] = &[
        "worker",
        "at_ms",
        "reason",
        "policy",
        "uid",
        "state_version",
        "prev_seq",
    ];
}

/// An amount given in one unit: cents (records before nanodollars) or nanodollars.
/// Giving both is not representable; in a record from [`crate::Decision::typed`] the
/// cents fit in nanodollars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    /// In cents (`reserve_cents`, `settled_cents`, `cents`).
    Cents(u64),
    /// In nanodollars (`reserve_nanos`, `settled_nanos`, `nanos`).
    Nanos(u64),
}

impl Amount {
    /// The amount in nanodollars, exactly.
    pub fn nanos(self) -> Nanos {
        match self {
            // Validation refuses cents that do not fit; built by hand, they read as the
            // most there is, never wrapped.
            Amount::Cents(c) => Nanos::from_cents(c).unwrap_or(Nanos::MAX),
            Amount::Nanos(n) => Nanos(n),
        }
    }
}

/// `start`: a run begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// The task.
    pub goal: Option<&'a str>,
    /// The allocation, each amount in one unit.
    pub budget: Option<&'a Budget>,
    /// Parent run.
    pub parent: Option<&'a str>,
    /// The credential the run is made under.
    pub credential: Option<&'a str>,
    /// The stopped run this one continues.
    pub continues: Option<&'a str>,
}

impl Start<'_> {
    /// The JSON names of the fields a start carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] =
        &["goal", "budget", "parent", "credential", "continues"];
}

/// The call an `allow` or a `deny` is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    /// Tool name.
    pub tool: Option<&'a str>,
    /// The logical operation.
    pub operation: Option<&'a str>,
    /// Raw call arguments (input only, never stored).
    pub args: Option<&'a Args>,
    /// BLAKE3 of the canonical arguments (64 lowercase hex; equal to `args`' digest when
    /// both are given).
    pub args_digest: Option<&'a str>,
    /// A bounded preview of the arguments.
    pub args_preview: Option<&'a str>,
    /// Side-effect class.
    pub effect: Option<Effect>,
    /// The caller's idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// Destination class.
    pub target: Option<&'a str>,
    /// How the call travels.
    pub channel: Option<Channel>,
    /// Agent chain depth.
    pub depth: Option<u64>,
    /// Parent run.
    pub parent: Option<&'a str>,
    /// The run's external attempt number.
    pub attempt: Option<u64>,
    /// Spend reserved (on a deny, what the call asked to reserve).
    pub reserve: Option<Amount>,
    /// The remote operation a poll reads.
    pub remote_ref: Option<&'a str>,
    /// Snapshot of `{dimension: {used, limit}}`: known dimensions, spend in one unit.
    pub limits: Option<&'a BTreeMap<LimitKey, Limit>>,
    /// The credential the call is made under.
    pub credential: Option<&'a str>,
    /// The call was asked for by tally's proxy (`proxied: true`; absent is false).
    pub proxied: bool,
    /// The OpenTelemetry trace-id of the check.
    pub trace_id: Option<&'a str>,
    /// The leased slice it was decided on.
    pub lease: Option<u64>,
}

impl Call<'_> {
    /// The JSON names of the fields a call carries.
    pub const FIELDS: &'static [&'static str] = &[
        "tool",
        "operation",
        "args",
        "args_digest",
        "args_preview",
        "effect",
        "idempotency_key",
        "target",
        "channel",
        "depth",
        "parent",
        "attempt",
        "reserve_cents",
        "reserve_nanos",
        "remote_ref",
        "limits",
        "credential",
        "proxied",
        "trace_id",
        "lease",
    ];
}

/// `allow`: the gate allowed a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allow<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// The call.
    pub call: Call<'a>,
    /// The longest the allowed call may take, ms.
    pub timeout_ms: Option<u64>,
    /// The approval (its digest, 64 lowercase hex) this allow used up.
    pub grant: Option<&'a str>,
}

impl Allow<'_> {
    /// The JSON names of the fields an allow carries beyond [`Head::FIELDS`] and
    /// [`Call::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &["timeout_ms", "grant"];
}

/// `deny`: the gate refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deny<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// Why (never `completed`).
    pub reason: Reason,
    /// The call.
    pub call: Call<'a>,
    /// When to ask again, ms.
    pub retry_after_ms: Option<u64>,
    /// The approval request it is (reason `approval_required` only).
    pub request: Option<&'a Request>,
}

impl Deny<'_> {
    /// The JSON names of the fields a deny carries beyond [`Head::FIELDS`] and
    /// [`Call::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &["retry_after_ms", "request"];
}

/// Who recorded an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observer<'a> {
    /// The agent (no `proxied`, no `operator`).
    Agent,
    /// tally's proxy observed it (`proxied: true`).
    Proxy {
        /// Why the usage the upstream reported was not believed (only on an `error`).
        usage_refused: Option<UsageRefused>,
        /// The usage the upstream reported.
        usage: Option<&'a Usage>,
    },
    /// The operator settled it (`operator: true`); the outcome then has a settlement.
    Operator,
}

/// `outcome`: what happened to an allowed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// The attempt it is about.
    pub attempt: Option<u64>,
    /// What happened.
    pub status: Status,
    /// Actual spend.
    pub settled: Option<Amount>,
    /// Remote operation id.
    pub remote_ref: Option<&'a str>,
    /// Last observed remote state.
    pub observed: Option<&'a str>,
    /// Upstream Retry-After, ms.
    pub retry_after_ms: Option<u64>,
    /// A digest of the call's result (64 lowercase hex).
    pub result_digest: Option<&'a str>,
    /// How far the settlement went above its reservation, nanodollars (never 0).
    pub overrun_nanos: Option<NonZeroU64>,
    /// Who recorded it.
    pub observer: Observer<'a>,
    /// The leased slice it was decided on.
    pub lease: Option<u64>,
}

impl Outcome<'_> {
    /// The JSON names of the fields an outcome carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &[
        "attempt",
        "status",
        "settled_cents",
        "settled_nanos",
        "remote_ref",
        "observed",
        "retry_after_ms",
        "result_digest",
        "proxied",
        "overrun_nanos",
        "operator",
        "usage_refused",
        "usage",
        "lease",
    ];
}

/// `refund`: attempt slots or a reservation given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refund<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// The attempt refunded.
    pub of: u64,
    /// Attempt slots returned.
    pub slots: Option<u64>,
    /// The reservation released.
    pub refunded: Option<Amount>,
    /// The leased slice it was decided on.
    pub lease: Option<u64>,
}

impl Refund<'_> {
    /// The JSON names of the fields a refund carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &["of", "slots", "cents", "nanos", "lease"];
}

/// `override`: a human approved going beyond the budget, or denied an approval request
/// (reason `denied_by_approver`, naming the denied call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// Who approved.
    pub approver: Option<&'a str>,
    /// What was approved, its extra spend in one unit.
    pub scope: Option<&'a Scope>,
    /// Digest of exactly what was approved (64 lowercase hex).
    pub digest: Option<&'a str>,
    /// When the approval expires.
    pub expires_ms: Option<u64>,
    /// The approver's Ed25519 signature (128 lowercase hex).
    pub signature: Option<&'a str>,
    /// Free text.
    pub note: Option<&'a str>,
    /// The approval request it answers.
    pub answers: Option<&'a str>,
    /// A denial's (reason `denied_by_approver`): the denied call's tool.
    pub tool: Option<&'a str>,
    /// A denial's: the denied call's logical operation.
    pub operation: Option<&'a str>,
    /// A denial's: the digest of the denied call's arguments (64 lowercase hex).
    pub args_digest: Option<&'a str>,
}

impl Override<'_> {
    /// The JSON names of the fields an override carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &[
        "answers",
        "tool",
        "operation",
        "args_digest",
        "approver",
        "scope",
        "digest",
        "expires_ms",
        "signature",
        "note",
    ];
}

/// `stop`: the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// Why (`completed` among them).
    pub reason: Reason,
    /// Snapshot of the run's use at the end.
    pub limits: Option<&'a BTreeMap<LimitKey, Limit>>,
    /// Free text.
    pub note: Option<&'a str>,
}

impl Stop<'_> {
    /// The JSON names of the fields a stop carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &["limits", "note"];
}

/// `policy`: the policy in force from here on. It belongs to no run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy<'a> {
    /// Which worker/process wrote it.
    pub worker: Option<&'a str>,
    /// The writer's elapsed ms.
    pub at_ms: Option<u64>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
    /// The digest of `policy_text`.
    pub policy: &'a str,
    /// The policy's TOML text.
    pub policy_text: &'a str,
    /// The Unix uid of the process that asked.
    pub uid: Option<u32>,
}

impl Policy<'_> {
    /// The JSON names of the fields a policy record carries.
    pub const FIELDS: &'static [&'static str] =
        &["worker", "at_ms", "reason", "policy", "policy_text", "uid"];
}

/// `pause` or `resume`: the operator paused or resumed the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark<'a> {
    /// The run's own fields.
    pub head: Head<'a>,
    /// A reason code (never `completed`).
    pub reason: Option<Reason>,
}

impl Mark<'_> {
    /// The JSON names of the fields a pause or resume carries beyond [`Head::FIELDS`].
    pub const FIELDS: &'static [&'static str] = &[];
}

/// `lease`: an event of a leased budget slice in its holder's ledger. It belongs to no
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease<'a> {
    /// Which worker/process wrote it.
    pub worker: Option<&'a str>,
    /// The writer's elapsed ms.
    pub at_ms: Option<u64>,
    /// The Unix uid of the process that asked.
    pub uid: Option<u32>,
    /// The slice's id in the fleet's database.
    pub id: u64,
    /// What happened to it (valid: [`Slice::validate`]).
    pub slice: &'a Slice,
}

impl Lease<'_> {
    /// The JSON names of the fields a lease record carries.
    pub const FIELDS: &'static [&'static str] = &["worker", "at_ms", "uid", "lease", "slice"];
}
