//! Starting a run: the one rule for what a run is granted (the ceiling for its
//! credential, what its parent has left), what it carries over from the stopped run it
//! continues, and who may start it. The gate calls [`start`] before it records a start;
//! replay and the audit call [`judge_start`] on a recorded one, and [`crate::apply`]
//! folds it (the carve-out from the parent, the carry-over) for all three.

use tally_record::decision::Budget;
use tally_record::{Decision, Effect};

use crate::config::Policy;
pub use crate::inconsistency::StartRefusal;
use crate::inconsistency::{Dimension, Inconsistency};
use crate::refill::Refill;
use crate::state::{PrincipalState, RunState};

/// What a start asks for: the agent's `POST /v1/runs`, or a recorded start record.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ask<'a> {
    /// The budget asked for (at most the ceiling is granted).
    pub budget: Option<&'a Budget>,
    /// The credential the run is to run under.
    pub credential: Option<&'a str>,
    /// The agent chain depth of the starting agent.
    pub depth: Option<u64>,
    /// The uid starting it (`None`: in-process, or a loopback TCP peer).
    pub uid: Option<u32>,
    /// Whether the operator starts it (not held to the per-uid quota or a credential's
    /// uids).
    pub operator: bool,
}

/// The runs a start depends on, as they stand before it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Family<'a> {
    /// The parent run, if the start names one.
    pub parent: Option<&'a RunState>,
    /// The stopped run it continues, if it names one.
    pub continued: Option<&'a RunState>,
    /// Runs the starting uid holds open (started, not stopped), where known: the gate
    /// knows it; a replay of one ledger of a fleet may not.
    pub open_runs_of_uid: Option<u64>,
    /// The starting uid's principal state as it stands now (its period rolled over if
    /// it ended), where the policy gives the uid a principal budget.
    pub principal: Option<PrincipalState>,
    /// Where the start continues a run stopped by a refusal beyond the policy's
    /// allowance with no approval, what [`crate::refill::refill`] found: the gate looks
    /// the chain up; a recorded start is judged by [`crate::refill::judge`] instead.
    pub refill: Option<Refill>,
}

/// The budget a run is granted: what it asked for, never more than the policy's ceiling
/// for its credential, and for a child run never more than its parent has left.
pub fn grant_budget(
    policy: &Policy,
    asked: Option<&Budget>,
    credential: Option<&str>,
    parent: Option<&RunState>,
) -> Budget {
    let b = clamp(
        asked.cloned().unwrap_or_default(),
        &policy.ceiling_for(credential),
    );
    match parent {
        Some(p) => clamp(b, &left_of(p)),
        None => b,
    }
}

/// The policy's ceiling for `credential`, when `asked` names more than it in any
/// dimension. A budget an approver names (a continuation grant) is refused above the
/// ceiling rather than cut to fit: the approver learns what was granted.
pub fn above_ceiling(policy: &Policy, asked: &Budget, credential: Option<&str>) -> Option<Budget> {
    let most = policy.ceiling_for(credential);
    let over = |a: Option<u64>, m: Option<u64>| matches!((a, m), (Some(a), Some(m)) if a > m);
    let above = over(asked.attempts, most.attempts)
        || over(asked.spend().map(|n| n.0), most.spend().map(|n| n.0))
        || over(asked.side_effects, most.side_effects)
        || over(asked.polls, most.polls)
        || over(asked.depth, most.depth)
        || over(asked.deadline_ms, most.deadline_ms);
    above.then_some(most)
}

/// What a parent has left to hand down: each limit in force less what it used.
pub fn left_of(parent: &RunState) -> Budget {
    let left = |limit: Option<u64>, used: u64| limit.map(|l| l.saturating_sub(used));
    Budget {
        attempts: left(parent.attempts_limit(), parent.attempts_used),
        spend_cents: None,
        spend_nanos: left(parent.spend_limit(), parent.spent_nanos()),
        side_effects: left(parent.side_effects_limit(), parent.side_effects_used),
        deadline_ms: parent
            .budget
            .deadline_ms
            .map(|d| d.saturating_sub(parent.last_ms)),
        polls: None,
        depth: None,
    }
}

/// Each dimension of `b`, at most `most`'s where `most` has one (a dimension `b` leaves
/// open takes `most`'s).
fn clamp(b: Budget, most: &Budget) -> Budget {
    let pick = |asked: Option<u64>, most: Option<u64>| match (asked, most) {
        (Some(a), Some(m)) => Some(a.min(m)),
        (a, m) => m.or(a),
    };
    Budget {
        attempts: pick(b.attempts, most.attempts),
        deadline_ms: pick(b.deadline_ms, most.deadline_ms),
        // Money in one unit: what a run is granted counts nanodollars.
        spend_cents: None,
        spend_nanos: pick(b.spend().map(|n| n.0), most.spend().map(|n| n.0)),
        side_effects: pick(b.side_effects, most.side_effects),
        polls: pick(b.polls, most.polls),
        depth: pick(b.depth, most.depth),
    }
}

/// Decide a start: the budget to grant, or why the run may not start. What the gate
/// records is this budget; [`judge_start`] holds a recorded start to the same rule.
pub fn start(policy: &Policy, ask: &Ask<'_>, family: &Family<'_>) -> Result<Budget, StartRefusal> {
    if !ask.operator {
        if let Some(open) = family.open_runs_of_uid {
            if open >= policy.max_open_runs_per_uid {
                return Err(StartRefusal::TooManyRuns {
                    max: policy.max_open_runs_per_uid,
                });
            }
        }
    }
    if let (Some(uid), Some(p)) = (ask.uid, family.principal) {
        if let Some(l) = policy.principal(uid) {
            // A new run is not a new budget: no run starts once the uid's runs, attempts
            // or spend of the period are used up.
            let runs = l.runs.is_some_and(|m| p.runs >= m);
            let attempts = l.attempts.is_some_and(|m| p.attempts >= m);
            let spend = l.spend_nanos.is_some_and(|m| m > 0 && p.spent_nanos >= m);
            if runs || attempts || spend {
                return Err(StartRefusal::PrincipalBudgetExceeded);
            }
        }
    }
    if let Some(p) = family.parent {
        if !p.started {
            return Err(StartRefusal::ParentNotStarted);
        }
        if p.stop.is_some() {
            return Err(StartRefusal::ParentStopped);
        }
        if p.paused {
            return Err(StartRefusal::ParentPaused);
        }
    }
    if family.continued.is_some_and(|c| c.stop.is_none()) {
        return Err(StartRefusal::ContinuedNotStopped);
    }
    if let Some(r) = family.refill {
        // A budget is never refilled by restarting.
        return Err(StartRefusal::RefillWithoutApproval {
            continuations: r.continuations,
            allowance: r.allowance,
        });
    }
    if let Some(c) = ask.credential {
        let allowed = policy.credentials.get(c).is_none_or(|cred| {
            cred.uids.is_empty() || ask.operator || ask.uid.is_some_and(|u| cred.uids.contains(&u))
        });
        if !allowed {
            return Err(StartRefusal::CredentialNotAllowed);
        }
    }
    let budget = grant_budget(policy, ask.budget, ask.credential, family.parent);
    if let (Some(depth), Some(limit)) = (ask.depth, budget.depth) {
        if depth > limit {
            return Err(StartRefusal::DepthExceeded { depth, limit });
        }
    }
    Ok(budget)
}

/// What is inconsistent about a recorded start, given the runs it names as they stood
/// before it. A start the gate wrote (it names a policy) must show exactly the budget
/// [`start`] grants for it; any start with a parent must fit in what the parent had
/// left, since that much is carved out of it.
pub fn judge_start(
    policy: &Policy,
    record: &Decision,
    run: &RunState,
    family: &Family<'_>,
) -> Vec<Inconsistency> {
    let mut found = Vec::new();
    if run.started {
        found.push(Inconsistency::SecondStart);
        return found;
    }
    let granted = record.budget.as_deref().cloned().unwrap_or_default();
    if record.policy.is_some() {
        let ask = Ask {
            budget: Some(&granted),
            credential: record.credential.as_deref(),
            depth: None,
            uid: record.uid,
            // A start with no uid came in-process or over loopback TCP: who asked is not
            // on record, so a credential's uids are not held against it.
            operator: record.uid.is_none(),
        };
        match start(policy, &ask, family) {
            Ok(most) => beyond(&granted, &most, &mut found),
            Err(refusal) => found.push(Inconsistency::StartRefused { refusal }),
        }
    } else if let Some(p) = family.parent {
        beyond(&granted, &clamp(granted.clone(), &left_of(p)), &mut found);
    }
    found
}

/// Each dimension where `granted` exceeds what could be granted.
fn beyond(granted: &Budget, most: &Budget, found: &mut Vec<Inconsistency>) {
    let dims = [
        (Dimension::Attempts, granted.attempts, most.attempts),
        (Dimension::DeadlineMs, granted.deadline_ms, most.deadline_ms),
        (
            Dimension::SpendNanos,
            granted.spend().map(|n| n.0),
            most.spend().map(|n| n.0),
        ),
        (
            Dimension::SideEffects,
            granted.side_effects,
            most.side_effects,
        ),
        (Dimension::Polls, granted.polls, most.polls),
        (Dimension::Depth, granted.depth, most.depth),
    ];
    for (dimension, g, m) in dims {
        // A dimension left open where one could be granted is beyond it too.
        let over = match (g, m) {
            (Some(g), Some(m)) => (g > m).then_some((g, m)),
            (None, Some(m)) => Some((u64::MAX, m)),
            _ => None,
        };
        if let Some((granted, most)) = over {
            found.push(Inconsistency::StartBeyondGrant {
                dimension,
                granted,
                most,
            });
        }
    }
}

/// A child run's allocation is carved out of its parent's: the parent can no longer
/// spend what it handed down.
pub fn delegate(parent: &mut RunState, child: &Budget) {
    parent.delegated_attempts = parent
        .delegated_attempts
        .saturating_add(child.attempts.unwrap_or(0));
    parent.delegated_nanos = parent
        .delegated_nanos
        .saturating_add(child.spend().map_or(0, |n| n.0));
    parent.delegated_side_effects = parent
        .delegated_side_effects
        .saturating_add(child.side_effects.unwrap_or(0));
}

/// A continuation (`continues`) carries over what the stopped run must not repeat: its
/// non-idempotent writes whose outcome is unknown stay refused in the new run until a
/// human reconciles them, and the calls an approver denied stay denied (a new run is
/// not a way around a human's no).
pub fn carry_over(new: &mut RunState, old: &RunState) {
    carry_denials(new, old);
    // The attempt number belongs to the old run; 0 marks one no outcome here settles.
    for op in old.unknown.keys() {
        new.unknown.entry(*op).or_insert(0);
    }
    // A non-idempotent write with no final outcome at all (the worker died mid-call) is
    // as unknown as one reported so.
    for a in old.open.values() {
        if a.effect == Some(Effect::NonIdempotentWrite) {
            new.unknown.entry(a.op).or_insert(0);
        }
    }
}

/// The old (or parent) run's denied calls, appended to the new run's after those it
/// holds (the latest [`crate::state::MAX_DENIED`] kept, as on the run itself).
pub(crate) fn carry_denials(new: &mut RunState, old: &RunState) {
    for d in &old.denied {
        if new.denied.iter().any(|n| n.request == d.request) {
            continue;
        }
        if new.denied.len() >= crate::state::MAX_DENIED {
            new.denied.remove(0);
        }
        new.denied.push(d.clone());
    }
}
