//! What a backtest found: per run and in total, the calls a new policy decides otherwise
//! than the gate did, where each run would have stopped, and what it would have saved.
//! Its JSON is `docs/schemas/backtest.json` (docs/REPORTS.md, "backtest"); its text fits
//! one screen for a small ledger.

use serde::Serialize;
use tally_ledger::money::Nanos;
use tally_ledger::Reason;

use crate::event::Seq;
use crate::text::{plural, shown};

/// Changed calls listed per run; the rest are counted in `changes_omitted`.
pub const MAX_CHANGES_PER_RUN: usize = 100;

/// One call the new policy decides otherwise than the gate did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The gate's decision of it.
    pub seq: Seq,
    /// Its place among the run's calls, from 1.
    pub call: u64,
    /// Its tool.
    pub tool: String,
    /// The gate's reason; `null`: the gate allowed it.
    pub recorded: Option<Reason>,
    /// The new policy's reason; `null`: it allows it.
    pub would: Option<Reason>,
    /// For `approval_required`: the limit a grant would have to lift.
    pub cause: Option<Reason>,
}

/// Where a run would have stopped: the call the new policy refuses with action `stop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StopsAt {
    /// The refused call's place among the run's calls, from 1.
    pub call: u64,
    /// The gate's decision of that call.
    pub seq: Seq,
    /// Why.
    pub reason: Reason,
}

/// One run under the new policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunBacktest {
    /// The run.
    pub run: String,
    /// Calls the gate decided (allows and refusals).
    pub calls: u64,
    /// Calls the run would have made: none after [`RunBacktest::stops_at`].
    pub calls_made: u64,
    /// The call at which it would have stopped; `null`: it would have gone as far.
    pub stops_at: Option<StopsAt>,
    /// Allowed by the gate, refused by the new policy.
    pub newly_refused: Vec<Change>,
    /// Refused by the gate, allowed by the new policy.
    pub newly_allowed: Vec<Change>,
    /// Changes beyond the listed ones.
    pub changes_omitted: u64,
    /// Calls newly refused, listed or not.
    #[serde(skip)]
    pub(crate) refused_count: u64,
    /// Calls newly allowed, listed or not.
    #[serde(skip)]
    pub(crate) allowed_count: u64,
    /// Attempts the run used as recorded, and under the new policy.
    pub attempts_recorded: u64,
    /// Attempts under the new policy.
    pub attempts_would: u64,
    /// Spend (settled and held), nanodollars, as recorded.
    pub spend_recorded_nanos: u64,
    /// Spend under the new policy.
    pub spend_would_nanos: u64,
}

impl RunBacktest {
    /// A change, listed while there is room.
    pub(crate) fn change(&mut self, c: Change) {
        if c.recorded.is_none() {
            self.refused_count += 1;
        } else {
            self.allowed_count += 1;
        }
        if self.newly_refused.len() + self.newly_allowed.len() >= MAX_CHANGES_PER_RUN {
            self.changes_omitted += 1;
        } else if c.recorded.is_none() {
            self.newly_refused.push(c);
        } else {
            self.newly_allowed.push(c);
        }
    }
}

/// The whole ledger under the new policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Runs the gate governed (replayed).
    pub runs: u64,
    /// Runs that would have stopped earlier.
    pub runs_stopping_earlier: u64,
    /// Calls the gate decided.
    pub calls: u64,
    /// Calls that would not have been made (after a `stop` refusal).
    pub calls_not_made: u64,
    /// Allowed, now refused.
    pub newly_refused: u64,
    /// Refused, now allowed.
    pub newly_allowed: u64,
    /// Attempts used as recorded less under the new policy (negative: it uses more).
    pub attempts_saved: i64,
    /// Spend as recorded less under the new policy, nanodollars (negative: more).
    pub spend_saved_nanos: i64,
    /// Runs not replayed: their start is not in the ledger, or the gate did not govern
    /// them.
    pub runs_skipped: u64,
}

/// `tally policy backtest`'s report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BacktestReport {
    /// The reports' version.
    pub version: u32,
    /// The new policy's digest.
    pub policy: String,
    /// Totals.
    pub total: Totals,
    /// Each replayed run, in order of its start.
    pub runs: Vec<RunBacktest>,
}

/// `saved` as people read it: "3 attempts saved", "2 attempts more".
fn saved(n: i64, one: &str, many: &str) -> String {
    let noun = plural(n.unsigned_abs(), one, many);
    if n < 0 {
        format!("{noun} more")
    } else {
        format!("{noun} saved")
    }
}

/// Signed nanodollars as people read them.
fn usd(n: i64) -> String {
    let abs = Nanos(n.unsigned_abs()).to_string();
    if n < 0 {
        format!("{abs} more")
    } else {
        format!("{abs} saved")
    }
}

/// One change as a line.
fn change_line(c: &Change) -> String {
    let reason = |r: Option<Reason>| r.map_or("allowed".to_owned(), |r| r.to_string());
    let cause = c.cause.map_or(String::new(), |r| format!(" (cause {r})"));
    format!(
        "    call {} (seq {}, {}): {} -> {}{cause}\n",
        c.call,
        c.seq,
        shown(&c.tool),
        reason(c.recorded),
        reason(c.would)
    )
}

impl RunBacktest {
    fn to_text(&self) -> String {
        let mut out = format!("  run {}: ", shown(&self.run));
        match self.stops_at {
            Some(s) => out.push_str(&format!(
                "stops at call {} of {} ({}, seq {})",
                s.call, self.calls, s.reason, s.seq
            )),
            None => out.push_str(&format!("all {} calls", self.calls)),
        }
        let attempts = self.attempts_recorded as i64 - self.attempts_would as i64;
        let spend = self.spend_recorded_nanos as i64 - self.spend_would_nanos as i64;
        out.push_str(&format!(
            "; {}, {}\n",
            saved(attempts, "attempt", "attempts"),
            usd(spend)
        ));
        for c in self.newly_refused.iter().chain(&self.newly_allowed) {
            out.push_str(&change_line(c));
        }
        if self.changes_omitted > 0 {
            out.push_str(&format!("    ... and {} more\n", self.changes_omitted));
        }
        out
    }
}

impl BacktestReport {
    /// Whether the new policy decides any call otherwise than the gate did.
    pub fn changes_anything(&self) -> bool {
        let t = &self.total;
        t.newly_refused + t.newly_allowed + t.calls_not_made > 0
    }

    /// The report as text: the totals, then each run it changes.
    pub fn to_text(&self) -> String {
        let t = &self.total;
        let mut out = format!(
            "Backtest of policy {} over {} ({} decided by the gate):\n",
            &self.policy[..self.policy.len().min(16)],
            plural(t.runs, "run", "runs"),
            plural(t.calls, "call", "calls"),
        );
        out.push_str(&format!(
            "  {} newly refused, {} newly allowed, {} not made; {} stop earlier\n  {}, {}\n",
            t.newly_refused,
            t.newly_allowed,
            t.calls_not_made,
            plural(t.runs_stopping_earlier, "run would", "runs would"),
            saved(t.attempts_saved, "attempt", "attempts"),
            usd(t.spend_saved_nanos),
        ));
        if t.runs_skipped > 0 {
            out.push_str(&format!(
                "  {} not replayed (not started by the gate, or its start is not in the ledger)\n",
                plural(t.runs_skipped, "run", "runs")
            ));
        }
        let changed: Vec<&RunBacktest> = self
            .runs
            .iter()
            .filter(|r| {
                r.stops_at.is_some() || !r.newly_refused.is_empty() || !r.newly_allowed.is_empty()
            })
            .collect();
        if changed.is_empty() {
            out.push_str("  every run goes as it went.\n");
        }
        for r in changed {
            out.push_str(&r.to_text());
        }
        out
    }

    /// The report as JSON (`docs/schemas/backtest.json`, without `verification`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}
