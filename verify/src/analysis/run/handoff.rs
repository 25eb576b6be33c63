//! A run's [`Handoff`], built from its state at the end of the ledger and the loops it
//! was in (the types are `analysis::handoff`'s).

use tally_ledger::{Action, Effect, Reason};

use crate::analysis::handoff::{
    Attempts, Coverage, Handoff, Pending, PendingStatus, PollsUsed, ResumeAction, ResumeStep,
    Spend, StopReason, StopStatus, UnsafeAction, UnsafeKind,
};
use crate::analysis::loops::{Clock, Loop, Pattern};

use super::RunAnalysis;

use crate::text::plural as count;

fn label(tool: Option<&str>, operation: Option<&str>) -> String {
    match (tool, operation) {
        (Some(t), Some(o)) if o != t => format!("{t} ({o})"),
        (Some(t), _) => t.to_owned(),
        (None, Some(o)) => o.to_owned(),
        (None, None) => "an unnamed call".to_owned(),
    }
}

/// The handoff of one run, from its state at the end of the ledger.
pub(crate) fn build(run: &RunAnalysis, loops: &[&Loop], findings: u64) -> Handoff {
    let stop = run.stop_reason();
    let pending: Vec<Pending> = run.pending_work();
    let mut safe_resume = Vec::new();
    let mut unsafe_actions = Vec::new();

    if stop.status != StopStatus::Stopped {
        safe_resume.push(ResumeStep {
            action: ResumeAction::ConfirmStopped,
            what: "the run has no stop record: confirm that none of its workers is still \
                   running before resuming"
                .to_owned(),
            tool: None,
            operation: None,
            remote_ref: None,
            reason: None,
            not_before: None,
            seq: None,
        });
    }
    for p in &pending {
        pending_steps(p, &mut safe_resume, &mut unsafe_actions);
    }
    unsafe_actions.extend(unknown_writes(run));
    safe_resume.extend(asks(run));
    safe_resume.extend(after_stop(run, &stop));
    if safe_resume.is_empty() && stop.reason == Some(Reason::Completed) {
        safe_resume.push(ResumeStep {
            action: ResumeAction::Nothing,
            what: "nothing to resume: the run completed its task".to_owned(),
            tool: None,
            operation: None,
            remote_ref: None,
            reason: Some(Reason::Completed),
            not_before: None,
            seq: stop.seq,
        });
    }
    unsafe_actions.extend(already_done(run));
    unsafe_actions.extend(loops.iter().map(|l| looped(l)));
    handoff(
        run,
        stop,
        pending,
        (safe_resume, unsafe_actions),
        loops.len() as u64,
        findings,
    )
}

/// What a pending call asks of whoever resumes: check a running remote operation (and
/// not start it again), or have a human find out whether it took effect.
fn pending_steps(
    p: &Pending,
    safe_resume: &mut Vec<ResumeStep>,
    unsafe_actions: &mut Vec<UnsafeAction>,
) {
    let name = label(p.tool.as_deref(), p.operation.as_deref());
    let attempt = p
        .attempt
        .map(|a| format!(" (attempt {a})"))
        .unwrap_or_default();
    match p.status {
        PendingStatus::Running => {
            let seen = p
                .observed
                .as_deref()
                .map(|s| format!("; last seen \"{s}\""))
                .unwrap_or_default();
            let remote = p.remote_ref.as_deref().unwrap_or("?");
            safe_resume.push(ResumeStep {
                action: ResumeAction::CheckRemote,
                what: format!("check remote operation {remote} of {name} for completion{seen}"),
                tool: p.tool.clone(),
                operation: p.operation.clone(),
                remote_ref: p.remote_ref.clone(),
                reason: None,
                not_before: p.not_before,
                seq: Some(p.seq),
            });
            if matches!(
                p.effect,
                Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
            ) {
                unsafe_actions.push(UnsafeAction {
                    kind: UnsafeKind::RemoteJobRunning,
                    what: format!(
                        "do not start {name} again: remote operation {remote} is still running"
                    ),
                    tool: p.tool.clone(),
                    operation: p.operation.clone(),
                    attempt: p.attempt,
                    remote_ref: p.remote_ref.clone(),
                    seq: p.seq,
                });
            }
        }
        PendingStatus::Unknown | PendingStatus::Timeout | PendingStatus::NoOutcome => {
            let known = match p.status {
                PendingStatus::Unknown => "its response was lost",
                PendingStatus::Timeout => "it timed out",
                _ => "no outcome was recorded",
            };
            safe_resume.push(ResumeStep {
                action: ResumeAction::AskHuman,
                what: format!(
                    "have a human check at the remote whether {name}{attempt} took effect \
                     ({known}) and record its outcome"
                ),
                tool: p.tool.clone(),
                operation: p.operation.clone(),
                remote_ref: p.remote_ref.clone(),
                reason: Some(Reason::OutcomeUnknownNonIdempotent),
                not_before: None,
                seq: Some(p.seq),
            });
        }
    }
}

/// Non-idempotent writes the core holds unknown (its own, and any a continuation
/// carried over): the gate refuses to repeat them until a human reconciles them.
fn unknown_writes(run: &RunAnalysis) -> Vec<UnsafeAction> {
    let mut unsafe_actions = Vec::new();
    let mut unknown: Vec<_> = run.unknown.values().collect();
    unknown.sort_by_key(|u| u.seq);
    for u in unknown {
        let name = label(u.tool.as_deref(), u.operation.as_deref());
        let attempt = match (&u.from_run, u.attempt) {
            (Some(r), 0) => format!(" (of run {r})"),
            (Some(r), a) => format!(" (attempt {a} of run {r})"),
            (None, a) => format!(" (attempt {a})"),
        };
        let known = match u.status {
            Some(s) if tally_policy::timed_out(s) => "it timed out",
            Some(_) => "its response was lost",
            None => "no outcome was recorded",
        };
        unsafe_actions.push(UnsafeAction {
            kind: UnsafeKind::OutcomeUnknownWrite,
            what: format!(
                "do not repeat {name}{attempt}: {known}, and repeating a \
                 non-idempotent write may do it twice"
            ),
            tool: u.tool.clone(),
            operation: u.operation.clone(),
            attempt: Some(u.attempt).filter(|&a| a > 0),
            remote_ref: None,
            seq: u.seq,
        });
    }
    unsafe_actions
}

/// The refusals only a human can lift: each asks for a human's approval.
fn asks(run: &RunAnalysis) -> Vec<ResumeStep> {
    let mut safe_resume = Vec::new();
    for ask in &run.asks {
        let why = match ask.cause {
            Some(c) => format!("{}: {c}", ask.reason),
            None => ask.reason.to_string(),
        };
        safe_resume.push(ResumeStep {
            action: ResumeAction::AskHuman,
            what: format!(
                "get a human's approval for {} (refused: {why})",
                label(ask.tool.as_deref(), ask.operation.as_deref()),
            ),
            tool: ask.tool.clone(),
            operation: ask.operation.clone(),
            remote_ref: None,
            reason: Some(ask.reason),
            not_before: None,
            seq: Some(ask.seq),
        });
    }
    safe_resume
}

/// What the run's stop (or its last refusal) leaves to do: retry after the back-off,
/// ask a human, or go on in a new run.
fn after_stop(run: &RunAnalysis, stop: &StopReason) -> Option<ResumeStep> {
    let mut safe_resume = None;
    match stop.action {
        Some(Action::Retry) | None => {
            if let Some(b) = run.backoff.as_ref() {
                let name = label(b.tool.as_deref(), b.operation.as_deref());
                safe_resume = Some(ResumeStep {
                    action: ResumeAction::Retry,
                    what: format!("retry {name} once the back-off has passed"),
                    tool: b.tool.clone(),
                    operation: b.operation.clone(),
                    remote_ref: None,
                    reason: Some(b.refused),
                    not_before: Some(b.not_before),
                    seq: Some(b.seq),
                });
            }
        }
        Some(Action::Ask) if run.asks.is_empty() => {
            if let Some(reason) = stop.reason {
                safe_resume = Some(ResumeStep {
                    action: ResumeAction::AskHuman,
                    what: format!("get a human's decision before continuing (stopped: {reason})"),
                    tool: None,
                    operation: None,
                    remote_ref: None,
                    reason: Some(reason),
                    not_before: None,
                    seq: stop.seq,
                });
            }
        }
        Some(Action::Stop) if stop.reason != Some(Reason::Completed) => {
            let reason = stop.reason.map(|r| r.as_str()).unwrap_or("stopped");
            let done = match run.completed_total {
                0 => String::new(),
                n => format!(
                    "; do not redo its {}",
                    count(n, "completed operation", "completed operations")
                ),
            };
            safe_resume = Some(ResumeStep {
                action: ResumeAction::NewRun,
                what: format!("this run cannot go on ({reason}): continue in a new run{done}"),
                tool: None,
                operation: None,
                remote_ref: None,
                reason: stop.reason,
                not_before: None,
                seq: stop.seq,
            });
        }
        Some(Action::Stop) | Some(Action::Ask) => {}
    }
    safe_resume
}

/// Non-idempotent writes the run completed: one line per distinct call (tool,
/// operation, arguments), named so that two different writes of one tool read apart; in
/// the order each last completed.
fn already_done(run: &RunAnalysis) -> Vec<UnsafeAction> {
    let mut unsafe_actions = Vec::new();
    let mut done: Vec<(&crate::analysis::handoff::Completed, u64)> = Vec::new();
    for c in run
        .completed
        .iter()
        .filter(|c| c.effect == Some(Effect::NonIdempotentWrite))
    {
        let same = |p: &&crate::analysis::handoff::Completed| {
            p.tool == c.tool && p.operation == c.operation && p.args_digest == c.args_digest
        };
        match done.iter().position(|(p, _)| same(p)) {
            Some(i) => {
                let (_, n) = done.remove(i);
                done.push((c, n + 1));
            }
            None => done.push((c, 1)),
        }
    }
    for (c, n) in done {
        let mut name = label(c.tool.as_deref(), c.operation.as_deref());
        if let Some(d) = c.args_digest.as_deref() {
            let prefix = d.get(..12).unwrap_or(d);
            name = format!("{name} with arguments {prefix}");
        }
        let remote = c
            .remote_ref
            .as_deref()
            .map(|r| format!(" as {r}"))
            .unwrap_or_default();
        let times = match n {
            1 => String::new(),
            n => format!(
                " ({}, the last at seq {})",
                count(n, "time", "times"),
                c.seq
            ),
        };
        unsafe_actions.push(UnsafeAction {
            kind: UnsafeKind::AlreadyDone,
            what: format!("do not repeat {name}: it already completed{remote}{times}"),
            tool: c.tool.clone(),
            operation: c.operation.clone(),
            attempt: c.attempt,
            remote_ref: c.remote_ref.clone(),
            seq: c.seq,
        });
    }
    unsafe_actions
}

/// A loop the run was in: not to be repeated.
fn looped(l: &Loop) -> UnsafeAction {
    let name = label(l.tool.as_deref(), l.operation.as_deref());
    let what = match l.pattern {
        Pattern::RetryStorm if l.clock == Clock::Wall => {
            let workers = match l.workers.len() {
                0 => String::new(),
                1 => " and 1 worker".to_owned(),
                n => format!(" and {n} workers"),
            };
            format!(
                "do not retry {name} while it keeps failing: {} across {}{workers} \
                 at once (seq {}..{})",
                count(l.failures, "failure", "failures"),
                count(l.runs.len() as u64, "run", "runs"),
                l.first_seq,
                l.last_seq
            )
        }
        Pattern::Polling => format!(
            "do not poll {name} faster than its Retry-After or past its allowance: {} looped (seq {}..{})",
            count(l.count, "poll", "polls"), l.first_seq, l.last_seq
        ),
        Pattern::Alternation => format!(
            "do not go back and forth with {name} again: it alternated with another \
             call {} and nothing changed (seq {}..{})",
            count(l.count, "time", "times"), l.first_seq, l.last_seq
        ),
        Pattern::HighCallCount => format!(
            "do not call {name} at that rate again: {} in {} (seq {}..{})",
            count(l.count, "call", "calls"),
            crate::text::duration(l.span_ms),
            l.first_seq,
            l.last_seq
        ),
        Pattern::ExactRepetition | Pattern::RetryStorm => format!(
            "do not repeat {name} with the same arguments unchanged: it looped {} \
             ({}, seq {}..{})",
            count(l.count, "time", "times"),
            l.pattern.as_str().replace('_', " "),
            l.first_seq,
            l.last_seq
        ),
    };
    UnsafeAction {
        kind: UnsafeKind::LoopedCall,
        what,
        tool: l.tool.clone(),
        operation: l.operation.clone(),
        attempt: None,
        remote_ref: l.remote_ref.clone(),
        seq: l.last_seq,
    }
}

/// The handoff from the run's state at the end and what it leaves to do.
fn handoff(
    run: &RunAnalysis,
    stop: StopReason,
    pending: Vec<Pending>,
    (safe_resume, unsafe_actions): (Vec<ResumeStep>, Vec<UnsafeAction>),
    loops: u64,
    findings: u64,
) -> Handoff {
    let core = &run.core;
    Handoff {
        run: run.name.clone(),
        started: core.started,
        goal: run.goal.clone(),
        parent: run.parent.clone(),
        workers: run.workers.iter().cloned().collect(),
        first_seq: run.first_seq,
        last_seq: run.last_seq,
        last_in: run.last_in.iter().map(|(l, s)| (*l, *s)).collect(),
        stop,
        attempts: Attempts {
            used: core.attempts_used,
            limit: core.attempts_limit(),
            approved_extra: core.extra_attempts,
            refunded: core.attempts_refunded,
            carved_out: core.delegated_attempts,
        },
        spend: Spend {
            reserved_nanos: core.held_nanos,
            settled_nanos: core.settled_nanos,
            limit_nanos: core.spend_limit(),
            approved_extra_nanos: core.extra_nanos,
            overrun_nanos: core.overrun_nanos,
            carved_out_nanos: core.delegated_nanos,
        },
        polls: run
            .polls_used()
            .into_iter()
            .map(|(remote_ref, used)| PollsUsed {
                remote_ref,
                used,
                allowance: core.budget.polls,
            })
            .collect(),
        completed: run.completed.iter().cloned().collect(),
        completed_total: run.completed_total,
        model_calls: run.model_calls.iter().cloned().collect(),
        model_calls_total: run.model_calls_total,
        refused: run.refused.iter().cloned().collect(),
        refused_total: run.refused_total,
        pending,
        last_observed: run.last_observed.clone(),
        safe_resume,
        unsafe_actions,
        loops,
        findings,
        checkpoint: Coverage::Unknown,
        chain: None,
    }
}
