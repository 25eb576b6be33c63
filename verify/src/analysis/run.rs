//! One run's state while the ledger streams by: its budget and what it has used, its
//! open attempts, pending work, overrides, and the loop windows of its calls.

use crate::event::Seq;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tally_ledger::decision::Budget;
use tally_ledger::{Action, Decision, Effect, Kind, Reason, Status};
use tally_policy::LoopRule;

use super::audit::{self, Approvable, AuditFinding, AuditKind, Dimension, Excess, Override};
use super::handoff::{Completed, Observed, Pending, PendingStatus, StopReason, StopStatus, When};
use super::loops::{
    Burst, CallFacts, CallSeries, Close, Loop, OutcomeFacts, PollSeries, ToolResult, ToolStorms,
};
use super::Config;
use crate::Event;

/// Most workers a handoff names.
const MAX_WORKERS: usize = 16;
/// Records of a run between sweeps of its silent loop windows.
const SWEEP_EVERY: u32 = 512;

/// Most distinct names, and combinations of a call's names, [`Names`] shares before it
/// starts afresh.
const MAX_SHARED_NAMES: usize = 4096;

/// What the analysis emits while streaming, and the names its runs share.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub loops: Vec<Loop>,
    pub findings: Vec<AuditFinding>,
    pub findings_omitted: u64,
    pub names: Names,
}

/// Tool, operation and worker names, one allocation each however many open attempts
/// and loop windows hold them, and one per combination a call has. Bounded: when full it
/// forgets them all (sharing saves memory only; nothing is decided by it).
#[derive(Debug, Default)]
pub(crate) struct Names {
    text: HashSet<Arc<str>>,
    /// By the addresses of the shared names: each stays allocated while its entry holds it.
    calls: HashMap<[usize; 3], Arc<CallNames>>,
}

impl Names {
    fn get(&mut self, name: Option<&str>) -> Option<Arc<str>> {
        let name = name?;
        if let Some(shared) = self.text.get(name) {
            return Some(Arc::clone(shared));
        }
        if self.text.len() >= MAX_SHARED_NAMES {
            self.text.clear();
        }
        let shared: Arc<str> = Arc::from(name);
        self.text.insert(Arc::clone(&shared));
        Some(shared)
    }

    /// A call's names, shared with every call that has the same.
    pub fn call(
        &mut self,
        tool: Option<&str>,
        operation: Option<&str>,
        worker: Option<&str>,
    ) -> Arc<CallNames> {
        let names = CallNames {
            tool: self.get(tool),
            operation: self.get(operation),
            worker: self.get(worker),
        };
        let address = |n: &Option<Arc<str>>| {
            n.as_ref()
                .map_or(0, |n| Arc::as_ptr(n).cast::<u8>() as usize)
        };
        let id = [&names.tool, &names.operation, &names.worker].map(address);
        if let Some(shared) = self.calls.get(&id) {
            return Arc::clone(shared);
        }
        if self.calls.len() >= MAX_SHARED_NAMES {
            self.calls.clear();
        }
        let shared = Arc::new(names);
        self.calls.insert(id, Arc::clone(&shared));
        shared
    }
}

/// A name as the reports carry it.
fn owned(name: &Option<Arc<str>>) -> Option<String> {
    name.as_deref().map(str::to_owned)
}

/// An argument digest: its 32 bytes when it is 64 lowercase hex characters (as every
/// valid record's is), else the text as given.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Digest {
    Bytes([u8; 32]),
    Text(Box<str>),
}

impl Digest {
    pub fn new(text: &str) -> Digest {
        let mut bytes = [0u8; 32];
        let lower_hex = text.len() == 64
            && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && hex::decode_to_slice(text, &mut bytes).is_ok();
        if lower_hex {
            Digest::Bytes(bytes)
        } else {
            Digest::Text(text.into())
        }
    }

    pub fn text(&self) -> String {
        match self {
            Digest::Bytes(b) => hex::encode(b),
            Digest::Text(t) => t.to_string(),
        }
    }
}

/// Identical calls of a run: the same tool and argument digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SeriesKey {
    pub tool: Arc<str>,
    pub digest: Digest,
}

/// Which loop window an attempt's outcome belongs to.
#[derive(Clone, Debug)]
enum Track {
    None,
    /// The series of its tool (the call's) and this digest.
    Series(Digest),
    Poll(String),
}

/// An allowed attempt awaiting its (final) outcome: one per open attempt, up to
/// `max_open_attempts` per run, so it keeps only what an outcome or the handoff reads.
#[derive(Clone, Debug)]
struct Call {
    names: Arc<CallNames>,
    effect: Option<Effect>,
    outcome_seen: bool,
    reserve: u64,
    track: Track,
    /// What only a write needs (the handoff's `no_outcome`, a repeat after `unknown`).
    write: Option<Box<WriteCall>>,
}

/// The rest of an allowed write.
#[derive(Clone, Debug)]
struct WriteCall {
    seq: Seq,
    at: When,
    args_digest: Option<String>,
    idempotency_key: Option<String>,
}

/// A call's names, shared ([`Names`]).
#[derive(Debug)]
pub(crate) struct CallNames {
    tool: Option<Arc<str>>,
    operation: Option<Arc<str>>,
    worker: Option<Arc<str>>,
}

impl Call {
    fn series_key(&self) -> Option<SeriesKey> {
        match (&self.track, &self.names.tool) {
            (Track::Series(digest), Some(tool)) => Some(SeriesKey {
                tool: Arc::clone(tool),
                digest: digest.clone(),
            }),
            _ => None,
        }
    }
}

/// A non-idempotent write whose outcome is unknown.
#[derive(Clone, Debug)]
struct UnknownWrite {
    attempt: Option<u64>,
    outcome_seq: Seq,
    status: Status,
    tool: Option<String>,
    operation: Option<String>,
    args_digest: Option<String>,
    idempotency_key: Option<String>,
    /// A human override matching it came after the unknown outcome.
    cleared: bool,
}

/// A remote operation the run has seen, so later calls naming it are polls.
#[derive(Clone, Debug, Default)]
struct RemoteRef {
    observed: Option<String>,
    backoff_until: Option<u64>,
}

/// A stop record or stopping refusal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Halt {
    pub reason: Reason,
    pub seq: Seq,
    pub at: When,
}

/// The latest back-off the run was told to honour.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    pub not_before: When,
    pub tool: Option<String>,
    pub operation: Option<String>,
    /// The refusal's code; `None` for an upstream Retry-After on an outcome.
    pub refused: Option<Reason>,
    pub seq: Seq,
}

/// A refusal that only a human can lift, not yet followed by an allow of that call.
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub tool: Option<String>,
    pub operation: Option<String>,
    pub reason: Reason,
    pub seq: Seq,
}

/// One run's state.
#[derive(Debug)]
pub(crate) struct RunState {
    pub name: String,
    pub started: bool,
    pub goal: Option<String>,
    pub parent: Option<String>,
    pub budget: Budget,
    origin_wall: u64,
    pub first_seq: Seq,
    pub last_seq: Seq,
    /// In a merged audit, the run's last seq in each ledger that has it.
    pub last_in: BTreeMap<u16, u64>,
    pub workers: BTreeSet<String>,
    pub stop: Option<Halt>,
    first_stop_refusal: Option<Halt>,
    /// The budget as docs/GATE.md, how a budget is counted counts it: the policy core's own fold, the one the gate
    /// and the replay use.
    pub core: tally_policy::RunState,
    /// The policy the run was started under (for a run the gate governs: the recorded
    /// one, whose approvers' signatures the fold checks), else the budget-only default.
    pub policy: std::sync::Arc<tally_policy::Policy>,
    pub uses_granted: u64,
    pub cents_granted: u64,
    /// Boxed, so the map's nodes stay small.
    open: BTreeMap<u64, Box<Call>>,
    overrides: Vec<Override>,
    unknown_writes: HashMap<String, UnknownWrite>,
    pending: BTreeMap<String, Pending>,
    pub completed: VecDeque<Completed>,
    pub completed_total: u64,
    pub last_observed: Option<Observed>,
    pub backoff: Option<Backoff>,
    pub asks: Vec<Ask>,
    refs: HashMap<String, RemoteRef>,
    /// Boxed: most windows are short-lived, and the map's spare room stays small.
    series: HashMap<SeriesKey, Box<CallSeries>>,
    poll_series: HashMap<String, PollSeries>,
    bursts: HashMap<Arc<str>, Burst>,
    since_sweep: u32,
    pub findings: u64,
}

fn is_write(effect: Option<Effect>) -> bool {
    matches!(
        effect,
        Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
    )
}

/// The key identical writes share: tool and argument digest (else operation).
fn write_key(tool: Option<&str>, digest: Option<&str>, operation: Option<&str>) -> String {
    format!(
        "{}\u{0}{}",
        tool.unwrap_or(""),
        digest.or(operation).unwrap_or("")
    )
}

impl RunState {
    /// `policy` is the one a run without a recorded policy is read under.
    pub fn new(name: &str, e: &Event, policy: &std::sync::Arc<tally_policy::Policy>) -> RunState {
        RunState {
            name: name.to_owned(),
            started: false,
            goal: None,
            parent: None,
            budget: Budget::default(),
            origin_wall: e.wall_ms,
            first_seq: e.seq,
            last_seq: e.seq,
            last_in: BTreeMap::new(),
            workers: BTreeSet::new(),
            stop: None,
            first_stop_refusal: None,
            core: tally_policy::RunState::new(name),
            policy: std::sync::Arc::clone(policy),
            uses_granted: 0,
            cents_granted: 0,
            open: BTreeMap::new(),
            overrides: Vec::new(),
            unknown_writes: HashMap::new(),
            pending: BTreeMap::new(),
            completed: VecDeque::new(),
            completed_total: 0,
            last_observed: None,
            backoff: None,
            asks: Vec::new(),
            refs: HashMap::new(),
            series: HashMap::new(),
            poll_series: HashMap::new(),
            bursts: HashMap::new(),
            since_sweep: 0,
            findings: 0,
        }
    }

    /// The run's clock: the writer's `at_ms`, else wall time since the run's first record.
    fn when(&self, e: &Event) -> When {
        When {
            run_ms: e
                .decision
                .at_ms
                .unwrap_or(e.wall_ms.saturating_sub(self.origin_wall)),
            wall_ms: e.wall_ms,
        }
    }

    fn flag(&mut self, sink: &mut Sink, cfg: &Config, seq: Seq, kind: AuditKind) {
        self.findings += 1;
        if self.findings > cfg.max_findings_per_run {
            sink.findings_omitted += 1;
        } else {
            sink.findings.push(AuditFinding {
                seq,
                run: self.name.clone(),
                kind,
            });
        }
    }

    pub fn push(&mut self, e: &Event, cfg: &Config, sink: &mut Sink, storms: &mut ToolStorms) {
        let d = &e.decision;
        let at = self.when(e);
        self.last_seq = e.seq;
        self.last_in.insert(e.seq.ledger, e.seq.seq);
        if let Some(w) = &d.worker {
            if self.workers.len() < MAX_WORKERS && !self.workers.contains(w) {
                self.workers.insert(w.clone());
            }
        }
        let now = tally_policy::Now {
            wall_ms: e.wall_ms,
            at_ms: Some(at.run_ms),
        };
        // A call is judged as the gate judged it: against the state before it counts.
        let judged = matches!(d.kind(), Kind::Allow | Kind::Deny).then(|| self.judge(d, now));
        // Then the budget, so the checks below see this decision counted.
        let view = tally_policy::ViewMut {
            run: &mut self.core,
            tool: None,
            credential: None,
        };
        for found in tally_policy::apply(&self.policy, view, d, now) {
            if let Some(kind) = audit::from_core(found) {
                self.flag(sink, cfg, e.seq, kind);
            }
        }
        if let Some(stop) = self.stop {
            let kind = AuditKind::DecisionAfterStop {
                stop_seq: stop.seq,
                record: d.kind(),
            };
            self.flag(sink, cfg, e.seq, kind);
        }
        match d.kind() {
            Kind::Start => {
                self.started = true;
                self.goal = d.goal.clone().or(self.goal.take());
                self.parent = d.parent.clone().or(self.parent.take());
                if let Some(b) = &d.budget {
                    self.budget = b.clone();
                }
            }
            Kind::Allow | Kind::Deny => {
                let (poll, rule) = judged.unwrap_or_default();
                self.call(e, at, poll, rule, cfg, sink, storms)
            }
            Kind::Outcome => self.outcome(e, at, cfg, sink, storms),
            // Refunds change the budget only: the core counted them above.
            Kind::Refund => {}
            Kind::Override => self.approve(d, e.seq, cfg, sink),
            // Policy records belong to no run; the analysis never routes them here.
            Kind::Policy => {}
            Kind::Stop => {
                if let (None, Some(reason)) = (self.stop, d.reason) {
                    self.stop = Some(Halt {
                        reason,
                        seq: e.seq,
                        at,
                    });
                    self.close_all(Close::Stop { reason, seq: e.seq }, cfg, sink);
                }
            }
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.since_sweep = 0;
            self.sweep(at.run_ms, cfg, sink);
        }
    }

    /// What the core makes of a call before counting it: the remote operation it polls
    /// (by the name the call gives it), or else the loop rule it trips.
    fn judge(&self, d: &Decision, now: tally_policy::Now) -> (Option<String>, Option<LoopRule>) {
        let polled = self
            .core
            .poll_of(d.effect, d.remote_ref.as_deref(), d.operation.as_deref());
        if polled.is_some() {
            let named = d
                .remote_ref
                .as_deref()
                .filter(|r| self.core.remote(r).is_some())
                .or_else(|| d.operation.as_deref()?.rsplit_once(':').map(|(_, r)| r));
            return (named.map(str::to_owned), None);
        }
        let call = tally_policy::Call::from_record(d);
        let run_ms = self.core.run_ms(now);
        (
            None,
            tally_policy::loop_rule(&self.policy, &self.core, &call, run_ms),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        e: &Event,
        at: When,
        poll: Option<String>,
        rule: Option<LoopRule>,
        cfg: &Config,
        sink: &mut Sink,
        storms: &mut ToolStorms,
    ) {
        let d = &e.decision;
        let allowed = d.kind() == Kind::Allow;
        let refused = if allowed { None } else { d.reason };
        let reserve = if allowed {
            d.reserve_cents.unwrap_or(0)
        } else {
            0
        };
        let write = allowed && is_write(d.effect);
        let names = sink.names.call(
            d.tool.as_deref(),
            d.operation.as_deref(),
            d.worker.as_deref(),
        );
        let (tool, operation, worker) = (&names.tool, &names.operation, &names.worker);
        let facts = CallFacts {
            seq: e.seq,
            ms: at.run_ms,
            worker: worker.as_ref(),
            operation: operation.as_ref(),
            reserve,
            refused,
            retry_after_ms: if allowed { None } else { d.retry_after_ms },
        };

        let track = if let Some(r) = &poll {
            let remote = self.refs.get(r).cloned().unwrap_or_default();
            // The core counted this poll already.
            let polls = self.core.remote(r).map_or(0, |p| p.polls);
            let allowance = self.budget.polls;
            self.poll_series
                .entry(r.clone())
                .or_insert_with(|| {
                    PollSeries::new(
                        r,
                        remote.observed,
                        allowance,
                        remote.backoff_until,
                        e.seq,
                        at.run_ms,
                    )
                })
                .call(&facts, tool.as_ref(), polls);
            Track::Poll(r.clone())
        } else if let (Some(tool), Some(digest)) = (tool, &d.args_digest) {
            let key = SeriesKey {
                tool: Arc::clone(tool),
                digest: Digest::new(digest),
            };
            let silent = self
                .series
                .get(&key)
                .is_some_and(|s| at.run_ms.saturating_sub(s.last_ms()) > cfg.series_gap_ms());
            if silent {
                if let Some(l) = self
                    .series
                    .remove(&key)
                    .and_then(|s| s.close(&key, &self.name, Close::Gap, cfg))
                {
                    sink.loops.push(l);
                }
            }
            let digest = key.digest.clone();
            self.series
                .entry(key)
                .or_insert_with(|| Box::new(CallSeries::new(e.seq, at.run_ms)))
                .call(&facts, rule);
            Track::Series(digest)
        } else {
            Track::None
        };
        if let (None, Some(tool)) = (&poll, tool) {
            let burst_gap = self.policy.loops.tool_window_ms;
            let silent = self
                .bursts
                .get(tool)
                .is_some_and(|b| at.run_ms.saturating_sub(b.last_ms()) > burst_gap);
            if silent {
                if let Some(l) = self
                    .bursts
                    .remove(tool)
                    .and_then(|b| b.close(&self.name, Close::Gap))
                {
                    sink.loops.push(l);
                }
            }
            self.bursts
                .entry(Arc::clone(tool))
                .or_insert_with(|| Burst::new(tool, e.seq, at.run_ms))
                .call(&facts, rule);
        }
        if let (false, Some(tool)) = (allowed, &d.tool) {
            let result = ToolResult {
                tool,
                run: &self.name,
                worker: worker.as_ref(),
                operation: operation.as_ref(),
                seq: e.seq,
                wall_ms: e.wall_ms,
                failed: refused.is_some_and(|r| r.action() == Action::Retry),
                refused,
                ok: false,
                reserved: 0,
                settled: 0,
            };
            if let Some(l) = storms.result(&result, cfg, |_| None) {
                sink.loops.push(l);
            }
        }

        if allowed {
            self.allow(e, at, write, poll.is_some(), track, names, cfg, sink);
        } else if let Some(reason) = d.reason {
            self.refusal(d, e.seq, at, reason);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn allow(
        &mut self,
        e: &Event,
        at: When,
        write: bool,
        poll: bool,
        track: Track,
        names: Arc<CallNames>,
        cfg: &Config,
        sink: &mut Sink,
    ) {
        let d = &e.decision;
        let call = Approvable {
            tool: d.tool.as_deref(),
            operation: d.operation.as_deref(),
            args_digest: d.args_digest.as_deref(),
        };

        if d.effect == Some(Effect::NonIdempotentWrite) {
            let key = write_key(call.tool, call.args_digest, call.operation);
            if let Some(u) = self.unknown_writes.get(&key) {
                // The same idempotency key lets the remote side drop the duplicate.
                let deduplicated =
                    u.idempotency_key.is_some() && u.idempotency_key == d.idempotency_key;
                if !u.cleared && !deduplicated {
                    let kind = AuditKind::NonIdempotentRepeatedAfterUnknown {
                        attempt: d.attempt,
                        earlier_attempt: u.attempt,
                        earlier_seq: u.outcome_seq,
                        status: u.status,
                    };
                    self.flag(sink, cfg, e.seq, kind);
                }
            }
        }

        let (excess, need_use, need_cents) = self.excess(d, at, write, poll);
        // An allow that used a gate-signed approval (`grant`) is judged by the replay,
        // which checks the approval's signature under the recorded policy.
        let excess = excess.filter(|_| d.grant.is_none());
        if let Some(x) = excess {
            match audit::use_override(&mut self.overrides, &call, at.run_ms, need_use, need_cents) {
                Ok(()) => {
                    self.uses_granted = self.uses_granted.saturating_add(u64::from(need_use));
                    self.cents_granted = self.cents_granted.saturating_add(need_cents);
                }
                Err(problem) => self.flag(sink, cfg, e.seq, x.finding(problem)),
            }
        }

        self.asks
            .retain(|a| !(a.tool == d.tool && a.operation == d.operation));
        if let Some(attempt) = d.attempt {
            if self.open.len() >= cfg.max_open_attempts {
                // Bounded memory: forget the oldest attempt still awaiting an outcome.
                self.open.pop_first();
            }
            let write_call = is_write(d.effect).then(|| {
                let non_idempotent = d.effect == Some(Effect::NonIdempotentWrite);
                Box::new(WriteCall {
                    seq: e.seq,
                    at,
                    args_digest: d.args_digest.clone().filter(|_| non_idempotent),
                    idempotency_key: d.idempotency_key.clone().filter(|_| non_idempotent),
                })
            });
            self.open.insert(
                attempt,
                Box::new(Call {
                    names,
                    effect: d.effect,
                    outcome_seen: false,
                    reserve: d.reserve_cents.unwrap_or(0),
                    track,
                    write: write_call,
                }),
            );
        }
    }

    /// The first limit this allow exceeds, whether it needs an override's call, and the
    /// cents beyond the spend limit (counters already include the call).
    fn excess(
        &self,
        d: &Decision,
        at: When,
        write: bool,
        poll: bool,
    ) -> (Option<Excess>, bool, u64) {
        let b = &self.budget;
        let mut first: Option<Excess> = None;
        let mut need_use = false;
        let mut need_cents = 0;
        let mut check = |dimension: Dimension, used: u64, limit: Option<u64>| {
            if let Some(limit) = limit.filter(|l| used > *l) {
                first.get_or_insert(Excess {
                    dimension,
                    used,
                    limit,
                });
                if dimension == Dimension::SpendCents {
                    need_cents = used - limit;
                } else {
                    need_use = true;
                }
            }
        };
        let core = &self.core;
        check(Dimension::Attempts, core.attempts_used, b.attempts);
        check(
            Dimension::SpendCents,
            core.spent_cents(),
            b.spend_cents.map(|l| l.saturating_add(self.cents_granted)),
        );
        if write {
            check(
                Dimension::SideEffects,
                core.side_effects_used,
                b.side_effects,
            );
        }
        // Polls are judged per remote operation by the core (docs/GATE.md, how a budget is counted), not here.
        let _ = poll;
        if let Some(depth) = d.depth {
            check(Dimension::Depth, depth, b.depth);
        }
        check(Dimension::DeadlineMs, at.run_ms, b.deadline_ms);
        (first, need_use, need_cents)
    }

    fn refusal(&mut self, d: &Decision, seq: Seq, at: When, reason: Reason) {
        let action = reason.action();
        if action == Action::Stop && self.first_stop_refusal.is_none() {
            self.first_stop_refusal = Some(Halt { reason, seq, at });
        }
        if action == Action::Ask {
            self.asks
                .retain(|a| !(a.tool == d.tool && a.operation == d.operation));
            self.asks.push(Ask {
                tool: d.tool.clone(),
                operation: d.operation.clone(),
                reason,
                seq,
            });
        }
        if action == Action::Retry || d.retry_after_ms.is_some() {
            let wait = d.retry_after_ms.unwrap_or(0);
            self.backoff = Some(Backoff {
                not_before: When {
                    run_ms: at.run_ms.saturating_add(wait),
                    wall_ms: at.wall_ms.saturating_add(wait),
                },
                tool: d.tool.clone(),
                operation: d.operation.clone(),
                refused: Some(reason),
                seq,
            });
        }
    }

    fn outcome(
        &mut self,
        e: &Event,
        at: When,
        cfg: &Config,
        sink: &mut Sink,
        storms: &mut ToolStorms,
    ) {
        let d = &e.decision;
        let Some(status) = d.status else { return };
        let settled = d.settled_cents.unwrap_or(0);
        let mut call = d.attempt.and_then(|a| self.open.remove(&a));
        let facts = OutcomeFacts {
            seq: e.seq,
            ms: at.run_ms,
            status,
            settled,
            retry_after_ms: d.retry_after_ms,
            observed: d.observed.as_deref(),
        };

        if let Some(c) = call.as_mut() {
            c.outcome_seen = true;
            match &c.track {
                Track::Series(_) => {
                    if let Some(s) = c.series_key().and_then(|k| self.series.get_mut(&k)) {
                        s.outcome(&facts);
                    }
                }
                Track::Poll(k) => {
                    if let Some(s) = self.poll_series.get_mut(k) {
                        s.outcome(&facts);
                    }
                }
                Track::None => {}
            }
            if let Some(tool) = &c.names.tool {
                if !matches!(c.track, Track::Poll(_)) {
                    if let Some(b) = self.bursts.get_mut(tool) {
                        b.outcome(&facts);
                    }
                }
                let result = ToolResult {
                    tool,
                    run: &self.name,
                    worker: c.names.worker.as_ref(),
                    operation: c.names.operation.as_ref(),
                    seq: e.seq,
                    wall_ms: e.wall_ms,
                    failed: matches!(status, Status::Error | Status::Rejected | Status::Timeout),
                    refused: None,
                    ok: status == Status::Ok,
                    reserved: c.reserve,
                    settled,
                };
                if let Some(l) = storms.result(&result, cfg, |_| None) {
                    sink.loops.push(l);
                }
            }
        }

        let polled = match call.as_ref().map(|c| &c.track) {
            Some(Track::Poll(r)) => Some(r.clone()),
            _ => None,
        };
        let remote = d.remote_ref.clone().or_else(|| polled.clone());
        if let Some(r) = &remote {
            let known = self.refs.entry(r.clone()).or_default();
            if d.observed.is_some() {
                known.observed = d.observed.clone();
            }
            if let Some(ra) = d.retry_after_ms {
                known.backoff_until = Some(at.run_ms.saturating_add(ra));
            }
        }
        if let Some(state) = &d.observed {
            self.last_observed = Some(Observed {
                state: state.clone(),
                remote_ref: remote.clone(),
                seq: e.seq,
                at,
            });
        }
        let not_before = d.retry_after_ms.map(|ra| When {
            run_ms: at.run_ms.saturating_add(ra),
            wall_ms: at.wall_ms.saturating_add(ra),
        });
        if let Some(nb) = not_before {
            self.backoff = Some(Backoff {
                not_before: nb,
                tool: call.as_ref().and_then(|c| owned(&c.names.tool)),
                operation: call.as_ref().and_then(|c| owned(&c.names.operation)),
                refused: None,
                seq: e.seq,
            });
        }

        let attempt_key = d.attempt.map(|a| format!("attempt {a}"));
        match status {
            Status::Running => {
                let key = remote.clone().or(attempt_key);
                if let Some(key) = key {
                    let fresh = self.pending_from(
                        e.seq,
                        d.attempt,
                        call.as_deref(),
                        &remote,
                        PendingStatus::Running,
                        at,
                    );
                    let p = self.pending.entry(key).or_insert(fresh);
                    p.seq = e.seq;
                    p.since = at;
                    if d.observed.is_some() {
                        p.observed = d.observed.clone();
                    }
                    if not_before.is_some() {
                        p.not_before = not_before;
                    }
                }
            }
            Status::Unknown | Status::Timeout => {
                let effect = call.as_ref().and_then(|c| c.effect);
                if polled.is_none() && effect != Some(Effect::Read) {
                    let pending_status = if status == Status::Unknown {
                        PendingStatus::Unknown
                    } else {
                        PendingStatus::Timeout
                    };
                    if let Some(key) = d.remote_ref.clone().or(attempt_key) {
                        let p = self.pending_from(
                            e.seq,
                            d.attempt,
                            call.as_deref(),
                            &remote,
                            pending_status,
                            at,
                        );
                        self.pending.insert(key, p);
                    }
                }
                if let Some(c) = call
                    .as_ref()
                    .filter(|c| c.effect == Some(Effect::NonIdempotentWrite))
                {
                    let w = c.write.as_deref();
                    let args_digest = w.and_then(|w| w.args_digest.clone());
                    let key = write_key(
                        c.names.tool.as_deref(),
                        args_digest.as_deref(),
                        c.names.operation.as_deref(),
                    );
                    self.unknown_writes.insert(
                        key,
                        UnknownWrite {
                            attempt: d.attempt,
                            outcome_seq: e.seq,
                            status,
                            tool: owned(&c.names.tool),
                            operation: owned(&c.names.operation),
                            args_digest,
                            idempotency_key: w.and_then(|w| w.idempotency_key.clone()),
                            cleared: false,
                        },
                    );
                }
            }
            Status::Ok | Status::Error | Status::Rejected => {
                let mut resolved = attempt_key.and_then(|k| self.pending.remove(&k));
                if polled.is_none() || status == Status::Ok {
                    if let Some(r) = &remote {
                        resolved = self.pending.remove(r).or(resolved);
                        if let Some(series) = self.poll_series.remove(r) {
                            if let Some(l) = series.close(&self.name, Close::Gap, cfg) {
                                sink.loops.push(l);
                            }
                        }
                        self.refs.remove(r);
                    }
                }
                if let Some(a) = d.attempt {
                    self.unknown_writes.retain(|_, u| u.attempt != Some(a));
                }
                if status == Status::Ok {
                    let from_call = call
                        .as_ref()
                        .filter(|c| is_write(c.effect) || remote.is_some());
                    let done = match (&resolved, from_call) {
                        (Some(p), _) => {
                            Some((p.attempt, p.tool.clone(), p.operation.clone(), p.effect))
                        }
                        (None, Some(c)) => Some((
                            d.attempt,
                            owned(&c.names.tool),
                            owned(&c.names.operation),
                            c.effect,
                        )),
                        (None, None) => None,
                    };
                    if let Some((attempt, tool, operation, effect)) = done {
                        self.complete(
                            Completed {
                                seq: e.seq,
                                attempt,
                                tool,
                                operation,
                                effect,
                                remote_ref: remote.clone(),
                                observed: d.observed.clone(),
                                at,
                            },
                            cfg,
                        );
                    }
                }
            }
        }
        if let (Some(a), Some(c)) = (d.attempt, call) {
            if status == Status::Running {
                self.open.insert(a, c);
            }
        }
    }

    fn pending_from(
        &self,
        seq: Seq,
        attempt: Option<u64>,
        call: Option<&Call>,
        remote: &Option<String>,
        status: PendingStatus,
        at: When,
    ) -> Pending {
        Pending {
            seq,
            attempt,
            tool: call.and_then(|c| owned(&c.names.tool)),
            operation: call.and_then(|c| owned(&c.names.operation)),
            effect: call.and_then(|c| c.effect),
            remote_ref: remote.clone(),
            status,
            observed: None,
            since: at,
            not_before: None,
        }
    }

    fn complete(&mut self, done: Completed, cfg: &Config) {
        self.completed_total += 1;
        if self.completed.len() >= cfg.max_listed {
            self.completed.pop_front();
        }
        self.completed.push_back(done);
    }

    fn approve(&mut self, d: &Decision, seq: Seq, cfg: &Config, sink: &mut Sink) {
        let o = Override::new(
            seq,
            d.approver.as_deref(),
            d.scope.as_ref(),
            d.digest.as_deref(),
            d.expires_ms,
        );
        if !o.approved {
            self.flag(sink, cfg, seq, AuditKind::OverrideWithoutApprover);
        } else {
            for u in self.unknown_writes.values_mut() {
                let write = Approvable {
                    tool: u.tool.as_deref(),
                    operation: u.operation.as_deref(),
                    args_digest: u.args_digest.as_deref(),
                };
                if o.mismatch(&write).is_none() {
                    u.cleared = true;
                }
            }
        }
        self.overrides.push(o);
    }

    /// Close loop windows silent for longer than their window.
    fn sweep(&mut self, now: u64, cfg: &Config, sink: &mut Sink) {
        let gap = cfg.series_gap_ms();
        let burst_gap = self.policy.loops.tool_window_ms;
        let name = &self.name;
        self.series.retain(|key, s| {
            let keep = now.saturating_sub(s.last_ms()) <= gap;
            if !keep {
                sink.loops.extend(s.close(key, name, Close::Gap, cfg));
            }
            keep
        });
        self.bursts.retain(|_, b| {
            let keep = now.saturating_sub(b.last_ms()) <= burst_gap;
            if !keep {
                sink.loops.extend(b.close(name, Close::Gap));
            }
            keep
        });
    }

    /// Close every loop window (taking the maps, so a stopped run keeps no capacity).
    fn close_all(&mut self, close: Close, cfg: &Config, sink: &mut Sink) {
        let name = &self.name;
        for (key, s) in std::mem::take(&mut self.series) {
            sink.loops.extend(s.close(&key, name, close, cfg));
        }
        for p in std::mem::take(&mut self.poll_series).into_values() {
            sink.loops.extend(p.close(name, close, cfg));
        }
        for b in std::mem::take(&mut self.bursts).into_values() {
            sink.loops.extend(b.close(name, close));
        }
    }

    /// Close every loop window at the end of the ledger.
    pub fn finish(&mut self, cfg: &Config, sink: &mut Sink) {
        let stop = self.stop.map(|h| (h.reason, h.seq));
        self.close_all(Close::Finish { stop }, cfg, sink);
    }

    pub fn stop_reason(&self) -> StopReason {
        match (self.stop, self.first_stop_refusal) {
            (Some(h), _) => StopReason {
                status: StopStatus::Stopped,
                reason: Some(h.reason),
                action: Some(h.reason.action()),
                seq: Some(h.seq),
                at: Some(h.at),
            },
            (None, Some(h)) => StopReason {
                status: StopStatus::Refused,
                reason: Some(h.reason),
                action: Some(h.reason.action()),
                seq: Some(h.seq),
                at: Some(h.at),
            },
            (None, None) => StopReason {
                status: StopStatus::Running,
                reason: None,
                action: None,
                seq: None,
                at: None,
            },
        }
    }

    /// Pending work: unresolved outcomes, then writes with no outcome at all.
    pub fn pending_work(&self) -> Vec<Pending> {
        let mut out: Vec<Pending> = self.pending.values().cloned().collect();
        for (attempt, c) in &self.open {
            let Some(w) = c.write.as_deref().filter(|_| !c.outcome_seen) else {
                continue;
            };
            out.push(Pending {
                seq: w.seq,
                attempt: Some(*attempt),
                tool: owned(&c.names.tool),
                operation: owned(&c.names.operation),
                effect: c.effect,
                remote_ref: None,
                status: PendingStatus::NoOutcome,
                observed: None,
                since: w.at,
                not_before: None,
            });
        }
        out.sort_by_key(|p| p.seq);
        out
    }

    /// The run's stop, for loops across runs.
    pub fn halt(&self) -> Option<(Reason, Seq)> {
        self.stop.map(|h| (h.reason, h.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::Digest;

    #[test]
    fn a_digest_keeps_its_text_exactly() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(matches!(Digest::new(&hex), Digest::Bytes(_)));
        assert_eq!(Digest::new(&hex).text(), hex);
        // Anything else (never in a valid record) is kept as given, never normalised.
        for text in [
            hex.to_uppercase(),
            hex[..62].to_owned(),
            format!("{hex}0"),
            "zz".into(),
        ] {
            assert_eq!(Digest::new(&text), Digest::Text(text.clone().into()));
            assert_eq!(Digest::new(&text).text(), text);
        }
        assert_ne!(Digest::new(&hex), Digest::new(&hex.to_uppercase()));
    }
}
