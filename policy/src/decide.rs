//! `decide`: what the policy says about one intended call, from the state as it stands.
//! Never mutates; the record it returns is exactly what the gate appends (and what
//! [`crate::apply`] folds in), so what is recorded is what was decided.

use std::collections::BTreeMap;

use tally_record::decision::Limit;
use tally_record::{Decision, Kind, LimitKey, Reason};

use crate::call::{grant_fits, grant_live, use_grant};
pub use crate::call::{Call, View};
use crate::config::Policy;
use crate::limits::call_timeout;
use crate::refusals::{first_refusal, refuse, Refusal};
use crate::request::request;
use crate::state::Now;
use crate::state::{Grant, RunState};

pub use tally_record::Verdict;

/// A decision: the verdict, and the exact record to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// Allow, deny or require approval.
    pub verdict: Verdict,
    /// The record: `allow` or `deny`, with reason, attempt, limits, timeout and policy.
    pub record: Decision,
    /// The refusal that a grant would have to lift (for `require_approval`, the limit
    /// that was reached).
    pub cause: Option<Reason>,
    /// The run stops with this decision, for this reason: the gate appends the stop
    /// record in the same commit. Past its deadline a run can only be refused, so a
    /// refusal for its deadline (or one a grant cannot lift for it) stops it.
    pub stop: Option<Reason>,
    /// For `denied_by_approver`: the denial, whose approver and note the agent is told.
    pub denied: Option<crate::state::Denied>,
}

impl Decided {
    /// The reason code (none for an allow).
    pub fn reason(&self) -> Option<Reason> {
        self.record.reason
    }
}

/// Decide `call` under `policy` (named by `digest`) from `state` at `now`.
///
/// The run must have started and not stopped (the gate answers those itself, without a
/// decision). Deterministic: the same inputs give the same record.
pub fn decide(policy: &Policy, digest: &str, state: View<'_>, call: &Call, now: Now) -> Decided {
    let run = state.run;
    let run_ms = run.run_ms(now);
    // A request the proxy refused as sent is that refusal: no rule, no approval, can
    // make it a call.
    let refused = call
        .refused
        .filter(|r| call.proxied && crate::call::PROXY_REFUSALS.contains(r));
    let mut refusal = match refused {
        Some(reason) => Some(refuse(reason)),
        None => first_refusal(policy, state, call, now, run_ms),
    };
    let (mut grant, mut cause) = (None, None);
    if let Some(r) = refusal
        .as_ref()
        .filter(|r| refused.is_none() && policy.asks(r.reason))
    {
        let approved = approval(policy, state, call, now, run_ms, r.reason);
        (refusal, grant, cause) = (approved.refusal, approved.grant, approved.cause);
    }
    let mut record = call_record(policy, digest, state, call, now, run_ms);
    let verdict = match refusal {
        None => {
            record.attempt = Some(run.last_attempt.saturating_add(1));
            record.timeout_ms = Some(timeout(policy, run, call, run_ms));
            record.grant = grant;
            Verdict::Allow
        }
        Some(r) => {
            record.kind = Some(Kind::Deny);
            record.reason = Some(r.reason);
            record.retry_after_ms = r.retry_after_ms;
            if r.reason == Reason::ApprovalRequired {
                // The refusal is an approval request: its context is decided with it.
                record.request = cause.map(|c| Box::new(request(policy, run, call, c, run_ms)));
                Verdict::RequireApproval
            } else {
                Verdict::Deny
            }
        }
    };
    if verdict == Verdict::Allow {
        cause = None;
    }
    let deadline = Some(Reason::RunDeadlineExhausted);
    let stop =
        (record.reason == deadline || cause == deadline).then_some(Reason::RunDeadlineExhausted);
    let denied = (record.reason == Some(Reason::DeniedByApprover))
        .then(|| {
            run.denial_of(
                &call.tool,
                call.operation.as_deref(),
                call.args_digest.as_deref(),
            )
        })
        .flatten()
        .cloned();
    Decided {
        verdict,
        record,
        cause,
        stop,
        denied,
    }
}

/// The decision's record before its verdict: every input of the decision, so replay can
/// decide it again.
fn call_record(
    policy: &Policy,
    digest: &str,
    state: View<'_>,
    call: &Call,
    now: Now,
    run_ms: u64,
) -> Decision {
    let run = state.run;
    Decision {
        run: call.run.clone(),
        kind: Some(Kind::Allow),
        worker: call.worker.clone(),
        at_ms: Some(run_ms),
        tool: Some(call.tool.clone()),
        operation: call.operation.clone(),
        args_digest: call.args_digest.clone(),
        args_preview: call.args_preview.clone(),
        effect: call.effect,
        idempotency_key: call.idempotency_key.clone(),
        target: call.target.clone(),
        channel: call.channel,
        depth: call.depth,
        remote_ref: call.remote_ref.clone(),
        credential: call.credential.clone().or_else(|| run.credential.clone()),
        proxied: call.proxied.then_some(true),
        uid: call.uid,
        policy: Some(digest.to_owned()),
        limits: Some(limits(policy, state, call, now, run_ms)),
        // Every input of the decision is recorded, so replay can decide it again.
        // The reservation is at least the tool's price (`[tool_prices]`), whatever the
        // caller declared.
        reserve_nanos: Some(policy.reservation(&call.tool, call.reserve_nanos)).filter(|&r| r > 0),
        ..Decision::default()
    }
}

/// What a refusal a human may lift becomes: allowed under a usable grant if nothing else
/// stands in the way, or a request for approval naming its cause, or another refusal.
struct Approval {
    refusal: Option<Refusal>,
    grant: Option<String>,
    cause: Option<Reason>,
}

/// The refusal for `reason`, which a human may lift, decided again under the run's
/// grants (see [`Approval`]).
fn approval(
    policy: &Policy,
    state: View<'_>,
    call: &Call,
    now: Now,
    run_ms: u64,
    reason: Reason,
) -> Approval {
    let run = state.run;
    let mut out = Approval {
        refusal: None,
        grant: None,
        cause: Some(reason),
    };
    match usable_grant(run, call, reason, run_ms) {
        Ok(g) => {
            // Decide again as if the grant were in force: allow only if nothing else
            // stands in the way.
            let mut granted = run.clone();
            use_grant(&mut granted, g, call);
            let view = View {
                run: &granted,
                ..state
            };
            match first_refusal(policy, view, call, now, run_ms) {
                None => out.grant = Some(g.digest.clone()),
                // Another limit stands: a human may lift it too, or not.
                Some(other) if policy.asks(other.reason) => {
                    out.cause = Some(other.reason);
                    out.refusal = Some(refuse(Reason::ApprovalRequired));
                }
                Some(other) => {
                    out.cause = None;
                    out.refusal = Some(other);
                }
            }
        }
        Err(Some(reason)) => out.refusal = Some(refuse(reason)),
        Err(None) => out.refusal = Some(refuse(Reason::ApprovalRequired)),
    }
    out
}

/// The allowed call's time limit: its own, the policy's default, and never past the
/// run's deadline.
fn timeout(policy: &Policy, run: &RunState, call: &Call, run_ms: u64) -> u64 {
    // Never longer than the policy's longest call: a call's in-flight slot is held for
    // its timeout, so an agent cannot hold a tool's slots for hours.
    let own = call
        .timeout_ms
        .unwrap_or(policy.rate.call_timeout_ms)
        .min(policy.rate.call_timeout_ms);
    call_timeout(&run.budget, run_ms, own)
}

/// The grant a refusal with `reason` could use: `Ok` an unused, unexpired grant that
/// covers this call; `Err(Some(expired or mismatch))`; `Err(None)` if the run has none.
fn usable_grant<'a>(
    run: &'a RunState,
    call: &Call,
    reason: Reason,
    run_ms: u64,
) -> Result<&'a Grant, Option<Reason>> {
    let unused: Vec<&Grant> = run.grants.iter().filter(|g| !g.used).collect();
    if unused.is_empty() {
        return Err(None);
    }
    let fits = |g: &Grant| {
        let s = &g.scope;
        let covers = match reason {
            Reason::AttemptsExhausted | Reason::SideEffectLimitExceeded => {
                s.attempts.is_some_and(|a| a > 0)
            }
            Reason::ReservationInsufficient | Reason::BudgetExceeded => {
                s.spend().is_some_and(|c| c.0 > 0)
            }
            Reason::ToolBlocked => s.tool.as_ref() == Some(&call.tool),
            // A human checked the remote side: a grant naming the operation (or tool).
            Reason::OutcomeUnknownNonIdempotent => s.operation.is_some() || s.tool.is_some(),
            _ => true,
        };
        grant_fits(g, call) && covers
    };
    let matching: Vec<&Grant> = unused.into_iter().filter(|g| fits(g)).collect();
    if matching.is_empty() {
        return Err(Some(Reason::ApprovalMismatch));
    }
    matching
        .into_iter()
        .find(|g| grant_live(g, run_ms))
        .ok_or(Some(Reason::ApprovalExpired))
}

/// The `{dimension: {used, limit}}` snapshot of a decision.
/// With the run owner's principal usage, where the policy gives it a budget.
fn limits(
    policy: &Policy,
    state: View<'_>,
    call: &Call,
    now: Now,
    run_ms: u64,
) -> BTreeMap<LimitKey, Limit> {
    let run = state.run;
    let mut out = crate::state::standing(
        run,
        Now {
            wall_ms: 0,
            at_ms: Some(run_ms),
        },
    );
    if let Some(l) = run.owner_uid.and_then(|u| policy.principal(u)) {
        out.extend(crate::state::principal_limits(
            l,
            state.principal,
            now.wall_ms,
        ));
    }
    if let (Some(depth), Some(limit)) = (call.depth, run.budget.depth) {
        out.insert(LimitKey::Depth, Limit { used: depth, limit });
    }
    let poll = run.poll_of(
        call.effect,
        call.remote_ref.as_deref(),
        call.operation.as_deref(),
    );
    if let (Some(r), Some(limit)) = (poll, run.budget.polls) {
        let used = run.refs[&r].polls;
        out.insert(LimitKey::Polls, Limit { used, limit });
    }
    out
}
