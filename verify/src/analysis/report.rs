//! What the analysis found: loops, audit findings, the replay and one handoff per run.

use serde::Serialize;

use super::findings::AuditFinding;
use super::handoff::{Coverage, Handoff, LedgerCoverage};
use super::loops::Loop;
use crate::event::Seq;
use crate::replay::ReplayReport;

/// One outcome that settled above its attempt's reservation (`tally_policy::overrun`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Overrun {
    /// The outcome's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// The attempt it settled.
    pub attempt: u64,
    /// What the gate reserved for the attempt, nanodollars.
    pub reserved_nanos: u64,
    /// What the outcome settled, nanodollars.
    pub settled_nanos: u64,
    /// How far above the reservation, nanodollars.
    pub overrun_nanos: u64,
}

/// A proxied outcome whose usage the proxy refused (`usage_refused`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RefusedUsage {
    /// The outcome's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// The attempt.
    pub attempt: u64,
    /// Why: `implausible` or `unpriced`.
    pub why: tally_ledger::UsageRefused,
    /// What it settled (the attempt's reservation), nanodollars.
    pub settled_nanos: u64,
}

/// An amount per dimension of a leased slice or scope (absent: no bound, no cap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeaseAmounts {
    /// Attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u64>,
    /// Spend, nanodollars.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nanos: Option<u64>,
    /// Side effects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<u64>,
    /// Polls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub polls: Option<u64>,
}

impl From<tally_ledger::decision::SliceAmounts> for LeaseAmounts {
    fn from(a: tally_ledger::decision::SliceAmounts) -> LeaseAmounts {
        LeaseAmounts {
            attempts: a.attempts,
            nanos: a.nanos,
            side_effects: a.side_effects,
            polls: a.polls,
        }
    }
}

impl From<[u64; 4]> for LeaseAmounts {
    fn from([attempts, nanos, side_effects, polls]: [u64; 4]) -> LeaseAmounts {
        LeaseAmounts {
            attempts: Some(attempts),
            nanos: Some(nanos),
            side_effects: Some(side_effects),
            polls: Some(polls),
        }
    }
}

/// A scope's cap, as the ledgers say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cap {
    /// From the run's start record, or the recorded policy's principal limits.
    Known(LeaseAmounts),
    /// Not knowable from the ledgers (a credential's or bucket's, a run without its
    /// start, a principal whose recorded policies disagree or say nothing): the slices
    /// of the scope were not checked against a cap.
    Unknown,
}

/// One scope slices were leased from, over the ledgers given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScopeLeases {
    /// The scope's kind.
    pub scope_kind: tally_ledger::decision::LeaseScope,
    /// Which one.
    pub scope_key: String,
    /// Slices granted on it.
    pub slices: u64,
    /// The most its open slices bounded at once, per dimension.
    pub most_leased: LeaseAmounts,
    /// Its cap.
    pub cap: Cap,
}

/// Everything the analysis found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Loops, by first seq.
    pub loops: Vec<Loop>,
    /// Audit findings (the core's verdicts), by seq.
    pub findings: Vec<AuditFinding>,
    /// Findings beyond `Config::max_findings_per_run`, counted, not listed.
    pub findings_omitted: u64,
    /// Every outcome that settled above its attempt's reservation, by seq: the upstream
    /// billed more than the gate's worst case. A fact of the bill, not an inconsistency
    /// (the gate refuses later spending after one); each says where an estimate was
    /// wrong.
    pub overruns: Vec<Overrun>,
    /// Every proxied outcome whose usage the proxy did not believe or could not price
    /// (`usage_refused`), by seq: an `error` settled at its reservation, whose real bill
    /// the operator finds in the provider's console.
    pub usage_refused: Vec<RefusedUsage>,
    /// Every gate decision decided again under its recorded policy.
    pub replay: ReplayReport,
    /// One handoff per run, in order of the run's first record.
    pub handoffs: Vec<Handoff>,
    /// Every scope slices were leased from (`lease` records), by kind and key; its
    /// findings are among `findings`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<ScopeLeases>,
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

    /// Whether the core found anything inconsistent, or replay any decision the policy
    /// would not have made.
    pub fn inconsistent(&self) -> bool {
        !self.findings.is_empty()
            || self.findings_omitted > 0
            || !self.replay.findings.is_empty()
            || self.replay.omitted > 0
    }
}
