//! One call at the gate: the check before it and the outcome after it.

use tally_ledger::{Action, Decision, Kind, Reason, Receipt};
use tally_policy::{apply, decide, judge, Call, Verdict};

use crate::backend::{Scopes, StateBackend, StateTxn};
use crate::{
    encodable, inconsistent, principal_scope, tracks_credential, Caller, CheckAnswer, CheckRequest,
    Done, Gate, GateError, Logged, OutcomeRequest, SettleRequest, Touched, MAX_TOOL_BYTES,
};

impl<B: StateBackend> Gate<B> {
    /// Decide one intended call. `done` gets the answer once the decision is durable.
    pub fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        // Hashing the arguments needs no state: done before the lock.
        let args_digest = req.args.as_ref().map(tally_ledger::decision::Args::digest);
        let trace_id = req
            .trace_id
            .clone()
            .filter(|t| tally_ledger::decision::is_trace_id(t));
        let result = (|| {
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let (stopped, run_credential, owner, now) = {
                let run = t.run(&req.run, caller)?;
                let owner = run.owner_uid;
                (
                    run.stop.is_some(),
                    run.credential.clone(),
                    owner,
                    self.clock(run),
                )
            };
            if req.tool.len() > MAX_TOOL_BYTES {
                // Tool names are identifiers, and every open call keeps its tool's name.
                return Err(GateError::Invalid(tally_ledger::DecisionError::TooLong {
                    field: "tool",
                    len: req.tool.len(),
                    max: MAX_TOOL_BYTES,
                }));
            }
            if req.credential.is_some() && req.credential != run_credential {
                // A run's credential is the one it started under: naming another would
                // escape that credential's backstop and bucket.
                return Err(GateError::NotAuthorized(
                    "a check names the credential its run was started under, or none".into(),
                ));
            }
            let call = Call {
                run: req.run.clone(),
                worker: req.worker,
                tool: req.tool,
                operation: req.operation,
                args_digest,
                args_preview: req.args_preview,
                effect: Some(req.effect),
                idempotency_key: req.idempotency_key,
                target: req.target,
                channel: req.channel,
                depth: req.depth,
                reserve_nanos: tally_ledger::decision::one_amount(
                    "reserve_cents",
                    req.reserve_cents,
                    "reserve_nanos",
                    req.reserve_nanos,
                )?
                .map_or(0, |n| n.0),
                remote_ref: req.remote_ref,
                credential: run_credential,
                timeout_ms: req.timeout_ms,
                uid: caller.uid,
                proxied: caller.proxied,
                refused: req.refused.filter(|_| caller.proxied),
            };
            if stopped {
                let run = t.run(&req.run, caller)?.clone();
                // Bad input is refused the same whether or not the run is over.
                let view = tally_policy::View::of(&run);
                encodable(&mut decide(policy, &self.policy.digest, view, &call, now).record)?;
                // The run is over: nothing to decide, nothing recorded.
                return Err(GateError::Stopped(Box::new(CheckAnswer {
                    decision: Verdict::Deny,
                    reason: run.stop,
                    action: Some(Action::Stop),
                    cause: None,
                    retry_after_ms: None,
                    timeout_ms: None,
                    attempt: None,
                    reserve_nanos: None,
                    limits: tally_policy::apply::standing(&run, now),
                    seq: None,
                    hash: None,
                })));
            }
            t.ensure_tool(&call.tool, now.wall_ms, policy)?;
            // A credential has state only if the policy gives it a backstop or a bucket.
            let cred_scope = call
                .credential
                .clone()
                .filter(|c| tracks_credential(policy, c));
            if let Some(c) = &cred_scope {
                t.ensure_credential(c, now.wall_ms, policy)?;
            }
            // The run owner's budget across its runs, where the policy gives it one.
            let principal = principal_scope(policy, owner);
            if let Some(p) = &principal {
                t.ensure_principal(p)?;
            }
            let mut decided = {
                let scopes = Scopes {
                    run: &call.run,
                    tool: Some(&call.tool),
                    credential: cred_scope.as_deref(),
                    principal: principal.as_deref(),
                };
                decide(policy, &self.policy.digest, t.view(&scopes), &call, now)
            };
            decided.record.trace_id = trace_id;
            encodable(&mut decided.record)?;
            let writes = {
                let scopes = Scopes {
                    run: &call.run,
                    tool: Some(&call.tool),
                    credential: cred_scope.as_deref(),
                    principal: principal.as_deref(),
                };
                apply(policy, t.view_mut(&scopes), &decided.record, now);
                if decided.verdict == Verdict::Allow {
                    vec![Touched {
                        run: call.run.clone(),
                        tool: Some(call.tool.clone()),
                        credential: cred_scope.clone(),
                        principal: principal.clone(),
                    }]
                } else {
                    // A refusal changes no state worth keeping (the run's clock only): a
                    // stream of refusals rewrites nothing.
                    Vec::new()
                }
            };
            let record = decided.record;
            let cause = decided.cause;
            let verdict = decided.verdict;
            let mut records = vec![record.clone()];
            let mut writes = writes;
            if let Some(reason) = decided.stop {
                // The core stops the run with the refusal: in the same commit, and it no
                // longer counts as open.
                let state = t.run(&call.run, caller)?.clone();
                records.push(self.stop_one(&mut t, &call.run, &state, reason, None, caller)?);
                writes = vec![Touched::run(&call.run)];
            }
            Ok((
                records,
                writes,
                move |r: Receipt| CheckAnswer {
                    decision: verdict,
                    reason: record.reason,
                    action: record.reason.map(Reason::action),
                    cause,
                    retry_after_ms: record.retry_after_ms,
                    timeout_ms: record.timeout_ms,
                    attempt: record.attempt,
                    reserve_nanos: (verdict == Verdict::Allow)
                        .then(|| record.reserve_nanos.unwrap_or(0)),
                    limits: record.limits.unwrap_or_default(),
                    seq: Some(r.seq),
                    hash: Some(r.hash.to_string()),
                },
                t,
            ))
        })();
        match result {
            // The answer is the decision's, before any stop that follows it.
            Ok((records, writes, answer, t)) => {
                self.submit_answering(t, records, &writes, 0, answer, done)
            }
            Err(e) => done(Err(e)),
        }
    }

    /// Record what an allowed call did.
    pub fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        self.record_outcome(caller, req, false, done)
    }

    /// The operator settles what attempt `req.attempt` of `run` holds (`tally settle`):
    /// its outcome, `unknown` with the amount, marked `operator`, with the operator's uid.
    /// Only the operator may; an attempt already settled is refused (`AttemptSettled`).
    pub fn settle(&self, caller: Caller, run: &str, req: SettleRequest, done: Done<Logged>) {
        if !caller.operator || caller.proxied {
            return done(Err(GateError::NotAuthorized(
                "only the operator settles a held attempt (the operator socket)".into(),
            )));
        }
        let outcome = OutcomeRequest {
            run: run.to_owned(),
            attempt: req.attempt,
            status: tally_ledger::Status::Unknown,
            settled_cents: None,
            settled_nanos: Some(req.settled_nanos),
            remote_ref: None,
            observed: None,
            retry_after_ms: None,
            result_digest: None,
            worker: None,
            usage_refused: None,
            usage: None,
        };
        self.record_outcome(caller, outcome, true, done)
    }

    /// An outcome as recorded: the agent's or the proxy's report, or (`by_operator`) the
    /// operator's settlement.
    fn record_outcome(
        &self,
        caller: Caller,
        req: OutcomeRequest,
        by_operator: bool,
        done: Done<Logged>,
    ) {
        let result = (|| {
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let run = t.run(&req.run, caller)?;
            let now = self.clock(run);
            let run_owner = run.owner_uid;
            let tool = run.tool_of(req.attempt).map(str::to_owned);
            let credential = run
                .credential
                .clone()
                .filter(|c| tracks_credential(policy, c));
            if let Some(tool) = &tool {
                t.ensure_tool(tool, now.wall_ms, policy)?;
            }
            if let Some(c) = &credential {
                t.ensure_credential(c, now.wall_ms, policy)?;
            }
            let principal = principal_scope(policy, run_owner);
            if let Some(p) = &principal {
                t.ensure_principal(p)?;
            }
            let mut record = Decision {
                run: req.run.clone(),
                kind: Some(Kind::Outcome),
                worker: req.worker,
                at_ms: now.at_ms,
                attempt: Some(req.attempt),
                status: Some(req.status),
                // Kept in nanodollars whichever unit the agent reported in.
                settled_nanos: tally_ledger::decision::one_amount(
                    "settled_cents",
                    req.settled_cents,
                    "settled_nanos",
                    req.settled_nanos,
                )?
                .map(|n| n.0),
                remote_ref: req.remote_ref,
                observed: req.observed,
                retry_after_ms: req.retry_after_ms,
                result_digest: req.result_digest,
                // The proxy's own report of a call it made; an agent's never says so.
                proxied: caller.proxied.then_some(true),
                operator: by_operator.then_some(true),
                usage_refused: req.usage_refused.filter(|_| caller.proxied),
                usage: req.usage.filter(|_| caller.proxied),
                uid: caller.uid,
                policy: Some(self.policy.digest.clone()),
                ..Decision::default()
            };
            encodable(&mut record)?;
            let touched = Touched {
                run: req.run.clone(),
                tool,
                credential,
                principal,
            };
            // The overrun, if the settlement makes one: the core's count, on the record.
            record.overrun_nanos =
                tally_policy::overrun(t.view(&touched.scopes()).run, &record).map(|o| o.excess().0);
            // What the core would call inconsistent is refused and never recorded.
            if let Some(found) = judge(policy, t.view(&touched.scopes()), &record, now)
                .into_iter()
                .next()
            {
                return Err(inconsistent(&req.run, found));
            }
            apply(policy, t.view_mut(&touched.scopes()), &record, now);
            let limits = t
                .run_mut(&req.run)
                .map(|r| tally_policy::apply::standing(r, now))
                .unwrap_or_default();
            let writes = vec![touched];
            let overrun_nanos = record.overrun_nanos;
            Ok((
                record,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                    overrun_nanos,
                },
                t,
            ))
        })();
        match result {
            Ok((record, writes, answer, t)) => self.submit(t, vec![record], &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }
}
