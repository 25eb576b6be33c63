//! Loop reconstruction: exact repetition, alternation, high call count, retry storms and
//! polling.
//!
//! What a loop is, is the policy core's rule ([`tally_policy::loop_rule`]), the one the
//! gate refuses by: the run's state, folded by the core, judges each call before it is
//! counted, and the trackers here only group the calls it flags into loops and describe
//! them. Retry storms and stalled polling are the reports' own signals: failures and
//! polls that the budget, the breaker and the poll allowance bound at the gate.
//!
//! Each tracker keeps a small window per key (run and tool, arguments or remote
//! operation), never the events themselves; a key that falls silent for longer than its
//! window is closed and forgotten.

use crate::event::Seq;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;
use tally_ledger::{Action, Reason, Status};
use tally_policy::LoopRule;

use super::run::SeriesKey;
use super::Config;

/// Most distinct workers (or runs) a loop names; the rest are counted, not listed.
const MAX_NAMED: usize = 16;

/// How a loop was recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// The same call (tool and argument digest, else operation) again and again: more in
    /// a row, or among the run's recent calls, than the policy's loop limits allow.
    ExactRepetition,
    /// Two calls alternating (A, B, A, B, ...) with no change of observed state.
    Alternation,
    /// More calls of one tool in the policy's per-tool window than it allows, arguments
    /// varying.
    HighCallCount,
    /// Failures followed by retries: identical retries within a run, or many workers or
    /// runs hammering one failing tool at once.
    RetryStorm,
    /// Status checks of one remote operation that never progress, ignore Retry-After, or
    /// exceed the run's poll allowance.
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
    /// The run's own elapsed ms (`at_ms`, else wall time since the run's first record).
    Run,
    /// The ledger's wall time, ms since the Unix epoch (loops across runs).
    Wall,
}

/// What ended a loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoopEnd {
    /// The gate refused the loop's last call with this code.
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
    /// The loop's last call succeeded (the tool recovered, the job finished).
    Succeeded {
        /// The seq of the `ok` outcome.
        seq: Seq,
    },
    /// The agent stopped repeating by itself (silent for longer than the window) and the
    /// run went on.
    Abandoned,
    /// The ledger ends with the loop still going and the run not stopped.
    NeverStopped,
}

/// Evidence about a polling loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PollEvidence {
    /// The run's poll allowance (`budget.polls`), if it has one.
    pub allowance: Option<u64>,
    /// Whether the run polled past its allowance (or was refused for it).
    pub over_allowance: bool,
    /// How often the observed remote state changed while polling.
    pub state_changes: u64,
    /// The longest stretch of polls with no change of observed state.
    pub unchanged_polls: u64,
    /// The last observed remote state.
    pub last_observed: Option<String>,
}

/// One loop: a run (or several) doing the same thing over and over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Loop {
    /// How it was recognised.
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
    /// Calls in the loop (allows and refusals). For retry storms across runs or
    /// workers: calls whose result (an outcome or a refusal) fell in the storm.
    pub count: u64,
    /// First seq of the loop.
    pub first_seq: Seq,
    /// Last seq of the loop.
    pub last_seq: Seq,
    /// The clock `first_ms` and `last_ms` are on.
    pub clock: Clock,
    /// When the loop began.
    pub first_ms: u64,
    /// When the loop's last record was written.
    pub last_ms: u64,
    /// `last_ms - first_ms`.
    pub span_ms: u64,
    /// Cents reserved by the loop's calls.
    pub reserved_cents: u64,
    /// Cents settled by the loop's calls' outcomes.
    pub settled_cents: u64,
    /// Failed results in the loop: `error` or `timeout` outcomes and back-off refusals.
    pub failures: u64,
    /// Calls made before an upstream Retry-After had elapsed.
    pub ignored_retry_after: u64,
    /// Polling evidence (polling loops only).
    pub poll: Option<PollEvidence>,
    /// What ended it.
    pub ended_by: LoopEnd,
}

/// Why a tracker is being closed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Close {
    /// Silent for longer than the window.
    Gap,
    /// The run stopped.
    Stop { reason: Reason, seq: Seq },
    /// The ledger ended; `stop` is the run's stop if it has one.
    Finish { stop: Option<(Reason, Seq)> },
}

/// The extent of a loop candidate: seq and time range, count, spend, workers, ending.
#[derive(Clone, Debug)]
struct Span {
    first_seq: Seq,
    last_seq: Seq,
    first_ms: u64,
    last_ms: u64,
    count: u64,
    reserved: u64,
    settled: u64,
    /// Distinct workers, sorted, at most [`MAX_NAMED`].
    workers: Vec<Arc<str>>,
    refused: Option<(Reason, Seq)>,
    ok: Option<Seq>,
}

impl Span {
    fn new(seq: Seq, ms: u64) -> Span {
        Span {
            first_seq: seq,
            last_seq: seq,
            first_ms: ms,
            last_ms: ms,
            count: 0,
            reserved: 0,
            settled: 0,
            workers: Vec::new(),
            refused: None,
            ok: None,
        }
    }

    fn touch(&mut self, seq: Seq, ms: u64) {
        self.last_seq = self.last_seq.max(seq);
        self.last_ms = self.last_ms.max(ms);
    }

    fn call(&mut self, c: &CallFacts<'_>) {
        self.touch(c.seq, c.ms);
        self.count += 1;
        self.reserved = self.reserved.saturating_add(c.reserve);
        if let Some(w) = c.worker {
            if self.workers.len() < MAX_NAMED {
                if let Err(at) = self.workers.binary_search(w) {
                    self.workers.insert(at, Arc::clone(w));
                }
            }
        }
        self.refused = c.refused.map(|r| (r, c.seq));
        self.ok = None;
    }

    fn end(&self, close: Close) -> LoopEnd {
        if let Some((reason, seq)) = self.refused {
            return LoopEnd::Refused { reason, seq };
        }
        if let Some(seq) = self.ok {
            return LoopEnd::Succeeded { seq };
        }
        match close {
            Close::Stop { reason, seq } => LoopEnd::RunStopped { reason, seq },
            Close::Finish { stop: None } => LoopEnd::NeverStopped,
            Close::Finish { stop: Some(_) } | Close::Gap => LoopEnd::Abandoned,
        }
    }

    fn to_loop(&self, pattern: Pattern, runs: Vec<String>, clock: Clock, close: Close) -> Loop {
        Loop {
            pattern,
            runs,
            workers: self.workers.iter().map(|w| w.to_string()).collect(),
            tool: None,
            operation: None,
            args_digest: None,
            remote_ref: None,
            count: self.count,
            first_seq: self.first_seq,
            last_seq: self.last_seq,
            clock,
            first_ms: self.first_ms,
            last_ms: self.last_ms,
            span_ms: self.last_ms - self.first_ms,
            reserved_cents: self.reserved,
            settled_cents: self.settled,
            failures: 0,
            ignored_retry_after: 0,
            poll: None,
            ended_by: self.end(close),
        }
    }
}

/// One allow or deny, as the loop detectors see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallFacts<'a> {
    pub seq: Seq,
    /// Run time.
    pub ms: u64,
    pub worker: Option<&'a Arc<str>>,
    pub operation: Option<&'a Arc<str>>,
    pub reserve: u64,
    /// The refusal's reason, for a deny.
    pub refused: Option<Reason>,
    /// Retry-After given on a refusal.
    pub retry_after_ms: Option<u64>,
}

/// One outcome, as the loop detectors see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutcomeFacts<'a> {
    pub seq: Seq,
    /// Run time.
    pub ms: u64,
    pub status: Status,
    pub settled: u64,
    pub retry_after_ms: Option<u64>,
    pub observed: Option<&'a str>,
}

fn is_backoff(reason: Option<Reason>) -> bool {
    reason.is_some_and(|r| r.action() == Action::Retry)
}

/// Identical calls (same run, tool and argument digest: its [`SeriesKey`]).
#[derive(Clone, Debug)]
pub(crate) struct CallSeries {
    span: Span,
    operation: Option<Arc<str>>,
    /// The first loop rule one of its calls tripped.
    looping: Option<LoopRule>,
    failures: u64,
    ignored: u64,
    last_failed: bool,
    backoff_until: Option<u64>,
}

impl CallSeries {
    pub fn new(seq: Seq, ms: u64) -> CallSeries {
        CallSeries {
            span: Span::new(seq, ms),
            operation: None,
            looping: None,
            failures: 0,
            ignored: 0,
            last_failed: false,
            backoff_until: None,
        }
    }

    /// Run time of the last record in the series.
    pub fn last_ms(&self) -> u64 {
        self.span.last_ms
    }

    /// `rule` is the loop rule the call trips, judged by the core before it is counted.
    pub fn call(&mut self, c: &CallFacts<'_>, rule: Option<LoopRule>) {
        if self.backoff_until.is_some_and(|until| c.ms < until) {
            self.ignored += 1;
        }
        // The per-tool bar is the run's burst of that tool, not this series'.
        self.looping = self.looping.or(rule.filter(|r| *r != LoopRule::ToolBar));
        self.last_failed = false;
        if is_backoff(c.refused) {
            self.failures += 1;
            self.last_failed = true;
        }
        if let Some(ra) = c.retry_after_ms {
            self.backoff_until = Some(c.ms.saturating_add(ra));
        }
        self.operation = c.operation.cloned();
        self.span.call(c);
    }

    pub fn outcome(&mut self, o: &OutcomeFacts<'_>) {
        self.span.touch(o.seq, o.ms);
        self.span.settled = self.span.settled.saturating_add(o.settled);
        match o.status {
            Status::Error | Status::Rejected | Status::Timeout => {
                self.failures += 1;
                self.last_failed = true;
            }
            Status::Unknown => self.last_failed = true,
            Status::Ok => {
                self.last_failed = false;
                self.span.ok = Some(o.seq);
            }
            Status::Running => {}
        }
        if let Some(ra) = o.retry_after_ms {
            self.backoff_until = Some(o.ms.saturating_add(ra));
        }
    }

    pub fn pattern(&self, cfg: &Config) -> Option<Pattern> {
        if self.failures >= cfg.storm_min_failures || self.ignored >= cfg.retry_after_ignored_min {
            Some(Pattern::RetryStorm)
        } else {
            self.looping.map(|rule| match rule {
                LoopRule::Alternating => Pattern::Alternation,
                _ => Pattern::ExactRepetition,
            })
        }
    }

    pub fn close(&self, key: &SeriesKey, run: &str, close: Close, cfg: &Config) -> Option<Loop> {
        let pattern = self.pattern(cfg)?;
        let mut l = self
            .span
            .to_loop(pattern, vec![run.to_owned()], Clock::Run, close);
        l.tool = Some(key.tool.to_string());
        l.operation = self.operation.as_deref().map(str::to_owned);
        l.args_digest = Some(key.digest.text());
        l.failures = self.failures;
        l.ignored_retry_after = self.ignored;
        Some(l)
    }
}

/// Status checks of one remote operation.
#[derive(Clone, Debug)]
pub(crate) struct PollSeries {
    span: Span,
    tool: Option<Arc<str>>,
    operation: Option<Arc<str>>,
    remote_ref: String,
    allowance: Option<u64>,
    over_allowance: bool,
    state_changes: u64,
    unchanged: u64,
    max_unchanged: u64,
    last_observed: Option<String>,
    ignored: u64,
    backoff_until: Option<u64>,
    finished_ok: bool,
}

impl PollSeries {
    /// `observed` is the state last seen before polling began (the creating call's).
    pub fn new(
        remote_ref: &str,
        observed: Option<String>,
        allowance: Option<u64>,
        backoff_until: Option<u64>,
        seq: Seq,
        ms: u64,
    ) -> PollSeries {
        PollSeries {
            span: Span::new(seq, ms),
            tool: None,
            operation: None,
            remote_ref: remote_ref.to_owned(),
            allowance,
            over_allowance: false,
            state_changes: 0,
            unchanged: 0,
            max_unchanged: 0,
            last_observed: observed,
            ignored: 0,
            backoff_until,
            finished_ok: false,
        }
    }

    /// `polls_allowed` is the run's count of allowed polls including this one.
    pub fn call(&mut self, c: &CallFacts<'_>, tool: Option<&Arc<str>>, polls_allowed: u64) {
        if self.backoff_until.is_some_and(|until| c.ms < until) {
            self.ignored += 1;
        }
        if c.refused == Some(Reason::PollAllowanceExhausted)
            || self
                .allowance
                .is_some_and(|a| c.refused.is_none() && polls_allowed > a)
        {
            self.over_allowance = true;
        }
        if let Some(ra) = c.retry_after_ms {
            self.backoff_until = Some(c.ms.saturating_add(ra));
        }
        self.unchanged += 1;
        self.max_unchanged = self.max_unchanged.max(self.unchanged);
        self.tool = tool.cloned();
        self.operation = c.operation.cloned();
        self.span.call(c);
    }

    pub fn outcome(&mut self, o: &OutcomeFacts<'_>) {
        self.span.touch(o.seq, o.ms);
        self.span.settled = self.span.settled.saturating_add(o.settled);
        if let Some(state) = o.observed {
            if self.last_observed.as_deref().is_some_and(|s| s != state) {
                self.state_changes += 1;
                self.unchanged = 0;
            }
            self.last_observed = Some(state.to_owned());
        }
        if o.status == Status::Ok {
            self.finished_ok = true;
            self.span.ok = Some(o.seq);
        }
        if let Some(ra) = o.retry_after_ms {
            self.backoff_until = Some(o.ms.saturating_add(ra));
        }
    }

    pub fn flagged(&self, cfg: &Config) -> bool {
        self.over_allowance
            || self.ignored >= cfg.retry_after_ignored_min
            || (!self.finished_ok && self.max_unchanged >= cfg.poll_stall_min)
    }

    pub fn close(&self, run: &str, close: Close, cfg: &Config) -> Option<Loop> {
        if !self.flagged(cfg) {
            return None;
        }
        let mut l = self
            .span
            .to_loop(Pattern::Polling, vec![run.to_owned()], Clock::Run, close);
        l.tool = self.tool.as_deref().map(str::to_owned);
        l.operation = self.operation.as_deref().map(str::to_owned);
        l.remote_ref = Some(self.remote_ref.clone());
        l.ignored_retry_after = self.ignored;
        l.poll = Some(PollEvidence {
            allowance: self.allowance,
            over_allowance: self.over_allowance,
            state_changes: self.state_changes,
            unchanged_polls: self.max_unchanged,
            last_observed: self.last_observed.clone(),
        });
        Some(l)
    }
}

/// Calls of one tool in a run, whatever their arguments.
#[derive(Clone, Debug)]
pub(crate) struct Burst {
    span: Span,
    tool: Arc<str>,
    operation: Option<Arc<str>>,
    flagged: bool,
}

impl Burst {
    pub fn new(tool: &Arc<str>, seq: Seq, ms: u64) -> Burst {
        Burst {
            span: Span::new(seq, ms),
            tool: Arc::clone(tool),
            operation: None,
            flagged: false,
        }
    }

    pub fn last_ms(&self) -> u64 {
        self.span.last_ms
    }

    /// `rule` as for [`CallSeries::call`]: the per-tool bar makes this a loop.
    pub fn call(&mut self, c: &CallFacts<'_>, rule: Option<LoopRule>) {
        self.flagged |= rule == Some(LoopRule::ToolBar);
        self.operation = c.operation.cloned();
        self.span.call(c);
    }

    pub fn outcome(&mut self, o: &OutcomeFacts<'_>) {
        self.span.settled = self.span.settled.saturating_add(o.settled);
        if o.status == Status::Ok {
            self.span.ok = Some(o.seq);
        }
    }

    pub fn close(&self, run: &str, close: Close) -> Option<Loop> {
        if !self.flagged {
            return None;
        }
        let mut l = self.span.to_loop(
            Pattern::HighCallCount,
            vec![run.to_owned()],
            Clock::Run,
            close,
        );
        // A burst's calls vary, so its end is what happened to the run, not one call.
        l.ended_by = match (self.span.refused, close) {
            (Some((reason, seq)), _) => LoopEnd::Refused { reason, seq },
            (None, Close::Stop { reason, seq }) => LoopEnd::RunStopped { reason, seq },
            (None, Close::Finish { stop: None }) => LoopEnd::NeverStopped,
            (None, _) => LoopEnd::Abandoned,
        };
        l.tool = Some(self.tool.to_string());
        l.operation = self.operation.as_deref().map(str::to_owned);
        Some(l)
    }
}

/// Failures of one tool across all workers and runs, on the ledger's wall clock.
#[derive(Clone, Debug)]
struct ToolStorm {
    span: Span,
    failures: u64,
    last_failure_ms: u64,
    sources: BTreeSet<(String, Option<String>)>,
    sources_total: u64,
    runs: BTreeSet<String>,
    operation: Option<Arc<str>>,
}

/// Cross-worker and cross-run retry storms, one open storm per tool at a time.
#[derive(Debug, Default)]
pub(crate) struct ToolStorms {
    open: HashMap<String, ToolStorm>,
}

/// A result of one call of a tool, for the cross-run storm detector.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ToolResult<'a> {
    pub tool: &'a str,
    pub run: &'a str,
    pub worker: Option<&'a Arc<str>>,
    pub operation: Option<&'a Arc<str>>,
    pub seq: Seq,
    pub wall_ms: u64,
    pub failed: bool,
    pub refused: Option<Reason>,
    pub ok: bool,
    pub reserved: u64,
    pub settled: u64,
}

impl ToolStorms {
    /// Record one result; returns a storm the result's gap closed, if it was one.
    pub fn result(
        &mut self,
        r: &ToolResult<'_>,
        cfg: &Config,
        stop_of: impl Fn(&str) -> Option<(Reason, Seq)>,
    ) -> Option<Loop> {
        let mut closed = None;
        if let Some(storm) = self.open.get(r.tool) {
            if r.wall_ms.saturating_sub(storm.last_failure_ms) > cfg.storm_window_ms {
                closed = self
                    .open
                    .remove(r.tool)
                    .and_then(|s| close_storm(r.tool, &s, Close::Gap, cfg, &stop_of));
            }
        }
        if !r.failed && !self.open.contains_key(r.tool) {
            return closed;
        }
        let storm = self
            .open
            .entry(r.tool.to_owned())
            .or_insert_with(|| ToolStorm {
                span: Span::new(r.seq, r.wall_ms),
                failures: 0,
                last_failure_ms: r.wall_ms,
                sources: BTreeSet::new(),
                sources_total: 0,
                runs: BTreeSet::new(),
                operation: None,
            });
        storm.span.call(&CallFacts {
            seq: r.seq,
            ms: r.wall_ms,
            worker: r.worker,
            operation: r.operation,
            reserve: r.reserved,
            refused: r.refused,
            retry_after_ms: None,
        });
        storm.span.settled = storm.span.settled.saturating_add(r.settled);
        if r.ok {
            storm.span.ok = Some(r.seq);
        }
        storm.operation = r.operation.cloned().or(storm.operation.take());
        if r.failed {
            storm.failures += 1;
            storm.last_failure_ms = r.wall_ms;
            let source = (r.run.to_owned(), r.worker.map(|w| w.to_string()));
            if !storm.sources.contains(&source) {
                storm.sources_total += 1;
                if storm.sources.len() < 4 * MAX_NAMED {
                    storm.sources.insert(source);
                }
            }
            if storm.runs.len() < MAX_NAMED {
                storm.runs.insert(r.run.to_owned());
            }
        }
        closed
    }

    /// Close every open storm at the end of the ledger.
    pub fn finish(
        self,
        cfg: &Config,
        stop_of: impl Fn(&str) -> Option<(Reason, Seq)>,
    ) -> Vec<Loop> {
        let mut out: Vec<Loop> = self
            .open
            .iter()
            .filter_map(|(tool, storm)| {
                close_storm(tool, storm, Close::Finish { stop: None }, cfg, &stop_of)
            })
            .collect();
        out.sort_by_key(|l| l.first_seq);
        out
    }
}

fn close_storm(
    tool: &str,
    storm: &ToolStorm,
    close: Close,
    cfg: &Config,
    stop_of: &impl Fn(&str) -> Option<(Reason, Seq)>,
) -> Option<Loop> {
    if storm.failures < cfg.storm_min_failures || storm.sources_total < cfg.storm_min_sources {
        return None;
    }
    // At the end of the ledger the storm is over only if every run in it stopped.
    let close = match close {
        Close::Finish { .. } => {
            let stops: Option<Vec<(Reason, Seq)>> = storm.runs.iter().map(|r| stop_of(r)).collect();
            Close::Finish {
                stop: stops.and_then(|s| s.into_iter().max_by_key(|(_, seq)| *seq)),
            }
        }
        other => other,
    };
    let mut l = storm.span.to_loop(
        Pattern::RetryStorm,
        storm.runs.iter().cloned().collect(),
        Clock::Wall,
        close,
    );
    if let (
        Close::Finish {
            stop: Some((reason, seq)),
        },
        LoopEnd::Abandoned,
    ) = (close, &l.ended_by)
    {
        l.ended_by = LoopEnd::RunStopped { reason, seq };
    }
    l.tool = Some(tool.to_owned());
    l.operation = storm.operation.as_deref().map(str::to_owned);
    l.failures = storm.failures;
    Some(l)
}

/// Drop loops another loop already explains: identical-retry storms inside a storm
/// across workers or runs, and high call counts overlapping a sharper loop of the same
/// run and tool. Linear in the number of loops (indexed by tool, and by run and tool).
pub(crate) fn dedupe(loops: &mut Vec<Loop>) {
    let overlaps = |a: &Loop, b: &Loop| a.first_seq <= b.last_seq && b.first_seq <= a.last_seq;
    let keep: Vec<bool> = {
        let mut storms: HashMap<Option<&str>, Vec<&Loop>> = HashMap::new();
        let mut sharp: HashMap<(&str, Option<&str>), Vec<&Loop>> = HashMap::new();
        for l in loops.iter() {
            let tool = l.tool.as_deref();
            if l.clock == Clock::Wall {
                storms.entry(tool).or_default().push(l);
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
                    (Pattern::HighCallCount, _) => !sharp
                        .get(&(run, tool))
                        .is_some_and(|v| v.iter().any(|s| overlaps(l, s))),
                    _ => true,
                }
            })
            .collect()
    };
    let mut keep = keep.into_iter();
    loops.retain(|_| keep.next().unwrap_or(true));
}
