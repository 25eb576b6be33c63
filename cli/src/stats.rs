//! `tally stats`: attempts per run against its cap, spend against its limit, and why
//! each run stopped, from the handoffs of the analysis. The report is a serde type
//! ([`StatsReport`]): its JSON is `docs/schemas/stats.json` (docs/REPORTS.md), its text
//! a table.

use anyhow::{bail, Result};
use serde::Serialize;
use tally_ledger::money::Nanos;
use tally_ledger::Reason;
use tally_verify::analysis::{self, Attempts, Handoff, Spend};
use tally_verify::calibration;
use tally_verify::text::{plural, shown};

use crate::cli::ReportArgs;
use crate::commands::{analyse, analysis_code, emit};
use crate::Exit;

/// `tally stats --json` (besides `verification`): one entry per run.
#[derive(Clone, Debug, Serialize)]
pub struct StatsReport<'a> {
    /// The reports' version (docs/REPORTS.md).
    pub version: u32,
    /// The runs, in the order of their first record.
    pub runs: Vec<RunStats<'a>>,
    /// The completed runs' band by goal family, beside the limits (absent when no run
    /// completed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calibration: Vec<calibration::Family>,
}

/// One run's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct RunStats<'a> {
    /// The run.
    pub run: &'a str,
    /// Attempts used of the limit in force.
    pub attempts: &'a Attempts,
    /// Spend reserved and settled, against its limit.
    pub spend: &'a Spend,
    /// More attempts used than the limit in force: what approvals added is in
    /// `attempts.approved_extra`.
    pub over_cap: bool,
    /// Why the run stopped; `null` while it runs.
    pub stop: Option<Reason>,
}

impl<'a> RunStats<'a> {
    fn of(h: &'a Handoff) -> RunStats<'a> {
        RunStats {
            run: &h.run,
            attempts: &h.attempts,
            spend: &h.spend,
            over_cap: tally_policy::over_limit(h.attempts.used, h.attempts.limit),
            stop: h.stop.reason,
        }
    }
}

/// Spend settled of its limit, as people read it: `$0.35 of $0.50`.
fn usd_of(used: u64, limit: Option<u64>) -> String {
    match limit {
        Some(l) => format!("{} of {}", Nanos(used), Nanos(l)),
        None => format!("{} (no limit)", Nanos(used)),
    }
}

impl StatsReport<'_> {
    /// The table people read, and the count of inconsistencies found.
    pub fn to_text(&self, inconsistencies: u64) -> String {
        let of = |used: u64, limit: Option<u64>, unit: &str| match limit {
            Some(l) => format!("{used}{unit} of {l}{unit}"),
            None => format!("{used}{unit} (no limit)"),
        };
        let mut text = format!(
            "{:<24} {:<16} {:<20} {:<14} {}\n",
            "run", "attempts", "spend settled", "held", "stop"
        );
        for r in &self.runs {
            let (a, s) = (r.attempts, r.spend);
            text.push_str(&format!(
                "{:<24} {:<16} {:<20} {:<14} {}{}\n",
                shown(r.run),
                of(a.used, a.limit, ""),
                usd_of(s.settled_nanos, s.limit_nanos),
                Nanos(s.reserved_nanos).to_string(),
                r.stop.map_or_else(|| "running".into(), |r| r.to_string()),
                if r.over_cap {
                    format!(
                        "  (over the cap by {}; {} approved)",
                        a.used - a.limit.unwrap_or(0),
                        a.approved_extra
                    )
                } else {
                    String::new()
                }
            ));
        }
        text.push_str(&calibration::to_text(&self.calibration));
        if inconsistencies > 0 {
            text.push_str(&format!(
                "\n{} found: `tally loops` (or `tally verify --auditor-key`) lists them\n",
                plural(inconsistencies, "inconsistency", "inconsistencies")
            ));
        }
        text
    }
}

/// `tally stats`.
pub fn stats(args: &ReportArgs) -> Result<Exit> {
    let ReportArgs {
        read,
        auditor_key,
        run,
        force,
        rules,
    } = args;
    let run = run.as_deref();
    let Some((verified, found)) = analyse(read, auditor_key, *force, rules)? else {
        return Ok(Exit::Findings);
    };
    // With --run, only that run's findings decide the exit code.
    let findings = match run {
        Some(run) => match found.handoff(run) {
            Some(h) => h.findings,
            None => bail!("no run named {run:?} in the ledgers read"),
        },
        None => found.findings.len() as u64 + found.findings_omitted,
    };
    let shown = || {
        found
            .handoffs
            .iter()
            .filter(|h| run.is_none_or(|r| h.run == r))
    };
    let report = StatsReport {
        version: analysis::REPORT_VERSION,
        runs: shown().map(RunStats::of).collect(),
        calibration: calibration::calibrate(shown()),
    };
    let text = report.to_text(found.findings.len() as u64 + found.findings_omitted);
    let json = serde_json::to_string(&report)?;
    emit(&verified, read.json, text, &[json])?;
    Ok(analysis_code(&verified, findings, run))
}
