//! Backtest: a new policy tried on the past. Every run the gate governed is replayed
//! under the new policy, with the gate's recorded decisions as the calls the agent asked
//! for and its recorded outcomes as what the calls did: each call is decided again by the
//! one policy core ([`tally_policy::decide`]) on the state the new policy's own decisions
//! give ([`tally_policy::apply`]), beside the state as recorded (the same fold under the
//! policy the ledger names).
//!
//! What a call the new policy refuses did never happens: it uses no budget, its outcomes
//! are not folded. A call the new policy allows that the gate refused is allowed with no
//! outcome (the ledger holds none): its reservation stays held. A run stops at the first
//! call the new policy refuses, the gate did not, with action `stop`: the calls after it
//! are not made (an agent that went on after the gate's own `stop` refusal is taken to
//! go on as it did). Refusals whose cause is outside the records (a rate limit, an open
//! breaker, a pause) are taken as recorded, as replay takes them.
//!
//! Feed every [`Event`] in seq order to [`Backtest::push`], then [`Backtest::finish`].

mod report;

use std::sync::Arc;

use tally_ledger::{Action, Decision, Kind, Reason};
use tally_policy::{
    apply, apply_keyed, decide, grant_budget, CredentialState, Keyed, Now, Policy, PolicyError,
    PrincipalState, Recorded, RunState, Verdict, View, ViewMut,
};
use tally_record::decision::Budget;

pub use report::{BacktestReport, Change, RunBacktest, StopsAt, Totals, MAX_CHANGES_PER_RUN};

use crate::hash::Map;
use crate::Event;

/// Why a backtest cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BacktestError {
    /// The new policy does not parse or is not valid.
    #[error("the policy to backtest is not a valid policy: {source} (check it with `tally policy check FILE`)")]
    Policy {
        /// Why.
        #[source]
        source: PolicyError,
    },
}

/// One run, as recorded and as the new policy would have had it.
#[derive(Debug)]
struct Sim {
    /// The state as the gate's records give it (under the policy they name).
    recorded: RunState,
    /// The state under the new policy.
    would: RunState,
    /// The policy the run's start named (as applied offline).
    old: Arc<Policy>,
    /// The gate's attempt numbers and the new policy's, for attempts both allowed.
    attempts: Map<u64, u64>,
    report: RunBacktest,
}

/// The streaming backtest: push events in seq order, then finish.
#[derive(Debug)]
pub struct Backtest {
    new: Policy,
    digest: String,
    /// Policies the ledger recorded, by digest (as replay applies them offline).
    policies: Map<String, Arc<Policy>>,
    runs: Vec<Sim>,
    index: Map<String, usize>,
    /// Runs seen that are not replayed.
    skipped: Map<String, ()>,
    credentials: Map<String, CredentialState>,
    principals: Map<u32, PrincipalState>,
}

impl Backtest {
    /// A backtest of the policy `text` (a policy file's text, as `tally serve --policy`
    /// takes it).
    pub fn new(text: &str) -> Result<Backtest, BacktestError> {
        let r = Recorded::new(text).map_err(|source| BacktestError::Policy { source })?;
        Ok(Backtest {
            new: crate::replay::offline(&r.policy),
            digest: r.digest,
            policies: Map::default(),
            runs: Vec::new(),
            index: Map::default(),
            skipped: Map::default(),
            credentials: Map::default(),
            principals: Map::default(),
        })
    }

    /// Take the next event. Events must arrive in seq order.
    pub fn push(&mut self, e: &Event) {
        let d = &e.decision;
        match d.kind() {
            Kind::Policy => {
                if let Ok(r) = Recorded::from_ledger(d.policy_text.as_deref().unwrap_or("")) {
                    let offline = Arc::new(crate::replay::offline(&r.policy));
                    self.policies.insert(r.digest, offline);
                }
            }
            // A slice's event is no run's: backtesting a policy leaves leases alone.
            Kind::Lease => {}
            Kind::Start if !self.index.contains_key(&d.run) => self.start(e),
            _ => match self.index.get(&d.run) {
                Some(&i) => self.fold(i, e),
                None => {
                    self.skipped.insert(d.run.clone(), ());
                }
            },
        }
    }

    /// A run's start: granted what the new policy grants for what it asked.
    fn start(&mut self, e: &Event) {
        let d = &e.decision;
        let old = d
            .policy
            .as_ref()
            .and_then(|p| self.policies.get(p))
            .cloned();
        let Some(old) = old else {
            // Not started by the gate (or under a policy the ledger never recorded).
            self.skipped.insert(d.run.clone(), ());
            return;
        };
        let parent = d.parent.as_ref().and_then(|p| self.index.get(p)).copied();
        let asked = asked(&old, d);
        let budget = grant_budget(
            &self.new,
            Some(&asked),
            d.credential.as_deref(),
            parent.map(|p| &self.runs[p].would),
        );
        let mut again = d.as_ref().clone();
        again.budget = Some(Box::new(budget));
        again.policy = Some(self.digest.clone());
        let mut sim = Sim {
            recorded: RunState::new(&d.run),
            would: RunState::new(&d.run),
            old: Arc::clone(&old),
            attempts: Map::default(),
            report: RunBacktest {
                run: d.run.clone(),
                ..RunBacktest::default()
            },
        };
        let now = Now {
            wall_ms: e.wall_ms,
            at_ms: d.at_ms,
        };
        apply(&old, ViewMut::of(&mut sim.recorded), d, now);
        let uid = d.uid.filter(|u| self.new.principal(*u).is_some());
        let principal = uid.map(|u| self.principals.entry(u).or_default());
        let parent_state = parent.map(|p| &mut self.runs[p].would);
        apply(
            &self.new,
            ViewMut {
                run: &mut sim.would,
                tool: None,
                credential: None,
                principal,
                parent: parent_state,
                continued: None,
            },
            &again,
            now,
        );
        self.index.insert(d.run.clone(), self.runs.len());
        self.runs.push(sim);
    }

    /// A record of a replayed run.
    fn fold(&mut self, i: usize, e: &Event) {
        let d = &e.decision;
        let sim = &mut self.runs[i];
        let at = |run: &RunState| {
            let run_ms = run.run_ms(Now {
                wall_ms: e.wall_ms,
                at_ms: d.at_ms,
            });
            Now {
                wall_ms: run.start_wall_ms.saturating_add(run_ms),
                at_ms: Some(run_ms),
            }
        };
        let old = Arc::clone(&sim.old);
        let recorded_now = at(&sim.recorded);
        apply(&old, ViewMut::of(&mut sim.recorded), d, recorded_now);
        match d.kind() {
            Kind::Allow | Kind::Deny => self.call(i, e),
            Kind::Outcome | Kind::Refund => self.outcome(i, e),
            Kind::Start | Kind::Policy | Kind::Lease => {}
            Kind::Stop | Kind::Override | Kind::Pause | Kind::Resume => {
                let now = at(&self.runs[i].would);
                self.apply_would(i, d, None, now);
            }
        }
    }

    /// Fold `d` into run `i`'s state under the new policy.
    fn apply_would(&mut self, i: usize, d: &Decision, keyed: Option<&Keyed>, now: Now) {
        let credential = d
            .credential
            .clone()
            .or_else(|| self.runs[i].would.credential.clone())
            .filter(|_| matches!(d.kind(), Kind::Allow | Kind::Outcome | Kind::Refund));
        let uid = self.runs[i].would.owner_uid;
        let principal = uid
            .filter(|u| self.new.principal(*u).is_some())
            .map(|u| self.principals.entry(u).or_default());
        let credential = credential.map(|c| self.credentials.entry(c).or_default());
        apply_keyed(
            &self.new,
            ViewMut {
                run: &mut self.runs[i].would,
                tool: None,
                credential,
                principal,
                parent: None,
                continued: None,
            },
            d,
            keyed,
            now,
        );
    }

    /// The new policy's time for a record of run `i`.
    fn now(&self, i: usize, e: &Event) -> Now {
        let run = &self.runs[i].would;
        let run_ms = run.run_ms(Now {
            wall_ms: e.wall_ms,
            at_ms: e.decision.at_ms,
        });
        Now {
            wall_ms: run.start_wall_ms.saturating_add(run_ms),
            at_ms: Some(run_ms),
        }
    }

    /// A call the gate decided: decided again under the new policy.
    fn call(&mut self, i: usize, e: &Event) {
        let d = &e.decision;
        let recorded = d.reason.filter(|_| d.kind() == Kind::Deny);
        let stopped = self.runs[i].would.stop.is_some();
        let report = &mut self.runs[i].report;
        report.calls += 1;
        let n = report.calls;
        if report.stops_at.is_some() || stopped {
            return;
        }
        report.calls_made += 1;
        if recorded.is_some_and(tally_policy::taken_as_recorded) {
            return;
        }
        let now = self.now(i, e);
        let keyed = Keyed::from_record(d);
        let again = {
            let run = &self.runs[i].would;
            let credential = keyed.call.credential.as_ref().or(run.credential.as_ref());
            let view = View {
                run,
                tool: None,
                credential: credential.and_then(|c| self.credentials.get(c)),
                principal: run
                    .owner_uid
                    .and_then(|u| self.new.principal(u).and_then(|_| self.principals.get(&u))),
                family: Default::default(),
            };
            decide(&self.new, &self.digest, view, &keyed.call, now)
        };
        let would = match again.verdict {
            Verdict::Allow => None,
            Verdict::Deny | Verdict::RequireApproval => again.reason(),
        };
        if would.is_none() {
            if let (None, Some(theirs), Some(ours)) = (recorded, d.attempt, again.record.attempt) {
                self.runs[i].attempts.insert(theirs, ours);
            }
            self.apply_would(i, &again.record, Some(&keyed), now);
        }
        let sim = &mut self.runs[i];
        if recorded.is_none() != would.is_none() {
            sim.report.change(Change {
                seq: e.seq,
                call: n,
                tool: d.tool.clone().unwrap_or_default(),
                recorded,
                would,
                cause: again.cause,
            });
        }
        let stops = |r: Option<Reason>| r.is_some_and(|r| r.action() == Action::Stop);
        if stops(would) && !stops(recorded) {
            let reason = would.unwrap_or(Reason::AttemptsExhausted);
            sim.report.stops_at = Some(StopsAt {
                call: n,
                seq: e.seq,
                reason,
            });
        }
    }

    /// An outcome or refund: of an attempt the new policy allowed too, folded under its
    /// number there; of one it refused, nothing happened.
    fn outcome(&mut self, i: usize, e: &Event) {
        let d = &e.decision;
        let Some(ours) = d
            .attempt
            .and_then(|a| self.runs[i].attempts.get(&a).copied())
        else {
            return;
        };
        let mut again = d.as_ref().clone();
        again.attempt = Some(ours);
        let now = self.now(i, e);
        self.apply_would(i, &again, None, now);
    }

    /// The report.
    pub fn finish(self) -> BacktestReport {
        let mut total = Totals {
            runs_skipped: self.skipped.len() as u64,
            ..Totals::default()
        };
        let mut runs = Vec::with_capacity(self.runs.len());
        for sim in self.runs {
            let mut r = sim.report;
            r.attempts_recorded = sim.recorded.attempts_used;
            r.attempts_would = sim.would.attempts_used;
            r.spend_recorded_nanos = sim.recorded.spent_nanos();
            r.spend_would_nanos = sim.would.spent_nanos();
            total.runs += 1;
            total.calls += r.calls;
            total.calls_not_made += r.calls - r.calls_made;
            total.runs_stopping_earlier += u64::from(r.calls_made < r.calls);
            total.newly_refused += r.refused_count;
            total.newly_allowed += r.allowed_count;
            total.attempts_saved += r.attempts_recorded as i64 - r.attempts_would as i64;
            total.spend_saved_nanos += r.spend_recorded_nanos as i64 - r.spend_would_nanos as i64;
            runs.push(r);
        }
        BacktestReport {
            version: crate::analysis::REPORT_VERSION,
            policy: self.digest,
            total,
            runs,
        }
    }
}

/// What a recorded start asked for, as far as its grant tells: a dimension granted at
/// the old policy's ceiling may have asked for more (it is left to the new ceiling); one
/// granted below it asked for that.
fn asked(old: &Policy, d: &Decision) -> Budget {
    let granted = d.budget.clone().unwrap_or_default();
    let ceiling = old.ceiling_for(d.credential.as_deref());
    let below = |g: Option<u64>, c: Option<u64>| g.filter(|g| c.is_none_or(|c| g < &c));
    Budget {
        attempts: below(granted.attempts, ceiling.attempts),
        spend_cents: None,
        spend_nanos: below(granted.spend().map(|n| n.0), ceiling.spend().map(|n| n.0)),
        side_effects: below(granted.side_effects, ceiling.side_effects),
        deadline_ms: below(granted.deadline_ms, ceiling.deadline_ms),
        polls: below(granted.polls, ceiling.polls),
        depth: below(granted.depth, ceiling.depth),
    }
}
