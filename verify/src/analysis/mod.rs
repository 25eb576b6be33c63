//! Loops, consistency audit and handoffs over verified, decrypted decisions (issue 4).
//!
//! Feed every [`Event`] of a verified ledger, in seq order, to [`Analysis::push`], then
//! [`Analysis::finish`] for a [`Report`]: the [`Loop`]s runs fell into, the
//! [`AuditFinding`]s where decisions break their run's own budget or history, and one
//! [`Handoff`] per run. Render it with [`render_loops_text`], [`render_findings_text`],
//! [`render_handoffs_text`], or serialize it (the `*_json` functions give the documented,
//! versioned schemas of `docs/REPORTS.md`).
//!
//! Memory is bounded per run: the analysis keeps windows and counters, never the events.
//! Thresholds are in [`Config`]; its defaults are documented there and in
//! `docs/REPORTS.md`.

mod audit;
mod handoff;
mod loops;
mod render;
mod run;

use std::collections::HashMap;

use serde::Serialize;

pub use audit::{AuditFinding, AuditKind, Dimension, Mismatch};
pub use handoff::{
    Attempts, Completed, Coverage, Handoff, LedgerCoverage, Observed, Pending, PendingStatus,
    ResumeAction, ResumeStep, Spend, StopReason, StopStatus, UnsafeAction, UnsafeKind, When,
};
pub use loops::{Clock, Loop, LoopEnd, Pattern, PollEvidence};
pub use render::{
    render_findings_json, render_findings_text, render_handoffs_json, render_handoffs_text,
    render_loops_json, render_loops_text, REPORT_VERSION,
};

use crate::Event;
use loops::ToolStorms;
use run::{RunState, Sink};

/// Loop thresholds and output bounds. `Config::default()` holds the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    /// The policy whose loop breakers (and budget rules) read a run that carries no
    /// recorded policy: a run the gate governs is always read under its own. Default
    /// `Policy::default()`, the gate's defaults.
    #[serde(skip)]
    pub policy: std::sync::Arc<tally_policy::Policy>,
    /// Retry storm: at least this many failures (`error`/`timeout` outcomes and back-off
    /// refusals) of identical calls in a run, or of one tool across workers and runs.
    /// Default 4.
    pub storm_min_failures: u64,
    /// A storm ends after this many ms with no failure (run time within a run, wall time
    /// across runs). Default 60 000.
    pub storm_window_ms: u64,
    /// A storm across workers or runs needs failures from at least this many distinct
    /// (run, worker) sources. Default 3.
    pub storm_min_sources: u64,
    /// Calls made before an upstream Retry-After elapsed that make a retry series a storm,
    /// or a polling series a loop. Default 2.
    pub retry_after_ignored_min: u64,
    /// Polling with no change of observed state for this many polls, and not finished
    /// `ok`, is a loop. Default 20.
    pub poll_stall_min: u64,
    /// Completed operations a handoff lists (the latest; all are counted). Default 50.
    pub max_listed: usize,
    /// Findings reported per run; the rest are counted in `findings_omitted`.
    /// Default 1000.
    pub max_findings_per_run: u64,
    /// Attempts per run remembered while awaiting their outcome; beyond it the oldest is
    /// forgotten. Default 4096 (about 1 MiB per run at most).
    pub max_open_attempts: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: std::sync::Arc::new(tally_policy::Policy::default()),
            storm_min_failures: 4,
            storm_window_ms: 60_000,
            storm_min_sources: 3,
            retry_after_ignored_min: 2,
            poll_stall_min: 20,
            max_listed: 50,
            max_findings_per_run: 1000,
            max_open_attempts: 4096,
        }
    }
}

impl Config {
    /// Identical calls further apart than this belong to separate series.
    fn series_gap_ms(&self) -> u64 {
        self.storm_window_ms
    }
}

/// Everything the analysis found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Loops, by first seq.
    pub loops: Vec<Loop>,
    /// Audit findings, by seq.
    pub findings: Vec<AuditFinding>,
    /// Findings beyond `Config::max_findings_per_run`, counted, not listed.
    pub findings_omitted: u64,
    /// One handoff per run, in order of the run's first record.
    pub handoffs: Vec<Handoff>,
}

impl Report {
    /// Record which checkpoint covers each run: a run whose last seq is below
    /// `sealed_size` is covered by the checkpoint over the first `sealed_size` entries
    /// (chain head `head`, signed in `epoch`); any other run is not yet sealed.
    pub fn set_coverage(&mut self, sealed_size: u64, head: String, epoch: u32) {
        for h in &mut self.handoffs {
            h.checkpoint = if h.last_seq.seq < sealed_size {
                Coverage::Covered {
                    size: sealed_size,
                    head: head.clone(),
                    epoch,
                }
            } else {
                Coverage::NotYetSealed { sealed_size }
            };
        }
    }

    /// Record, for a merged audit, which checkpoint covers each run in each ledger:
    /// `sealed[l - 1]` is ledger `l`'s latest checkpoint (entries sealed, head, epoch).
    pub fn set_coverage_merged(&mut self, sealed: &[(u64, Option<String>, Option<u32>)]) {
        for h in &mut self.handoffs {
            let ledgers = h
                .last_in
                .iter()
                .filter_map(|&(l, last_seq)| {
                    let (size, head, epoch) = sealed.get(usize::from(l).checked_sub(1)?)?;
                    Some(LedgerCoverage {
                        ledger: l,
                        last_seq,
                        covered: last_seq < *size,
                        size: *size,
                        head: head.clone(),
                        epoch: *epoch,
                    })
                })
                .collect();
            h.checkpoint = Coverage::Ledgers { ledgers };
        }
    }

    /// The handoff of `run`, if the ledger has it.
    pub fn handoff(&self, run: &str) -> Option<&Handoff> {
        self.handoffs.iter().find(|h| h.run == run)
    }
}

/// The streaming analysis: push events in seq order, then finish.
#[derive(Debug)]
pub struct Analysis {
    config: Config,
    runs: HashMap<String, RunState>,
    order: Vec<String>,
    /// Policies the ledger recorded, by digest.
    policies: HashMap<String, std::sync::Arc<tally_policy::Policy>>,
    storms: ToolStorms,
    sink: Sink,
}

impl Analysis {
    /// A new analysis with these thresholds.
    pub fn new(config: Config) -> Analysis {
        Analysis {
            config,
            runs: HashMap::new(),
            order: Vec::new(),
            policies: HashMap::new(),
            storms: ToolStorms::default(),
            sink: Sink::default(),
        }
    }

    /// Take the next event. Events must arrive in seq order.
    pub fn push(&mut self, event: &Event) {
        let d = &event.decision;
        if d.kind() == tally_ledger::Kind::Policy {
            // An invalid policy text is the replay's finding; the audit keeps its default.
            if let Ok(r) = tally_policy::Recorded::new(d.policy_text.as_deref().unwrap_or("")) {
                self.policies
                    .insert(r.digest, std::sync::Arc::new(r.policy));
            }
            return;
        }
        let name = &d.run;
        if !self.runs.contains_key(name) {
            self.order.push(name.clone());
            let mut run = RunState::new(name, event, &self.config.policy);
            let recorded = d.policy.as_ref().and_then(|p| self.policies.get(p));
            if let (tally_ledger::Kind::Start, Some(p)) = (d.kind(), recorded) {
                run.policy = std::sync::Arc::clone(p);
            }
            self.runs.insert(name.clone(), run);
        }
        if let Some(run) = self.runs.get_mut(name) {
            run.push(event, &self.config, &mut self.sink, &mut self.storms);
        }
    }

    /// Close every open window and build the report.
    pub fn finish(self) -> Report {
        let Analysis {
            config,
            mut runs,
            order,
            storms,
            mut sink,
            ..
        } = self;
        for name in &order {
            if let Some(run) = runs.get_mut(name) {
                run.finish(&config, &mut sink);
            }
        }
        sink.loops
            .extend(storms.finish(&config, |r| runs.get(r).and_then(|s| s.halt())));
        loops::dedupe(&mut sink.loops);
        sink.loops.sort_by_key(|l| (l.first_seq, l.last_seq));
        sink.findings.sort_by_key(|f| f.seq);
        // Each run's loops, in report order: one pass over the loops, not one per run.
        let mut of_run: HashMap<&str, Vec<&Loop>> = HashMap::new();
        for l in &sink.loops {
            for (i, r) in l.runs.iter().enumerate() {
                if !l.runs[..i].contains(r) {
                    of_run.entry(r.as_str()).or_default().push(l);
                }
            }
        }
        let handoffs = order
            .iter()
            .filter_map(|name| {
                let run = runs.get(name)?;
                let loops = of_run.get(name.as_str()).map_or(&[][..], Vec::as_slice);
                Some(handoff::build(run, loops, run.findings))
            })
            .collect();
        Report {
            loops: sink.loops,
            findings: sink.findings,
            findings_omitted: sink.findings_omitted,
            handoffs,
        }
    }

    /// Analyse a whole sequence of events.
    pub fn analyse<'a>(config: Config, events: impl IntoIterator<Item = &'a Event>) -> Report {
        let mut analysis = Analysis::new(config);
        for e in events {
            analysis.push(e);
        }
        analysis.finish()
    }
}
