//! The flat validation [`Decision::validate`] was before the typed record, kept
//! verbatim as an oracle: the typed form must accept exactly the decisions this accepts
//! (`super::tests` holds it to that).

use crate::decision::{
    is_digest_hex, is_trace_id, one_amount, policy_digest, Decision, Kind, Reason, Status,
    MAX_POLICY_BYTES, MAX_PREVIEW_BYTES, MAX_TEXT_BYTES,
};
use crate::error::DecisionError;
use crate::LimitKey;

const CALL: &[Kind] = &[Kind::Allow, Kind::Deny];

/// A call's identity is also a denial's: the `override` that denies it names it.
const CALL_OR_DENIAL: &[Kind] = &[Kind::Allow, Kind::Deny, Kind::Override];

/// Every kind but `lease`, which carries only `worker`, `at_ms`, `uid`, `lease`, `slice`.
const NOT_LEASE: &[Kind] = &[
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
];

/// Each amount in one unit only, and every cents amount exactly convertible to
/// nanodollars (docs/FORMAT.md, "Money").
fn validate_amounts(d: &Decision) -> Result<(), DecisionError> {
    let budget = d.budget.as_ref();
    let scope = d.scope.as_ref();
    let pairs = [
        (
            "reserve_cents",
            d.reserve_cents,
            "reserve_nanos",
            d.reserve_nanos,
        ),
        (
            "settled_cents",
            d.settled_cents,
            "settled_nanos",
            d.settled_nanos,
        ),
        ("cents", d.cents, "nanos", d.nanos),
        (
            "budget.spend_cents",
            budget.and_then(|b| b.spend_cents),
            "budget.spend_nanos",
            budget.and_then(|b| b.spend_nanos),
        ),
        (
            "scope.cents",
            scope.and_then(|s| s.cents),
            "scope.nanos",
            scope.and_then(|s| s.nanos),
        ),
    ];
    for (cents_field, cents, nanos_field, nanos) in pairs {
        one_amount(cents_field, cents, nanos_field, nanos)?;
    }
    if let Some(l) = d.limits.as_ref().and_then(|l| l.get(&LimitKey::SpendCents)) {
        for (v, field) in [
            (l.used, "limits.spend_cents.used"),
            (l.limit, "limits.spend_cents.limit"),
        ] {
            if crate::money::Nanos::from_cents(v).is_none() {
                return Err(DecisionError::CentsOverflow { field, cents: v });
            }
        }
    }
    Ok(())
}

/// Check the decision against docs/FORMAT.md: required fields per kind, fields only
/// on the kinds they belong to, bounded text, well-formed digests.
pub(super) fn validate(d: &Decision) -> Result<(), DecisionError> {
    let kind = d.kind.ok_or(DecisionError::Missing { field: "kind" })?;
    if kind == Kind::Policy {
        if !d.run.is_empty() {
            return Err(DecisionError::Invalid {
                field: "run",
                why: "a policy record belongs to no run: leave `run` empty",
            });
        }
    } else if kind == Kind::Lease {
        if !d.run.is_empty() {
            return Err(DecisionError::Invalid {
                field: "run",
                why: "a lease record belongs to no run (its slice names its scope): leave `run` empty",
            });
        }
    } else if d.run.is_empty() {
        return Err(DecisionError::Missing { field: "run" });
    }
    let texts: [(&'static str, Option<&str>); 18] = [
        ("run", Some(d.run.as_str())),
        ("worker", d.worker.as_deref()),
        ("goal", d.goal.as_deref()),
        ("tool", d.tool.as_deref()),
        ("operation", d.operation.as_deref()),
        ("idempotency_key", d.idempotency_key.as_deref()),
        ("target", d.target.as_deref()),
        ("parent", d.parent.as_deref()),
        ("remote_ref", d.remote_ref.as_deref()),
        ("observed", d.observed.as_deref()),
        ("approver", d.approver.as_deref()),
        ("note", d.note.as_deref()),
        (
            "scope.tool",
            d.scope.as_ref().and_then(|s| s.tool.as_deref()),
        ),
        (
            "scope.operation",
            d.scope.as_ref().and_then(|s| s.operation.as_deref()),
        ),
        (
            "scope.new_run",
            d.scope.as_ref().and_then(|s| s.new_run.as_deref()),
        ),
        ("digest", d.digest.as_deref()),
        ("credential", d.credential.as_deref()),
        ("continues", d.continues.as_deref()),
    ];
    for (field, value) in texts {
        if let Some(v) = value {
            if v.len() > MAX_TEXT_BYTES {
                return Err(DecisionError::TooLong {
                    field,
                    len: v.len(),
                    max: MAX_TEXT_BYTES,
                });
            }
        }
    }
    if let Some(t) = &d.policy_text {
        if t.len() > MAX_POLICY_BYTES {
            return Err(DecisionError::TooLong {
                field: "policy_text",
                len: t.len(),
                max: MAX_POLICY_BYTES,
            });
        }
    }
    if let Some(p) = &d.args_preview {
        if p.len() > MAX_PREVIEW_BYTES {
            return Err(DecisionError::TooLong {
                field: "args_preview",
                len: p.len(),
                max: MAX_PREVIEW_BYTES,
            });
        }
    }
    validate_amounts(d)?;
    let present: [(&'static str, bool, &[Kind]); 55] = [
        ("worker", d.worker.is_some(), Kind::ALL),
        ("at_ms", d.at_ms.is_some(), Kind::ALL),
        ("goal", d.goal.is_some(), &[Kind::Start]),
        ("budget", d.budget.is_some(), &[Kind::Start]),
        ("tool", d.tool.is_some(), CALL_OR_DENIAL),
        ("operation", d.operation.is_some(), CALL_OR_DENIAL),
        ("args", d.args.is_some(), CALL),
        ("args_digest", d.args_digest.is_some(), CALL_OR_DENIAL),
        ("args_preview", d.args_preview.is_some(), CALL),
        ("effect", d.effect.is_some(), CALL),
        ("idempotency_key", d.idempotency_key.is_some(), CALL),
        ("target", d.target.is_some(), CALL),
        ("channel", d.channel.is_some(), CALL),
        ("depth", d.depth.is_some(), CALL),
        (
            "parent",
            d.parent.is_some(),
            &[Kind::Start, Kind::Allow, Kind::Deny],
        ),
        ("reason", d.reason.is_some(), NOT_LEASE),
        (
            "attempt",
            d.attempt.is_some(),
            &[Kind::Allow, Kind::Deny, Kind::Outcome],
        ),
        ("reserve_cents", d.reserve_cents.is_some(), CALL),
        ("reserve_nanos", d.reserve_nanos.is_some(), CALL),
        ("status", d.status.is_some(), &[Kind::Outcome]),
        ("settled_cents", d.settled_cents.is_some(), &[Kind::Outcome]),
        ("settled_nanos", d.settled_nanos.is_some(), &[Kind::Outcome]),
        (
            "remote_ref",
            d.remote_ref.is_some(),
            &[Kind::Allow, Kind::Deny, Kind::Outcome],
        ),
        ("observed", d.observed.is_some(), &[Kind::Outcome]),
        (
            "retry_after_ms",
            d.retry_after_ms.is_some(),
            &[Kind::Outcome, Kind::Deny],
        ),
        ("of", d.of.is_some(), &[Kind::Refund]),
        ("slots", d.slots.is_some(), &[Kind::Refund]),
        ("cents", d.cents.is_some(), &[Kind::Refund]),
        ("nanos", d.nanos.is_some(), &[Kind::Refund]),
        ("approver", d.approver.is_some(), &[Kind::Override]),
        ("scope", d.scope.is_some(), &[Kind::Override]),
        ("digest", d.digest.is_some(), &[Kind::Override]),
        ("expires_ms", d.expires_ms.is_some(), &[Kind::Override]),
        (
            "limits",
            d.limits.is_some(),
            &[Kind::Allow, Kind::Deny, Kind::Stop],
        ),
        ("policy", d.policy.is_some(), NOT_LEASE),
        ("policy_text", d.policy_text.is_some(), &[Kind::Policy]),
        ("uid", d.uid.is_some(), Kind::ALL),
        (
            "credential",
            d.credential.is_some(),
            &[Kind::Start, Kind::Allow, Kind::Deny],
        ),
        ("timeout_ms", d.timeout_ms.is_some(), &[Kind::Allow]),
        ("grant", d.grant.is_some(), &[Kind::Allow]),
        ("signature", d.signature.is_some(), &[Kind::Override]),
        ("continues", d.continues.is_some(), &[Kind::Start]),
        (
            "state_version",
            d.state_version.is_some(),
            &[
                Kind::Start,
                Kind::Allow,
                Kind::Deny,
                Kind::Outcome,
                Kind::Refund,
                Kind::Override,
                Kind::Stop,
                Kind::Pause,
                Kind::Resume,
            ],
        ),
        ("result_digest", d.result_digest.is_some(), &[Kind::Outcome]),
        (
            "proxied",
            d.proxied.is_some(),
            &[Kind::Allow, Kind::Deny, Kind::Outcome],
        ),
        ("overrun_nanos", d.overrun_nanos.is_some(), &[Kind::Outcome]),
        ("operator", d.operator.is_some(), &[Kind::Outcome]),
        ("usage_refused", d.usage_refused.is_some(), &[Kind::Outcome]),
        ("usage", d.usage.is_some(), &[Kind::Outcome]),
        ("request", d.request.is_some(), &[Kind::Deny]),
        ("answers", d.answers.is_some(), &[Kind::Override]),
        ("trace_id", d.trace_id.is_some(), &[Kind::Allow, Kind::Deny]),
        (
            "lease",
            d.lease.is_some(),
            &[
                Kind::Allow,
                Kind::Deny,
                Kind::Outcome,
                Kind::Refund,
                Kind::Lease,
            ],
        ),
        ("slice", d.slice.is_some(), &[Kind::Lease]),
        (
            "prev_seq",
            d.prev_seq.is_some(),
            &[
                Kind::Start,
                Kind::Allow,
                Kind::Deny,
                Kind::Outcome,
                Kind::Refund,
                Kind::Override,
                Kind::Stop,
                Kind::Pause,
                Kind::Resume,
            ],
        ),
    ];
    for (field, is_present, kinds) in present {
        if is_present && !kinds.contains(&kind) {
            return Err(DecisionError::NotAllowed { field, kind });
        }
    }
    if d.note.is_some() && !matches!(kind, Kind::Override | Kind::Stop) {
        return Err(DecisionError::NotAllowed {
            field: "note",
            kind,
        });
    }
    match kind {
        Kind::Deny | Kind::Stop if d.reason.is_none() => {
            return Err(DecisionError::Missing { field: "reason" })
        }
        Kind::Outcome if d.status.is_none() => {
            return Err(DecisionError::Missing { field: "status" })
        }
        Kind::Refund if d.of.is_none() => return Err(DecisionError::Missing { field: "of" }),
        Kind::Policy if d.policy_text.is_none() => {
            return Err(DecisionError::Missing {
                field: "policy_text",
            })
        }
        Kind::Policy if d.policy.is_none() => {
            return Err(DecisionError::Missing { field: "policy" })
        }
        Kind::Lease if d.lease.is_none() => return Err(DecisionError::Missing { field: "lease" }),
        Kind::Lease if d.slice.is_none() => return Err(DecisionError::Missing { field: "slice" }),
        _ => {}
    }
    if d.reason == Some(Reason::Completed) && kind != Kind::Stop {
        return Err(DecisionError::Invalid {
            field: "reason",
            why: "`completed` is for stop records only",
        });
    }
    for (field, digest) in [
        ("args_digest", d.args_digest.as_deref()),
        ("digest", d.digest.as_deref()),
        ("policy", d.policy.as_deref()),
        ("grant", d.grant.as_deref()),
        ("result_digest", d.result_digest.as_deref()),
    ] {
        if let Some(d) = digest {
            if !is_digest_hex(d) {
                return Err(DecisionError::Invalid {
                    field,
                    why: "must be 64 lowercase hex characters (a BLAKE3 digest)",
                });
            }
        }
    }
    if d.proxied == Some(false) {
        return Err(DecisionError::Invalid {
            field: "proxied",
            why: "only `true` is written; leave it out for a call the proxy did not make",
        });
    }
    if d.operator == Some(false) {
        return Err(DecisionError::Invalid {
            field: "operator",
            why: "only `true` is written; leave it out for an outcome the operator did not record",
        });
    }
    if d.overrun_nanos == Some(0) {
        return Err(DecisionError::Invalid {
            field: "overrun_nanos",
            why: "is written only above 0; leave it out for an outcome within its reservation",
        });
    }
    if d.operator == Some(true) && d.settled().is_none() {
        return Err(DecisionError::Invalid {
                field: "operator",
                why: "the operator's outcome settles its attempt: give `settled_nanos` (0 releases what it held)",
            });
    }
    if d.usage_refused.is_some() && (d.proxied != Some(true) || d.status != Some(Status::Error)) {
        return Err(DecisionError::Invalid {
            field: "usage_refused",
            why:
                "is written by tally's proxy on an `error` outcome only (`proxied`, status `error`)",
        });
    }
    if let Some(u) = &d.usage {
        if d.proxied != Some(true) {
            return Err(DecisionError::Invalid {
                field: "usage",
                why: "is written by tally's proxy on the outcome it observed only (`proxied`)",
            });
        }
        u.validate()?;
    }
    if let Some(slice) = &d.slice {
        slice.validate()?;
    }
    if d.operator == Some(true) && d.proxied.is_some() {
        return Err(DecisionError::Invalid {
            field: "operator",
            why: "an outcome is the proxy's observation or the operator's settlement, not both",
        });
    }
    if let Some(t) = &d.trace_id {
        if !is_trace_id(t) {
            return Err(DecisionError::Invalid {
                field: "trace_id",
                why: "must be 32 lowercase hex characters, not all zero (a W3C trace-id)",
            });
        }
    }
    if let Some(sig) = &d.signature {
        if sig.len() != 128 || !sig.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DecisionError::Invalid {
                field: "signature",
                why: "must be 128 lowercase hex characters (an Ed25519 signature)",
            });
        }
    }
    if let (Some(text), Some(given)) = (&d.policy_text, &d.policy) {
        if &policy_digest(text) != given {
            return Err(DecisionError::Invalid {
                field: "policy",
                why: "does not match the BLAKE3 digest of `policy_text`",
            });
        }
    }
    if let (Some(args), Some(given)) = (&d.args, &d.args_digest) {
        if &args.digest() != given {
            return Err(DecisionError::Invalid {
                field: "args_digest",
                why: "does not match the BLAKE3 digest of canonical `args`",
            });
        }
    }
    if let Some(limits) = &d.limits {
        for name in limits.keys() {
            if !name.is_known() {
                return Err(DecisionError::Invalid {
                    field: "limits",
                    why: LimitKey::UNKNOWN_WHY,
                });
            }
        }
        if limits.contains_key(&LimitKey::SpendCents) && limits.contains_key(&LimitKey::SpendNanos)
        {
            return Err(DecisionError::BothUnits {
                cents: "limits.spend_cents",
                nanos: "limits.spend_nanos",
            });
        }
    }
    Ok(())
}
