//! Which fields a record gives, and the refusal of any its kind does not carry.

use std::sync::OnceLock;

use crate::codes::Kind;
use crate::decision::Decision;
use crate::error::DecisionError;

use super::kinds::{
    Allow, Call, Deny, Head, Lease, Mark, Outcome, Override, Policy, Refund, Start, Stop,
};

/// Every field present in `d` must be one its kind carries; the first that is not (in
/// the order of [`NAMES`], `note` last) is refused.
pub(super) fn only(d: &Decision, kind: Kind) -> Result<(), DecisionError> {
    let carries = &carries()[kind as usize];
    for (i, is_present) in present(d).into_iter().enumerate() {
        if is_present && !carries[i] {
            return Err(DecisionError::NotAllowed {
                field: NAMES[i],
                kind,
            });
        }
    }
    Ok(())
}

/// The field lists of a kind's struct.
pub(super) fn carried(kind: Kind) -> &'static [&'static [&'static str]] {
    match kind {
        Kind::Start => &[Head::FIELDS, Start::FIELDS],
        Kind::Allow => &[Head::FIELDS, Call::FIELDS, Allow::FIELDS],
        Kind::Deny => &[Head::FIELDS, Call::FIELDS, Deny::FIELDS],
        Kind::Outcome => &[Head::FIELDS, Outcome::FIELDS],
        Kind::Refund => &[Head::FIELDS, Refund::FIELDS],
        Kind::Override => &[Head::FIELDS, Override::FIELDS],
        Kind::Stop => &[Head::FIELDS, Stop::FIELDS],
        Kind::Policy => &[Policy::FIELDS],
        Kind::Pause | Kind::Resume => &[Head::FIELDS, Mark::FIELDS],
        Kind::Lease => &[Lease::FIELDS],
    }
}

/// For each kind (in declaration order), whether it carries each of [`NAMES`]: the
/// lists of [`carried`], looked up once rather than by name on every record.
fn carries() -> &'static [[bool; NAMES.len()]; Kind::ALL.len()] {
    static CARRIES: OnceLock<[[bool; NAMES.len()]; Kind::ALL.len()]> = OnceLock::new();
    CARRIES.get_or_init(|| {
        let mut table = [[false; NAMES.len()]; Kind::ALL.len()];
        for &kind in Kind::ALL {
            let lists = carried(kind);
            for (i, name) in NAMES.iter().enumerate() {
                table[kind as usize][i] = lists.iter().any(|list| list.contains(name));
            }
        }
        table
    })
}

/// The optional fields by their JSON names, in the order they are refused in.
const NAMES: [&str; 56] = [
    "worker",
    "at_ms",
    "goal",
    "budget",
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
    "reason",
    "attempt",
    "reserve_cents",
    "reserve_nanos",
    "status",
    "settled_cents",
    "settled_nanos",
    "remote_ref",
    "observed",
    "retry_after_ms",
    "of",
    "slots",
    "cents",
    "nanos",
    "approver",
    "scope",
    "digest",
    "expires_ms",
    "limits",
    "policy",
    "policy_text",
    "uid",
    "credential",
    "timeout_ms",
    "grant",
    "signature",
    "continues",
    "state_version",
    "result_digest",
    "proxied",
    "overrun_nanos",
    "operator",
    "usage_refused",
    "usage",
    "request",
    "answers",
    "trace_id",
    "lease",
    "slice",
    "prev_seq",
    "note",
];

/// Whether each of [`NAMES`] is given.
fn present(d: &Decision) -> [bool; NAMES.len()] {
    [
        d.worker.is_some(),
        d.at_ms.is_some(),
        d.goal.is_some(),
        d.budget.is_some(),
        d.tool.is_some(),
        d.operation.is_some(),
        d.args.is_some(),
        d.args_digest.is_some(),
        d.args_preview.is_some(),
        d.effect.is_some(),
        d.idempotency_key.is_some(),
        d.target.is_some(),
        d.channel.is_some(),
        d.depth.is_some(),
        d.parent.is_some(),
        d.reason.is_some(),
        d.attempt.is_some(),
        d.reserve_cents.is_some(),
        d.reserve_nanos.is_some(),
        d.status.is_some(),
        d.settled_cents.is_some(),
        d.settled_nanos.is_some(),
        d.remote_ref.is_some(),
        d.observed.is_some(),
        d.retry_after_ms.is_some(),
        d.of.is_some(),
        d.slots.is_some(),
        d.cents.is_some(),
        d.nanos.is_some(),
        d.approver.is_some(),
        d.scope.is_some(),
        d.digest.is_some(),
        d.expires_ms.is_some(),
        d.limits.is_some(),
        d.policy.is_some(),
        d.policy_text.is_some(),
        d.uid.is_some(),
        d.credential.is_some(),
        d.timeout_ms.is_some(),
        d.grant.is_some(),
        d.signature.is_some(),
        d.continues.is_some(),
        d.state_version.is_some(),
        d.result_digest.is_some(),
        d.proxied.is_some(),
        d.overrun_nanos.is_some(),
        d.operator.is_some(),
        d.usage_refused.is_some(),
        d.usage.is_some(),
        d.request.is_some(),
        d.answers.is_some(),
        d.trace_id.is_some(),
        d.lease.is_some(),
        d.slice.is_some(),
        d.prev_seq.is_some(),
        d.note.is_some(),
    ]
}
