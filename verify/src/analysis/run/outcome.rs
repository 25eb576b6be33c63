//! What a run's outcomes tell: the remote operations its calls registered, the calls it
//! completed, the work still pending, the writes the core holds unknown, the polls used.

use std::sync::Arc;

use tally_ledger::{Effect, Status};
use tally_policy::state::ref_key;

use super::RunAnalysis;
use crate::analysis::handoff::{Completed, ModelCall, Observed, Pending, PendingStatus, When};
use crate::analysis::loops::{Loop, OutcomeFacts, ToolStorms};
use crate::analysis::names::CallNames;
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

/// What the steps of an outcome read of the call it settles, once the call is updated.
struct Settles {
    attempt: u64,
    names: Arc<CallNames>,
    /// The call's place among the run's recent calls, and its series' keys.
    ring: Option<u64>,
    call_key: Option<u64>,
    op: u64,
    poll: Option<u64>,
    tool: u64,
    /// The remote operation: a poll's own, else the one the call registered.
    remote: Option<u64>,
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
        let Some(call) = self.open.get_mut(&attempt) else {
            return;
        };
        call.settled = call.settled.saturating_add(settled);
        call.seq = e.seq;
        call.at = at;
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
        let s = Settles {
            attempt,
            names: Arc::clone(&call.names),
            ring: call.ring,
            call_key: call.call_key,
            op: call.op,
            poll: call.poll,
            tool: call.tool,
            remote,
        };
        if call.model {
            let model = call.model_name.as_deref().map(str::to_owned);
            self.list_model_call(e, at, &s, &facts, model);
        }
        self.count_first(&s, &facts);
        self.feed_series(&s, &facts, e.wall_ms, storms, policy, loops);
        self.track_job(e, at, &s, &remote_name);
        self.observe(e, at, &remote_name);
        self.hold_unknown(e, &s, status);
        if tally_policy::is_success(status) {
            self.complete(e, at, &s, remote_name);
        }
    }

    /// A model call's outcome: what it settled counts to the run's model spend, and the
    /// call is listed.
    fn list_model_call(
        &mut self,
        e: &Event,
        at: When,
        s: &Settles,
        facts: &OutcomeFacts,
        model: Option<String>,
    ) {
        let d = &e.decision;
        self.model_settled = self.model_settled.saturating_add(facts.settled);
        super::listed(
            &mut self.model_calls,
            &mut self.model_calls_total,
            ModelCall {
                seq: e.seq,
                attempt: s.attempt,
                upstream: s.names.tool.as_deref().map(str::to_owned),
                model,
                status: facts.status,
                usage: d.usage.as_deref().copied(),
                settled_nanos: facts.settled,
                overrun_nanos: d.overrun_nanos,
                usage_refused: d.usage_refused,
                at,
            },
        );
    }

    /// The call among the run's recent ones, if the core still looks back at it: what
    /// it settled, and whether it failed.
    fn count_first(&mut self, s: &Settles, facts: &OutcomeFacts) {
        if let Some(f) = s
            .ring
            .and_then(|pos| pos.checked_sub(self.firsts_popped))
            .and_then(|i| self.firsts.get_mut(i as usize))
        {
            f.settled = f.settled.saturating_add(facts.settled);
            if tally_policy::is_failure(facts.status) {
                f.failures += 1;
            }
        }
    }

    /// The outcome, fed to the series its call is in: identical calls, retries, polls,
    /// the tool's calls, and the tool's storms across runs.
    fn feed_series(
        &mut self,
        s: &Settles,
        facts: &OutcomeFacts,
        wall_ms: u64,
        storms: &mut ToolStorms,
        policy: &tally_policy::Policy,
        loops: &mut Vec<Loop>,
    ) {
        if let Some(k) = s.call_key {
            if let Some(series) = self.calls.get_mut(&k) {
                series.outcome(facts);
            }
            if let Some(series) = self.retries.get_mut(&s.op) {
                series.outcome(facts);
            }
        }
        if let Some(r) = s.poll {
            if let Some(series) = self.polls.get_mut(&r) {
                series.outcome(facts);
            }
        }
        if let Some(tool) = s.names.tool.clone() {
            if s.poll.is_none() {
                if let Some(series) = self.bursts.get_mut(&s.tool) {
                    series.outcome(facts);
                }
            }
            storms.outcome(policy, &tool, &self.name, s.attempt, facts, wall_ms, loops);
        }
    }

    /// The remote operation the outcome is news of: registered by a call's outcome, or
    /// polled; its latest record, what was observed of it, when to look again.
    fn track_job(&mut self, e: &Event, at: When, s: &Settles, remote_name: &Option<String>) {
        let d = &e.decision;
        let not_before = d.retry_after_ms.map(|ra| When {
            run_ms: at.run_ms.saturating_add(ra),
            wall_ms: at.wall_ms.saturating_add(ra),
        });
        let job = match (s.remote, s.poll) {
            (Some(r), None) => Some(self.jobs.entry(r).or_insert_with(|| Job {
                name: Box::from(remote_name.as_deref().unwrap_or_default()),
                attempt: s.attempt,
                seq: e.seq,
                at,
                observed: None,
                not_before: None,
                finished: false,
            })),
            (Some(r), Some(_)) => self.jobs.get_mut(&r),
            (None, _) => None,
        };
        if let Some(job) = job {
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

    /// The last state the run observed of a remote operation.
    fn observe(&mut self, e: &Event, at: When, remote_name: &Option<String>) {
        let Some(state) = &e.decision.observed else {
            return;
        };
        // Most outcomes observe what the one before did: its strings are kept.
        match &mut self.last_observed {
            Some(o) => {
                if o.state != *state {
                    o.state.clone_from(state);
                }
                if o.remote_ref != *remote_name {
                    o.remote_ref.clone_from(remote_name);
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

    /// A non-idempotent write whose outcome the core now holds unknown: its names. The
    /// writes the core no longer holds unknown are let go.
    fn hold_unknown(&mut self, e: &Event, s: &Settles, status: Status) {
        if self.core.unknown.get(&s.op) == Some(&s.attempt) {
            self.unknown.insert(
                s.op,
                UnknownWrite {
                    attempt: s.attempt,
                    tool: s.names.tool.as_deref().map(str::to_owned),
                    operation: s.names.operation.as_deref().map(str::to_owned),
                    seq: e.seq,
                    status: Some(status),
                    from_run: None,
                },
            );
        }
        self.unknown
            .retain(|op, _| self.core.unknown.contains_key(op));
    }

    /// A successful outcome completes its call; a poll that finds its job done completes
    /// the call that started the job. The completion is listed.
    fn complete(&mut self, e: &Event, at: When, s: &Settles, remote_name: Option<String>) {
        let d = &e.decision;
        let done = if s.poll.is_some() {
            // A poll that finds its job done completes the call that started it.
            let job = s
                .remote
                .and_then(|r| self.jobs.get_mut(&r))
                .filter(|j| !j.finished);
            job.map(|j| {
                j.finished = true;
                j.attempt
            })
        } else {
            Some(s.attempt)
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
