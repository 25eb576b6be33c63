//! What an audit found, as every reader prints it: each ledger's verification (and for
//! several, the verdict over them and the merge's findings), and for `tally verify` with
//! the auditor key, the analysis's audit findings and replay beside it.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::analysis::{self, render_findings_text, render_overruns_text};
use crate::analysis::{render_leases_text, render_usage_refused_text, REPORT_VERSION};
use crate::merge::MergeReport;
use crate::{Report, Verdict};

/// What the verifier found: one report per ledger, and for several, the merge's.
#[derive(Debug)]
pub struct Verified {
    /// Each ledger's report, under its path, in the order given.
    pub reports: Vec<(PathBuf, Report)>,
    /// The merge of several ledgers' decisions (with the auditor key only).
    pub merge: Option<MergeReport>,
}

/// `tally verify`'s report: the verification, and with the auditor key the analysis.
#[derive(Debug)]
pub struct AuditReport {
    /// What the walks found.
    pub verified: Verified,
    /// The one fold over every decision (with the auditor key).
    pub analysis: Option<analysis::Report>,
}

impl Verified {
    /// The worst of the ledgers' verdicts.
    pub fn verdict(&self) -> Verdict {
        let verdicts = || self.reports.iter().map(|(_, r)| r.verdict());
        if verdicts().any(|v| v == Verdict::Tampered) {
            Verdict::Tampered
        } else if verdicts().any(|v| v == Verdict::Incomplete) {
            Verdict::Incomplete
        } else {
            Verdict::Intact
        }
    }

    /// The one report of a one-ledger audit.
    pub fn single(&self) -> Option<&Report> {
        match self.reports.as_slice() {
            [(_, r)] => Some(r),
            _ => None,
        }
    }

    /// How many findings the merge made (of `run`'s records only, if given; findings
    /// beyond those listed count for every run).
    pub fn merge_findings(&self, run: Option<&str>) -> u64 {
        self.merge.as_ref().map_or(0, |m| {
            let listed = m
                .findings
                .iter()
                .filter(|f| run.is_none_or(|r| f.run == r))
                .count() as u64;
            listed + m.omitted
        })
    }

    /// Every ledger's report as text, each under its path.
    pub fn to_text(&self) -> String {
        let Some(r) = self.single() else {
            return self.ledgers_text();
        };
        r.to_text()
    }

    /// Several ledgers' reports as text: the verdict over them, each ledger's, the merge.
    fn ledgers_text(&self) -> String {
        let n = self.reports.len();
        let worst = |v: Verdict| {
            self.reports
                .iter()
                .enumerate()
                .filter(|(_, (_, r))| r.verdict() == v)
                .map(|(i, _)| (i + 1).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = match self.verdict() {
            Verdict::Intact if self.merge.is_some() => {
                format!("INTACT: all {n} ledgers verified and sealed, read as one\n")
            }
            Verdict::Intact => format!("INTACT: all {n} ledgers verified and sealed\n"),
            Verdict::Tampered => format!(
                "TAMPERED: ledger {} of {n} did not verify\n",
                worst(Verdict::Tampered)
            ),
            Verdict::Incomplete => format!(
                "INCOMPLETE: ledger {} of {n} is not wholly sealed\n",
                worst(Verdict::Incomplete)
            ),
        };
        for (i, (path, r)) in self.reports.iter().enumerate() {
            out.push_str(&format!("ledger {} ({}):\n", i + 1, path.display()));
            for line in r.to_text().lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if let Some(m) = &self.merge {
            let total: u64 = m.decisions.iter().sum();
            out.push_str(&format!(
                "merged: {total} decisions of {} ledgers in state version order\n",
                self.reports.len()
            ));
            out.push_str(&m.to_text());
        }
        out
    }

    /// Every ledger's full report as JSON: one ledger's, or for several the verdict over
    /// them, each ledger's (numbered, with its path) and the merge's.
    pub fn to_json(&self) -> Value {
        match self.single() {
            Some(report) => report.to_json(),
            None => json!({
                "version": REPORT_VERSION,
                "verdict": self.verdict(),
                "ledgers": self.numbered(Report::to_json),
                "merge": self.merge,
            }),
        }
    }

    /// What the verifier found, as every report's JSON carries it (`verification`): one
    /// ledger's verdict and extent, or for several the verdict over them, each ledger's,
    /// and the merge's findings.
    pub fn verification_json(&self) -> Value {
        let one = |report: &Report| {
            json!({
                "verdict": report.verdict(),
                "ledger_id": report.ledger_id,
                "entries": report.entries,
                "sealed": report.sealed,
                "tail": report.tail,
                "first_bad": report.first_break(),
            })
        };
        match self.single() {
            Some(report) => one(report),
            None => json!({
                "verdict": self.verdict(),
                "ledgers": self.numbered(one),
                "merge": self.merge,
            }),
        }
    }

    /// Each ledger's `part`, with its number and path.
    fn numbered(&self, part: impl Fn(&Report) -> Value) -> Vec<Value> {
        self.reports
            .iter()
            .enumerate()
            .map(|(i, (path, r))| {
                let mut v = part(r);
                if let Value::Object(map) = &mut v {
                    map.insert("ledger".into(), (i + 1).into());
                    map.insert("path".into(), path.display().to_string().into());
                }
                v
            })
            .collect()
    }

    /// The line every report page carries when the evidence is not intact: a chain that
    /// did not verify (forced), or evidence that is incomplete, saying what is covered;
    /// and a warning when the merge found state versions out of order or shared.
    pub fn banner(&self) -> Option<String> {
        let first = match self.single() {
            Some(report) => report
                .to_text()
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
            None => self
                .reports
                .iter()
                .enumerate()
                .filter(|(_, (_, r))| r.verdict() != Verdict::Intact)
                .map(|(i, (_, r))| {
                    let line = r.to_text().lines().next().unwrap_or_default().to_owned();
                    format!("ledger {}: {line}", i + 1)
                })
                .collect::<Vec<_>>()
                .join("; "),
        };
        let merge = match self.merge_findings(None) {
            0 => String::new(),
            n => format!(
                "WARNING: merging the ledgers found {n} state versions out of order or shared (`tally verify` lists them).\n"
            ),
        };
        let verdict = match self.verdict() {
            Verdict::Tampered => Some(format!(
                "WARNING: this ledger did NOT verify ({first}); what follows may be false.\n"
            )),
            Verdict::Incomplete => Some(format!(
                "NOTE: the evidence is incomplete ({first}); what follows covers only the records read.\n"
            )),
            Verdict::Intact => None,
        };
        match (verdict, merge.is_empty()) {
            (None, true) => None,
            (v, _) => Some(format!("{}{merge}", v.unwrap_or_default())),
        }
    }
}

impl AuditReport {
    /// The worst of the ledgers' verdicts.
    pub fn verdict(&self) -> Verdict {
        self.verified.verdict()
    }

    /// Whether the decisions are inconsistent: the analysis found something, or the merge
    /// did (`tally verify` exits 1 then, over incomplete evidence too).
    pub fn inconsistent(&self) -> bool {
        self.analysis
            .as_ref()
            .is_some_and(analysis::Report::inconsistent)
            || self.verified.merge_findings(None) > 0
    }

    /// The report as `tally verify --json` prints it (schemas in docs/schemas/): the
    /// verification, and with the analysis its audit findings and replay.
    pub fn to_json(&self) -> Value {
        let mut value = self.verified.to_json();
        if let (Value::Object(map), Some(f)) = (&mut value, &self.analysis) {
            map.insert(
                "audit".into(),
                json!({"findings": f.findings, "findings_omitted": f.findings_omitted,
                       "overruns": f.overruns, "usage_refused": f.usage_refused}),
            );
            if !f.leases.is_empty() {
                if let Some(Value::Object(audit)) = map.get_mut("audit") {
                    audit.insert("leases".into(), json!(f.leases));
                }
            }
            map.insert("replay".into(), json!(f.replay));
        }
        value
    }

    /// The report as `tally verify` prints it: the verification, the analysis's
    /// findings, overruns, refused usage and replay, and the inconsistency's last line.
    pub fn to_text(&self) -> String {
        let mut text = self.verified.to_text();
        if let Some(f) = &self.analysis {
            text.push('\n');
            text.push_str(&render_findings_text(f));
            text.push_str(&render_overruns_text(f));
            text.push_str(&render_usage_refused_text(f));
            text.push_str(&render_leases_text(f));
            text.push('\n');
            text.push_str(&f.replay.to_text());
        }
        if self.inconsistent() && self.verdict() != Verdict::Tampered {
            text.push_str(
                "\nINCONSISTENT: the chain verifies, but decisions in it are inconsistent (the findings above): exit 1\n",
            );
        }
        text
    }
}
