//! What a run's outcomes tell: the remote operations its calls registered, the calls it
//! completed, the work still pending, the writes the core holds unknown, the polls used.

use tally_ledger::{Effect, Status};
use tally_policy::state::{call_id, ref_key};

use super::RunAnalysis;
use crate::analysis::handoff::{Completed, ModelCall, Observed, Pending, PendingStatus, When};
use crate::analysis::loops::{Loop, OutcomeFacts, ToolStorms};
use crate::event::Seq;
use crate::Event;

/// A remote operation the run registered: its name, and what is known of it.
#[derive(Clone, Debug)]
pub(super) struct Job {
    pub(super) name: Box<str>,
    /// The attempt whose outcome registered it.
    pub(super) attempt: u64,
    /// The latest outcome about it (its own call's, or a poll's), and when.
    pub(super) seq: Seq,
    pub(super) at: When,
    pub(super) observed: Option<String>,
    pub(super) not_before: Option<When>,
    /// A poll of it finished `ok`: the job is done.
    pub(super) finished: bool,
}

/// A non-idempotent write whose outcome the core holds unknown: what to call it.
#[derive(Clone, Debug)]
pub(crate) struct UnknownWrite {
    pub attempt: u64,
    pub tool: Option<String>,
    pub operation: Option<String>,
    pub seq: Seq,
    pub status: Option<Status>,
    /// The run it was carried over from (a continuation).
    pub from_run: Option<String>,
}

impl RunAnalysis {
    pub(super) fn outcome(
        &mut self,
        e: &Event,
        at: When,
        storms: &mut ToolStorms,
        policy: &tally_policy::Policy,
        loops: &mut Vec<Loop>,
    ) {
        let d = &e.decision;
        let (Some(status), Some(attempt)) = (d.status, d.attempt) else {
            return;
        };
        let settled = d.settled().map_or(0, |n| n.0);
        let facts = OutcomeFacts {
            seq: e.seq,
            status,
            settled,
            observed: d.observed.as_deref(),
        };
        let not_before = d.retry_after_ms.map(|ra| When {
            run_ms: at.run_ms.saturating_add(ra),
            wall_ms: at.wall_ms.saturating_add(ra),
        });
        let Some(call) = self.open.get_mut(&attempt) else {
            return;
        };
        call.settled = call.settled.saturating_add(settled);
        if call.model {
            self.model_settled = self.model_settled.saturating_add(settled);
            super::listed(
                &mut self.model_calls,
                &mut self.model_calls_total,
                ModelCall {
                    seq: e.seq,
                    attempt,
                    upstream: call.names.tool.as_deref().map(str::to_owned),
                    model: call.model_name.as_deref().map(str::to_owned),
                    status,
                    usage: d.usage,
                    settled_nanos: settled,
                    overrun_nanos: d.overrun_nanos,
                    usage_refused: d.usage_refused,
                    at,
                },
            );
        }
        call.seq = e.seq;
        call.at = at;
        if let Some(f) = call
            .ring
            .and_then(|pos| pos.checked_sub(self.firsts_popped))
            .and_then(|i| self.firsts.get_mut(i as usize))
        {
            f.settled = f.settled.saturating_add(settled);
            if tally_policy::is_failure(status) {
                f.failures += 1;
            }
        }
        if let Some(k) = call.call_key {
            if let Some(s) = self.calls.get_mut(&k) {
                s.outcome(&facts);
            }
            if let Some(s) = self.retries.get_mut(&call.op) {
                s.outcome(&facts);
            }
        }
        if let Some(r) = call.poll {
            if let Some(s) = self.polls.get_mut(&r) {
                s.outcome(&facts);
            }
        }
        if let Some(tool) = call.names.tool.clone() {
            if call.poll.is_none() {
                if let Some(s) = self.bursts.get_mut(&call.tool) {
                    s.outcome(&facts);
                }
            }
            let id = call_id(&self.name, attempt);
            storms.outcome(policy, &tool, &self.name, id, &facts, e.wall_ms, loops);
        }
        // The remote operation: a poll's own, else the one this call's outcome
        // registered with the core.
        let remote = match call.poll {
            Some(r) => Some(r),
            None => {
                // One remote operation per counted call, as the core registers it.
                if call.counted && call.remote_ref.is_none() {
                    call.remote_ref = d.remote_ref.as_deref().map(Box::from);
                }
                call.remote_ref.as_deref().map(ref_key)
            }
        };
        let remote_name = match (call.poll, &call.remote_ref) {
            (None, Some(n)) => Some(n.to_string()),
            (Some(r), _) => self.jobs.get(&r).map(|j| j.name.to_string()),
            (None, None) => d.remote_ref.clone(),
        };
        if let (Some(r), None) = (remote, call.poll) {
            let job = self.jobs.entry(r).or_insert_with(|| Job {
                name: Box::from(remote_name.as_deref().unwrap_or_default()),
                attempt,
                seq: e.seq,
                at,
                observed: None,
                not_before: None,
                finished: false,
            });
            job.seq = e.seq;
            job.at = at;
            if d.observed.is_some() && job.observed != d.observed {
                job.observed.clone_from(&d.observed);
            }
            if not_before.is_some() {
                job.not_before = not_before;
            }
        }
        let is_poll = call.poll.is_some();
        if let (Some(r), true) = (remote, is_poll) {
            if let Some(job) = self.jobs.get_mut(&r) {
                job.seq = e.seq;
                job.at = at;
                if d.observed.is_some() && job.observed != d.observed {
                    job.observed.clone_from(&d.observed);
                }
                if not_before.is_some() {
                    job.not_before = not_before;
                }
            }
        }
        if let Some(state) = &d.observed {
            // Most outcomes observe what the one before did: its strings are kept.
            match &mut self.last_observed {
                Some(o) => {
                    if o.state != *state {
                        o.state.clone_from(state);
                    }
                    if o.remote_ref != remote_name {
                        o.remote_ref.clone_from(&remote_name);
                    }
                    o.seq = e.seq;
                    o.at = at;
                }
                None => {
                    self.last_observed = Some(Observed {
                        state: state.clone(),
                        remote_ref: remote_name.clone(),
                        seq: e.seq,
                        at,
                    });
                }
            }
        }
        // A non-idempotent write whose outcome the core now holds unknown: its names.
        let op = call.op;
        if self.core.unknown.get(&op) == Some(&attempt) {
            self.unknown.insert(
                op,
                UnknownWrite {
                    attempt,
                    tool: call.names.tool.as_deref().map(str::to_owned),
                    operation: call.names.operation.as_deref().map(str::to_owned),
                    seq: e.seq,
                    status: Some(status),
                    from_run: None,
                },
            );
        }
        self.unknown
            .retain(|op, _| self.core.unknown.contains_key(op));
        if tally_policy::is_success(status) {
            let done = if is_poll {
                // A poll that finds its job done completes the call that started it.
                let job = remote
                    .and_then(|r| self.jobs.get_mut(&r))
                    .filter(|j| !j.finished);
                job.map(|j| {
                    j.finished = true;
                    j.attempt
                })
            } else {
                Some(attempt)
            };
            // Described from the open call in place: its names are copied once, into
            // the listed completion.
            if let Some((a, o)) = done.and_then(|a| self.open.get(&a).map(|o| (a, o))) {
                self.completed_total += 1;
                if self.completed.len() >= super::MAX_LISTED {
                    self.completed.pop_front();
                }
                self.completed.push_back(Completed {
                    seq: e.seq,
                    attempt: Some(a),
                    tool: o.names.tool.as_deref().map(str::to_owned),
                    operation: o.names.operation.as_deref().map(str::to_owned),
                    args_digest: o.args_digest.as_deref().map(str::to_owned),
                    effect: o.effect,
                    remote_ref: remote_name,
                    observed: d.observed.clone(),
                    settled_nanos: o.settled,
                    at,
                });
            }
        }
    }
    /// Carry over the names of the unknown writes of the run this one continues (the
    /// core carried the writes themselves).
    pub fn carry_names(&mut self, old: &RunAnalysis) {
        for (op, u) in &old.unknown {
            if self.core.unknown.contains_key(op) {
                let mut u = u.clone();
                u.from_run.get_or_insert_with(|| old.name.clone());
                self.unknown.insert(*op, u);
            }
        }
        // Writes the old run never heard back from: the core carried them too.
        for o in old.open.values() {
            if o.effect == Some(Effect::NonIdempotentWrite) && self.core.unknown.contains_key(&o.op)
            {
                self.unknown.entry(o.op).or_insert_with(|| UnknownWrite {
                    attempt: 0,
                    tool: o.names.tool.as_deref().map(str::to_owned),
                    operation: o.names.operation.as_deref().map(str::to_owned),
                    seq: o.seq,
                    status: None,
                    from_run: Some(old.name.clone()),
                });
            }
        }
    }
    /// Pending work, from the attempts the core holds open: jobs still running, writes
    /// whose outcome is unknown or timed out, writes with no outcome at all.
    pub fn pending_work(&self) -> Vec<Pending> {
        let mut out = Vec::new();
        for (attempt, a) in &self.core.open {
            // A poll's own outcome is news of the job it polls, not work of its own.
            let Some(o) = self.open.get(attempt).filter(|o| o.poll.is_none()) else {
                continue;
            };
            let write = matches!(
                a.effect,
                Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
            );
            let job = o
                .remote_ref
                .as_deref()
                .map(ref_key)
                .and_then(|r| self.jobs.get(&r));
            let status = match a.status {
                Some(s) if tally_policy::is_running(s) => match job {
                    Some(j) if j.finished => continue,
                    _ => PendingStatus::Running,
                },
                Some(s) if tally_policy::may_have_happened(s) && a.effect != Some(Effect::Read) => {
                    if tally_policy::timed_out(s) {
                        PendingStatus::Timeout
                    } else {
                        PendingStatus::Unknown
                    }
                }
                None if write => PendingStatus::NoOutcome,
                _ => continue,
            };
            let (seq, since) = match job {
                Some(j) if j.seq > o.seq => (j.seq, j.at),
                _ => (o.seq, o.at),
            };
            out.push(Pending {
                seq,
                attempt: Some(*attempt),
                tool: o.names.tool.as_deref().map(str::to_owned),
                operation: o.names.operation.as_deref().map(str::to_owned),
                effect: o.effect,
                remote_ref: o.remote_ref.as_deref().map(str::to_owned),
                status,
                observed: job.and_then(|j| j.observed.clone()),
                since,
                not_before: job.and_then(|j| j.not_before),
            });
        }
        out.sort_by_key(|p| p.seq);
        out
    }
    /// Polls used of each remote operation the core remembers, by name.
    pub fn polls_used(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .core
            .refs
            .iter()
            .filter(|(_, r)| r.polls > 0)
            .map(|(k, r)| {
                let name = self
                    .jobs
                    .get(k)
                    .map_or_else(String::new, |j| j.name.to_string());
                (name, r.polls)
            })
            .collect();
        out.sort();
        out
    }
}
