//! Refill chains in a ledger: runs continuing runs a `stop`-action refusal ended, each
//! start held to the policy core's count ([`tally_policy::refill`]), and the chain a
//! run ends shown in its handoff. Nothing is counted here: this file only looks runs
//! up by name for the core.

use std::collections::BTreeSet;

use tally_ledger::{Decision, Kind, Reason};
use tally_policy::refill;
use tally_policy::{Policy, RunState};

use super::handoff::{Handoff, RefillChain, ResumeAction, ResumeStep};
use super::run::RunAnalysis;
use crate::hash::Map;

/// Most runs of a chain a handoff walks back and names.
const MOST_SHOWN: u64 = 64;

/// Starts whose `continues` named a run that had not stopped (or was unknown) when they
/// started: no continuation of it, whatever that run did later.
#[derive(Debug, Default)]
pub(super) struct Links {
    unlinked: BTreeSet<usize>,
}

impl Links {
    /// Note a start at `slot` before it is folded: whether the run it names had stopped.
    pub fn start(
        &mut self,
        runs: &[RunAnalysis],
        index: &Map<String, usize>,
        slot: usize,
        d: &Decision,
    ) {
        if d.kind() != Kind::Start {
            return;
        }
        let stopped = d
            .continues
            .as_deref()
            .and_then(|c| index.get(c))
            .is_some_and(|&c| c != slot && runs[c].core.stop.is_some());
        if !stopped {
            self.unlinked.insert(slot);
        }
    }

    /// Runs by name, as the core reads them: a start noted unlinked continues nothing.
    fn lookup<'a>(
        &'a self,
        runs: &'a [RunAnalysis],
        index: &'a Map<String, usize>,
    ) -> impl FnMut(&str) -> Option<RunState> + 'a {
        move |name| {
            let &i = index.get(name)?;
            let mut core = runs[i].core.clone();
            if self.unlinked.contains(&i) {
                core.continues = None;
            }
            Some(core)
        }
    }

    /// The core's verdict on a start record, before it is folded: a refill beyond the
    /// allowance with no grant.
    pub fn judge(
        &self,
        policy: &Policy,
        runs: &[RunAnalysis],
        index: &Map<String, usize>,
        d: &Decision,
    ) -> Option<tally_policy::Inconsistency> {
        if d.kind() != Kind::Start {
            return None;
        }
        refill::judge(policy, d, self.lookup(runs, index))
    }

    /// The chain `run` ends, where a continuation of it would need an approver: shown in
    /// its handoff, whose advice becomes a human's decision, never a new run.
    pub fn show(
        &self,
        policy: &Policy,
        runs: &[RunAnalysis],
        index: &Map<String, usize>,
        run: &RunAnalysis,
        handoff: &mut Handoff,
    ) {
        let next = refill::refill(policy, &run.core, None, self.lookup(runs, index));
        let Some(next) = next else {
            return;
        };
        let chain = refill::chain(&run.core, MOST_SHOWN, self.lookup(runs, index));
        let reasons: BTreeSet<Reason> = chain.runs.iter().filter_map(|r| r.stop).collect();
        let failure = (reasons.len() == 1)
            .then(|| reasons.into_iter().next())
            .flatten();
        let shown = RefillChain {
            runs: chain.runs.iter().rev().map(|r| r.run.clone()).collect(),
            attempts_used: chain
                .runs
                .iter()
                .map(|r| r.attempts_used)
                .fold(0, u64::saturating_add),
            spent_nanos: chain
                .runs
                .iter()
                .map(|r| r.spent_nanos())
                .fold(0, u64::saturating_add),
            failure,
            tool: handoff.refused.last().and_then(|c| c.tool.clone()),
            continuations: next.continuations,
            allowance: next.allowance,
        };
        advise(handoff, &shown);
        handoff.chain = Some(shown);
    }
}

/// A human's decision in place of "continue in a new run".
fn advise(handoff: &mut Handoff, chain: &RefillChain) {
    let seq = handoff
        .safe_resume
        .iter()
        .find(|s| s.action == ResumeAction::NewRun)
        .and_then(|s| s.seq);
    handoff
        .safe_resume
        .retain(|s| s.action != ResumeAction::NewRun);
    let why = chain
        .failure
        .map_or("refusals".to_owned(), |r| r.as_str().to_owned());
    handoff.safe_resume.push(ResumeStep {
        action: ResumeAction::AskHuman,
        what: format!(
            "a human decides: {} runs in a row stopped on {why} (a new run is not a new budget: fix the cause first, or raise approvals.max_unapproved_continuations)",
            chain.runs.len()
        ),
        tool: chain.tool.clone(),
        operation: None,
        remote_ref: None,
        reason: Some(Reason::RefillWithoutApproval),
        not_before: None,
        seq: seq.or(Some(handoff.last_seq)),
    });
}
