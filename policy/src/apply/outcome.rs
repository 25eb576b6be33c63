//! What an outcome or a refund does to state: the attempt settled once (held spend
//! released, settled charged on the run, its credential and principal, an overrun
//! recorded), its status counted, a remote operation registered, its result kept, the
//! breaker moved; a refund's attempt given back.

use tally_record::money::Nanos;
use tally_record::{Decision, Effect, Status};

use crate::config::Policy;
use crate::judge::is_final;
use crate::state::Now;
use crate::state::{
    call_id, result_key, Attempt, Breaker, CredentialState, PrincipalState, RunState, ToolState,
    MAX_REFS,
};

/// An outcome folded into its attempt's run, tool, credential and principal.
#[allow(clippy::too_many_arguments)]
pub(super) fn outcome(
    policy: &Policy,
    run: &mut RunState,
    tool: Option<&mut ToolState>,
    credential: Option<&mut CredentialState>,
    principal: Option<&mut PrincipalState>,
    d: &Decision,
    now: Now,
    run_ms: u64,
) {
    let (Some(status), Some(attempt)) = (d.status, d.attempt) else {
        return;
    };
    let over = crate::overrun::overrun(run, d);
    let Some(mut a) = run.open.remove(&attempt) else {
        // Forgotten beyond the bound on open attempts: what it settled still counts.
        // (Else it had its final outcome: a duplicate, counted once.)
        if attempt <= run.forgotten_to {
            if let Some(Nanos(s)) = d.settled() {
                run.settled_nanos = run.settled_nanos.saturating_add(s);
            }
        }
        return;
    };
    settle(run, credential, principal, &mut a, d, over);
    count_status(run, &a, status, attempt);
    // The observed state, hashed once: the run's progress and its remote operation's.
    let observed = d.observed.as_deref().map(crate::state::observed_key);
    if let Some(state) = observed {
        if run.observed != Some(state) {
            run.progress = run.progress.saturating_add(1);
            run.observed = Some(state);
        }
    }
    if let Some(result) = d.result_digest.as_deref().map(result_key) {
        record_result(run, attempt, result);
    }
    register_remote(run, &mut a, d, observed, run_ms);
    let final_outcome = is_final(status);
    a.status = Some(status);
    if !final_outcome {
        run.open.insert(attempt, a.clone());
    }
    if let Some(t) = tool {
        let id = call_id(&run.run, attempt);
        if final_outcome || status == Status::Timeout || status == Status::Unknown {
            t.in_flight.remove(&id);
        }
        breaker_outcome(
            policy,
            a.tool.as_deref().unwrap_or(""),
            t,
            || id,
            status,
            now,
        );
    }
}

/// What an outcome settles, once per attempt: the held spend released and the settled
/// charged, on the run, its credential and its principal; an overrun recorded.
fn settle(
    run: &mut RunState,
    credential: Option<&mut CredentialState>,
    principal: Option<&mut PrincipalState>,
    a: &mut Attempt,
    d: &Decision,
    over: Option<crate::overrun::Overrun>,
) {
    let status = d.status;
    let settles = d.settled().is_some() || status.is_some_and(is_final);
    if settles && !a.settled {
        let settled = d.settled().map_or(0, |n| n.0);
        run.held_nanos = run.held_nanos.saturating_sub(a.held);
        run.settled_nanos = run.settled_nanos.saturating_add(settled);
        if let Some(c) = credential {
            c.spent_nanos = c.spent_nanos.saturating_sub(a.held).saturating_add(settled);
        }
        if let Some(p) = principal {
            p.spent_nanos = p.spent_nanos.saturating_sub(a.held).saturating_add(settled);
        }
        a.held = 0;
        a.settled = true;
        if let Some(o) = over {
            // The upstream billed more than was reserved: a fact, recorded; no call is
            // allowed after it until a human grants spend.
            run.overrun = true;
            run.overrun_nanos = run.overrun_nanos.saturating_add(o.excess().0);
        }
    }
}

/// What an outcome's status says of its call: a rejected call gives back what it used; an
/// unknown non-idempotent write is remembered until a later outcome of its operation
/// settles it; an `ok` ends the operation's retries, and a write that succeeded is
/// progress.
fn count_status(run: &mut RunState, a: &Attempt, status: Status, attempt: u64) {
    if status == Status::Rejected && !run.refunded.contains(attempt) {
        // Nothing happened: the budget counts iteration, not friction.
        run.refunded.insert(attempt);
        if a.counted {
            run.attempts_used = run.attempts_used.saturating_sub(1);
            run.attempts_refunded = run.attempts_refunded.saturating_add(1);
        }
        if a.write {
            run.side_effects_used = run.side_effects_used.saturating_sub(1);
        }
        if let Some(n) = run.ops.get_mut(&a.op) {
            *n = n.saturating_sub(1);
        }
    }
    match status {
        Status::Ok | Status::Error | Status::Rejected
            if run.unknown.get(&a.op) == Some(&attempt) =>
        {
            run.unknown.remove(&a.op);
        }
        Status::Unknown | Status::Timeout if a.effect == Some(Effect::NonIdempotentWrite) => {
            run.unknown.insert(a.op, attempt);
        }
        _ => {}
    }
    if status == Status::Ok {
        run.ops.remove(&a.op);
        if a.write {
            run.progress = run.progress.saturating_add(1);
        }
    }
}

/// The remote operation the outcome reports on, and what it observed of it.
fn register_remote(
    run: &mut RunState,
    a: &mut Attempt,
    d: &Decision,
    observed: Option<u64>,
    run_ms: u64,
) {
    // A remote operation is registered only by the outcome of a call that used an
    // attempt: a poll reports on its own operation, never a new one, and an exempt call
    // registers none. Otherwise each poll could name the next, and one attempt would buy
    // unlimited "polls".
    let remote = match a.poll {
        Some(polled) => Some(polled),
        None if a.counted => match a.registered {
            // One remote operation per call: later outcomes of it report on that one.
            Some(r) => Some(r),
            None => d.remote_ref.as_deref().map(crate::state::ref_key),
        },
        None => None,
    };
    if a.poll.is_none() && a.registered.is_none() {
        a.registered = remote;
    }
    if let Some(r) = remote {
        if !run.refs.contains_key(&r) && run.refs.len() >= MAX_REFS {
            let oldest = run
                .refs
                .iter()
                .min_by_key(|(_, v)| v.last_ms)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                run.refs.remove(&k);
            }
        }
        let entry = run.refs.entry(r).or_default();
        entry.last_ms = run_ms;
        entry.retry_after_ms = d.retry_after_ms;
        if let Some(o) = observed {
            if entry.observed != Some(o) {
                entry.unchanged = 0;
            }
            entry.observed = Some(o);
        }
    }
}

/// Keep an attempt's result with its call, for the loop rule: identical calls whose
/// results differ are progress, not the same call again (and progress for alternation).
fn record_result(run: &mut RunState, attempt: u64, result: u64) {
    let Some(i) = run.recent.iter().rposition(|r| r.attempt == attempt) else {
        return;
    };
    let key = run.recent[i].key;
    let before = run
        .recent
        .iter()
        .take(i)
        .rev()
        .filter(|r| r.key == key)
        .find_map(|r| r.result);
    run.recent[i].result = Some(result);
    if before.is_some_and(|b| b != result) {
        run.progress = run.progress.saturating_add(1);
    }
}

/// The breaker's transitions on an outcome of a call of `tool`, in one place: the gate
/// and every report that follows a tool's breaker fold outcomes through it. A tool the
/// policy gives no breaker (`[breaker.tools]`, 0) stays closed whatever it reports.
/// `id` gives the call's [`call_id`]; it is asked only when a half-open breaker's probe
/// must be told apart (a hash per outcome otherwise spent for nothing).
pub fn breaker_outcome(
    policy: &Policy,
    tool: &str,
    t: &mut ToolState,
    id: impl FnOnce() -> u64,
    status: Status,
    now: Now,
) {
    let Some(limit) = policy.breaker.failures_for(tool) else {
        t.breaker = Breaker::Closed { failures: 0 };
        return;
    };
    let failed = crate::status::is_failure(status);
    let reopen = Breaker::Open {
        until_ms: now.wall_ms.saturating_add(policy.breaker.open_ms),
    };
    t.breaker = match t.breaker.at(now.wall_ms, policy.breaker.open_ms) {
        Breaker::Closed { failures } if failed => {
            let failures = failures.saturating_add(1);
            if failures >= limit {
                reopen
            } else {
                Breaker::Closed { failures }
            }
        }
        Breaker::Closed { .. } if status == Status::Ok => Breaker::Closed { failures: 0 },
        Breaker::HalfOpen { probe: Some(p) } if p.call == id() => match status {
            Status::Ok => Breaker::Closed { failures: 0 },
            _ if failed => reopen,
            // Rejected, running, unknown: the probe proved nothing; admit another.
            Status::Rejected => Breaker::HalfOpen { probe: None },
            _ => Breaker::HalfOpen { probe: Some(p) },
        },
        other => other,
    };
}

pub(super) fn refund(
    run: &mut RunState,
    credential: Option<&mut CredentialState>,
    principal: Option<&mut PrincipalState>,
    d: &Decision,
) {
    let Some(of) = d.of else { return };
    run.refunded.insert(of);
    let slots = d.slots.unwrap_or(1).min(run.attempts_used);
    run.attempts_used -= slots;
    run.attempts_refunded = run.attempts_refunded.saturating_add(slots);
    if let Some(a) = run.open.get_mut(&of) {
        let nanos = d.refunded().map_or(a.held, |n| n.0).min(a.held);
        a.held -= nanos;
        run.held_nanos = run.held_nanos.saturating_sub(nanos);
        if let Some(c) = credential {
            c.spent_nanos = c.spent_nanos.saturating_sub(nanos);
        }
        if let Some(p) = principal {
            p.spent_nanos = p.spent_nanos.saturating_sub(nanos);
        }
    }
}
