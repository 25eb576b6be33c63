//! Decision records: what an agent (or the gate in front of its tool calls) appends.
//!
//! The wire form is one JSON object per decision (docs/FORMAT.md). Unknown fields are an
//! error. Raw call arguments never enter the ledger: [`Decision::seal_args`] replaces
//! `args` by `args_digest`, BLAKE3 over the canonical JSON of the arguments.

mod request;
mod slice;
mod usage;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::args::Args;
use crate::error::DecisionError;
use crate::money::Nanos;
pub use crate::strict::is_blank_line;
use crate::strict::{limits, present};
use crate::LimitKey;

pub use crate::codes::{Action, Channel, Effect, Kind, Reason, Status, UsageRefused};
pub use request::Request;
pub use slice::{LeaseEvent, LeaseScope, Slice, SliceAmounts};
pub use usage::Usage;

/// Longest `args_preview` the ledger stores, in bytes.
pub const MAX_PREVIEW_BYTES: usize = 256;
/// Longest text field (run, tool, operation, goal, note, ...) the ledger stores, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Longest policy text a policy record stores, in bytes.
pub const MAX_POLICY_BYTES: usize = 12 * 1024;
/// Longest canonical plaintext of one decision, in bytes.
pub const MAX_DECISION_BYTES: usize = 16 * 1024;

/// A run's allocation, given at `start`. Every dimension is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// External attempts allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub attempts: Option<u64>,
    /// Run deadline, ms after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub deadline_ms: Option<u64>,
    /// Spend allowed, in cents (records before nanodollars; read exactly as
    /// nanodollars, see [`Budget::spend`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub spend_cents: Option<u64>,
    /// Spend allowed, in nanodollars (10⁻⁹ USD). At most one of `spend_cents` and
    /// `spend_nanos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub spend_nanos: Option<u64>,
    /// Side-effecting calls allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub side_effects: Option<u64>,
    /// Status polls allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub polls: Option<u64>,
    /// Deepest agent chain allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub depth: Option<u64>,
}

/// What an override approved beyond the budget.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// Extra attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub attempts: Option<u64>,
    /// Extra spend, in cents (records before nanodollars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub cents: Option<u64>,
    /// Extra spend, in nanodollars. At most one of `cents` and `nanos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub nanos: Option<u64>,
    /// A tool otherwise blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub tool: Option<String>,
    /// The operation the approval is for, if it is that narrow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub operation: Option<String>,
    /// A continuation grant: the new run, continuing the approved (stopped) run, that
    /// the allocation is for. Absent on an ordinary approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub new_run: Option<String>,
}

/// One dimension's use at decision time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    /// Used so far.
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

/// One decision of the budget gate (docs/FORMAT.md).
///
/// Deserialize it from the agent's JSON, then [`Decision::validate`] and
/// [`Decision::seal_args`] (the ledger's append does both). What the ledger stores is the
/// canonical JSON of the sealed decision: no raw `args`, only `args_digest`.
///
/// The rare parts (`budget`, `scope`, `usage`, `request`, `slice`: a few records of a run
/// have one) are boxed, so a decision is about 1 KiB, not 1.7: the verifier's workers
/// read millions and hand them to the fold on another core. The JSON is the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The agent run this belongs to.
    #[serde(default)]
    pub run: String,
    /// What the record is about.
    #[serde(default, deserialize_with = "present")]
    pub kind: Option<Kind>,
    /// Which worker/process wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub worker: Option<String>,
    /// The writer's monotonic elapsed ms since run start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub at_ms: Option<u64>,
    /// The task (start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub goal: Option<String>,
    /// The allocation (start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub budget: Option<Box<Budget>>,
    /// Tool name (allow, deny).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub tool: Option<String>,
    /// The logical operation, e.g. `export.status:ea91` (allow, deny).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub operation: Option<String>,
    /// Raw call arguments, exactly as given (canonical JSON): input only, never stored
    /// (replaced by `args_digest`).
    #[serde(default, skip_serializing, deserialize_with = "present")]
    pub args: Option<Args>,
    /// BLAKE3 of the canonical JSON of `args`, lowercase hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub args_digest: Option<String>,
    /// A bounded, caller-chosen preview of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub args_preview: Option<String>,
    /// Side-effect class (allow, deny).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub effect: Option<Effect>,
    /// The caller's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub idempotency_key: Option<String>,
    /// Destination class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub target: Option<String>,
    /// How the call travels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub channel: Option<Channel>,
    /// Agent chain depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub depth: Option<u64>,
    /// Parent run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub parent: Option<String>,
    /// Typed reason code (required for deny and stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub reason: Option<Reason>,
    /// The run's external attempt number this record is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub attempt: Option<u64>,
    /// Spend reserved before the call (allow; on a deny, what the call asked to reserve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub reserve_cents: Option<u64>,
    /// Spend reserved before the call, in nanodollars. At most one of `reserve_cents`
    /// and `reserve_nanos`; read both through [`Decision::reserve`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub reserve_nanos: Option<u64>,
    /// Outcome status (required for outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub status: Option<Status>,
    /// Actual spend (outcome), in cents (records before nanodollars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub settled_cents: Option<u64>,
    /// Actual spend (outcome), in nanodollars. At most one of `settled_cents` and
    /// `settled_nanos`; read both through [`Decision::settled`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub settled_nanos: Option<u64>,
    /// Remote operation id (outcome; on allow and deny, the operation a poll reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub remote_ref: Option<String>,
    /// Last observed remote state (outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub observed: Option<String>,
    /// Upstream Retry-After, ms (outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub retry_after_ms: Option<u64>,
    /// The attempt refunded (required for refund).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub of: Option<u64>,
    /// Attempt slots returned (refund).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub slots: Option<u64>,
    /// Reserved cents released (refund; records before nanodollars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub cents: Option<u64>,
    /// Reserved nanodollars released (refund). At most one of `cents` and `nanos`; read
    /// both through [`Decision::refunded`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub nanos: Option<u64>,
    /// Who approved (override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub approver: Option<String>,
    /// What was approved (override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub scope: Option<Box<Scope>>,
    /// Digest of exactly what was approved (override), lowercase hex BLAKE3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub digest: Option<String>,
    /// When the approval expires, in the run's `at_ms` time (override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub expires_ms: Option<u64>,
    /// Free text (override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub note: Option<String>,
    /// Snapshot of `{dimension: {used, limit}}` at decision time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "limits")]
    pub limits: Option<BTreeMap<LimitKey, Limit>>,
    /// Digest (lowercase hex BLAKE3) of the policy text the gate decided under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub policy: Option<String>,
    /// The policy's TOML text (policy records only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub policy_text: Option<String>,
    /// The Unix uid of the process that asked (the gate reads it from the socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub uid: Option<u32>,
    /// The credential the call or run is made under (start, allow, deny).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub credential: Option<String>,
    /// The longest the allowed call may take, ms: never past the run's deadline (allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub timeout_ms: Option<u64>,
    /// The approval (its `digest`) this allow used up (allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub grant: Option<String>,
    /// The approver's Ed25519 signature over the approval digest, lowercase hex
    /// (override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub signature: Option<String>,
    /// The stopped run this one continues (start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub continues: Option<String>,
    /// The version of the gate's state this decision was decided at (every record the
    /// gate writes but policy records): one counter per state, shared by every gate on
    /// it, so the decisions of one run can be put in order across the ledgers of
    /// several hosts (docs/FLEET.md). Written by the gate alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub state_version: Option<u64>,
    /// A digest of the call's result (outcome), lowercase hex, 64 characters: only
    /// whether two results of identical calls are equal matters (the loop rule's
    /// progress). The result itself never enters the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub result_digest: Option<String>,
    /// The call was asked for by tally's proxy (allow, deny, outcome): only `true` is written
    /// (absent is false). The proxy owns an allowed proxied attempt's outcome: it observes
    /// it, and the agent socket refuses to take one from the agent (docs/GATE.md,
    /// "Proxied attempts"). Written by the gate alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub proxied: Option<bool>,
    /// How far the outcome settled above its attempt's reservation, nanodollars
    /// (outcome): the upstream billed more than the gate reserved. Written by the gate
    /// alone, from the policy core's count (`tally_policy::overrun`), and only when it is
    /// above 0; `tally verify` holds it to that count and lists every overrun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub overrun_nanos: Option<u64>,
    /// Why the usage the upstream reported was not believed (outcome): the call is an
    /// `error` settled at its reservation. Written by the gate for tally's proxy alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub usage_refused: Option<UsageRefused>,
    /// The tokens and server tool uses the upstream reported for the call (outcome):
    /// what its settlement priced (or, with `usage_refused: unpriced`, could not).
    /// Written by the gate for tally's proxy alone, on the outcome it observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub usage: Option<Box<Usage>>,
    /// The outcome was recorded by the operator (outcome; only `true` is written):
    /// `tally settle` settling what a call held when nobody observed how it ended (a cut
    /// stream, a daemon killed mid-call), from the upstream's own figure. Only the gate
    /// writes it, for the operator socket's caller (whose uid it records); `tally verify`
    /// takes such an outcome as the operator's, not the run owner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub operator: Option<bool>,
    /// The approval request a `require_approval` deny is (deny, reason
    /// `approval_required`): its id, cause, cost and the run's standing beyond `limits`
    /// (docs/APPROVALS.md). Computed by the policy core with the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub request: Option<Box<Request>>,
    /// The approval request (its id) an override answers (override): the approver's
    /// signature covers it (docs/APPROVALS.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub answers: Option<String>,
    /// The OpenTelemetry trace the decision belongs to (allow, deny): 32 lowercase hex
    /// characters, not all zero (a W3C trace-id). The gate writes the trace id of the
    /// span it made for the check, or of the `traceparent` the agent sent, so an auditor
    /// can join the ledger to the traces (docs/OPERATOR.md). Declared before `prev_seq`,
    /// which the ledger splices in as the last field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub trace_id: Option<String>,
    /// The leased slice a decision was decided on (allow, deny, outcome, refund), or
    /// the slice a `lease` record is about: its id in the fleet's database
    /// (docs/FORMAT.md, "Leases"). Declared before `prev_seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub lease: Option<u64>,
    /// What happened to the slice `lease` names (`lease` records only): the event, its
    /// holder, scope, bounds and times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub slice: Option<Box<Slice>>,
    /// The seq of the previous decision of the same run in this ledger, if there is one
    /// (every kind but `policy`, which belongs to no run). Written by the ledger alone,
    /// when it assigns seqs: it links a run's decisions to each other, so a proof of a
    /// run's history shows that none is missing (docs/FORMAT.md, "Run links").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub prev_seq: Option<u64>,
}

impl Decision {
    /// Parse one decision from JSON text, strictly: unknown fields, wrong types, trailing
    /// data, duplicate keys (in the decision, `budget`, `scope`, `limits`, and at every
    /// depth of `args`), `null` for any field, and whitespace JSON does not allow are
    /// errors. `args` are kept exactly, every digit of every number included.
    pub fn from_json(text: &str) -> Result<Decision, DecisionError> {
        // serde's derive also accepts a struct written as an array (`["r","start"]`):
        // refuse that second encoding wherever a struct stands.
        if text.contains('[') {
            reject_struct_arrays(text)?;
        }
        let mut de = serde_json::Deserializer::from_str(text);
        Decision::deserialize(&mut de)
            .and_then(|d| de.end().map(|()| d))
            .map_err(|e| {
                crate::strict::diagnose(text, &e).unwrap_or_else(|| DecisionError::Json {
                    message: e.to_string(),
                })
            })
    }

    /// A `lease` record: what happened to the slice `id` (docs/FORMAT.md, "Leases"). It
    /// belongs to no run; the writer adds `worker` and `at_ms` where it has them.
    pub fn lease_record(id: u64, slice: Slice) -> Decision {
        Decision {
            kind: Some(Kind::Lease),
            lease: Some(id),
            slice: Some(Box::new(slice)),
            ..Decision::default()
        }
    }

    /// The record's kind. Validated decisions always have one.
    pub fn kind(&self) -> Kind {
        self.kind.unwrap_or(Kind::Start)
    }

    /// The reservation in nanodollars, from `reserve_nanos` or `reserve_cents` (exactly).
    /// For a validated record; a cents amount too large for nanodollars (which
    /// [`Decision::validate`] refuses) reads as [`Nanos::MAX`], never wrapped.
    pub fn reserve(&self) -> Option<Nanos> {
        amount(self.reserve_cents, self.reserve_nanos)
    }

    /// The settled spend in nanodollars, from `settled_nanos` or `settled_cents`; as
    /// [`Decision::reserve`].
    pub fn settled(&self) -> Option<Nanos> {
        amount(self.settled_cents, self.settled_nanos)
    }

    /// The refunded reservation in nanodollars, from `nanos` or `cents`; as
    /// [`Decision::reserve`].
    pub fn refunded(&self) -> Option<Nanos> {
        amount(self.cents, self.nanos)
    }

    /// Replace raw `args` by their digest. Raw arguments never reach the store.
    pub fn seal_args(&mut self) {
        if let Some(args) = self.args.take() {
            self.args_digest = Some(args.digest());
        }
    }

    /// The canonical stored JSON of a validated, sealed decision (fixed field order,
    /// no whitespace). The verifier re-encodes what it decrypts and rejects any record
    /// whose plaintext is not exactly this form.
    pub fn to_canonical_json(&self) -> Vec<u8> {
        debug_assert!(self.args.is_none(), "seal_args before storing");
        // Serializing a struct of strings, integers and enums cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// One amount an input gives in cents (`cents_field`) or in nanodollars
/// (`nanos_field`), in nanodollars: exactly, or a typed error if both are given or the
/// cents do not fit.
pub fn one_amount(
    cents_field: &'static str,
    cents: Option<u64>,
    nanos_field: &'static str,
    nanos: Option<u64>,
) -> Result<Option<Nanos>, DecisionError> {
    match (cents, nanos) {
        (Some(_), Some(_)) => Err(DecisionError::BothUnits {
            cents: cents_field,
            nanos: nanos_field,
        }),
        (Some(c), None) => Nanos::from_cents(c)
            .map(Some)
            .ok_or(DecisionError::CentsOverflow {
                field: cents_field,
                cents: c,
            }),
        (None, n) => Ok(n.map(Nanos)),
    }
}

/// One amount given in cents or in nanodollars: exactly, or [`Nanos::MAX`] for cents that
/// do not fit (refused by validation).
pub(crate) fn amount(cents: Option<u64>, nanos: Option<u64>) -> Option<Nanos> {
    match (nanos, cents) {
        (Some(n), _) => Some(Nanos(n)),
        (None, Some(c)) => Some(Nanos::from_cents(c).unwrap_or(Nanos::MAX)),
        (None, None) => None,
    }
}

/// A `limits` snapshot with its spend in nanodollars: records before nanodollars name
/// the dimension `spend_cents` (used and limit in cents); this gives it as `spend_nanos`,
/// exactly (a cents amount too large, which validation refuses, reads as the most a
/// `u64` holds). Every other dimension is as given.
pub fn limits_in_nanos(limits: &BTreeMap<LimitKey, Limit>) -> BTreeMap<LimitKey, Limit> {
    let mut out = limits.clone();
    if let Some(l) = out.remove(&LimitKey::SpendCents) {
        let n = |c: u64| Nanos::from_cents(c).unwrap_or(Nanos::MAX).0;
        out.insert(
            LimitKey::SpendNanos,
            Limit {
                used: n(l.used),
                limit: n(l.limit),
            },
        );
    }
    out
}

impl Budget {
    /// The spend allowed in nanodollars, from `spend_nanos` or `spend_cents`; as
    /// [`Decision::reserve`].
    pub fn spend(&self) -> Option<Nanos> {
        amount(self.spend_cents, self.spend_nanos)
    }
}

impl Scope {
    /// The extra spend approved in nanodollars, from `nanos` or `cents`; as
    /// [`Decision::reserve`].
    pub fn spend(&self) -> Option<Nanos> {
        amount(self.cents, self.nanos)
    }
}

fn reject_struct_arrays(text: &str) -> Result<(), DecisionError> {
    let array = |at: &str| DecisionError::Json {
        message: format!("{at} must be a JSON object, not an array"),
    };
    // Malformed JSON is left to the typed parse that follows, which reports it precisely.
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Ok(());
    };
    let Value::Object(map) = &value else {
        return Err(array("a decision"));
    };
    for field in ["budget", "scope", "request", "slice"] {
        if matches!(map.get(field), Some(Value::Array(_))) {
            return Err(array(field));
        }
    }
    match map.get("limits") {
        Some(Value::Array(_)) => return Err(array("limits")),
        Some(Value::Object(limits)) if limits.values().any(Value::is_array) => {
            return Err(array("each limit"));
        }
        _ => {}
    }
    Ok(())
}

/// A W3C Trace Context trace-id: 32 lowercase hex characters, not all zero.
pub fn is_trace_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && s.bytes().any(|b| b != b'0')
}

pub(crate) fn is_digest_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The digest that names a policy: BLAKE3 over its exact TOML text, lowercase hex.
pub fn policy_digest(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// BLAKE3 over the canonical JSON of `args` (built in code), lowercase hex: the same
/// digest as [`Args::digest`] of the same value. A `Value` holds numbers as `u64`, `i64`
/// or `f64`, so arguments that arrive as text go through [`Args`] instead, which keeps
/// every digit.
pub fn args_digest(args: &Value) -> String {
    let mut buf = Vec::with_capacity(128);
    canonical_json(args, &mut buf);
    blake3::hash(&buf).to_hex().to_string()
}

/// Canonical JSON of a `Value` (docs/FORMAT.md, "Argument digest"): object keys sorted by
/// their UTF-8 bytes, no insignificant whitespace, strings as serde_json writes them,
/// numbers by their exact decimal value in the one canonical form [`Args`] uses. Does not
/// depend on serde_json's map order.
pub fn canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing a string to a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                canonical_json(&map[k.as_str()], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(v, out);
            }
            out.push(b']');
        }
        // serde_json writes a `Number` as a valid JSON number (finite: a `Value` holds
        // no NaN); its exponent is within an f64's.
        Value::Number(n) => {
            let _ = crate::args::canonical_number(&n.to_string(), out);
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}
