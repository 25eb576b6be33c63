//! [`Decision::validate`]: a record against docs/FORMAT.md, field by field and kind by
//! kind.

use crate::error::DecisionError;
use crate::Dimension;

use super::{
    is_digest_hex, policy_digest, Decision, Kind, Reason, Status, LIMIT_DIMENSIONS,
    MAX_POLICY_BYTES, MAX_PREVIEW_BYTES, MAX_TEXT_BYTES,
};

const CALL: &[Kind] = &[Kind::Allow, Kind::Deny];

impl Decision {
    /// Each amount in one unit only, and every cents amount exactly convertible to
    /// nanodollars (docs/FORMAT.md, "Money").
    fn validate_amounts(&self) -> Result<(), DecisionError> {
        let budget = self.budget.as_ref();
        let scope = self.scope.as_ref();
        let pairs = [
            (
                "reserve_cents",
                self.reserve_cents,
                "reserve_nanos",
                self.reserve_nanos,
            ),
            (
                "settled_cents",
                self.settled_cents,
                "settled_nanos",
                self.settled_nanos,
            ),
            ("cents", self.cents, "nanos", self.nanos),
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
            super::one_amount(cents_field, cents, nanos_field, nanos)?;
        }
        if let Some(l) = self.limits.as_ref().and_then(|l| l.get("spend_cents")) {
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
    pub fn validate(&self) -> Result<(), DecisionError> {
        let kind = self.kind.ok_or(DecisionError::Missing { field: "kind" })?;
        if kind == Kind::Policy {
            if !self.run.is_empty() {
                return Err(DecisionError::Invalid {
                    field: "run",
                    why: "a policy record belongs to no run: leave `run` empty",
                });
            }
        } else if self.run.is_empty() {
            return Err(DecisionError::Missing { field: "run" });
        }
        let texts: [(&'static str, Option<&str>); 17] = [
            ("run", Some(self.run.as_str())),
            ("worker", self.worker.as_deref()),
            ("goal", self.goal.as_deref()),
            ("tool", self.tool.as_deref()),
            ("operation", self.operation.as_deref()),
            ("idempotency_key", self.idempotency_key.as_deref()),
            ("target", self.target.as_deref()),
            ("parent", self.parent.as_deref()),
            ("remote_ref", self.remote_ref.as_deref()),
            ("observed", self.observed.as_deref()),
            ("approver", self.approver.as_deref()),
            ("note", self.note.as_deref()),
            (
                "scope.tool",
                self.scope.as_ref().and_then(|s| s.tool.as_deref()),
            ),
            (
                "scope.operation",
                self.scope.as_ref().and_then(|s| s.operation.as_deref()),
            ),
            ("digest", self.digest.as_deref()),
            ("credential", self.credential.as_deref()),
            ("continues", self.continues.as_deref()),
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
        if let Some(t) = &self.policy_text {
            if t.len() > MAX_POLICY_BYTES {
                return Err(DecisionError::TooLong {
                    field: "policy_text",
                    len: t.len(),
                    max: MAX_POLICY_BYTES,
                });
            }
        }
        if let Some(p) = &self.args_preview {
            if p.len() > MAX_PREVIEW_BYTES {
                return Err(DecisionError::TooLong {
                    field: "args_preview",
                    len: p.len(),
                    max: MAX_PREVIEW_BYTES,
                });
            }
        }
        self.validate_amounts()?;
        let present: [(&'static str, bool, &[Kind]); 51] = [
            ("worker", self.worker.is_some(), Kind::ALL),
            ("at_ms", self.at_ms.is_some(), Kind::ALL),
            ("goal", self.goal.is_some(), &[Kind::Start]),
            ("budget", self.budget.is_some(), &[Kind::Start]),
            ("tool", self.tool.is_some(), CALL),
            ("operation", self.operation.is_some(), CALL),
            ("args", self.args.is_some(), CALL),
            ("args_digest", self.args_digest.is_some(), CALL),
            ("args_preview", self.args_preview.is_some(), CALL),
            ("effect", self.effect.is_some(), CALL),
            ("idempotency_key", self.idempotency_key.is_some(), CALL),
            ("target", self.target.is_some(), CALL),
            ("channel", self.channel.is_some(), CALL),
            ("depth", self.depth.is_some(), CALL),
            (
                "parent",
                self.parent.is_some(),
                &[Kind::Start, Kind::Allow, Kind::Deny],
            ),
            ("reason", self.reason.is_some(), Kind::ALL),
            (
                "attempt",
                self.attempt.is_some(),
                &[Kind::Allow, Kind::Deny, Kind::Outcome],
            ),
            ("reserve_cents", self.reserve_cents.is_some(), CALL),
            ("reserve_nanos", self.reserve_nanos.is_some(), CALL),
            ("status", self.status.is_some(), &[Kind::Outcome]),
            (
                "settled_cents",
                self.settled_cents.is_some(),
                &[Kind::Outcome],
            ),
            (
                "settled_nanos",
                self.settled_nanos.is_some(),
                &[Kind::Outcome],
            ),
            (
                "remote_ref",
                self.remote_ref.is_some(),
                &[Kind::Allow, Kind::Deny, Kind::Outcome],
            ),
            ("observed", self.observed.is_some(), &[Kind::Outcome]),
            (
                "retry_after_ms",
                self.retry_after_ms.is_some(),
                &[Kind::Outcome, Kind::Deny],
            ),
            ("of", self.of.is_some(), &[Kind::Refund]),
            ("slots", self.slots.is_some(), &[Kind::Refund]),
            ("cents", self.cents.is_some(), &[Kind::Refund]),
            ("nanos", self.nanos.is_some(), &[Kind::Refund]),
            ("approver", self.approver.is_some(), &[Kind::Override]),
            ("scope", self.scope.is_some(), &[Kind::Override]),
            ("digest", self.digest.is_some(), &[Kind::Override]),
            ("expires_ms", self.expires_ms.is_some(), &[Kind::Override]),
            (
                "limits",
                self.limits.is_some(),
                &[Kind::Allow, Kind::Deny, Kind::Stop],
            ),
            ("policy", self.policy.is_some(), Kind::ALL),
            ("policy_text", self.policy_text.is_some(), &[Kind::Policy]),
            ("uid", self.uid.is_some(), Kind::ALL),
            (
                "credential",
                self.credential.is_some(),
                &[Kind::Start, Kind::Allow, Kind::Deny],
            ),
            ("timeout_ms", self.timeout_ms.is_some(), &[Kind::Allow]),
            ("grant", self.grant.is_some(), &[Kind::Allow]),
            ("signature", self.signature.is_some(), &[Kind::Override]),
            ("continues", self.continues.is_some(), &[Kind::Start]),
            (
                "state_version",
                self.state_version.is_some(),
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
            (
                "result_digest",
                self.result_digest.is_some(),
                &[Kind::Outcome],
            ),
            (
                "proxied",
                self.proxied.is_some(),
                &[Kind::Allow, Kind::Deny, Kind::Outcome],
            ),
            (
                "overrun_nanos",
                self.overrun_nanos.is_some(),
                &[Kind::Outcome],
            ),
            ("operator", self.operator.is_some(), &[Kind::Outcome]),
            (
                "usage_refused",
                self.usage_refused.is_some(),
                &[Kind::Outcome],
            ),
            ("usage", self.usage.is_some(), &[Kind::Outcome]),
            (
                "trace_id",
                self.trace_id.is_some(),
                &[Kind::Allow, Kind::Deny],
            ),
            (
                "prev_seq",
                self.prev_seq.is_some(),
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
        if self.note.is_some() && !matches!(kind, Kind::Override | Kind::Stop) {
            return Err(DecisionError::NotAllowed {
                field: "note",
                kind,
            });
        }
        match kind {
            Kind::Deny | Kind::Stop if self.reason.is_none() => {
                return Err(DecisionError::Missing { field: "reason" })
            }
            Kind::Outcome if self.status.is_none() => {
                return Err(DecisionError::Missing { field: "status" })
            }
            Kind::Refund if self.of.is_none() => {
                return Err(DecisionError::Missing { field: "of" })
            }
            Kind::Policy if self.policy_text.is_none() => {
                return Err(DecisionError::Missing {
                    field: "policy_text",
                })
            }
            Kind::Policy if self.policy.is_none() => {
                return Err(DecisionError::Missing { field: "policy" })
            }
            _ => {}
        }
        if self.reason == Some(Reason::Completed) && kind != Kind::Stop {
            return Err(DecisionError::Invalid {
                field: "reason",
                why: "`completed` is for stop records only",
            });
        }
        for (field, digest) in [
            ("args_digest", self.args_digest.as_deref()),
            ("digest", self.digest.as_deref()),
            ("policy", self.policy.as_deref()),
            ("grant", self.grant.as_deref()),
            ("result_digest", self.result_digest.as_deref()),
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
        if self.proxied == Some(false) {
            return Err(DecisionError::Invalid {
                field: "proxied",
                why: "only `true` is written; leave it out for a call the proxy did not make",
            });
        }
        if self.operator == Some(false) {
            return Err(DecisionError::Invalid {
                field: "operator",
                why: "only `true` is written; leave it out for an outcome the operator did not record",
            });
        }
        if self.overrun_nanos == Some(0) {
            return Err(DecisionError::Invalid {
                field: "overrun_nanos",
                why: "is written only above 0; leave it out for an outcome within its reservation",
            });
        }
        if self.operator == Some(true) && self.settled().is_none() {
            return Err(DecisionError::Invalid {
                field: "operator",
                why: "the operator's outcome settles its attempt: give `settled_nanos` (0 releases what it held)",
            });
        }
        if self.usage_refused.is_some()
            && (self.proxied != Some(true) || self.status != Some(Status::Error))
        {
            return Err(DecisionError::Invalid {
                field: "usage_refused",
                why: "is written by tally's proxy on an `error` outcome only (`proxied`, status `error`)",
            });
        }
        if let Some(u) = &self.usage {
            if self.proxied != Some(true) {
                return Err(DecisionError::Invalid {
                    field: "usage",
                    why: "is written by tally's proxy on the outcome it observed only (`proxied`)",
                });
            }
            u.validate()?;
        }
        if self.operator == Some(true) && self.proxied.is_some() {
            return Err(DecisionError::Invalid {
                field: "operator",
                why: "an outcome is the proxy's observation or the operator's settlement, not both",
            });
        }
        if let Some(t) = &self.trace_id {
            if !super::is_trace_id(t) {
                return Err(DecisionError::Invalid {
                    field: "trace_id",
                    why: "must be 32 lowercase hex characters, not all zero (a W3C trace-id)",
                });
            }
        }
        if let Some(sig) = &self.signature {
            if sig.len() != 128 || !sig.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(DecisionError::Invalid {
                    field: "signature",
                    why: "must be 128 lowercase hex characters (an Ed25519 signature)",
                });
            }
        }
        if let (Some(text), Some(given)) = (&self.policy_text, &self.policy) {
            if &policy_digest(text) != given {
                return Err(DecisionError::Invalid {
                    field: "policy",
                    why: "does not match the BLAKE3 digest of `policy_text`",
                });
            }
        }
        if let (Some(args), Some(given)) = (&self.args, &self.args_digest) {
            if &args.digest() != given {
                return Err(DecisionError::Invalid {
                    field: "args_digest",
                    why: "does not match the BLAKE3 digest of canonical `args`",
                });
            }
        }
        if let Some(limits) = &self.limits {
            for name in limits.keys() {
                if !LIMIT_DIMENSIONS.contains(&name.as_str()) {
                    return Err(DecisionError::Invalid {
                        field: "limits",
                        why: "unknown dimension (known: attempts, deadline_ms, spend_cents, spend_nanos, side_effects, polls, depth, rate, principal_runs, principal_attempts, principal_spend_nanos)",
                    });
                }
            }
            if limits.contains_key("spend_cents")
                && limits.contains_key(Dimension::SpendNanos.as_str())
            {
                return Err(DecisionError::BothUnits {
                    cents: "limits.spend_cents",
                    nanos: "limits.spend_nanos",
                });
            }
        }
        Ok(())
    }
}
