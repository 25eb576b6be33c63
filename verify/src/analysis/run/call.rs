//! What a run's allows and denies tell: the calls it made and the refusals the core's
//! rules gave it, fed to its loop series.

use std::sync::Arc;

use tally_ledger::{Action, Decision, Kind, Reason};
use tally_policy::{LoopRule, PollRule, Rule};

use crate::analysis::handoff::{RefusedCall, When};
use crate::analysis::loops::{CallFacts, Pattern, Series, ToolStorms};
use crate::analysis::names::{CallNames, Names};
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
        let facts = CallFacts {
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
            flagged: false,
            early: false,
        };
        let mut ring = None;
        if let Some(r) = v.poll {
            self.poll_call(d, at, v, r, &shared, facts);
        } else {
            ring = Some(self.repeat_call(d, at, v, &shared, facts));
        }
        if let Some(tool) = &shared.tool {
            let flagged = v.breaker || refused == Some(Reason::CircuitOpen);
            let f = CallFacts {
                ms: at.wall_ms,
                flagged,
                ..facts
            };
            storms.call(tool, &self.name, &f);
        }
        if allowed {
            self.allowed(d, e.seq, at, v, shared, ring);
        } else if let Some(reason) = d.reason {
            self.refusal(d, e.seq, at, reason, v.cause);
        }
    }

    /// A poll of the remote operation `r`: fed to its poll series.
    fn poll_call(
        &mut self,
        d: &Decision,
        at: When,
        v: Verdicts,
        r: u64,
        shared: &CallNames,
        facts: CallFacts,
    ) {
        let refused = facts.refused;
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
                    facts.seq,
                    at.run_ms,
                    shared.tool.clone(),
                    &job_name,
                    allowance,
                    observed,
                )
            })
            .call(
                &CallFacts {
                    flagged,
                    early,
                    ..facts
                },
                None,
            );
    }

    /// A call that is not a poll: fed to the series of identical calls, of retries of
    /// its operation and of its tool's calls, and remembered among the run's recent
    /// calls. Its place there is returned.
    fn repeat_call(
        &mut self,
        d: &Decision,
        at: When,
        v: Verdicts,
        shared: &CallNames,
        facts: CallFacts,
    ) -> u64 {
        let (key, op) = (v.key, v.op);
        let refused = facts.refused;
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
        let first = |keyed: &dyn Fn(&First) -> bool| self.firsts.iter().find(|f| keyed(f)).cloned();
        let seq = facts.seq;
        if v.repeats_call || pattern.is_some() {
            let from = first(&|f| f.key == key);
            self.calls
                .entry(key)
                .or_insert_with(|| {
                    series_from(Pattern::ExactRepetition, from, seq, at.run_ms, shared)
                })
                .call(
                    &CallFacts {
                        flagged: pattern.is_some(),
                        ..facts
                    },
                    pattern,
                );
        }
        if v.retries_op || retried {
            let from = first(&|f| f.op == op);
            let differ = from.as_ref().is_some_and(|f| f.key != key);
            self.retries
                .entry(op)
                .or_insert_with(|| {
                    let mut s = series_from(Pattern::RetryStorm, from, seq, at.run_ms, shared);
                    if differ {
                        s.digests_differ();
                    }
                    s
                })
                .call(
                    &CallFacts {
                        flagged: retried,
                        ..facts
                    },
                    None,
                );
        }
        let ring = self.remember(key, op, at, shared, facts);
        if d.tool.is_some() {
            let bar = v.loop_rule == Some(LoopRule::ToolBar) && !(retried && before_loop);
            self.burst_call(
                v.tool,
                at,
                shared,
                CallFacts {
                    flagged: bar,
                    ..facts
                },
            );
        }
        ring
    }

    /// A call of a named tool: fed to the series of the tool's calls (`tool`, its key).
    fn burst_call(&mut self, tool: u64, at: When, shared: &CallNames, facts: CallFacts) {
        self.bursts
            .entry(tool)
            .or_insert_with(|| {
                Series::new(
                    Pattern::HighCallCount,
                    facts.seq,
                    at.run_ms,
                    shared.tool.clone(),
                )
            })
            .call(&facts, None);
    }

    /// A call among the run's recent ones, as far back as the core looks: its place
    /// (counted from the first ever).
    fn remember(
        &mut self,
        key: u64,
        op: u64,
        at: When,
        shared: &CallNames,
        facts: CallFacts,
    ) -> u64 {
        if self.firsts.len() >= tally_policy::config::MAX_WINDOW as usize {
            self.firsts.pop_front();
            self.firsts_popped += 1;
        }
        let ring = self.firsts_popped + self.firsts.len() as u64;
        self.firsts.push_back(First {
            key,
            op,
            seq: facts.seq,
            ms: at.run_ms,
            reserve: facts.reserve,
            settled: 0,
            failures: 0,
            worker: shared.worker.clone(),
            model: self.model_settled,
        });
        ring
    }

    /// An allowed call: it lifts the run's refusal and its asks for that call, and the
    /// attempt the core holds open is described by its names.
    fn allowed(
        &mut self,
        d: &Decision,
        seq: Seq,
        at: When,
        v: Verdicts,
        shared: Arc<CallNames>,
        ring: Option<u64>,
    ) {
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
                    seq,
                    at,
                    remote_ref: None,
                    settled: 0,
                    counted,
                    ring,
                    call_key: v.poll.is_none().then_some(v.key),
                    op: v.op,
                    poll: v.poll,
                    tool: v.tool,
                }),
            );
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
