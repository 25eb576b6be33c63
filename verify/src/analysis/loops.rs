//! Loops as the policy core sees them. A loop is a series of calls in which the core's
//! rules refused a call, or would have refused one (an allow the core's rule refuses,
//! which only a ledger the gate did not write can hold): identical calls and alternation
//! ([`tally_policy::loop_rule`]), the per-tool bar, retries of one logical operation
//! ([`tally_policy::retry_rule`]), polling ([`tally_policy::poll_rule`]), and a tool's
//! shared breaker across runs ([`tally_policy::breaker_outcome`]). The trackers here
//! only group the calls those rules judge into series and describe them; a series no
//! rule refused is not a loop, however it looks.
//!
//! A loop spans its first call to the last call a rule refused: what came after is the
//! recovery, not the loop. So on a ledger the gate wrote, every loop ends in a refusal
//! the gate made.

mod storms;

pub(crate) use storms::ToolStorms;

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use tally_ledger::{Action, Reason, Status};

use crate::event::Seq;

/// Most distinct workers (or runs) a loop names; the rest are counted, not listed.
const MAX_NAMED: usize = 16;

/// How a loop was recognised: which of the core's rules refused in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// The same call (tool and argument digest, else operation), its result unchanged:
    /// more in a row, or among the run's recent calls, than the policy's loop limits
    /// allow (`loop_repeated_call`).
    ExactRepetition,
    /// Two calls alternating (A, B, A, B, ...) with no progress (`loop_repeated_call`).
    Alternation,
    /// More calls of one tool in the policy's per-tool window than it allows, arguments
    /// varying (`loop_repeated_call`).
    HighCallCount,
    /// One logical operation retried past its effect class's retries
    /// (`retries_exhausted`); across runs, failures of one tool that opened its shared
    /// breaker, and the calls it then refused (`circuit_open`).
    RetryStorm,
    /// Polls of one remote operation past its allowance, before its Retry-After (less
    /// the tolerance), or past the policy's stall bound (`poll_allowance_exhausted`,
    /// `upstream_backoff`).
    Polling,
}

impl Pattern {
    /// The pattern's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::ExactRepetition => "exact_repetition",
            Pattern::Alternation => "alternation",
            Pattern::HighCallCount => "high_call_count",
            Pattern::RetryStorm => "retry_storm",
            Pattern::Polling => "polling",
        }
    }
}

/// Which clock a loop's times are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The run's own elapsed ms (`at_ms`, else wall time since the run's start).
    Run,
    /// The ledger's wall time, ms since the Unix epoch (loops across runs).
    Wall,
}

/// What ended a loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoopEnd {
    /// Its last call was refused with this code.
    Refused {
        /// The refusal's reason code.
        reason: Reason,
        /// The refusal's seq.
        seq: Seq,
    },
    /// The run stopped while the loop was going on.
    RunStopped {
        /// The stop record's reason code.
        reason: Reason,
        /// The stop record's seq.
        seq: Seq,
    },
    /// A call of it succeeded after its last refused one (the tool recovered, the job
    /// finished).
    Succeeded {
        /// The seq of the `ok` outcome.
        seq: Seq,
    },
    /// The agent stopped by itself (the rule's window passed) and the run went on.
    Abandoned,
    /// The ledger ends with the loop still going and the run not stopped.
    NeverStopped,
}

/// Evidence about a polling loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PollEvidence {
    /// The run's poll allowance (`budget.polls`), if it has one.
    pub allowance: Option<u64>,
    /// Whether a poll of it was refused (or would have been) for the allowance or the
    /// stall bound.
    pub over_allowance: bool,
    /// How often the observed remote state changed while polling.
    pub state_changes: u64,
    /// The longest stretch of polls with no change of observed state.
    pub unchanged_polls: u64,
    /// The last observed remote state.
    pub last_observed: Option<String>,
}

/// One loop: a run (or several) doing the same thing over and over until a rule refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Loop {
    /// Which rule refused in it.
    pub pattern: Pattern,
    /// The run(s) it belongs to: one for a loop within a run, several across runs.
    pub runs: Vec<String>,
    /// Distinct workers seen in it (at most 16 named).
    pub workers: Vec<String>,
    /// The tool called.
    pub tool: Option<String>,
    /// The logical operation of the last call in the loop.
    pub operation: Option<String>,
    /// The argument digest, when every call in the loop had the same one.
    pub args_digest: Option<String>,
    /// The remote operation polled (polling loops).
    pub remote_ref: Option<String>,
    /// Calls in the loop (allows and refusals), up to its last refused one; across
    /// runs: the failed outcomes and refused calls of the tool.
    pub count: u64,
    /// First seq of the loop.
    pub first_seq: Seq,
    /// Last seq of the loop (its last refused call).
    pub last_seq: Seq,
    /// The clock `first_ms` and `last_ms` are on.
    pub clock: Clock,
    /// When the loop began.
    pub first_ms: u64,
    /// When its last refused call was made.
    pub last_ms: u64,
    /// `last_ms - first_ms`.
    pub span_ms: u64,
    /// Nanodollars reserved by the loop's calls.
    pub reserved_nanos: u64,
    /// Nanodollars settled by the loop's calls' outcomes.
    pub settled_nanos: u64,
    /// Nanodollars the run's model calls (channel `model`) settled while the loop went
    /// on, from its first call to its last refused one: what the loop cost in model
    /// turns beyond its own calls (which are counted in too, if they are model calls).
    /// `null` for a loop across runs.
    pub model_spend_nanos: Option<u64>,
    /// Failed results in the loop: `error` or `timeout` outcomes and refusals whose
    /// action is `retry`.
    pub failures: u64,
    /// Polls made before the upstream's Retry-After (less the tolerance) had elapsed.
    pub ignored_retry_after: u64,
    /// Polling evidence (polling loops only).
    pub poll: Option<PollEvidence>,
    /// What ended it.
    pub ended_by: LoopEnd,
}

/// Why a tracker is being closed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Close {
    /// Its rule no longer looks back at it (the window passed, the count reset).
    Gap,
    /// The run stopped.
    Stop { reason: Reason, seq: Seq },
    /// The ledger ended; `stop` is the run's stop if it has one.
    Finish { stop: Option<(Reason, Seq)> },
}

/// One call (allow or refusal) as a series sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallFacts<'a> {
    pub seq: Seq,
    /// Run time (wall time for a series across runs).
    pub ms: u64,
    pub worker: Option<&'a Arc<str>>,
    pub operation: Option<&'a Arc<str>>,
    pub args_digest: Option<&'a str>,
    pub reserve: u64,
    /// What the run's model calls had settled before this call (a running total).
    pub model: u64,
    /// The refusal's reason, for a deny.
    pub refused: Option<Reason>,
    /// Whether the core's rule for this series refuses this call (or refused it).
    pub flagged: bool,
    /// For a poll: the poll rule refuses it as early.
    pub early: bool,
}

/// One outcome, as a series sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutcomeFacts<'a> {
    pub seq: Seq,
    pub status: Status,
    pub settled: u64,
    pub observed: Option<&'a str>,
}

/// The part of a series up to its last flagged call: what a loop reports.
#[derive(Clone, Debug, Default)]
struct Upto {
    last_seq: Seq,
    last_ms: u64,
    count: u64,
    reserved: u64,
    settled: u64,
    failures: u64,
    refused: Option<(Reason, Seq)>,
    /// The run's model spend so far at its last call.
    model: u64,
}

/// A series of calls one rule looks at: identical calls, one operation's retries, one
/// remote operation's polls, one tool's calls.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    pattern: Pattern,
    first_seq: Seq,
    first_ms: u64,
    /// The run's model spend so far at its first call.
    model_first: Option<u64>,
    /// Running totals of the whole series.
    now: Upto,
    /// Snapshot at its last flagged call (`None`: no rule refused in it: no loop).
    flagged: Option<Upto>,
    /// An `ok` outcome of one of its calls after the last flagged call.
    ok_after: Option<Seq>,
    workers: Vec<Arc<str>>,
    tool: Option<Arc<str>>,
    operation: Option<Arc<str>>,
    args_digest: Option<String>,
    /// Its calls' argument digests differ: none is shown.
    digests_differ: bool,
    /// A call's digest was taken.
    digest_seen: bool,
    remote_ref: Option<String>,
    early: u64,
    poll: Option<PollTrack>,
}

#[derive(Clone, Debug, Default)]
struct PollTrack {
    allowance: Option<u64>,
    over_allowance: bool,
    state_changes: u64,
    unchanged: u64,
    max_unchanged: u64,
    last_observed: Option<String>,
}

impl Series {
    pub fn new(pattern: Pattern, seq: Seq, ms: u64, tool: Option<Arc<str>>) -> Series {
        Series {
            pattern,
            first_seq: seq,
            first_ms: ms,
            model_first: None,
            now: Upto {
                last_seq: seq,
                last_ms: ms,
                ..Upto::default()
            },
            flagged: None,
            ok_after: None,
            workers: Vec::new(),
            tool,
            operation: None,
            args_digest: None,
            digests_differ: false,
            digest_seen: false,
            remote_ref: None,
            early: 0,
            poll: None,
        }
    }

    /// The series began with an earlier call (reserving `reserve`) than the one it is
    /// made for: it counts that one too.
    pub fn after(
        mut self,
        reserve: u64,
        settled: u64,
        failures: u64,
        worker: Option<Arc<str>>,
        model: u64,
    ) -> Series {
        self.model_first = Some(model);
        self.workers.extend(worker);
        self.now.count = 1;
        self.now.reserved = reserve;
        self.now.settled = settled;
        self.now.failures = failures;
        self
    }

    /// Its calls' argument digests differ: none is shown.
    pub fn digests_differ(&mut self) {
        self.digests_differ = true;
    }

    /// A polling series of `remote_ref`, with the run's poll allowance and the state
    /// last observed before polling began.
    pub fn polling(
        seq: Seq,
        ms: u64,
        tool: Option<Arc<str>>,
        remote_ref: &str,
        allowance: Option<u64>,
        observed: Option<String>,
    ) -> Series {
        let mut s = Series::new(Pattern::Polling, seq, ms, tool);
        s.remote_ref = Some(remote_ref.to_owned());
        s.poll = Some(PollTrack {
            allowance,
            last_observed: observed,
            ..PollTrack::default()
        });
        s
    }

    /// Run time of its last record.
    pub fn last_ms(&self) -> u64 {
        self.now.last_ms
    }

    /// Take one call; `pattern`, where given, is the rule that refuses it (for series
    /// whose pattern depends on the rule: identical calls or alternation).
    pub fn call(&mut self, c: &CallFacts<'_>, pattern: Option<Pattern>) {
        self.now.last_seq = self.now.last_seq.max(c.seq);
        self.now.last_ms = self.now.last_ms.max(c.ms);
        self.now.count += 1;
        self.now.reserved = self.now.reserved.saturating_add(c.reserve);
        self.model_first.get_or_insert(c.model);
        self.now.model = self.now.model.max(c.model);
        if c.refused.is_some_and(|r| r.action() == Action::Retry) {
            self.now.failures += 1;
        }
        self.now.refused = c.refused.map(|r| (r, c.seq));
        if let Some(w) = c.worker {
            if self.workers.len() < MAX_NAMED {
                if let Err(at) = self.workers.binary_search(w) {
                    self.workers.insert(at, Arc::clone(w));
                }
            }
        }
        self.operation = c.operation.cloned();
        match (&self.args_digest, self.digest_seen) {
            (_, false) => {
                self.args_digest = c.args_digest.map(str::to_owned);
                self.digest_seen = true;
            }
            (d, true) if d.as_deref() != c.args_digest => self.digests_differ = true,
            _ => {}
        }
        if c.early {
            self.early += 1;
        }
        if let Some(p) = &mut self.poll {
            p.unchanged += 1;
            p.max_unchanged = p.max_unchanged.max(p.unchanged);
            if c.flagged && !c.early {
                p.over_allowance = true;
            }
        }
        if c.flagged {
            if let Some(p) = pattern {
                self.pattern = p;
            }
            self.flagged = Some(self.now.clone());
            self.ok_after = None;
        }
    }

    /// Take the outcome of one of its calls.
    pub fn outcome(&mut self, o: &OutcomeFacts<'_>) {
        self.now.settled = self.now.settled.saturating_add(o.settled);
        if tally_policy::is_failure(o.status) {
            self.now.failures += 1;
        }
        if let Some(f) = &mut self.flagged {
            // The loop's calls' outcomes belong to it, wherever they land.
            f.settled = f.settled.saturating_add(o.settled);
            if tally_policy::is_failure(o.status) {
                f.failures += 1;
            }
            if tally_policy::is_success(o.status) {
                self.ok_after = Some(o.seq);
            }
        }
        if let (Some(p), Some(state)) = (&mut self.poll, o.observed) {
            if p.last_observed.as_deref().is_some_and(|s| s != state) {
                p.state_changes += 1;
                p.unchanged = 0;
            }
            p.last_observed = Some(state.to_owned());
        }
    }

    /// The loop it was, if a rule refused in it.
    pub fn close(&self, runs: Vec<String>, clock: Clock, close: Close) -> Option<Loop> {
        let f = self.flagged.as_ref()?;
        let ended_by = match (f.refused, self.ok_after, close) {
            (Some((reason, seq)), _, _) => LoopEnd::Refused { reason, seq },
            (None, Some(seq), _) => LoopEnd::Succeeded { seq },
            (None, None, Close::Stop { reason, seq }) => LoopEnd::RunStopped { reason, seq },
            (None, None, Close::Finish { stop: None }) => LoopEnd::NeverStopped,
            (
                None,
                None,
                Close::Finish {
                    stop: Some((reason, seq)),
                },
            ) if clock == Clock::Wall => LoopEnd::RunStopped { reason, seq },
            (None, None, _) => LoopEnd::Abandoned,
        };
        Some(Loop {
            pattern: self.pattern,
            runs,
            workers: self.workers.iter().map(|w| w.to_string()).collect(),
            tool: self.tool.as_deref().map(str::to_owned),
            operation: self.operation.as_deref().map(str::to_owned),
            args_digest: self.args_digest.clone().filter(|_| !self.digests_differ),
            remote_ref: self.remote_ref.clone(),
            count: f.count,
            first_seq: self.first_seq,
            last_seq: f.last_seq,
            clock,
            first_ms: self.first_ms,
            last_ms: f.last_ms,
            span_ms: f.last_ms.saturating_sub(self.first_ms),
            reserved_nanos: f.reserved,
            settled_nanos: f.settled,
            model_spend_nanos: (clock == Clock::Run)
                .then(|| f.model.saturating_sub(self.model_first.unwrap_or(f.model))),
            failures: f.failures,
            ignored_retry_after: self.early,
            poll: self.poll.as_ref().map(|p| PollEvidence {
                allowance: p.allowance,
                over_allowance: p.over_allowance,
                state_changes: p.state_changes,
                unchanged_polls: p.max_unchanged,
                last_observed: p.last_observed.clone(),
            }),
            ended_by,
        })
    }
}

/// Drop loops another loop already explains: a run's retry storm inside a storm of the
/// same tool across several runs; a tool's storm within one run that a loop of that run
/// and tool already shows; and a high call count overlapping a sharper loop of the same
/// run and tool. Linear in the number of loops.
pub(crate) fn dedupe(loops: &mut Vec<Loop>) {
    let overlaps = |a: &Loop, b: &Loop| a.first_seq <= b.last_seq && b.first_seq <= a.last_seq;
    let keep: Vec<bool> = {
        let mut storms: HashMap<Option<&str>, Vec<&Loop>> = HashMap::new();
        let mut in_run: HashMap<(&str, Option<&str>), Vec<&Loop>> = HashMap::new();
        let mut sharp: HashMap<(&str, Option<&str>), Vec<&Loop>> = HashMap::new();
        for l in loops.iter() {
            let tool = l.tool.as_deref();
            if l.clock == Clock::Wall && l.runs.len() > 1 {
                storms.entry(tool).or_default().push(l);
            }
            if l.clock == Clock::Run {
                for run in &l.runs {
                    in_run.entry((run.as_str(), tool)).or_default().push(l);
                }
            }
            if l.pattern != Pattern::HighCallCount {
                for run in &l.runs {
                    sharp.entry((run.as_str(), tool)).or_default().push(l);
                }
            }
        }
        loops
            .iter()
            .map(|l| {
                let tool = l.tool.as_deref();
                let run = l.runs.first().map(String::as_str).unwrap_or("");
                match (l.pattern, l.clock) {
                    (Pattern::RetryStorm, Clock::Run) => !storms.get(&tool).is_some_and(|v| {
                        v.iter()
                            .any(|s| s.runs.iter().any(|r| r == run) && overlaps(l, s))
                    }),
                    (Pattern::RetryStorm, Clock::Wall) if l.runs.len() == 1 => !in_run
                        .get(&(run, tool))
                        .is_some_and(|v| v.iter().any(|s| overlaps(l, s))),
                    (Pattern::HighCallCount, _) => !sharp
                        .get(&(run, tool))
                        .is_some_and(|v| v.iter().any(|s| s.clock == Clock::Run && overlaps(l, s))),
                    _ => true,
                }
            })
            .collect()
    };
    let mut keep = keep.into_iter();
    loops.retain(|_| keep.next().unwrap_or(true));
}
