//! The check phase: the gate asked to reserve the plan's worst case (its `check`, with
//! the run owner's uid, `proxied`), the call's span started; a refusal is answered in
//! the upstream's dialect, saying for money what the call needed and what is left.
//! Allowed, the settle phase is armed ([`Settling`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use tally_gate::{Caller, CheckAnswer, CheckRequest, GateError};
use tally_policy::{KeyDayExceeded, UpstreamKind, Verdict};
use tally_record::money::Nanos;
use tally_record::{Action, LimitKey, Reason};

use super::plan::Plan;
use super::settle::{Settle, Settling};
use super::{channel_of, Call};
use crate::dialect::Refusal;
use crate::key_spend::KeyHold;
use crate::proxy::Proxy;
use crate::refuse::{preview, unavailable, Pre, Refused};
use crate::trace::CallSpan;

/// The gate's check of `plan` (its arguments handed over to it, not copied): the armed
/// settle phase of an allowed call, or the refusal.
pub(super) async fn check(
    proxy: &Proxy,
    call: &Call<'_>,
    plan: &mut Plan,
) -> Result<Settling, Refusal> {
    // A key's call holds what the gate will reserve against the key's day first: the
    // count read and the hold are one step, so racing calls of one key never pass its
    // budget together. Dropped before the settle phase takes it over (a refusal, the
    // client gone during the check), the hold is given back.
    let key = hold(proxy, call, plan).await?;
    let (u, standing) = (&call.route.upstream, &call.caught.standing);
    let timeout_ms = tally_policy::call_timeout(&standing.budget, standing.at_ms, u.timeout_ms);
    // The call's span (with a tracer), the agent's trace its parent; the decision
    // records the trace id, the span's or (without a tracer) the agent's.
    let mut span = span(proxy, call, plan);
    let trace_id = match &span {
        Some(s) => Some(s.trace_id()),
        None => call.parent.as_ref().map(|(p, _)| p.trace_id.clone()),
    };
    let check = request(call, plan, timeout_ms, trace_id);
    // The arguments' digest (BLAKE3 over a model call's whole body; remembered by the
    // arguments) made here, on the call's task, not on the decision thread every check
    // waits its turn for.
    if let Some(args) = &check.args {
        args.digest();
    }
    let caller = Caller {
        uid: standing.owner_uid,
        operator: false,
        proxied: true,
    };
    let answer = match proxy
        .gate(move |gate, done| gate.check(caller, check, done))
        .await
    {
        Ok(a) => a,
        Err(GateError::Stopped(a)) => *a,
        Err(e) => {
            drop(key);
            if let Some(mut s) = span {
                // A refusal the gate typed (a leased scope with no room left) says its
                // reason; anything else, that the gate could not decide.
                match &e {
                    GateError::Refused(r) => s.decided("deny", Some(r.as_str()), None),
                    _ => s.decided("error", Some(Reason::GateUnavailable.as_str()), None),
                }
                s.finish();
            }
            return Err(refused_by(e));
        }
    };
    if let Some(s) = &mut span {
        s.decided(
            verdict(answer.decision),
            answer.reason.map(|r| r.as_str()),
            answer.seq,
        );
    }
    let attempt = match allowed(&answer, plan.worst) {
        Ok(a) => a,
        Err(mut r) => {
            drop(key);
            r.recorded = answer.seq.map(|seq| (call.caught.run.clone(), seq));
            if let Some(s) = span {
                s.finish();
            }
            return Err(r);
        }
    };
    let deadline = Instant::now()
        + Duration::from_millis(answer.timeout_ms.unwrap_or(timeout_ms).min(timeout_ms));
    let settle = facts(call, plan, (attempt, &answer), caller, key);
    Ok(Settling::arm(proxy.recorder(), settle, deadline, span))
}

/// What the settle phase of `call`'s `attempt` knows, the gate's `answer` to `plan` in.
fn facts(
    call: &Call<'_>,
    plan: &Plan,
    (attempt, answer): (u64, &CheckAnswer),
    caller: Caller,
    key: Option<KeyHold>,
) -> Settle {
    let u = &call.route.upstream;
    Settle {
        run: call.caught.run.clone(),
        attempt,
        seq: answer.seq,
        caller,
        effect: plan.effect,
        kind: u.kind,
        endpoint: plan.endpoint,
        price: plan.price.clone(),
        route_price: plan.route_price,
        lands: plan.lands.clone(),
        cost_header: u.cost_header.clone(),
        // What the gate reserved: the most this call may settle.
        reserved: Nanos(answer.reserve_nanos.unwrap_or(plan.worst.0)),
        choices: plan.choices,
        // The key's hold is what the gate reserved: what it settles above that is its
        // overrun, as the run's.
        key,
    }
}

/// For a call with a key: what the gate reserves for `plan` (its worst case, at least
/// the tool's price: the policy's `reservation`) held against the key's day of the
/// call's run, or the refusal: the key's budget per day, recorded as the run's
/// `request_refused` (a refusal the gate itself would not make), with the key's amounts
/// in the answer; or the day turned since the run was named, recorded too, to be sent
/// again (it then names the new day's run).
async fn hold(proxy: &Proxy, call: &Call<'_>, plan: &Plan) -> Result<Option<KeyHold>, Refusal> {
    let (Some(key), Some(ring)) = (&call.caught.key, &proxy.keys) else {
        return Ok(None);
    };
    let spend = ring.spend();
    let limits = crate::keys::day_limits(&key.info);
    let reserve = proxy
        .gate
        .policy()
        .policy
        .reservation(&call.route.name, plan.worst.0);
    let e = match spend.hold(
        &key.info.id,
        &limits,
        (key.named_ms, ring.now_ms()),
        reserve,
    ) {
        Ok(charge) => return Ok(Some(KeyHold::new(Arc::clone(spend), charge))),
        Err(e) => e,
    };
    // A day turned is no refusal of the key's (not counted as one): sent again, the
    // call names the new day's run.
    let turned = matches!(e, KeyDayExceeded::DayTurned { .. });
    let (said, counted) = match turned {
        true => (
            Refusal::own(
                StatusCode::TOO_MANY_REQUESTS,
                tally_wire::ErrorCode::Refused,
                format!("key {}: {e}", key.info.id),
            ),
            None,
        ),
        false => {
            let (r, why) = super::keyed::exceeded(&key.info.id, e);
            (r, Some(why))
        }
    };
    let pre = Pre::new(Reason::RequestRefused, StatusCode::FORBIDDEN, said.message)
        .preview(format!("key {}: {e}", key.info.id));
    let refused = Refused {
        tool: call.route.name.clone(),
        target: Some(call.route.host.clone()),
        channel: channel_of(call.route.upstream.kind),
        effect: plan.effect,
    };
    let mut r = proxy.refuse(&call.caught, refused, pre).await;
    if r.recorded.is_some() {
        // Counted only as the answer it is: a refusal the gate could not record is
        // answered `gate_unavailable`, which is no refusal of the key's.
        if let Some(why) = counted {
            spend.refused(why);
        }
        r.key = said.key;
        r.action = Action::Stop;
        if turned {
            r.status = StatusCode::TOO_MANY_REQUESTS;
            r.action = Action::Retry;
            r.retry_after_ms = Some(1000);
        }
    }
    Err(r)
}

/// The call's span, with a tracer.
fn span(proxy: &Proxy, call: &Call<'_>, plan: &Plan) -> Option<CallSpan> {
    let (route, u) = (call.route, &call.route.upstream);
    proxy.tracer.as_ref().map(|t| {
        CallSpan::start(
            t,
            call.parent.as_ref(),
            &crate::trace::About {
                kind: u.kind,
                upstream: &route.name,
                host: &route.host,
                method: &call.method,
                model: (u.kind != UpstreamKind::Http).then_some(plan.operation.as_str()),
                run: &call.caught.run,
            },
        )
    })
}

/// The gate's check request for `plan`, its arguments taken (a model call's are its
/// whole body: one copy fewer).
fn request(
    call: &Call<'_>,
    plan: &mut Plan,
    timeout_ms: u64,
    trace_id: Option<String>,
) -> CheckRequest {
    CheckRequest {
        run: call.caught.run.clone(),
        worker: None,
        tool: call.route.name.clone(),
        // A logical operation is the request itself (tool and arguments): concurrent
        // calls to one model are not retries of each other.
        operation: None,
        args: plan.args.take(),
        args_preview: Some(preview(&plan.operation)),
        effect: plan.effect,
        idempotency_key: None,
        target: Some(call.route.host.clone()),
        channel: Some(channel_of(call.route.upstream.kind)),
        depth: None,
        reserve_cents: None,
        reserve_nanos: Some(plan.worst.0),
        remote_ref: None,
        credential: None,
        timeout_ms: Some(timeout_ms),
        trace_id,
        refused: None,
    }
}

/// The answer when the gate could not decide.
fn refused_by(e: GateError) -> Refusal {
    match e {
        GateError::Unavailable(_) => unavailable(),
        GateError::RunStopped { reason, .. } => Refusal::ended(
            reason,
            format!("the run of this token has stopped ({})", reason.as_str()),
        ),
        GateError::RunNotFound(_) => {
            Refusal::token("the run of this token is not known to the gate")
        }
        // Refused with a reason of the budget's (a scope with no room left): that
        // reason and its action, as the agent API types it; nothing recorded.
        GateError::Refused(reason) => Refusal::reason(
            reason,
            None,
            format!(
                "the gate refused the call: {} ({})",
                reason.as_str(),
                reason.meaning()
            ),
        ),
        e => Refusal::own(
            StatusCode::FORBIDDEN,
            tally_wire::ErrorCode::Refused,
            format!("the gate refused the call: {e}"),
        ),
    }
}

/// A verdict as spans and logs name it.
fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
        Verdict::RequireApproval => "require_approval",
    }
}

/// The attempt of an allow, or the refusal in words: a refusal for money says what the
/// call needed (`needed`, its worst case) and what the run and its owner have left.
fn allowed(a: &CheckAnswer, needed: Nanos) -> Result<u64, Refusal> {
    if a.decision == Verdict::Allow {
        if let Some(attempt) = a.attempt {
            return Ok(attempt);
        }
    }
    let reason = a.reason.unwrap_or(Reason::GateUnavailable);
    let mut words = match a.cause {
        Some(cause) => format!(
            "the gate refused the call: {} ({})",
            reason.as_str(),
            cause.as_str()
        ),
        None => format!("the gate refused the call: {}", reason.as_str()),
    };
    let money = [
        Reason::ReservationInsufficient,
        Reason::BudgetExceeded,
        Reason::PrincipalBudgetExceeded,
    ];
    if money.contains(&reason) || a.cause.is_some_and(|c| money.contains(&c)) {
        // The gate's own counts as it decided: settled plus held of each limit.
        let left = |dimension: LimitKey, whose: &str| {
            a.limits.get(&dimension).map(|l| {
                format!(
                    "{whose} has {} left of {}",
                    Nanos(tally_policy::left(l)),
                    Nanos(l.limit)
                )
            })
        };
        let mut parts = vec![format!("the call may cost up to {needed}")];
        parts.extend(left(LimitKey::SpendNanos, "the run"));
        parts.extend(left(LimitKey::PrincipalSpendNanos, "its owner's budget"));
        words = format!("{words}: {}", parts.join("; "));
    }
    let mut r = Refusal::reason(reason, a.retry_after_ms, words);
    r.cause = a.cause;
    Err(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_the_gate_typed_keeps_its_reason_and_action() {
        for reason in [Reason::BudgetExceeded, Reason::PrincipalBudgetExceeded] {
            let r = refused_by(GateError::Refused(reason));
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{reason:?}");
            assert_eq!(r.code, tally_wire::RefusalCode::Reason(reason));
            assert_eq!(r.action, Action::Ask);
            assert_eq!(r.retry_after_ms, None);
            assert!(r.message.contains(reason.as_str()), "{}", r.message);
        }
        let r = refused_by(GateError::Unavailable("down".into()));
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
