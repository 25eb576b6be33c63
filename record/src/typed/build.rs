//! Each kind's constructor: from a decision that gives only fields its kind carries
//! ([`super::fields`]), the typed record, or the first rule it breaks. Within a kind the
//! rules run in one fixed order: amounts, required fields, `completed`, digests, then
//! the rules between fields.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use crate::codes::{Reason, Status};
use crate::decision::{
    is_digest_hex, is_trace_id, one_amount, policy_digest, Decision, Limit, Request,
};
use crate::error::DecisionError;
use crate::money::Nanos;
use crate::LimitKey;

use super::kinds::{
    Allow, Amount, Call, Deny, Head, Lease, Mark, Observer, Outcome, Override, Policy, Refund,
    Start, Stop,
};

pub(super) fn start(d: &Decision) -> Result<Start<'_>, DecisionError> {
    if let Some(b) = &d.budget {
        amount(
            "budget.spend_cents",
            b.spend_cents,
            "budget.spend_nanos",
            b.spend_nanos,
        )?;
    }
    not_completed(d.reason)?;
    digest("policy", d.policy.as_deref())?;
    Ok(Start {
        head: head(d),
        reason: d.reason,
        goal: d.goal.as_deref(),
        budget: d.budget.as_deref(),
        parent: d.parent.as_deref(),
        credential: d.credential.as_deref(),
        continues: d.continues.as_deref(),
    })
}

pub(super) fn allow(d: &Decision) -> Result<Allow<'_>, DecisionError> {
    let reserve = call_amounts(d)?;
    not_completed(d.reason)?;
    digest("args_digest", d.args_digest.as_deref())?;
    digest("policy", d.policy.as_deref())?;
    digest("grant", d.grant.as_deref())?;
    Ok(Allow {
        head: head(d),
        reason: d.reason,
        call: call(d, reserve)?,
        timeout_ms: d.timeout_ms,
        grant: d.grant.as_deref(),
    })
}

pub(super) fn deny(d: &Decision) -> Result<Deny<'_>, DecisionError> {
    let reserve = call_amounts(d)?;
    let reason = required("reason", d.reason)?;
    not_completed(Some(reason))?;
    digest("args_digest", d.args_digest.as_deref())?;
    digest("policy", d.policy.as_deref())?;
    Ok(Deny {
        head: head(d),
        reason,
        call: call(d, reserve)?,
        retry_after_ms: d.retry_after_ms,
        request: request(d, reason)?,
    })
}

pub(super) fn outcome(d: &Decision) -> Result<Outcome<'_>, DecisionError> {
    let settled = amount(
        "settled_cents",
        d.settled_cents,
        "settled_nanos",
        d.settled_nanos,
    )?;
    let status = required("status", d.status)?;
    not_completed(d.reason)?;
    digest("policy", d.policy.as_deref())?;
    digest("result_digest", d.result_digest.as_deref())?;
    let proxied = only_true(
        "proxied",
        d.proxied,
        "only `true` is written; leave it out for a call the proxy did not make",
    )?;
    let operator = only_true(
        "operator",
        d.operator,
        "only `true` is written; leave it out for an outcome the operator did not record",
    )?;
    let overrun_nanos = match d.overrun_nanos {
        Some(n) => Some(NonZeroU64::new(n).ok_or(DecisionError::Invalid {
            field: "overrun_nanos",
            why: "is written only above 0; leave it out for an outcome within its reservation",
        })?),
        None => None,
    };
    Ok(Outcome {
        head: head(d),
        reason: d.reason,
        attempt: d.attempt,
        status,
        settled,
        remote_ref: d.remote_ref.as_deref(),
        observed: d.observed.as_deref(),
        retry_after_ms: d.retry_after_ms,
        result_digest: d.result_digest.as_deref(),
        overrun_nanos,
        observer: observer(d, status, settled, proxied, operator)?,
        lease: d.lease,
    })
}

/// Who recorded an outcome: the proxy (with the usage it saw), the operator (who
/// settles), or neither; never both.
fn observer(
    d: &Decision,
    status: Status,
    settled: Option<Amount>,
    proxied: bool,
    operator: bool,
) -> Result<Observer<'_>, DecisionError> {
    if operator && settled.is_none() {
        return Err(DecisionError::Invalid {
            field: "operator",
            why: "the operator's outcome settles its attempt: give `settled_nanos` (0 releases what it held)",
        });
    }
    if d.usage_refused.is_some() && (!proxied || status != Status::Error) {
        return Err(DecisionError::Invalid {
            field: "usage_refused",
            why:
                "is written by tally's proxy on an `error` outcome only (`proxied`, status `error`)",
        });
    }
    if let Some(u) = &d.usage {
        if !proxied {
            return Err(DecisionError::Invalid {
                field: "usage",
                why: "is written by tally's proxy on the outcome it observed only (`proxied`)",
            });
        }
        u.validate()?;
    }
    Ok(match (proxied, operator) {
        (true, true) => {
            return Err(DecisionError::Invalid {
                field: "operator",
                why: "an outcome is the proxy's observation or the operator's settlement, not both",
            })
        }
        (true, false) => Observer::Proxy {
            usage_refused: d.usage_refused,
            usage: d.usage.as_deref(),
        },
        (false, true) => Observer::Operator,
        (false, false) => Observer::Agent,
    })
}

pub(super) fn refund(d: &Decision) -> Result<Refund<'_>, DecisionError> {
    let refunded = amount("cents", d.cents, "nanos", d.nanos)?;
    let of = required("of", d.of)?;
    not_completed(d.reason)?;
    digest("policy", d.policy.as_deref())?;
    Ok(Refund {
        head: head(d),
        reason: d.reason,
        of,
        slots: d.slots,
        refunded,
        lease: d.lease,
    })
}

/// An `override` record (an approval, or a denial).
pub(super) fn grant(d: &Decision) -> Result<Override<'_>, DecisionError> {
    if let Some(s) = &d.scope {
        amount("scope.cents", s.cents, "scope.nanos", s.nanos)?;
    }
    not_completed(d.reason)?;
    digest("args_digest", d.args_digest.as_deref())?;
    digest("digest", d.digest.as_deref())?;
    digest("policy", d.policy.as_deref())?;
    if let Some(sig) = &d.signature {
        if sig.len() != 128 || !sig.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DecisionError::Invalid {
                field: "signature",
                why: "must be 128 lowercase hex characters (an Ed25519 signature)",
            });
        }
    }
    Ok(Override {
        head: head(d),
        reason: d.reason,
        approver: d.approver.as_deref(),
        scope: d.scope.as_deref(),
        digest: d.digest.as_deref(),
        expires_ms: d.expires_ms,
        signature: d.signature.as_deref(),
        note: d.note.as_deref(),
        answers: d.answers.as_deref(),
        tool: d.tool.as_deref(),
        operation: d.operation.as_deref(),
        args_digest: d.args_digest.as_deref(),
    })
}

pub(super) fn stop(d: &Decision) -> Result<Stop<'_>, DecisionError> {
    limits_cents(d.limits.as_ref())?;
    let reason = required("reason", d.reason)?;
    digest("policy", d.policy.as_deref())?;
    limits_known(d.limits.as_ref())?;
    Ok(Stop {
        head: head(d),
        reason,
        limits: d.limits.as_ref(),
        note: d.note.as_deref(),
    })
}

pub(super) fn policy(d: &Decision) -> Result<Policy<'_>, DecisionError> {
    let policy_text = required("policy_text", d.policy_text.as_deref())?;
    let policy = required("policy", d.policy.as_deref())?;
    not_completed(d.reason)?;
    digest("policy", Some(policy))?;
    if policy_digest(policy_text) != policy {
        return Err(DecisionError::Invalid {
            field: "policy",
            why: "does not match the BLAKE3 digest of `policy_text`",
        });
    }
    Ok(Policy {
        worker: d.worker.as_deref(),
        at_ms: d.at_ms,
        reason: d.reason,
        policy,
        policy_text,
        uid: d.uid,
    })
}

/// A `pause` or a `resume`.
pub(super) fn mark(d: &Decision) -> Result<Mark<'_>, DecisionError> {
    not_completed(d.reason)?;
    digest("policy", d.policy.as_deref())?;
    Ok(Mark {
        head: head(d),
        reason: d.reason,
    })
}

/// A `lease`: its id and a valid slice.
pub(super) fn lease(d: &Decision) -> Result<Lease<'_>, DecisionError> {
    let id = required("lease", d.lease)?;
    let slice = required("slice", d.slice.as_ref())?;
    slice.validate()?;
    Ok(Lease {
        worker: d.worker.as_deref(),
        at_ms: d.at_ms,
        uid: d.uid,
        id,
        slice,
    })
}

/// The amounts of an allow or deny: the reservation in one unit, and a `limits` spend
/// in cents that fits in nanodollars.
fn call_amounts(d: &Decision) -> Result<Option<Amount>, DecisionError> {
    let reserve = amount(
        "reserve_cents",
        d.reserve_cents,
        "reserve_nanos",
        d.reserve_nanos,
    )?;
    limits_cents(d.limits.as_ref())?;
    Ok(reserve)
}

/// The call of an allow or deny, once its amounts and digests are checked: `proxied`
/// only `true`, a W3C trace-id, `args_digest` the digest of `args`, known limits.
fn call(d: &Decision, reserve: Option<Amount>) -> Result<Call<'_>, DecisionError> {
    let proxied = only_true(
        "proxied",
        d.proxied,
        "only `true` is written; leave it out for a call the proxy did not make",
    )?;
    if d.trace_id.as_deref().is_some_and(|t| !is_trace_id(t)) {
        return Err(DecisionError::Invalid {
            field: "trace_id",
            why: "must be 32 lowercase hex characters, not all zero (a W3C trace-id)",
        });
    }
    if let (Some(args), Some(given)) = (&d.args, &d.args_digest) {
        if &args.digest() != given {
            return Err(DecisionError::Invalid {
                field: "args_digest",
                why: "does not match the BLAKE3 digest of canonical `args`",
            });
        }
    }
    limits_known(d.limits.as_ref())?;
    Ok(Call {
        tool: d.tool.as_deref(),
        operation: d.operation.as_deref(),
        args: d.args.as_ref(),
        args_digest: d.args_digest.as_deref(),
        args_preview: d.args_preview.as_deref(),
        effect: d.effect,
        idempotency_key: d.idempotency_key.as_deref(),
        target: d.target.as_deref(),
        channel: d.channel,
        depth: d.depth,
        parent: d.parent.as_deref(),
        attempt: d.attempt,
        reserve,
        remote_ref: d.remote_ref.as_deref(),
        limits: d.limits.as_ref(),
        credential: d.credential.as_deref(),
        proxied,
        trace_id: d.trace_id.as_deref(),
        lease: d.lease,
    })
}

fn head(d: &Decision) -> Head<'_> {
    Head {
        run: &d.run,
        worker: d.worker.as_deref(),
        at_ms: d.at_ms,
        policy: d.policy.as_deref(),
        uid: d.uid,
        state_version: d.state_version,
        prev_seq: d.prev_seq,
    }
}

fn required<T>(field: &'static str, value: Option<T>) -> Result<T, DecisionError> {
    value.ok_or(DecisionError::Missing { field })
}

/// One amount in one unit, its cents exactly convertible to nanodollars
/// (docs/FORMAT.md, "Money").
fn amount(
    cents_field: &'static str,
    cents: Option<u64>,
    nanos_field: &'static str,
    nanos: Option<u64>,
) -> Result<Option<Amount>, DecisionError> {
    one_amount(cents_field, cents, nanos_field, nanos)?;
    Ok(match (cents, nanos) {
        (Some(c), _) => Some(Amount::Cents(c)),
        (None, n) => n.map(Amount::Nanos),
    })
}

/// `completed` ends a run: a stop's reason only.
fn not_completed(reason: Option<Reason>) -> Result<(), DecisionError> {
    if reason == Some(Reason::Completed) {
        return Err(DecisionError::Invalid {
            field: "reason",
            why: "`completed` is for stop records only",
        });
    }
    Ok(())
}

fn digest(field: &'static str, value: Option<&str>) -> Result<(), DecisionError> {
    if value.is_some_and(|d| !is_digest_hex(d)) {
        return Err(DecisionError::Invalid {
            field,
            why: "must be 64 lowercase hex characters (a BLAKE3 digest)",
        });
    }
    Ok(())
}

/// A deny's approval request: only on `approval_required`, with an id of 16 lowercase
/// hex characters and a cost in one unit.
fn request(d: &Decision, reason: Reason) -> Result<Option<&Request>, DecisionError> {
    let Some(r) = &d.request else {
        return Ok(None);
    };
    if reason != Reason::ApprovalRequired {
        return Err(DecisionError::Invalid {
            field: "request",
            why: "only an `approval_required` deny is an approval request",
        });
    }
    if r.id.len() != 16 || !r.id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(DecisionError::Invalid {
            field: "request.id",
            why: "must be 16 lowercase hex characters",
        });
    }
    amount(
        "request.cost.cents",
        r.cost.cents,
        "request.cost.nanos",
        r.cost.nanos,
    )?;
    Ok(Some(r))
}

/// A flag written only as `true`: absent is false.
fn only_true(
    field: &'static str,
    value: Option<bool>,
    why: &'static str,
) -> Result<bool, DecisionError> {
    match value {
        Some(false) => Err(DecisionError::Invalid { field, why }),
        Some(true) => Ok(true),
        None => Ok(false),
    }
}

/// A `limits` spend in cents (records before nanodollars) fits in nanodollars.
fn limits_cents(limits: Option<&BTreeMap<LimitKey, Limit>>) -> Result<(), DecisionError> {
    if let Some(l) = limits.and_then(|l| l.get(&LimitKey::SpendCents)) {
        for (cents, field) in [
            (l.used, "limits.spend_cents.used"),
            (l.limit, "limits.spend_cents.limit"),
        ] {
            if Nanos::from_cents(cents).is_none() {
                return Err(DecisionError::CentsOverflow { field, cents });
            }
        }
    }
    Ok(())
}

/// A `limits` snapshot names known dimensions, its spend in one unit.
fn limits_known(limits: Option<&BTreeMap<LimitKey, Limit>>) -> Result<(), DecisionError> {
    let Some(limits) = limits else {
        return Ok(());
    };
    if limits.keys().any(|key| !key.is_known()) {
        return Err(DecisionError::Invalid {
            field: "limits",
            why: LimitKey::UNKNOWN_WHY,
        });
    }
    if limits.contains_key(&LimitKey::SpendCents) && limits.contains_key(&LimitKey::SpendNanos) {
        return Err(DecisionError::BothUnits {
            cents: "limits.spend_cents",
            nanos: "limits.spend_nanos",
        });
    }
    Ok(())
}
