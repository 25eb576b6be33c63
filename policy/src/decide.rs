//! `decide`: what the policy says about one intended call, from the state as it stands.
//! Never mutates; the record it returns is exactly what the gate appends (and what
//! [`crate::apply`] folds in), so what is recorded is what was decided.

use std::collections::BTreeMap;

use tally_record::decision::Limit;
use tally_record::{Decision, Effect, Kind, Reason};

use crate::call::{counts, grant_fits, grant_live, use_grant};
pub use crate::call::{Call, View};
use crate::config::{matches, target_matches, Policy};
use crate::rules::{loop_rule, poll_rule, retry_rule, PollRule};
use crate::state::Now;
use crate::state::{Breaker, Grant, RunState};

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
}

impl Decided {
    /// The reason code (none for an allow).
    pub fn reason(&self) -> Option<Reason> {
        self.record.reason
    }
}

struct Refusal {
    reason: Reason,
    retry_after_ms: Option<u64>,
}

fn refuse(reason: Reason) -> Refusal {
    Refusal {
        reason,
        retry_after_ms: None,
    }
}

fn retry(reason: Reason, after_ms: u64) -> Refusal {
    Refusal {
        reason,
        retry_after_ms: Some(after_ms.max(1)),
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
    let mut grant = None;
    let mut cause = None;
    if let Some(r) = refusal
        .as_ref()
        .filter(|r| refused.is_none() && policy.asks(r.reason))
    {
        cause = Some(r.reason);
        match usable_grant(run, call, r.reason, run_ms) {
            Ok(g) => {
                // Decide again as if the grant were in force: allow only if nothing else
                // stands in the way.
                let mut granted = run.clone();
                use_grant(&mut granted, g, call);
                let view = View {
                    run: &granted,
                    ..state
                };
                let again = first_refusal(policy, view, call, now, run_ms);
                match again {
                    None => {
                        grant = Some(g.digest.clone());
                        refusal = None;
                    }
                    // Another limit stands: a human may lift it too, or not.
                    Some(other) if policy.asks(other.reason) => {
                        cause = Some(other.reason);
                        refusal = Some(refuse(Reason::ApprovalRequired));
                    }
                    Some(other) => {
                        cause = None;
                        refusal = Some(other);
                    }
                }
            }
            Err(Some(reason)) => refusal = Some(refuse(reason)),
            Err(None) => refusal = Some(refuse(Reason::ApprovalRequired)),
        }
    }
    let mut record = Decision {
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
    };
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
                Verdict::RequireApproval
            } else {
                Verdict::Deny
            }
        }
    };
    if verdict == Verdict::Allow {
        cause = None;
    }
    Decided {
        verdict,
        record,
        cause,
    }
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
    match run.budget.deadline_ms {
        Some(d) => own.min(d.saturating_sub(run_ms)),
        None => own,
    }
}

fn first_refusal(
    policy: &Policy,
    state: View<'_>,
    call: &Call,
    now: Now,
    run_ms: u64,
) -> Option<Refusal> {
    let run = state.run;
    let b = &run.budget;
    let reserve = policy.reservation(&call.tool, call.reserve_nanos);
    if run.paused {
        return Some(refuse(Reason::RunPaused));
    }
    if run.open.len() >= crate::state::MAX_IN_FLIGHT_PER_RUN {
        // Calls without a reported outcome: the run must report (or time out) some
        // before it may make more; its state stays bounded.
        return Some(retry(Reason::RateLimitExceeded, 1000));
    }
    if b.deadline_ms.is_some_and(|d| run_ms >= d) {
        return Some(refuse(Reason::RunDeadlineExhausted));
    }
    if let (Some(depth), Some(limit)) = (call.depth, b.depth) {
        if depth > limit {
            return Some(refuse(Reason::ChainDepthExceeded));
        }
    }
    let scope = &policy.scope;
    if !scope.tools.is_empty() && !scope.tools.iter().any(|p| matches(p, &call.tool)) {
        return Some(refuse(Reason::ScopeViolation));
    }
    if let Some(target) = &call.target {
        if !scope.targets.is_empty() && !scope.targets.iter().any(|p| target_matches(p, target)) {
            return Some(refuse(Reason::ScopeViolation));
        }
    }
    if scope.blocked.iter().any(|p| matches(p, &call.tool))
        && !run.unblocked.iter().any(|t| t == &call.tool)
    {
        return Some(refuse(Reason::ToolBlocked));
    }
    if let Some(tool) = state.tool {
        match tool.breaker.at(now.wall_ms, policy.breaker.open_ms) {
            Breaker::Open { until_ms } => {
                return Some(retry(Reason::CircuitOpen, until_ms - now.wall_ms));
            }
            Breaker::HalfOpen { probe: Some(p) } => {
                return Some(retry(Reason::CircuitOpen, p.deadline_ms - now.wall_ms));
            }
            Breaker::HalfOpen { probe: None } | Breaker::Closed { .. } => {}
        }
    }
    let op = call.op();
    if call.effect == Some(Effect::NonIdempotentWrite) && run.unknown.contains_key(&op) {
        return Some(refuse(Reason::OutcomeUnknownNonIdempotent));
    }
    let poll = run.poll_of(
        call.effect,
        call.remote_ref.as_deref(),
        call.operation.as_deref(),
    );
    if let Some(r) = poll {
        match poll_rule(policy, run, r, run_ms) {
            Some(PollRule::Allowance | PollRule::Stalled) => {
                return Some(refuse(Reason::PollAllowanceExhausted))
            }
            Some(PollRule::Early { wait_ms }) => {
                return Some(retry(Reason::UpstreamBackoff, wait_ms))
            }
            None => {}
        }
    } else {
        // A failing operation retried past its class is told so before it is told it
        // loops: the more specific of the two.
        if retry_rule(policy, run, call) {
            return Some(refuse(Reason::RetriesExhausted));
        }
        if loop_rule(policy, run, call, run_ms).is_some() {
            return Some(refuse(Reason::LoopRepeatedCall));
        }
    }
    if run.last_attempt == u64::MAX {
        // No attempt number is left to give: never reuse one.
        return Some(refuse(Reason::AttemptsExhausted));
    }
    let committed = run
        .held_nanos
        .checked_add(run.settled_nanos)
        .and_then(|c| c.checked_add(reserve));
    if committed.is_none() {
        // The reservation would overflow the run's spend: it never fits.
        return Some(refuse(Reason::ReservationInsufficient));
    }
    if counts(policy, &call.tool, poll.is_some())
        && run
            .attempts_limit()
            .is_some_and(|limit| run.attempts_used >= limit)
    {
        return Some(refuse(Reason::AttemptsExhausted));
    }
    if call.is_write()
        && run
            .side_effects_limit()
            .is_some_and(|limit| run.side_effects_used >= limit)
    {
        return Some(refuse(Reason::SideEffectLimitExceeded));
    }
    if let Some(limit) = run.spend_limit() {
        // After an overrun the run's outcomes settle more than its calls reserve, so no
        // call is free: a zero-reserve call could settle any amount. Until a human grants
        // more, every counted call is refused; otherwise a spent budget refuses spend.
        if run.overrun || (reserve > 0 && run.settled_nanos >= limit) {
            return Some(refuse(Reason::BudgetExceeded));
        }
        let total = run.spent_nanos().checked_add(reserve);
        if total.is_none_or(|t| t > limit) {
            return Some(refuse(Reason::ReservationInsufficient));
        }
    }
    let rate = &policy.rate;
    if let Some(wait) = run
        .bucket
        .wait(rate.run_per_sec, rate.run_burst, now.wall_ms)
    {
        return Some(retry(Reason::RateLimitExceeded, wait));
    }
    if let Some(cred) = state.credential {
        if let Some(wait) =
            cred.bucket
                .wait(rate.credential_per_sec, rate.credential_burst, now.wall_ms)
        {
            return Some(retry(Reason::RateLimitExceeded, wait));
        }
    }
    if let Some(tool) = state.tool {
        if let Some(wait) = tool
            .bucket
            .wait(rate.tool_per_sec, rate.tool_burst, now.wall_ms)
        {
            return Some(retry(Reason::RateLimitExceeded, wait));
        }
        if rate.tool_in_flight > 0 && tool.in_flight_at(now.wall_ms) >= rate.tool_in_flight {
            let next = tool
                .in_flight
                .values()
                .filter(|&&t| t > now.wall_ms)
                .min()
                .map_or(1, |t| t - now.wall_ms);
            return Some(retry(Reason::RateLimitExceeded, next));
        }
    }
    let backstop = call
        .credential
        .as_deref()
        .or(run.credential.as_deref())
        .and_then(|c| policy.credentials.get(c))
        .and_then(|c| c.spend_nanos_per_period.map(|s| (s, c.period_ms.max(1))));
    if let (Some((cap, period)), Some(cred)) = (backstop, state.credential) {
        let spent = if now.wall_ms >= cred.period_start_ms.saturating_add(period) {
            0
        } else {
            cred.spent_nanos
        };
        if spent.saturating_add(reserve) > cap {
            return Some(refuse(Reason::BudgetExceeded));
        }
    }
    // The principal: the run's owner's budget across all its runs in the period.
    let limits = run.owner_uid.and_then(|u| policy.principal(u));
    if let (Some(l), Some(p)) = (limits, state.principal) {
        let p = p.at(now.wall_ms, l.period_ms);
        let counted = counts(policy, &call.tool, poll.is_some());
        if counted && l.attempts.is_some_and(|m| p.attempts >= m) {
            return Some(refuse(Reason::PrincipalBudgetExceeded));
        }
        if l.spend_nanos
            .is_some_and(|m| p.spent_nanos.saturating_add(reserve) > m)
        {
            return Some(refuse(Reason::PrincipalBudgetExceeded));
        }
    }
    None
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
) -> BTreeMap<String, Limit> {
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
        out.insert("depth".to_owned(), Limit { used: depth, limit });
    }
    let poll = run.poll_of(
        call.effect,
        call.remote_ref.as_deref(),
        call.operation.as_deref(),
    );
    if let (Some(r), Some(limit)) = (poll, run.budget.polls) {
        let used = run.refs[&r].polls;
        out.insert("polls".to_owned(), Limit { used, limit });
    }
    out
}
