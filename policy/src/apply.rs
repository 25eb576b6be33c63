//! `apply`: the one fold of decisions into state (docs/GATE.md, how a budget is
//! counted). The live gate applies each decision it makes; replay and every report apply
//! the ledger's decisions in seq order. What a record does that its history does not
//! allow is [`crate::judge`]'s to say, and `apply` returns it; the fold itself never
//! wraps a number.

use tally_record::{Decision, Effect, Kind};

use crate::call::{counts, use_grant_op, Keyed, View};
use crate::config::Policy;
use crate::judge::{grant_in_force, judge_keyed, Inconsistency};
use crate::start::{carry_denials, carry_over, delegate, Family};
pub use crate::state::standing;
use crate::state::Now;
use crate::state::{
    call_id, Attempt, Breaker, Continuation, CredentialState, Denied, Grant, PrincipalState, Probe,
    Recent, RunState, ToolState, Window, MAX_DENIED, MAX_OPEN, MAX_OPS, MAX_TOOL_WINDOWS,
};

mod outcome;

pub use outcome::breaker_outcome;
use outcome::{outcome, refund};

/// The state a decision changes.
#[derive(Debug)]
pub struct ViewMut<'a> {
    /// The run.
    pub run: &'a mut RunState,
    /// The call's downstream tool (for an outcome: the tool of its attempt).
    pub tool: Option<&'a mut ToolState>,
    /// The run's credential.
    pub credential: Option<&'a mut CredentialState>,
    /// The run owner's principal state (for a start, the starting uid's), where the
    /// policy gives the uid a principal budget.
    pub principal: Option<&'a mut PrincipalState>,
    /// For a start naming a parent: the parent, which its child's budget is carved from.
    pub parent: Option<&'a mut RunState>,
    /// For a start naming the run it continues: that run.
    pub continued: Option<&'a RunState>,
}

impl<'a> ViewMut<'a> {
    /// The run's own state alone.
    pub fn of(run: &'a mut RunState) -> ViewMut<'a> {
        ViewMut {
            run,
            tool: None,
            credential: None,
            principal: None,
            parent: None,
            continued: None,
        }
    }
}

/// Most skipped attempt numbers marked allowed one by one (a forged attempt number may be
/// huge; the count of attempts used takes the whole gap anyway).
const MAX_GAP: u64 = 4096;

/// Fold `record` into `state` at `now`; returns what [`judge`] finds inconsistent about
/// it (against the state before it), which the fold then counts as the rules say: a
/// duplicate is counted once, a refund of nothing returns nothing.
///
/// `policy` says which tools are exempt, who may approve, and how the breaker and buckets
/// behave; the budget numbers follow docs/GATE.md, how a budget is counted.
pub fn apply(
    policy: &Policy,
    state: ViewMut<'_>,
    record: &Decision,
    now: Now,
) -> Vec<Inconsistency> {
    apply_keyed(policy, state, record, None, now)
}

/// [`apply`], with the call an allow describes and its keys ([`Keyed::from_record`])
/// when the caller has them already: they are hashed once per record.
pub fn apply_keyed(
    policy: &Policy,
    state: ViewMut<'_>,
    record: &Decision,
    keyed: Option<&Keyed>,
    now: Now,
) -> Vec<Inconsistency> {
    let owned;
    let keyed = match keyed {
        Some(k) => Some(k),
        None if record.kind() == Kind::Allow => {
            owned = Keyed::from_record(record);
            Some(&owned)
        }
        None => None,
    };
    let principal_now = principal_now(policy, state.run, state.principal.as_deref(), record, now);
    let mut found = count_unrecorded(state.run, record);
    found.extend(judge_keyed(
        policy,
        View {
            run: state.run,
            tool: state.tool.as_deref(),
            credential: state.credential.as_deref(),
            principal: state.principal.as_deref(),
            family: Family {
                parent: state.parent.as_deref(),
                continued: state.continued,
                open_runs_of_uid: None,
                principal: principal_now,
                refill: None,
            },
        },
        record,
        keyed,
        now,
    ));
    fold(policy, state, record, keyed, now, principal_now, &found);
    found
}

/// The principal's state in its current period: the starting uid's for a start, else
/// the run's owner's, where the policy gives the uid a principal budget.
fn principal_now(
    policy: &Policy,
    run: &RunState,
    principal: Option<&PrincipalState>,
    record: &Decision,
    now: Now,
) -> Option<PrincipalState> {
    let uid = match record.kind() {
        Kind::Start => record.uid,
        _ => run.owner_uid,
    };
    let period = uid.and_then(|u| policy.principal(u)).map(|l| l.period_ms);
    principal
        .zip(period)
        .map(|(p, period)| p.at(now.wall_ms, period))
}

/// Fold a judged record into the state, as the rules say of what `found` holds: a
/// duplicate is counted once, a refund of nothing returns nothing.
fn fold(
    policy: &Policy,
    state: ViewMut<'_>,
    record: &Decision,
    keyed: Option<&Keyed>,
    now: Now,
    principal_now: Option<PrincipalState>,
    found: &[Inconsistency],
) {
    let ViewMut {
        run,
        tool,
        credential,
        mut principal,
        parent,
        continued,
    } = state;
    let kind = record.kind();
    let run_ms = tick(run, kind, now);
    let has = |f: fn(&Inconsistency) -> bool| found.iter().any(f);
    match kind {
        Kind::Start => {
            if !has(|f| matches!(f, Inconsistency::SecondStart)) {
                start(run, record, now);
                if let (Some(p), Some(rolled)) = (principal.as_deref_mut(), principal_now) {
                    *p = rolled;
                    p.runs = p.runs.saturating_add(1);
                }
                family_start(run, record, continued, parent);
            }
        }
        Kind::Allow => {
            if let Some(k) =
                keyed.filter(|_| !has(|f| matches!(f, Inconsistency::DuplicateAllow { .. })))
            {
                // Whether it uses an attempt, as the run counts it (before it is folded).
                let counted = counts(policy, &k.call.tool, k.poll(run).is_some());
                allow(policy, run, tool, credential, record, k, now);
                if let (Some(p), Some(rolled)) = (principal.as_deref_mut(), principal_now) {
                    principal_allow(p, rolled, counted, record);
                }
            }
        }
        Kind::Deny | Kind::Policy | Kind::Lease => {}
        Kind::Outcome => {
            // A second settlement of an open attempt is not counted, but its status is.
            if !has(|f| matches!(f, Inconsistency::OutcomeWithoutAllow { .. })) {
                outcome(
                    policy, run, tool, credential, principal, record, now, run_ms,
                );
            }
        }
        Kind::Refund => {
            let bad = has(|f| {
                matches!(
                    f,
                    Inconsistency::RefundWithoutAttempt { .. }
                        | Inconsistency::RefundedTwice { .. }
                )
            });
            if !bad {
                refund(run, credential, principal, record);
            }
        }
        Kind::Override => {
            if !has(|f| matches!(f, Inconsistency::InvalidApproval { .. })) {
                approve(run, record);
            }
        }
        Kind::Stop | Kind::Pause | Kind::Resume => halt(run, record),
    }
}

/// The run's clock at `now`, which a `kind` record moves on. A refusal changes no state,
/// the run's clock included: a networked gate keeps no state of a refusal, so the clock
/// is what the run's writes left, on every host.
fn tick(run: &mut RunState, kind: Kind, now: Now) -> u64 {
    let run_ms = run.run_ms(now);
    if kind != Kind::Deny {
        run.last_ms = run.last_ms.max(run_ms);
    }
    run_ms
}

/// A stop, or the operator's pause or resume: a stop is kept (the first one); a pause
/// refuses the run's calls until a resume. A stopped run stays as it stopped (the record
/// is a finding).
fn halt(run: &mut RunState, record: &Decision) {
    if run.stop.is_some() {
        return;
    }
    match record.kind() {
        Kind::Stop => run.stop = record.reason,
        kind => run.paused = kind == Kind::Pause,
    }
}

/// A started run's family: a continued run's use carried over, a child's budget taken
/// from its parent's.
fn family_start(
    run: &mut RunState,
    record: &Decision,
    continued: Option<&RunState>,
    parent: Option<&mut RunState>,
) {
    if let Some(old) = continued {
        carry_over(run, old);
    }
    if let Some(p) = parent {
        // A child is not a way around a human's no to its parent either.
        carry_denials(run, p);
        delegate(p, record.budget.as_ref().unwrap_or(&Default::default()));
    }
}

/// An allow counted on its principal, in the principal's current period.
fn principal_allow(
    p: &mut PrincipalState,
    rolled: PrincipalState,
    counted: bool,
    record: &Decision,
) {
    *p = rolled;
    if counted {
        p.attempts = p.attempts.saturating_add(1);
    }
    p.spent_nanos = p
        .spent_nanos
        .saturating_add(record.reserve().map_or(0, |n| n.0));
}

/// Attempts a gate-governed run's allow skips: the gate numbers its attempts one by one,
/// so a gap is attempts its state issued that no record given shows (a networked gate
/// killed between committing its state and recording, or a ledger of the fleet not
/// given). They are counted as the state counted them (used, never settled), so the allow
/// after them is judged on that: a forged gap excuses nothing. [`apply`] calls it first;
/// replay calls it before it decides the allow again. Returns the finding, once.
pub fn count_unrecorded(run: &mut RunState, d: &Decision) -> Vec<Inconsistency> {
    let next = run.last_attempt.saturating_add(1);
    let gap = match (d.kind(), d.attempt) {
        (Kind::Allow, Some(a)) if run.governed && d.policy.is_some() && a > next => a,
        _ => return Vec::new(),
    };
    if run.allowed.contains(gap) {
        return Vec::new();
    }
    let to = gap - 1;
    for skipped in next..=to.min(next.saturating_add(MAX_GAP)) {
        run.allowed.insert(skipped);
    }
    run.attempts_used = run.attempts_used.saturating_add(to - next + 1);
    run.last_attempt = to;
    vec![Inconsistency::AttemptsUnrecorded { from: next, to }]
}

fn start(run: &mut RunState, d: &Decision, now: Now) {
    run.started = true;
    run.goal = d.goal.clone();
    run.parent = d.parent.clone();
    run.continues = d.continues.clone();
    run.credential = d.credential.clone();
    run.owner_uid = d.uid;
    run.governed = d.policy.is_some();
    run.budget = d.budget.as_deref().cloned().unwrap_or_default();
    // Money in one unit: a start in cents is kept as the same amount in nanodollars.
    run.budget.spend_nanos = run.budget.spend().map(|n| n.0);
    run.budget.spend_cents = None;
    run.start_wall_ms = now.wall_ms.saturating_sub(d.at_ms.unwrap_or(0));
}

fn allow(
    policy: &Policy,
    run: &mut RunState,
    tool: Option<&mut ToolState>,
    credential: Option<&mut CredentialState>,
    d: &Decision,
    keyed: &Keyed,
    now: Now,
) {
    let run_ms = run.run_ms(now);
    let call = &keyed.call;
    let attempt = d.attempt.unwrap_or(run.last_attempt.saturating_add(1));
    let granted = grant_in_force(run, d, call, run_ms).cloned();
    if let Some(g) = &granted {
        use_grant_op(run, g, keyed.op);
    }
    let poll = keyed.poll(run);
    let counted = counts(policy, &call.tool, poll.is_some());
    let write = matches!(
        d.effect,
        Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
    );
    let reserve = d.reserve().map_or(0, |n| n.0);
    let op = keyed.op;

    run.allowed.insert(attempt);
    run.last_attempt = run.last_attempt.max(attempt);
    if counted {
        run.attempts_used = run.attempts_used.saturating_add(1);
    }
    if write {
        run.side_effects_used = run.side_effects_used.saturating_add(1);
    }
    run.held_nanos = run.held_nanos.saturating_add(reserve);

    if let Some(r) = &poll {
        let remote = run.refs.entry(*r).or_default();
        remote.polls = remote.polls.saturating_add(1);
        remote.unchanged = remote.unchanged.saturating_add(1);
        (remote.last_ms, remote.retry_after_ms) = (run_ms, None);
    } else {
        remember_call(policy, run, d, keyed, attempt, run_ms);
    }
    if let Some(t) = granted.and_then(|g| g.scope.tool) {
        // A tool's approval is used by this one call: the tool is blocked again after.
        run.unblocked.retain(|u| *u != t);
    }
    let proxied = d.proxied == Some(true);
    open_attempt(
        run,
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
        proxied,
    );
    let rate = &policy.rate;
    run.bucket.take(rate.run_per_sec, now.wall_ms);
    if let Some(t) = tool {
        hold_in_flight(policy, run, t, d, attempt, now);
    }
    if let Some(c) = credential {
        c.bucket.take(rate.credential_per_sec, now.wall_ms);
        roll_period(policy, run.credential.as_deref(), c, now);
        c.spent_nanos = c.spent_nanos.saturating_add(reserve);
    }
}

/// The attempt held open until its outcome, the oldest forgotten past [`MAX_OPEN`].
fn open_attempt(run: &mut RunState, attempt: u64, open: Attempt, proxied: bool) {
    run.open.insert(attempt, open);
    if proxied {
        run.proxied.insert(attempt);
    }
    if run.open.len() > MAX_OPEN {
        // Bounded, in O(log n): the oldest open attempt is forgotten. Its held spend stays
        // counted as held (it may have been charged); its later outcome is counted, not
        // matched.
        if let Some((a, _)) = run.open.pop_first() {
            run.forgotten_to = run.forgotten_to.max(a);
        }
    }
}

/// An allowed call that is not a poll, remembered for the rules that look back: its
/// operation's retry count, the recent calls the breakers read, its tool's window.
fn remember_call(
    policy: &Policy,
    run: &mut RunState,
    d: &Decision,
    keyed: &Keyed,
    attempt: u64,
    run_ms: u64,
) {
    let op = keyed.op;
    // Progress since the call was last made starts its count again (the retry rule's).
    let used = crate::rules::retries_used(run, op, keyed.key);
    run.ops.insert(op, used.saturating_add(1));
    if run.ops.len() > MAX_OPS {
        // The operation retried longest ago: its count is least likely to matter.
        if let Some(k) = run.ops.keys().find(|k| **k != op).copied() {
            run.ops.remove(&k);
        }
    }
    run.recent.push_back(Recent {
        key: keyed.key,
        attempt,
        progress: run.progress,
        result: None,
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
    // The tool's key, hashed once with the call's ([`Keyed`]).
    if let Some(t) = d.tool.as_ref().map(|_| keyed.tool) {
        count_tool_window(policy, run, t, run_ms);
    }
}

/// The tool's calls in its current window (the tool-rate loop rule's), bounded in the
/// number of tools a run remembers.
fn count_tool_window(policy: &Policy, run: &mut RunState, t: u64, run_ms: u64) {
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

/// The call in flight on its tool until its timeout (at least a second), the tool's rate
/// bucket taken, and the probe named when the tool's breaker is half-open.
fn hold_in_flight(
    policy: &Policy,
    run: &RunState,
    t: &mut ToolState,
    d: &Decision,
    attempt: u64,
    now: Now,
) {
    let rate = &policy.rate;
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
    if let Breaker::HalfOpen { probe: None } = t.breaker.at(now.wall_ms, policy.breaker.open_ms) {
        t.breaker = Breaker::HalfOpen {
            probe: Some(Probe {
                call: id,
                deadline_ms: now.wall_ms.saturating_add(policy.breaker.probe_timeout_ms),
            }),
        };
    }
}

fn roll_period(policy: &Policy, credential: Option<&str>, c: &mut CredentialState, now: Now) {
    let period = credential
        .and_then(|n| policy.credentials.get(n))
        .map_or(86_400_000, |p| p.period_ms.max(1));
    if now.wall_ms >= c.period_start_ms.saturating_add(period) {
        c.period_start_ms = now.wall_ms;
        c.spent_nanos = 0;
    }
}

fn approve(run: &mut RunState, d: &Decision) {
    if crate::approval::is_denial(d) {
        return deny(run, d);
    }
    let (Some(digest), Some(approver), Some(scope), Some(expires_ms)) = (
        d.digest.clone(),
        d.approver.clone(),
        d.scope.as_deref().cloned(),
        d.expires_ms,
    ) else {
        return;
    };
    // A continuation grant is the new run's allocation, never this run's.
    if let Some(new_run) = scope.new_run {
        run.continuations.push(Continuation {
            new_run,
            digest,
            approver,
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

/// A denial: the run remembers the denied call (the latest [`MAX_DENIED`]).
fn deny(run: &mut RunState, d: &Decision) {
    let (Some(tool), Some(request), Some(approver), Some(note)) = (
        d.tool.clone(),
        d.answers.clone(),
        d.approver.clone(),
        d.note.clone(),
    ) else {
        return;
    };
    if run.denied.len() >= MAX_DENIED {
        run.denied.remove(0);
    }
    run.denied.push(Denied {
        tool,
        operation: d.operation.clone(),
        args_digest: d.args_digest.clone(),
        request,
        approver,
        note,
    });
}
