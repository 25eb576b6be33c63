//! Retry storms across runs: one tool's calls from every run, on the wall clock.

use std::collections::BTreeSet;
use std::sync::Arc;

use tally_ledger::Reason;

use crate::event::Seq;

use super::{CallFacts, Clock, Close, Loop, OutcomeFacts, Pattern, Series, MAX_NAMED};

/// One tool's failures across every run and worker, judged by the tool's shared
/// breaker (the core's): a storm is the failures that opened it and the calls it then
/// refused.
#[derive(Debug)]
pub(crate) struct ToolStorm {
    pub breaker: tally_policy::ToolState,
    series: Option<Series>,
    runs: BTreeSet<String>,
}

/// The breakers of every tool, folded by the core's own transitions.
#[derive(Debug, Default)]
pub(crate) struct ToolStorms {
    tools: crate::hash::Map<Arc<str>, ToolStorm>,
}

/// Most tools whose breaker the analysis follows at once; a closed breaker with no
/// failures is the first forgotten (it is what a fresh one is).
const MAX_TOOLS: usize = 10_000;

impl ToolStorms {
    /// The breaker of `tool` (a fresh one if it is not followed).
    pub fn breaker(&self, tool: &str) -> Option<&tally_policy::ToolState> {
        self.tools.get(tool).map(|t| &t.breaker)
    }

    fn entry(&mut self, tool: &Arc<str>) -> &mut ToolStorm {
        if !self.tools.contains_key(tool) && self.tools.len() >= MAX_TOOLS {
            let fresh = tally_policy::Breaker::default();
            self.tools
                .retain(|_, t| t.breaker.breaker != fresh || t.series.is_some());
        }
        self.tools
            .entry(Arc::clone(tool))
            .or_insert_with(|| ToolStorm {
                breaker: tally_policy::ToolState::default(),
                series: None,
                runs: BTreeSet::new(),
            })
    }

    /// A call of `tool` by `run`: `refused` when the breaker refused it, or would have.
    pub fn call(&mut self, tool: &Arc<str>, run: &str, c: &CallFacts<'_>) {
        // A storm counts results: failed outcomes, and the calls its breaker refused (or
        // would have).
        if !c.flagged {
            return;
        }
        let t = self.entry(tool);
        if let Some(s) = &mut t.series {
            s.call(c, None);
            if t.runs.len() < MAX_NAMED {
                t.runs.insert(run.to_owned());
            }
        }
    }

    /// The outcome of `run`'s call `attempt` of `tool`: folded through the core's
    /// breaker. A failure opens (or extends) the series; an `ok` that closes the breaker
    /// ends it.
    #[allow(clippy::too_many_arguments)]
    pub fn outcome(
        &mut self,
        policy: &tally_policy::Policy,
        tool: &Arc<str>,
        run: &str,
        attempt: u64,
        o: &OutcomeFacts<'_>,
        wall_ms: u64,
        sink: &mut Vec<Loop>,
    ) {
        if policy.breaker.failures_for(tool).is_none() {
            // A tool the policy gives no breaker: its failures are the runs' own to
            // bound (their retry and loop rules), never a storm across runs.
            return;
        }
        let t = self.entry(tool);
        let now = tally_policy::Now {
            wall_ms,
            at_ms: None,
        };
        let id = || tally_policy::state::call_id(run, attempt);
        tally_policy::breaker_outcome(policy, tool, &mut t.breaker, id, o.status, now);
        let failed = tally_policy::is_failure(o.status);
        if failed {
            let s = t.series.get_or_insert_with(|| {
                Series::new(Pattern::RetryStorm, o.seq, wall_ms, Some(Arc::clone(tool)))
            });
            s.now.last_seq = s.now.last_seq.max(o.seq);
            s.now.last_ms = s.now.last_ms.max(wall_ms);
            s.now.count += 1;
            s.outcome(o);
            if t.runs.len() < MAX_NAMED {
                t.runs.insert(run.to_owned());
            }
        } else if let Some(s) = &mut t.series {
            s.outcome(o);
        }
        if t.breaker.breaker == (tally_policy::Breaker::Closed { failures: 0 }) {
            if let Some(s) = t.series.take() {
                let runs = std::mem::take(&mut t.runs).into_iter().collect();
                sink.extend(s.close(runs, Clock::Wall, Close::Gap));
            }
        }
    }

    /// Close every storm at the end of the ledger.
    pub fn finish(self, stop_of: impl Fn(&str) -> Option<(Reason, Seq)>) -> Vec<Loop> {
        let mut out = Vec::new();
        for (_, t) in self.tools {
            if let Some(s) = t.series {
                // At the end of the ledger the storm is over only if every run in it
                // stopped.
                let stops: Option<Vec<(Reason, Seq)>> = t.runs.iter().map(|r| stop_of(r)).collect();
                let stop = stops.and_then(|s| s.into_iter().max_by_key(|(_, seq)| *seq));
                out.extend(s.close(
                    t.runs.into_iter().collect(),
                    Clock::Wall,
                    Close::Finish { stop },
                ));
            }
        }
        out
    }
}
