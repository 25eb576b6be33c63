//! Which fields a record gives, and the refusal of any its kind does not carry.

use crate::codes::Kind;
use crate::decision::Decision;
use crate::error::DecisionError;

use super::kinds::{Allow, Call, Deny, Head, Mark, Outcome, Override, Policy, Refund, Start, Stop};

/// Every field present in `d` must be one its kind carries; the first that is not (in
/// the order below, `note` last) is refused.
pub(super) fn only(d: &Decision, kind: Kind) -> Result<(), DecisionError> {
    let carried = carried(kind);
    for (field, is_present) in present(d) {
        if is_present && !carried.iter().any(|list| list.contains(&field)) {
            return Err(DecisionError::NotAllowed { field, kind });
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
    }
}

/// Whether each optional field is given, by its JSON name.
fn present(d: &Decision) -> [(&'static str, bool); 52] {
    [
        ("worker", d.worker.is_some()),
        ("at_ms", d.at_ms.is_some()),
        ("goal", d.goal.is_some()),
        ("budget", d.budget.is_some()),
        ("tool", d.tool.is_some()),
        ("operation", d.operation.is_some()),
        ("args", d.args.is_some()),
        ("args_digest", d.args_digest.is_some()),
        ("args_preview", d.args_preview.is_some()),
        ("effect", d.effect.is_some()),
        ("idempotency_key", d.idempotency_key.is_some()),
        ("target", d.target.is_some()),
        ("channel", d.channel.is_some()),
        ("depth", d.depth.is_some()),
        ("parent", d.parent.is_some()),
        ("reason", d.reason.is_some()),
        ("attempt", d.attempt.is_some()),
        ("reserve_cents", d.reserve_cents.is_some()),
        ("reserve_nanos", d.reserve_nanos.is_some()),
        ("status", d.status.is_some()),
        ("settled_cents", d.settled_cents.is_some()),
        ("settled_nanos", d.settled_nanos.is_some()),
        ("remote_ref", d.remote_ref.is_some()),
        ("observed", d.observed.is_some()),
        ("retry_after_ms", d.retry_after_ms.is_some()),
        ("of", d.of.is_some()),
        ("slots", d.slots.is_some()),
        ("cents", d.cents.is_some()),
        ("nanos", d.nanos.is_some()),
        ("approver", d.approver.is_some()),
        ("scope", d.scope.is_some()),
        ("digest", d.digest.is_some()),
        ("expires_ms", d.expires_ms.is_some()),
        ("limits", d.limits.is_some()),
        ("policy", d.policy.is_some()),
        ("policy_text", d.policy_text.is_some()),
        ("uid", d.uid.is_some()),
        ("credential", d.credential.is_some()),
        ("timeout_ms", d.timeout_ms.is_some()),
        ("grant", d.grant.is_some()),
        ("signature", d.signature.is_some()),
        ("continues", d.continues.is_some()),
        ("state_version", d.state_version.is_some()),
        ("result_digest", d.result_digest.is_some()),
        ("proxied", d.proxied.is_some()),
        ("overrun_nanos", d.overrun_nanos.is_some()),
        ("operator", d.operator.is_some()),
        ("usage_refused", d.usage_refused.is_some()),
        ("usage", d.usage.is_some()),
        ("trace_id", d.trace_id.is_some()),
        ("prev_seq", d.prev_seq.is_some()),
        ("note", d.note.is_some()),
    ]
}
