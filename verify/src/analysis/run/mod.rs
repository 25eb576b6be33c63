//! One run while the ledger streams by: the policy core's state of it (the one fold the
//! gate decides with, replay re-decides with and the audit judges with), and the names
//! the reports describe it by, which the core keeps only hashed. Nothing here counts a
//! budget, a poll, a loop or a grant: every number comes from the core's state, every
//! verdict from the core's rules.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use tally_ledger::{Decision, Effect, Kind, Reason};
use tally_policy::{LoopRule, PollRule, Rule};

mod call;
mod handoff;
mod outcome;

use super::handoff::{Completed, ModelCall, Observed, RefusedCall, StopReason, StopStatus, When};
use super::loops::{Close, Loop, Pattern, Series, ToolStorms};
use super::names::{CallNames, Names};
use crate::event::Seq;
use crate::hash::Map;
use crate::Event;
pub(crate) use handoff::build as build_handoff;
use outcome::Job;
pub(crate) use outcome::UnknownWrite;

/// Completed calls a handoff lists (the latest; all are counted).
pub(crate) const MAX_LISTED: usize = 50;

/// Most workers a handoff names.
const MAX_WORKERS: usize = 16;
/// Most refusals awaiting a human a handoff lists.
const MAX_ASKS: usize = 16;
/// Records of a run between sweeps of its loop series.
const SWEEP_EVERY: u32 = 256;

/// What the rules say about a call, judged on the run's state before it counts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Verdicts {
    /// The call's key (identical calls share it) and its logical operation's.
    pub key: u64,
    pub op: u64,
    /// Its tool's key (`tool_key`), hashed once with the call's.
    pub tool: u64,
    /// An identical call is in the core's recent history: this one repeats it.
    pub repeats_call: bool,
    /// The core counts earlier attempts of this operation since its last `ok`.
    pub retries_op: bool,
    /// The remote operation it polls (the core's `poll_of`).
    pub poll: Option<u64>,
    /// The poll rule's refusal.
    pub poll_rule: Option<PollRule>,
    /// The loop rule's refusal.
    pub loop_rule: Option<LoopRule>,
    /// The retry rule refuses it.
    pub retries: bool,
    /// The tool's shared breaker refuses it.
    pub breaker: bool,
    /// For an `approval_required` refusal: the limit a grant would lift, as the core
    /// decides the call again.
    pub cause: Option<Reason>,
}

/// An allowed attempt the core holds open: the names it is described by.
#[derive(Clone, Debug)]
struct Open {
    names: Arc<CallNames>,
    /// The digest of its arguments (its allow's).
    args_digest: Option<Box<str>>,
    effect: Option<Effect>,
    /// The latest record about it (its allow, then each outcome), and when.
    seq: Seq,
    at: When,
    /// The remote operation its outcome registered, by name.
    remote_ref: Option<Box<str>>,
    /// What its outcomes settled.
    settled: u64,
    /// Whether it used an attempt (only such a call's outcome registers a remote
    /// operation with the core, whose polls are then polls).
    counted: bool,
    /// A model call (channel `model`): what it settles is the run's model spend.
    model: bool,
    /// A model call's model: its allow's preview, where the proxy writes it.
    model_name: Option<Box<str>>,
    /// Its place among the run's recent calls (`firsts`, counted from the first ever).
    ring: Option<u64>,
    /// The series it belongs to: identical calls, retries, polls (keys), and its tool.
    call_key: Option<u64>,
    op: u64,
    poll: Option<u64>,
    /// Its tool's key (`tool_key`), as the call's verdicts hashed it.
    tool: u64,
}

/// A stop record, or the refusal of the run's last call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Halt {
    pub reason: Reason,
    /// What an `approval_required` refusal was caused by.
    pub cause: Option<Reason>,
    pub seq: Seq,
    pub at: When,
}

/// The latest back-off the run was told to honour.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    pub not_before: When,
    pub tool: Option<String>,
    pub operation: Option<String>,
    pub refused: Reason,
    pub seq: Seq,
}

/// A refusal that only a human can lift, not yet followed by an allow of that call.
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub tool: Option<String>,
    pub operation: Option<String>,
    pub reason: Reason,
    /// What an `approval_required` refusal was caused by.
    pub cause: Option<Reason>,
    pub seq: Seq,
}

/// One run's state.
#[derive(Debug)]
pub(crate) struct RunAnalysis {
    pub name: String,
    pub goal: Option<String>,
    pub parent: Option<String>,
    pub first_seq: Seq,
    pub last_seq: Seq,
    /// In a merged audit, the run's last seq in each ledger that has it.
    pub last_in: BTreeMap<u16, u64>,
    pub workers: BTreeSet<String>,
    /// The core's state of the run: every number the reports give.
    pub core: tally_policy::RunState,
    /// The policy the run's start named (a run the gate governs), by digest.
    pub digest: Option<String>,
    /// The policy its last record was judged under, by digest (most records name the
    /// one the record before them did).
    pub policy: Option<(String, std::sync::Arc<tally_policy::Policy>)>,
    pub stop: Option<Halt>,
    /// The refusal of the run's last call (none once a later call is allowed).
    last_refusal: Option<Halt>,
    open: BTreeMap<u64, Box<Open>>,
    jobs: Map<u64, Job>,
    pub unknown: Map<u64, UnknownWrite>,
    pub completed: VecDeque<Completed>,
    pub completed_total: u64,
    pub model_calls: VecDeque<ModelCall>,
    pub model_calls_total: u64,
    pub refused: VecDeque<RefusedCall>,
    pub refused_total: u64,
    /// What the run's model calls have settled so far (loops report what was spent on
    /// model turns while they went on).
    model_settled: u64,
    pub last_observed: Option<Observed>,
    pub backoff: Option<Backoff>,
    pub asks: Vec<Ask>,
    /// The run's recent calls (not polls), oldest first, at most the core's window.
    firsts: VecDeque<First>,
    /// Recent calls forgotten from the front of `firsts`.
    firsts_popped: u64,
    calls: Map<u64, Series>,
    retries: Map<u64, Series>,
    polls: Map<u64, Series>,
    bursts: Map<u64, Series>,
    since_sweep: u32,
    pub findings: u64,
}

impl RunAnalysis {
    pub fn new(name: &str, e: &Event) -> RunAnalysis {
        let mut core = tally_policy::RunState::new(name);
        // A run whose start the ledger does not hold is timed from its first record.
        core.start_wall_ms = e.wall_ms.saturating_sub(e.decision.at_ms.unwrap_or(0));
        RunAnalysis {
            name: name.to_owned(),
            goal: None,
            parent: None,
            first_seq: e.seq,
            last_seq: e.seq,
            last_in: BTreeMap::new(),
            workers: BTreeSet::new(),
            core,
            digest: None,
            policy: None,
            stop: None,
            last_refusal: None,
            open: BTreeMap::new(),
            jobs: Map::default(),
            unknown: Map::default(),
            completed: VecDeque::new(),
            completed_total: 0,
            model_calls: VecDeque::new(),
            model_calls_total: 0,
            refused: VecDeque::new(),
            refused_total: 0,
            model_settled: 0,
            last_observed: None,
            backoff: None,
            asks: Vec::new(),
            firsts: VecDeque::new(),
            firsts_popped: 0,
            calls: Map::default(),
            retries: Map::default(),
            polls: Map::default(),
            bursts: Map::default(),
            since_sweep: 0,
            findings: 0,
        }
    }

    /// The run's clock at a record: the core's.
    pub fn when(&self, d: &Decision, wall_ms: u64) -> When {
        let now = tally_policy::Now {
            wall_ms,
            at_ms: d.at_ms,
        };
        When {
            run_ms: self.core.run_ms(now),
            wall_ms,
        }
    }

    /// What the rules say about the call `d` (an allow or a deny), before it counts.
    pub fn verdicts(
        &self,
        policy: &tally_policy::Policy,
        keyed: &tally_policy::Keyed,
        run_ms: u64,
        breaker: Option<&tally_policy::ToolState>,
        wall_ms: u64,
    ) -> Verdicts {
        let core = &self.core;
        let poll = keyed.poll(core);
        let call = &keyed.call;
        let (key, op) = (keyed.key, keyed.op);
        let breaker =
            breaker.is_some_and(|t| tally_policy::breaker_wait(policy, t, wall_ms).is_some());
        match poll {
            Some(r) => Verdicts {
                key,
                op,
                tool: keyed.tool,
                poll,
                poll_rule: tally_policy::poll_rule(policy, core, r, run_ms),
                breaker,
                ..Verdicts::default()
            },
            None => Verdicts {
                key,
                op,
                tool: keyed.tool,
                repeats_call: core.recent.iter().any(|r| r.key == key),
                retries_op: core.ops.get(&op).is_some_and(|&n| n > 0),
                poll: None,
                poll_rule: None,
                loop_rule: keyed.loop_rule(policy, core, run_ms),
                // The retry rule, unless a rule the core checks before it refuses the
                // call (a non-idempotent write repeated while its outcome is unknown).
                retries: keyed.retry_rule(policy, core)
                    && !(Rule::OutcomeUnknown.precedes(Rule::Retries)
                        && tally_policy::outcome_unknown(core, call.effect, op)),
                breaker,
                cause: None,
            },
        }
    }

    /// Describe one record, once the core has folded it. `v` is what the rules said of
    /// it before it counted (allows and denies).
    #[allow(clippy::too_many_arguments)]
    pub fn describe(
        &mut self,
        e: &Event,
        at: When,
        v: Verdicts,
        names: &mut Names,
        storms: &mut ToolStorms,
        policy: &tally_policy::Policy,
        loops: &mut Vec<Loop>,
    ) {
        let d = &e.decision;
        self.last_seq = e.seq;
        match self.last_in.get_mut(&e.seq.ledger) {
            Some(last) => *last = e.seq.seq,
            None => {
                self.last_in.insert(e.seq.ledger, e.seq.seq);
            }
        }
        if let Some(w) = &d.worker {
            if self.workers.len() < MAX_WORKERS && !self.workers.contains(w) {
                self.workers.insert(w.clone());
            }
        }
        match d.kind() {
            Kind::Start => {
                self.goal = d.goal.clone().or(self.goal.take());
                self.parent = d.parent.clone().or(self.parent.take());
                self.digest = d.policy.clone();
            }
            Kind::Allow | Kind::Deny => self.call(e, at, v, names, storms),
            Kind::Outcome => self.outcome(e, at, storms, policy, loops),
            Kind::Refund
            | Kind::Override
            | Kind::Policy
            | Kind::Pause
            | Kind::Resume
            | Kind::Lease => {}
            Kind::Stop => {
                if let (None, Some(reason)) = (self.stop, d.reason) {
                    self.stop = Some(Halt {
                        reason,
                        cause: None,
                        seq: e.seq,
                        at,
                    });
                    self.close_all(Close::Stop { reason, seq: e.seq }, loops);
                }
            }
        }
        // Names of attempts the core no longer holds open are dropped with them.
        if matches!(d.kind(), Kind::Allow | Kind::Outcome) {
            self.forget_closed(d.attempt);
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.since_sweep = 0;
            self.sweep(loops);
        }
    }

    fn forget_closed(&mut self, attempt: Option<u64>) {
        if let Some(a) = attempt {
            if !self.core.open.contains_key(&a) {
                self.open.remove(&a);
            }
        }
        // The core forgets its oldest open attempt beyond its bound: so do the names.
        while self.open.len() > self.core.open.len() {
            match self.open.first_key_value() {
                Some((&a, _)) if !self.core.open.contains_key(&a) => {
                    self.open.pop_first();
                }
                _ => break,
            }
        }
    }

    /// Close series the core's rules no longer look back at, and forget remote
    /// operations the core forgot.
    fn sweep(&mut self, loops: &mut Vec<Loop>) {
        let core = &self.core;
        let name = &self.name;
        let mut closed = |s: Series| {
            loops.extend(s.close(vec![name.clone()], super::loops::Clock::Run, Close::Gap));
        };
        let recent: BTreeSet<u64> = core.recent.iter().map(|r| r.key).collect();
        for (_, s) in extract(&mut self.calls, |k, _| !recent.contains(k)) {
            closed(s);
        }
        for (_, s) in extract(&mut self.retries, |k, _| !core.ops.contains_key(k)) {
            closed(s);
        }
        for (_, s) in extract(&mut self.polls, |k, _| !core.refs.contains_key(k)) {
            closed(s);
        }
        for (_, s) in extract(&mut self.bursts, |k, s| {
            core.tools.get(k).is_none_or(|w| w.start_ms > s.last_ms())
        }) {
            closed(s);
        }
        self.jobs
            .retain(|k, j| core.refs.contains_key(k) || self.open.contains_key(&j.attempt));
    }

    /// Close every series (taking the maps, so a stopped run keeps no capacity).
    fn close_all(&mut self, close: Close, loops: &mut Vec<Loop>) {
        let name = &self.name;
        for map in [
            &mut self.calls,
            &mut self.retries,
            &mut self.polls,
            &mut self.bursts,
        ] {
            for s in std::mem::take(map).into_values() {
                loops.extend(s.close(vec![name.clone()], super::loops::Clock::Run, close));
            }
        }
    }

    /// Close every series at the end of the ledger.
    pub fn finish(&mut self, loops: &mut Vec<Loop>) {
        let stop = self.stop.map(|h| (h.reason, h.seq));
        self.close_all(Close::Finish { stop }, loops);
    }

    /// How the run ended: its stop record, else the refusal of its last call (a refusal
    /// an allow followed is history, not the run's state), else running.
    pub fn stop_reason(&self) -> StopReason {
        let (status, halt) = match (self.stop, self.last_refusal) {
            (Some(h), _) => (StopStatus::Stopped, Some(h)),
            (None, Some(h)) => (StopStatus::Refused, Some(h)),
            (None, None) => (StopStatus::Running, None),
        };
        StopReason {
            status,
            reason: halt.map(|h| h.reason),
            action: halt.map(|h| h.reason.action()),
            cause: halt.and_then(|h| h.cause),
            seq: halt.map(|h| h.seq),
            at: halt.map(|h| h.at),
        }
    }

    /// The run's stop, for loops across runs.
    pub fn halt(&self) -> Option<(Reason, Seq)> {
        self.stop.map(|h| (h.reason, h.seq))
    }
}

/// A recent call, remembered so that a series started at a repeat begins where the
/// repeated call did.
#[derive(Clone, Debug)]
pub(crate) struct First {
    key: u64,
    op: u64,
    seq: Seq,
    ms: u64,
    reserve: u64,
    /// What its outcomes settled, and how many failed, while no series held it.
    settled: u64,
    failures: u64,
    worker: Option<Arc<str>>,
    /// The run's model spend so far when it was made.
    model: u64,
}

/// A series of `pattern` from the recent call `from` (else from this call).
fn series_from(
    pattern: Pattern,
    from: Option<First>,
    seq: Seq,
    ms: u64,
    names: &CallNames,
) -> Series {
    match from {
        Some(f) => Series::new(pattern, f.seq, f.ms, names.tool.clone()).after(
            f.reserve,
            f.settled,
            f.failures,
            f.worker.clone(),
            f.model,
        ),
        None => Series::new(pattern, seq, ms, names.tool.clone()),
    }
}

/// Keep `item` among the latest [`MAX_LISTED`] of `list`, counting it in `total`.
fn listed<T>(list: &mut VecDeque<T>, total: &mut u64, item: T) {
    *total += 1;
    if list.len() >= MAX_LISTED {
        list.pop_front();
    }
    list.push_back(item);
}

/// Remove and return the entries of `map` for which `f` holds.
fn extract<V>(map: &mut Map<u64, V>, f: impl Fn(&u64, &V) -> bool) -> Vec<(u64, V)> {
    let keys: Vec<u64> = map
        .iter()
        .filter(|(k, v)| f(k, v))
        .map(|(k, _)| *k)
        .collect();
    keys.into_iter()
        .filter_map(|k| map.remove(&k).map(|v| (k, v)))
        .collect()
}
