//! `apply`: the one fold of decisions into state (docs/GATE.md, how a budget is counted). The live gate applies each
//! decision it makes; replay and every report apply the ledger's decisions in seq order.
//! What the fold finds inconsistent (a refund of nothing, an outcome without an allow,
//! an allow beyond a limit) it reports, and it never wraps a number.

use serde::{Deserialize, Serialize};
use tally_record::decision::Limit;
use tally_record::{Decision, Effect, Kind, Reason, Status};

use crate::config::Policy;
use crate::decide::{counts, Call};
use crate::state::{
    call_id, op_key, Attempt, Breaker, CredentialState, Grant, Probe, Recent, RunState, ToolState,
    Window, MAX_OPEN, MAX_OPS, MAX_REFS, MAX_TOOL_WINDOWS,
};
use crate::Now;

/// The state a decision changes.
#[derive(Debug)]
pub struct ViewMut<'a> {
    /// The run.
    pub run: &'a mut RunState,
    /// The call's downstream tool (for an outcome: the tool of its attempt).
    pub tool: Option<&'a mut ToolState>,
    /// The run's credential.
    pub credential: Option<&'a mut CredentialState>,
}

/// A budget dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Attempts.
    Attempts,
    /// Spend, cents.
    SpendCents,
    /// Side effects.
    SideEffects,
    /// Polls of one remote operation.
    Polls,
    /// Run time, ms.
    DeadlineMs,
    /// Chain depth.
    Depth,
}

/// Something a decision does that its run's own history does not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Inconsistency {
    /// An allow beyond a limit of the run's budget.
    AllowBeyondLimit {
        /// Which limit.
        dimension: Dimension,
        /// Used, with this allow.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// A record after the run's stop.
    AfterStop {
        /// The record's kind.
        record: Kind,
        /// The stop's reason.
        stop: Reason,
    },
    /// A second start of the same run.
    SecondStart,
    /// An outcome for an attempt that was never allowed.
    OutcomeWithoutAllow {
        /// The attempt named.
        attempt: u64,
    },
    /// A second final outcome for an attempt already settled.
    DuplicateOutcome {
        /// The attempt.
        attempt: u64,
    },
    /// Settled above what was reserved (an overrun: recorded, and further spend is
    /// refused until a human grants more).
    SettledAboveReservation {
        /// The attempt.
        attempt: u64,
        /// Cents reserved.
        reserved_cents: u64,
        /// Cents settled.
        settled_cents: u64,
    },
    /// A refund of an attempt never allowed.
    RefundWithoutAttempt {
        /// The attempt named.
        of: u64,
    },
    /// A second refund of one attempt.
    RefundedTwice {
        /// The attempt.
        of: u64,
    },
    /// A non-idempotent write repeated while an earlier identical one's outcome was
    /// unknown, with no approval.
    RepeatedUnknownWrite {
        /// The earlier attempt.
        attempt: u64,
    },
    /// An approval whose signature, digest or approver does not check out.
    InvalidApproval {
        /// Why.
        why: String,
    },
    /// An allow that names an approval the run does not hold unused.
    GrantNotHeld {
        /// The digest named.
        digest: String,
    },
    /// An allow naming an attempt number already allowed (nothing is counted for it).
    DuplicateAllow {
        /// The attempt.
        attempt: u64,
    },
    /// A number that would overflow u64.
    Overflow {
        /// What overflowed.
        field: &'static str,
    },
}

fn add(a: u64, b: u64, field: &'static str, found: &mut Vec<Inconsistency>) -> u64 {
    a.checked_add(b).unwrap_or_else(|| {
        found.push(Inconsistency::Overflow { field });
        u64::MAX
    })
}

/// Fold `record` into `state` at `now`; returns what it found inconsistent.
///
/// `policy` says which tools are exempt and how the breaker and buckets behave; the
/// budget numbers follow docs/GATE.md, how a budget is counted whatever the policy.
pub fn apply(
    policy: &Policy,
    state: ViewMut<'_>,
    record: &Decision,
    now: Now,
) -> Vec<Inconsistency> {
    let mut found = Vec::new();
    let ViewMut {
        run,
        tool,
        credential,
    } = state;
    let kind = record.kind();
    let run_ms = run.run_ms(now);
    // A refusal changes no state, the run's clock included: a networked gate keeps no
    // state of a refusal, so the clock is what the run's writes left, on every host.
    if kind != Kind::Deny {
        run.last_ms = run.last_ms.max(run_ms);
    }
    if let Some(stop) = run.stop {
        if kind != Kind::Outcome {
            found.push(Inconsistency::AfterStop { record: kind, stop });
        }
    }
    match kind {
        Kind::Start => start(run, record, now, &mut found),
        Kind::Allow => allow(
            policy, run, tool, credential, record, now, run_ms, &mut found,
        ),
        Kind::Deny | Kind::Policy => {}
        Kind::Outcome => outcome(
            policy, run, tool, credential, record, now, run_ms, &mut found,
        ),
        Kind::Refund => refund(run, credential, record, &mut found),
        Kind::Override => approve(policy, run, record, &mut found),
        Kind::Stop => {
            if run.stop.is_none() {
                run.stop = record.reason;
            }
        }
    }
    found
}

fn start(run: &mut RunState, d: &Decision, now: Now, found: &mut Vec<Inconsistency>) {
    if run.started {
        found.push(Inconsistency::SecondStart);
        return;
    }
    run.started = true;
    run.goal = d.goal.clone();
    run.parent = d.parent.clone();
    run.continues = d.continues.clone();
    run.credential = d.credential.clone();
    run.owner_uid = d.uid;
    run.budget = d.budget.clone().unwrap_or_default();
    run.start_wall_ms = now.wall_ms.saturating_sub(d.at_ms.unwrap_or(0));
}

#[allow(clippy::too_many_arguments)]
fn allow(
    policy: &Policy,
    run: &mut RunState,
    tool: Option<&mut ToolState>,
    credential: Option<&mut CredentialState>,
    d: &Decision,
    now: Now,
    run_ms: u64,
    found: &mut Vec<Inconsistency>,
) {
    let call = Call::from_record(d);
    let attempt = d.attempt.unwrap_or(run.last_attempt.saturating_add(1));
    if run.allowed.contains(attempt) {
        found.push(Inconsistency::DuplicateAllow { attempt });
        return;
    }
    let poll = run.poll_of(d.effect, d.remote_ref.as_deref(), d.operation.as_deref());
    let counted = counts(policy, &call.tool, poll.is_some());
    let write = matches!(
        d.effect,
        Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
    );
    let reserve = d.reserve_cents.unwrap_or(0);
    let op = op_key(
        d.tool.as_deref(),
        d.operation.as_deref(),
        d.args_digest.as_deref(),
    );
    let mut granted_tool = None;
    if let Some(digest) = &d.grant {
        let held = run
            .grants
            .iter()
            .position(|g| !g.used && &g.digest == digest);
        match held {
            Some(i) => {
                let g = run.grants[i].clone();
                use_grant(run, &g, &call);
                granted_tool = g.scope.tool.clone();
            }
            None => found.push(Inconsistency::GrantNotHeld {
                digest: digest.clone(),
            }),
        }
    }
    if d.effect == Some(Effect::NonIdempotentWrite) {
        if let Some(&earlier) = run.unknown.get(&op) {
            found.push(Inconsistency::RepeatedUnknownWrite { attempt: earlier });
        }
    }

    run.allowed.insert(attempt);
    run.last_attempt = run.last_attempt.max(attempt);
    if counted {
        run.attempts_used = add(run.attempts_used, 1, "attempts", found);
    }
    if write {
        run.side_effects_used = add(run.side_effects_used, 1, "side_effects", found);
    }
    run.held_cents = add(run.held_cents, reserve, "held_cents", found);
    let beyond = [
        (
            Dimension::Attempts,
            counted,
            run.attempts_used,
            run.attempts_limit(),
        ),
        (
            Dimension::SideEffects,
            write,
            run.side_effects_used,
            run.side_effects_limit(),
        ),
        (
            Dimension::SpendCents,
            reserve > 0,
            run.spent_cents(),
            run.spend_limit(),
        ),
        (
            Dimension::DeadlineMs,
            true,
            run_ms,
            run.budget.deadline_ms.map(|d| d.saturating_sub(1)),
        ),
        (
            Dimension::Depth,
            true,
            d.depth.unwrap_or(0),
            run.budget.depth,
        ),
    ];
    for (dimension, applies, used, limit) in beyond {
        if let Some(limit) = limit.filter(|&l| applies && used > l) {
            found.push(Inconsistency::AllowBeyondLimit {
                dimension,
                used,
                limit,
            });
        }
    }

    if let Some(r) = &poll {
        let remote = run.refs.entry(*r).or_default();
        remote.polls = add(remote.polls, 1, "polls", found);
        remote.last_ms = run_ms;
        remote.retry_after_ms = None;
        if let Some(limit) = run.budget.polls.filter(|&l| remote.polls > l) {
            found.push(Inconsistency::AllowBeyondLimit {
                dimension: Dimension::Polls,
                used: remote.polls,
                limit,
            });
        }
    } else {
        let n = run.ops.entry(op).or_insert(0);
        *n = n.saturating_add(1);
        if run.ops.len() > MAX_OPS {
            // The operation retried longest ago: its count is least likely to matter.
            if let Some(k) = run.ops.keys().find(|k| **k != op).copied() {
                run.ops.remove(&k);
            }
        }
        run.recent.push_back(Recent {
            key: crate::state::call_key(
                d.tool.as_deref(),
                d.operation.as_deref(),
                d.args_digest.as_deref(),
            ),
            progress: run.progress,
        });
        // The breakers look back at most this far.
        let l = &policy.loops;
        let keep = l
            .identical_window
            .max(l.identical_consecutive)
            .max(l.alternating)
            .min(crate::config::MAX_WINDOW);
        while run.recent.len() as u64 > keep {
            run.recent.pop_front();
        }
        if let Some(t) = d.tool.as_deref().map(crate::state::tool_key) {
            let window = policy.loops.tool_window_ms;
            let w = run.tools.entry(t).or_insert_with(|| Window {
                start_ms: run_ms,
                count: 0,
            });
            if run_ms.saturating_sub(w.start_ms) >= window {
                *w = Window {
                    start_ms: run_ms,
                    count: 0,
                };
            }
            w.count = w.count.saturating_add(1);
            if run.tools.len() > MAX_TOOL_WINDOWS {
                let oldest = run
                    .tools
                    .iter()
                    .filter(|(k, _)| **k != t)
                    .min_by_key(|(_, w)| w.start_ms)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    run.tools.remove(&k);
                }
            }
        }
    }
    if let Some(t) = granted_tool {
        // A tool's approval is used by this one call: the tool is blocked again after.
        run.unblocked.retain(|u| *u != t);
    }
    run.open.insert(
        attempt,
        Attempt {
            tool: d.tool.clone(),
            op,
            effect: d.effect,
            reserved: reserve,
            held: reserve,
            counted,
            write,
            poll,
            settled: false,
            status: None,
            registered: None,
        },
    );
    if run.open.len() > MAX_OPEN {
        let unknown: Vec<u64> = run.unknown.values().copied().collect();
        let forget = run
            .open
            .iter()
            .find(|(a, o)| o.held == 0 && !unknown.contains(a) && **a != attempt)
            .map(|(a, _)| *a);
        if let Some(a) = forget {
            run.open.remove(&a);
        }
    }
    let rate = &policy.rate;
    run.bucket.take(rate.run_per_sec, now.wall_ms);
    if let Some(t) = tool {
        let id = call_id(&run.run, attempt);
        // A call counts in flight for at least a second: a timeout of 0 must not make
        // the in-flight bound vanish.
        let held = d
            .timeout_ms
            .unwrap_or(rate.call_timeout_ms)
            .min(rate.call_timeout_ms)
            .max(1000);
        let until = now.wall_ms.saturating_add(held);
        t.in_flight.retain(|_, &mut u| u > now.wall_ms);
        t.in_flight.insert(id, until);
        t.bucket.take(rate.tool_per_sec, now.wall_ms);
        if let Breaker::HalfOpen { probe: None } = t.breaker.at(now.wall_ms, policy.breaker.open_ms)
        {
            t.breaker = Breaker::HalfOpen {
                probe: Some(Probe {
                    call: id,
                    deadline_ms: now.wall_ms.saturating_add(policy.breaker.probe_timeout_ms),
                }),
            };
        }
    }
    if let Some(c) = credential {
        c.bucket.take(rate.credential_per_sec, now.wall_ms);
        roll_period(policy, run.credential.as_deref(), c, now);
        c.spent_cents = c.spent_cents.saturating_add(reserve);
    }
}

fn roll_period(policy: &Policy, credential: Option<&str>, c: &mut CredentialState, now: Now) {
    let period = credential
        .and_then(|n| policy.credentials.get(n))
        .map_or(86_400_000, |p| p.period_ms.max(1));
    if now.wall_ms >= c.period_start_ms.saturating_add(period) {
        c.period_start_ms = now.wall_ms;
        c.spent_cents = 0;
    }
}

#[allow(clippy::too_many_arguments)]
fn outcome(
    policy: &Policy,
    run: &mut RunState,
    tool: Option<&mut ToolState>,
    credential: Option<&mut CredentialState>,
    d: &Decision,
    now: Now,
    run_ms: u64,
    found: &mut Vec<Inconsistency>,
) {
    let Some(status) = d.status else { return };
    let Some(attempt) = d.attempt else { return };
    if !run.allowed.contains(attempt) {
        found.push(Inconsistency::OutcomeWithoutAllow { attempt });
        return;
    }
    let Some(mut a) = run.open.remove(&attempt) else {
        found.push(Inconsistency::DuplicateOutcome { attempt });
        return;
    };
    let settles = d.settled_cents.is_some()
        || matches!(status, Status::Ok | Status::Error | Status::Rejected);
    if settles && !a.settled {
        let settled = d.settled_cents.unwrap_or(0);
        run.held_cents = run.held_cents.saturating_sub(a.held);
        run.settled_cents = add(run.settled_cents, settled, "settled_cents", found);
        if let Some(c) = credential {
            c.spent_cents = c.spent_cents.saturating_sub(a.held).saturating_add(settled);
        }
        a.held = 0;
        a.settled = true;
        if settled > a.reserved {
            run.overrun = true;
            found.push(Inconsistency::SettledAboveReservation {
                attempt,
                reserved_cents: a.reserved,
                settled_cents: settled,
            });
        }
    } else if d.settled_cents.is_some() && a.settled {
        found.push(Inconsistency::DuplicateOutcome { attempt });
    }
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
    if let Some(state) = d.observed.as_deref().map(crate::state::observed_key) {
        if run.observed != Some(state) {
            run.progress = run.progress.saturating_add(1);
            run.observed = Some(state);
        }
    }
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
        if let Some(o) = &d.observed {
            entry.observed = Some(crate::state::observed_key(o));
        }
    }
    let final_outcome = matches!(status, Status::Ok | Status::Error | Status::Rejected);
    a.status = Some(status);
    if !final_outcome {
        run.open.insert(attempt, a.clone());
    }
    if let Some(t) = tool {
        let id = call_id(&run.run, attempt);
        if final_outcome || status == Status::Timeout || status == Status::Unknown {
            t.in_flight.remove(&id);
        }
        breaker_outcome(policy, t, id, status, now);
    }
}

/// The breaker's transitions on an outcome, in one place.
fn breaker_outcome(policy: &Policy, t: &mut ToolState, id: u64, status: Status, now: Now) {
    let failed = matches!(status, Status::Error | Status::Timeout);
    let reopen = Breaker::Open {
        until_ms: now.wall_ms.saturating_add(policy.breaker.open_ms),
    };
    t.breaker = match t.breaker.at(now.wall_ms, policy.breaker.open_ms) {
        Breaker::Closed { failures } if failed => {
            let failures = failures.saturating_add(1);
            if failures >= policy.breaker.failures {
                reopen
            } else {
                Breaker::Closed { failures }
            }
        }
        Breaker::Closed { .. } if status == Status::Ok => Breaker::Closed { failures: 0 },
        Breaker::HalfOpen { probe: Some(p) } if p.call == id => match status {
            Status::Ok => Breaker::Closed { failures: 0 },
            _ if failed => reopen,
            // Rejected, running, unknown: the probe proved nothing; admit another.
            Status::Rejected => Breaker::HalfOpen { probe: None },
            _ => Breaker::HalfOpen { probe: Some(p) },
        },
        other => other,
    };
}

fn refund(
    run: &mut RunState,
    credential: Option<&mut CredentialState>,
    d: &Decision,
    found: &mut Vec<Inconsistency>,
) {
    let Some(of) = d.of else { return };
    if !run.allowed.contains(of) {
        found.push(Inconsistency::RefundWithoutAttempt { of });
        return;
    }
    if run.refunded.contains(of) {
        found.push(Inconsistency::RefundedTwice { of });
        return;
    }
    run.refunded.insert(of);
    let slots = d.slots.unwrap_or(1).min(run.attempts_used);
    run.attempts_used -= slots;
    run.attempts_refunded = run.attempts_refunded.saturating_add(slots);
    if let Some(a) = run.open.get_mut(&of) {
        let cents = d.cents.unwrap_or(a.held).min(a.held);
        a.held -= cents;
        run.held_cents = run.held_cents.saturating_sub(cents);
        if let Some(c) = credential {
            c.spent_cents = c.spent_cents.saturating_sub(cents);
        }
    }
}

fn approve(policy: &Policy, run: &mut RunState, d: &Decision, found: &mut Vec<Inconsistency>) {
    if let Err(e) = crate::approval::check(policy, d) {
        found.push(Inconsistency::InvalidApproval { why: e.to_string() });
        return;
    }
    let (Some(digest), Some(approver), Some(scope), Some(expires_ms)) = (
        d.digest.clone(),
        d.approver.clone(),
        d.scope.clone(),
        d.expires_ms,
    ) else {
        return;
    };
    if run.grants.iter().any(|g| g.digest == digest) {
        found.push(Inconsistency::InvalidApproval {
            why: "the same approval was recorded twice (each is used once)".into(),
        });
        return;
    }
    run.grants.push(Grant {
        digest,
        approver,
        scope,
        expires_ms,
        used: false,
    });
}

/// Put a grant in force for `call`: extra attempts (and side effects), extra cents, the
/// tool unblocked, an unknown write the human reconciled; the grant is used up.
pub(crate) fn use_grant(run: &mut RunState, grant: &Grant, call: &Call) {
    if let Some(g) = run.grants.iter_mut().find(|g| g.digest == grant.digest) {
        g.used = true;
    }
    let s = &grant.scope;
    if s.cents.is_some_and(|c| c > 0) {
        // A human granted more cents: spend may go on after an overrun (a new one stops
        // it again).
        run.overrun = false;
    }
    run.extra_attempts = run.extra_attempts.saturating_add(s.attempts.unwrap_or(0));
    run.extra_cents = run.extra_cents.saturating_add(s.cents.unwrap_or(0));
    if let Some(t) = &s.tool {
        if !run.unblocked.contains(t) {
            run.unblocked.push(t.clone());
        }
    }
    if s.operation.is_some() || s.tool.is_some() {
        let op = op_key(
            Some(&call.tool),
            call.operation.as_deref(),
            call.args_digest.as_deref(),
        );
        run.unknown.remove(&op);
        run.ops.remove(&op);
    }
    if s.attempts.is_some_and(|a| a > 0) {
        // More attempts for the operation too, not only for the run.
        let op = op_key(
            Some(&call.tool),
            call.operation.as_deref(),
            call.args_digest.as_deref(),
        );
        run.ops.remove(&op);
    }
}

/// The limits snapshot of a run as it stands (every decision's `limits` starts from it,
/// and `GET /v1/runs/{run}` shows it).
pub fn standing(run: &RunState, now: Now) -> std::collections::BTreeMap<String, Limit> {
    let mut out = std::collections::BTreeMap::new();
    let mut put = |name: &str, used: u64, limit: Option<u64>| {
        if let Some(limit) = limit {
            out.insert(name.to_owned(), Limit { used, limit });
        }
    };
    put("attempts", run.attempts_used, run.attempts_limit());
    put("spend_cents", run.spent_cents(), run.spend_limit());
    put(
        "side_effects",
        run.side_effects_used,
        run.side_effects_limit(),
    );
    put("deadline_ms", run.run_ms(now), run.budget.deadline_ms);
    out
}
