//! Handoff summaries (docs/REPORTS.md): where a run stands, for the human or the next run.

use crate::event::Seq;
use serde::Serialize;
use tally_ledger::{Action, Effect, Reason};

use super::loops::{Clock, Loop, Pattern};
use super::run::RunAnalysis;

/// A moment on both clocks: the run's own, and the ledger's wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct When {
    /// Run time, ms (the run's `at_ms` clock).
    pub run_ms: u64,
    /// Wall time, ms since the Unix epoch.
    pub wall_ms: u64,
}

/// How a run ended, if it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopStatus {
    /// The run wrote a stop record.
    Stopped,
    /// No stop record, but the gate refused a call with a code whose action is stop.
    Refused,
    /// No stop record and no stopping refusal: the run may still be running.
    Running,
}

/// Why the run stopped: the stop record's reason, else the first refusal whose code
/// means stop, else still running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StopReason {
    /// Which of the three it is.
    pub status: StopStatus,
    /// The reason code (absent while running).
    pub reason: Option<Reason>,
    /// What the code tells a caller to do.
    pub action: Option<Action>,
    /// The stop record's (or refusal's) seq.
    pub seq: Option<Seq>,
    /// When it was written.
    pub at: Option<When>,
}

/// A call the run completed: its outcome was `ok` (reads too, and a late `ok` after a
/// timeout), with what it settled; a job a poll found done is listed under the call that
/// started it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Completed {
    /// The seq of the `ok` outcome.
    pub seq: Seq,
    /// The attempt that started it.
    pub attempt: Option<u64>,
    /// Its tool.
    pub tool: Option<String>,
    /// Its logical operation.
    pub operation: Option<String>,
    /// Its side-effect class.
    pub effect: Option<Effect>,
    /// The remote operation id.
    pub remote_ref: Option<String>,
    /// The remote state observed when it completed.
    pub observed: Option<String>,
    /// What it settled, cents (what it cost).
    pub settled_cents: u64,
    /// When it completed.
    pub at: When,
}

/// What is known about external work not yet resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingStatus {
    /// Accepted, still running remotely.
    Running,
    /// The response was lost.
    Unknown,
    /// No response in time.
    Timeout,
    /// A write was allowed and no outcome was ever recorded.
    NoOutcome,
}

/// External work started and not resolved by a later outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pending {
    /// The seq of the latest record about it.
    pub seq: Seq,
    /// The attempt that started it.
    pub attempt: Option<u64>,
    /// Its tool.
    pub tool: Option<String>,
    /// Its logical operation.
    pub operation: Option<String>,
    /// Its side-effect class.
    pub effect: Option<Effect>,
    /// The remote operation id.
    pub remote_ref: Option<String>,
    /// What is known.
    pub status: PendingStatus,
    /// The last observed remote state.
    pub observed: Option<String>,
    /// When that was last learned.
    pub since: When,
    /// The upstream's Retry-After for it, as a moment.
    pub not_before: Option<When>,
}

/// The last remote state the run observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// The state.
    pub state: String,
    /// The remote operation it is about.
    pub remote_ref: Option<String>,
    /// The outcome's seq.
    pub seq: Seq,
    /// When it was observed.
    pub at: When,
}

/// Attempts used of the limit in force, as the policy core counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Attempts {
    /// Allowed calls less refunded slots (polls and exempt calls use none).
    pub used: u64,
    /// The limit in force: `budget.attempts`, plus what approvals granted, less what was
    /// carved out for child runs (`null`: no limit).
    pub limit: Option<u64>,
    /// Attempts granted by approvals the run used.
    pub approved_extra: u64,
    /// Slots given back by refunds and `rejected` outcomes.
    pub refunded: u64,
    /// Attempts carved out for child runs.
    pub carved_out: u64,
}

/// Spend reserved and settled, as the policy core counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Spend {
    /// Cents held: reserved by allowed calls not yet settled.
    pub reserved_cents: u64,
    /// Cents settled by outcomes.
    pub settled_cents: u64,
    /// The limit in force: `budget.spend_cents`, plus what approvals granted, less what
    /// was carved out for child runs (`null`: no limit).
    pub limit_cents: Option<u64>,
    /// Cents granted by approvals the run used.
    pub approved_extra_cents: u64,
    /// Cents settled above their calls' reservations (the upstream billed more than was
    /// reserved). After an overrun the gate allows no call until a human grants cents.
    pub overrun_cents: u64,
    /// Cents carved out for child runs.
    pub carved_out_cents: u64,
}

/// Polls of one remote operation against the allowance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PollsUsed {
    /// The remote operation.
    pub remote_ref: String,
    /// Polls allowed of it.
    pub used: u64,
    /// The run's allowance per remote operation (`budget.polls`).
    pub allowance: Option<u64>,
}

/// What a resume step asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeAction {
    /// The run never wrote a stop: make sure none of its workers still runs.
    ConfirmStopped,
    /// Check a remote operation before doing anything that depends on it.
    CheckRemote,
    /// A human must decide (approve, or check remote state) first.
    AskHuman,
    /// Retry the refused call, not before `not_before`.
    Retry,
    /// This run's budget is spent: continue in a new run with a new budget.
    NewRun,
    /// The run completed; nothing to resume.
    Nothing,
}

/// One thing that is safe to do next, and not before when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResumeStep {
    /// What kind of step.
    pub action: ResumeAction,
    /// The step in words.
    pub what: String,
    /// The tool concerned.
    pub tool: Option<String>,
    /// The operation concerned.
    pub operation: Option<String>,
    /// The remote operation concerned.
    pub remote_ref: Option<String>,
    /// The reason code that calls for it.
    pub reason: Option<Reason>,
    /// Not before this moment (an upstream Retry-After or a refusal's back-off).
    pub not_before: Option<When>,
    /// The record that calls for it.
    pub seq: Option<Seq>,
}

/// Why an action must not be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnsafeKind {
    /// A non-idempotent write whose outcome is unknown: repeating may do it twice.
    OutcomeUnknownWrite,
    /// A non-idempotent write that completed: repeating does it twice.
    AlreadyDone,
    /// The remote job a write started is still running: do not start it again.
    RemoteJobRunning,
    /// The call looped: repeating it unchanged will loop again.
    LoopedCall,
}

/// Something the next run must not repeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnsafeAction {
    /// Why.
    pub kind: UnsafeKind,
    /// The warning in words.
    pub what: String,
    /// The tool.
    pub tool: Option<String>,
    /// The operation.
    pub operation: Option<String>,
    /// The attempt concerned.
    pub attempt: Option<u64>,
    /// The remote operation concerned.
    pub remote_ref: Option<String>,
    /// The record that shows it.
    pub seq: Seq,
}

/// Whether a signed checkpoint covers the run's last record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Coverage {
    /// Not yet determined (the verifier did not say).
    Unknown,
    /// A checkpoint over the first `size` entries covers every record of the run.
    Covered {
        /// Entries the checkpoint seals.
        size: u64,
        /// The chain head it signs, hex.
        head: String,
        /// The key epoch that signed it.
        epoch: u32,
    },
    /// The run's last record is in the unsealed tail: not yet covered by a checkpoint.
    NotYetSealed {
        /// Entries the latest checkpoint seals.
        sealed_size: u64,
    },
    /// A merged audit: in each ledger that has records of the run, whether a checkpoint
    /// covers them.
    Ledgers {
        /// One per ledger with records of the run, in the order the ledgers were given.
        ledgers: Vec<LedgerCoverage>,
    },
}

/// Whether one ledger's checkpoint covers a run's records in that ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerCoverage {
    /// The ledger, from 1 in the order given.
    pub ledger: u16,
    /// The run's last seq in it.
    pub last_seq: u64,
    /// Whether the ledger's latest checkpoint covers it.
    pub covered: bool,
    /// Entries that checkpoint seals.
    pub size: u64,
    /// The chain head it signs, hex (none if the ledger has no valid checkpoint).
    pub head: Option<String>,
    /// The key epoch that signed it.
    pub epoch: Option<u32>,
}

/// Where a run stands: what a careful operator would write for the next person, and
/// what the next run loads to continue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Handoff {
    /// The run.
    pub run: String,
    /// Whether the ledger holds the run's start record.
    pub started: bool,
    /// Its goal, from its start record (`null` without a start record, or a start
    /// record that gives none).
    pub goal: Option<String>,
    /// Its parent run.
    pub parent: Option<String>,
    /// Workers that wrote for it (at most 16 named).
    pub workers: Vec<String>,
    /// Its first record.
    pub first_seq: Seq,
    /// Its last record.
    pub last_seq: Seq,
    /// Its last seq in each ledger that has it (a merged audit's coverage).
    #[serde(skip)]
    pub last_in: Vec<(u16, u64)>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Attempts used of the limit.
    pub attempts: Attempts,
    /// Spend reserved and settled.
    pub spend: Spend,
    /// Polls used of each remote operation the run polled.
    pub polls: Vec<PollsUsed>,
    /// Completed calls (the latest 50).
    pub completed: Vec<Completed>,
    /// All completed calls, listed or not.
    pub completed_total: u64,
    /// External work not resolved.
    pub pending: Vec<Pending>,
    /// The last remote state observed.
    pub last_observed: Option<Observed>,
    /// What is safe to do next.
    pub safe_resume: Vec<ResumeStep>,
    /// What must not be repeated.
    pub unsafe_actions: Vec<UnsafeAction>,
    /// Loops found in the run.
    pub loops: u64,
    /// Audit findings about the run.
    pub findings: u64,
    /// The checkpoint that covers the run.
    pub checkpoint: Coverage,
}

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
    // Non-idempotent writes the core holds unknown (its own, and any a continuation
    // carried over): the gate refuses to repeat them until a human reconciles them.
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
            Some(tally_ledger::Status::Timeout) => "it timed out",
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
    for ask in &run.asks {
        safe_resume.push(ResumeStep {
            action: ResumeAction::AskHuman,
            what: format!(
                "get a human's approval for {} (refused: {})",
                label(ask.tool.as_deref(), ask.operation.as_deref()),
                ask.reason
            ),
            tool: ask.tool.clone(),
            operation: ask.operation.clone(),
            remote_ref: None,
            reason: Some(ask.reason),
            not_before: None,
            seq: Some(ask.seq),
        });
    }
    match stop.action {
        Some(Action::Retry) | None => {
            if let Some(b) = run.backoff.as_ref() {
                let name = label(b.tool.as_deref(), b.operation.as_deref());
                safe_resume.push(ResumeStep {
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
                safe_resume.push(ResumeStep {
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
            safe_resume.push(ResumeStep {
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

    for c in run
        .completed
        .iter()
        .filter(|c| c.effect == Some(Effect::NonIdempotentWrite))
    {
        let name = label(c.tool.as_deref(), c.operation.as_deref());
        let remote = c
            .remote_ref
            .as_deref()
            .map(|r| format!(" as {r}"))
            .unwrap_or_default();
        unsafe_actions.push(UnsafeAction {
            kind: UnsafeKind::AlreadyDone,
            what: format!("do not repeat {name}: it already completed{remote}"),
            tool: c.tool.clone(),
            operation: c.operation.clone(),
            attempt: c.attempt,
            remote_ref: c.remote_ref.clone(),
            seq: c.seq,
        });
    }
    for l in loops {
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
        unsafe_actions.push(UnsafeAction {
            kind: UnsafeKind::LoopedCall,
            what,
            tool: l.tool.clone(),
            operation: l.operation.clone(),
            attempt: None,
            remote_ref: l.remote_ref.clone(),
            seq: l.last_seq,
        });
    }

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
            reserved_cents: core.held_cents,
            settled_cents: core.settled_cents,
            limit_cents: core.spend_limit(),
            approved_extra_cents: core.extra_cents,
            overrun_cents: core.overrun_cents,
            carved_out_cents: core.delegated_cents,
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
        pending,
        last_observed: run.last_observed.clone(),
        safe_resume,
        unsafe_actions,
        loops: loops.len() as u64,
        findings,
        checkpoint: Coverage::Unknown,
    }
}
