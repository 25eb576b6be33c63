//! What a run's allows and denies tell: the calls it made and the refusals the core's
//! rules gave it, fed to its loop series.

use tally_ledger::{Action, Decision, Kind, Reason};
use tally_policy::{LoopRule, PollRule, Rule};

use crate::analysis::handoff::{RefusedCall, When};
use crate::analysis::loops::{CallFacts, Pattern, Series, ToolStorms};
use crate::analysis::names::Names;
use crate::event::Seq;
use crate::Event;

use super::{series_from, Ask, Backoff, First, Halt, Open, RunAnalysis, Verdicts, MAX_ASKS};

impl RunAnalysis {
    pub(super) fn call(
        &mut self,
        e: &Event,
        at: When,
        v: Verdicts,
        names: &mut Names,
        storms: &mut ToolStorms,
    ) {
        let d = &e.decision;
        let allowed = d.kind() == Kind::Allow;
        let refused = if allowed { None } else { d.reason };
        let shared = names.call(
            d.tool.as_deref(),
            d.operation.as_deref(),
            d.worker.as_deref(),
        );
        let facts = |flagged: bool, early: bool| CallFacts {
            seq: e.seq,
            ms: at.run_ms,
            worker: shared.worker.as_ref(),
            operation: shared.operation.as_ref(),
            args_digest: d.args_digest.as_deref(),
            reserve: if allowed {
                d.reserve().map_or(0, |n| n.0)
            } else {
                0
            },
            model: self.model_settled,
            refused,
            flagged,
            early,
        };
        let (key, op) = (v.key, v.op);
        let mut ring = None;
        if let Some(r) = v.poll {
            let flagged = v.poll_rule.is_some()
                || matches!(
                    refused,
                    Some(Reason::PollAllowanceExhausted | Reason::UpstreamBackoff)
                );
            let early = matches!(v.poll_rule, Some(PollRule::Early { .. }))
                || refused == Some(Reason::UpstreamBackoff);
            let (job_name, observed) = match self.jobs.get(&r) {
                Some(j) => (j.name.to_string(), j.observed.clone()),
                None => (
                    d.remote_ref
                        .clone()
                        .or_else(|| {
                            d.operation
                                .as_deref()?
                                .rsplit_once(':')
                                .map(|(_, t)| t.to_owned())
                        })
                        .unwrap_or_default(),
                    None,
                ),
            };
            let allowance = self.core.budget.polls;
            self.polls
                .entry(r)
                .or_insert_with(|| {
                    Series::polling(
                        e.seq,
                        at.run_ms,
                        shared.tool.clone(),
                        &job_name,
                        allowance,
                        observed,
                    )
                })
                .call(&facts(flagged, early), None);
        } else {
            // Judged in the core's order (`tally_policy::RULES`): a refusal of the retry
            // rule, checked before the loop rule, is the call's, not a loop's.
            let before_loop = Rule::Retries.precedes(Rule::Loop);
            let retried = v.retries || refused == Some(Reason::RetriesExhausted);
            let loop_refused = refused == Some(Reason::LoopRepeatedCall);
            let pattern = match v
                .loop_rule
                .filter(|_| !(v.retries && before_loop) || loop_refused)
            {
                Some(LoopRule::Alternating) => Some(Pattern::Alternation),
                Some(LoopRule::ToolBar) => None,
                Some(_) => Some(Pattern::ExactRepetition),
                None if loop_refused => Some(Pattern::ExactRepetition),
                None => None,
            };
            // A series is kept only for a call that repeats one the core still looks back
            // at (or that a rule refuses): most calls are new, and cost no series.
            let first =
                |keyed: &dyn Fn(&First) -> bool| self.firsts.iter().find(|f| keyed(f)).cloned();
            if v.repeats_call || pattern.is_some() {
                let from = first(&|f| f.key == key);
                self.calls
                    .entry(key)
                    .or_insert_with(|| {
                        series_from(Pattern::ExactRepetition, from, e.seq, at.run_ms, &shared)
                    })
                    .call(&facts(pattern.is_some(), false), pattern);
            }
            if v.retries_op || retried {
                let from = first(&|f| f.op == op);
                let differ = from.as_ref().is_some_and(|f| f.key != key);
                self.retries
                    .entry(op)
                    .or_insert_with(|| {
                        let mut s =
                            series_from(Pattern::RetryStorm, from, e.seq, at.run_ms, &shared);
                        if differ {
                            s.digests_differ();
                        }
                        s
                    })
                    .call(&facts(retried, false), None);
            }
            if self.firsts.len() >= tally_policy::config::MAX_WINDOW as usize {
                self.firsts.pop_front();
                self.firsts_popped += 1;
            }
            ring = Some(self.firsts_popped + self.firsts.len() as u64);
            self.firsts.push_back(First {
                key,
                op,
                seq: e.seq,
                ms: at.run_ms,
                reserve: facts(false, false).reserve,
                settled: 0,
                failures: 0,
                worker: shared.worker.clone(),
                model: self.model_settled,
            });
            if d.tool.is_some() {
                let bar = v.loop_rule == Some(LoopRule::ToolBar) && !(retried && before_loop);
                self.bursts
                    .entry(v.tool)
                    .or_insert_with(|| {
                        Series::new(
                            Pattern::HighCallCount,
                            e.seq,
                            at.run_ms,
                            shared.tool.clone(),
                        )
                    })
                    .call(&facts(bar, false), None);
            }
        }
        if let Some(tool) = &shared.tool {
            let flagged = v.breaker || refused == Some(Reason::CircuitOpen);
            let mut f = facts(flagged, false);
            f.ms = at.wall_ms;
            storms.call(tool, &self.name, &f);
        }
        if allowed {
            self.last_refusal = None;
            self.asks
                .retain(|a| !(a.tool == d.tool && a.operation == d.operation));
            if let Some((attempt, a)) = d
                .attempt
                .and_then(|n| self.core.open.get(&n).map(|a| (n, a)))
            {
                let counted = a.counted;
                self.open.insert(
                    attempt,
                    Box::new(Open {
                        names: shared,
                        args_digest: d.args_digest.as_deref().map(Box::from),
                        effect: d.effect,
                        model: d.channel == Some(tally_ledger::decision::Channel::Model),
                        model_name: (d.channel == Some(tally_ledger::decision::Channel::Model))
                            .then(|| d.args_preview.as_deref().map(Box::from))
                            .flatten(),
                        seq: e.seq,
                        at,
                        remote_ref: None,
                        settled: 0,
                        counted,
                        ring,
                        call_key: v.poll.is_none().then_some(key),
                        op,
                        poll: v.poll,
                        tool: v.tool,
                    }),
                );
            }
        } else if let Some(reason) = d.reason {
            self.refusal(d, e.seq, at, reason, v.cause);
        }
    }

    fn refusal(&mut self, d: &Decision, seq: Seq, at: When, reason: Reason, cause: Option<Reason>) {
        let action = reason.action();
        super::listed(
            &mut self.refused,
            &mut self.refused_total,
            RefusedCall {
                seq,
                tool: d.tool.clone(),
                operation: d.operation.clone(),
                preview: d.args_preview.clone(),
                reason,
                action,
                cause,
                at,
            },
        );
        self.last_refusal = Some(Halt {
            reason,
            cause,
            seq,
            at,
        });
        if action == Action::Ask {
            self.asks
                .retain(|a| !(a.tool == d.tool && a.operation == d.operation));
            if self.asks.len() < MAX_ASKS {
                self.asks.push(Ask {
                    tool: d.tool.clone(),
                    operation: d.operation.clone(),
                    reason,
                    cause,
                    seq,
                });
            }
        }
        if action == Action::Retry {
            let wait = d.retry_after_ms.unwrap_or(0);
            self.backoff = Some(Backoff {
                not_before: When {
                    run_ms: at.run_ms.saturating_add(wait),
                    wall_ms: at.wall_ms.saturating_add(wait),
                },
                tool: d.tool.clone(),
                operation: d.operation.clone(),
                refused: reason,
                seq,
            });
        }
    }
}
