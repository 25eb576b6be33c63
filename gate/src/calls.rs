//! One call at the gate: the check before it and the outcome after it. Each is a step
//! that reads its scopes, lets the core decide, folds the decision into the transaction
//! and hands [`Gate::transact`] a [`Commit`].

use tally_ledger::{Action, Decision, Kind, Reason};
use tally_policy::{apply, decide, judge, Call, Decided, Now, Verdict};

use crate::backend::{Observed, StateBackend};
use crate::work::Work;

use crate::commit::{Answer, Commit};
use crate::{
    encodable, held, inconsistent, principal_scope, tracks_credential, Caller, CheckAnswer,
    CheckRequest, Done, Gate, GateError, Logged, OutcomeRequest, SettleRequest, Touched,
    MAX_TOOL_BYTES,
};

/// What a check computes before the state lock: the arguments' digest and the trace.
struct Unlocked {
    args_digest: Option<String>,
    trace_id: Option<String>,
}

/// The call a check asks about, as the core decides it, once its request passes the
/// gate's own checks: a tool name within [`MAX_TOOL_BYTES`], no credential but the
/// run's, a reserve in one unit.
fn call_of(
    req: CheckRequest,
    caller: Caller,
    run_credential: Option<String>,
    args_digest: Option<String>,
) -> Result<Call, GateError> {
    if req.tool.len() > MAX_TOOL_BYTES {
        // Tool names are identifiers, and every open call keeps its tool's name.
        return Err(GateError::Invalid(tally_ledger::DecisionError::TooLong {
            field: "tool",
            len: req.tool.len(),
            max: MAX_TOOL_BYTES,
        }));
    }
    if req.credential.is_some() && req.credential != run_credential {
        // A run's credential is the one it started under: naming another would escape
        // that credential's backstop and bucket.
        return Err(GateError::NotAuthorized(
            "a check names the credential its run was started under, or none".into(),
        ));
    }
    let reserve = tally_ledger::decision::one_amount(
        "reserve_cents",
        req.reserve_cents,
        "reserve_nanos",
        req.reserve_nanos,
    )?;
    Ok(Call {
        run: req.run,
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
        reserve_nanos: reserve.map_or(0, |n| n.0),
        remote_ref: req.remote_ref,
        credential: run_credential,
        timeout_ms: req.timeout_ms,
        uid: caller.uid,
        proxied: caller.proxied,
        refused: req.refused.filter(|_| caller.proxied),
    })
}

/// What a check answers for `decided`, before its receipt.
fn check_answer(decided: &Decided) -> CheckAnswer {
    let (record, verdict) = (&decided.record, decided.verdict);
    CheckAnswer {
        decision: verdict,
        reason: record.reason,
        action: record.reason.map(Reason::action),
        cause: decided.cause,
        denied_by: decided.denied.as_ref().map(|d| d.approver.clone()),
        note: decided.denied.as_ref().map(|d| d.note.clone()),
        retry_after_ms: record.retry_after_ms,
        timeout_ms: record.timeout_ms,
        attempt: record.attempt,
        reserve_nanos: (verdict == Verdict::Allow).then(|| record.reserve_nanos.unwrap_or(0)),
        limits: record.limits.clone().unwrap_or_default(),
        seq: None,
        hash: None,
    }
}

impl<B: StateBackend> Gate<B> {
    /// Decide one intended call. `done` gets the answer once the decision is durable.
    pub fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        // Hashing the arguments needs no state: done before the lock.
        let unlocked = Unlocked {
            args_digest: req.args.as_ref().map(tally_ledger::decision::Args::digest),
            trace_id: req
                .trace_id
                .clone()
                .filter(|t| tally_ledger::decision::is_trace_id(t)),
        };
        self.transact(done, |t| self.decide_call(t, caller, req, unlocked))
    }

    /// A check's step: the call decided by the core and folded into the transaction.
    fn decide_call(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        req: CheckRequest,
        unlocked: Unlocked,
    ) -> Result<Commit<CheckAnswer>, GateError> {
        let policy = &self.policy.policy;
        let run = held(t, &req.run, caller)?;
        let (stopped, owner, now) = (run.stop.is_some(), run.owner_uid, self.clock(run));
        let credential = run.credential.clone();
        let call = call_of(req, caller, credential, unlocked.args_digest)?;
        if stopped {
            return Err(self.over(t, &call, now));
        }
        let touched = self.call_scopes(t, &call, owner, now)?;
        let mut decided = decide(
            policy,
            &self.policy.digest,
            t.view(&touched.scopes()),
            &call,
            now,
        );
        decided.record.trace_id = unlocked.trace_id;
        if cfg!(feature = "bench-no-requests") {
            // A benchmark build's switch (gate/Cargo.toml): no request at all.
            decided.record.request = None;
        }
        encodable(&mut decided.record)?;
        apply(policy, t.view_mut(&touched.scopes()), &decided.record, now);
        let answer = check_answer(&decided);
        // A refusal changes no state worth keeping (the run's clock only): a stream of
        // refusals rewrites nothing.
        let mut writes = match decided.verdict {
            Verdict::Allow => vec![touched],
            _ => Vec::new(),
        };
        // An approval request joins the book once its record is durable.
        let asked = decided
            .record
            .request
            .is_some()
            .then(|| self.noting(&decided.record));
        let mut records = vec![decided.record];
        if let Some(reason) = decided.stop {
            // The core stops the run with the refusal: in the same commit, and it no
            // longer counts as open.
            let state = t.run(&call.run)?.clone();
            records.push(self.stop_one(t, &call.run, &state, reason, None, caller)?);
            writes = vec![Touched::run(&call.run)];
        }
        // The answer is the decision's, before any stop that follows it.
        let commit = Commit::new(records, writes, answer).answering(0);
        Ok(match asked {
            Some(add) => commit.then_durable(add),
            None => commit,
        })
    }

    /// The answer to a check of a stopped run: nothing to decide, nothing recorded. Bad
    /// input is refused the same whether or not the run is over.
    fn over(&self, t: &mut Work<B::Txn<'_>>, call: &Call, now: Now) -> GateError {
        let run = match t.run(&call.run) {
            Ok(r) => r.clone(),
            Err(e) => return e,
        };
        let view = tally_policy::View::of(&run);
        let mut record = decide(&self.policy.policy, &self.policy.digest, view, call, now).record;
        if let Err(e) = encodable(&mut record) {
            return e;
        }
        GateError::Stopped(Box::new(CheckAnswer {
            decision: Verdict::Deny,
            reason: run.stop,
            action: Some(Action::Stop),
            cause: None,
            denied_by: None,
            note: None,
            retry_after_ms: None,
            timeout_ms: None,
            attempt: None,
            reserve_nanos: None,
            limits: tally_policy::apply::standing(&run, now),
            seq: None,
            hash: None,
        }))
    }

    /// The scopes a call's decision reads and writes, read into the transaction: its
    /// run, its tool, its credential if the policy gives that state (a backstop or a
    /// bucket), and the run owner's principal if the policy gives the owner a budget.
    fn call_scopes(
        &self,
        t: &mut Work<B::Txn<'_>>,
        call: &Call,
        owner: Option<u32>,
        now: Now,
    ) -> Result<Touched, GateError> {
        let policy = &self.policy.policy;
        let credential = call
            .credential
            .clone()
            .filter(|c| tracks_credential(policy, c));
        let principal = principal_scope(policy, owner);
        // Tool, credential, principal: one load, in the fixed order.
        t.ensure(
            Some(&call.tool),
            credential.as_deref(),
            principal.as_deref(),
            now.wall_ms,
            policy,
        )?;
        Ok(Touched {
            run: call.run.clone(),
            tool: Some(call.tool.clone()),
            credential,
            principal,
        })
    }

    /// Record what an allowed call did.
    pub fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        self.record_outcome(caller, req, false, done)
    }

    /// Record the outcome of a call the proxy made, answered once it is *sequenced*:
    /// `sequenced` gets `Ok` as soon as its state change is applied and its record is
    /// queued in the ledger's commit order (every later operation decides on state that
    /// includes it, and every later decision is durable only after it), before the
    /// record is durable; `durable` gets the receipted answer once the ledger says it
    /// is, or the error that failed the gate closed. A refused outcome answers
    /// `sequenced` with the refusal, and `durable` never. Only the proxy's own caller
    /// may: every other outcome is answered once durable ([`Gate::outcome`]).
    pub fn outcome_sequenced(
        &self,
        caller: Caller,
        req: OutcomeRequest,
        sequenced: Done<()>,
        durable: Done<Logged>,
    ) {
        if !caller.proxied {
            return sequenced(Err(GateError::NotAuthorized(
                "only the proxy's own outcome is answered before it is durable".into(),
            )));
        }
        let answer = Answer::sequenced(sequenced, durable);
        self.transact_answering(answer, |t| self.settle_call(t, caller, req, false))
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
        self.transact(done, |t| self.settle_call(t, caller, req, by_operator))
    }

    /// An outcome's step: its record, judged by the core and folded into the transaction.
    fn settle_call(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        req: OutcomeRequest,
        by_operator: bool,
    ) -> Result<Commit<Logged>, GateError> {
        let policy = &self.policy.policy;
        let run = held(t, &req.run, caller)?;
        let now = self.clock(run);
        let owner = run.owner_uid;
        let tool = run.tool_of(req.attempt).map(str::to_owned);
        let credential = run.credential.clone();
        let touched = self.outcome_scopes(t, &req.run, tool, credential, owner, now)?;
        let mut record = self.outcome_record(req, caller, by_operator, now)?;
        // The overrun, if the settlement makes one: the core's count, on the record.
        record.overrun_nanos =
            tally_policy::overrun(t.view(&touched.scopes()).run, &record).map(|o| o.excess().0);
        // What the core would call inconsistent is refused and never recorded.
        if let Some(found) = judge(policy, t.view(&touched.scopes()), &record, now)
            .into_iter()
            .next()
        {
            return Err(inconsistent(&record.run, found));
        }
        apply(policy, t.view_mut(&touched.scopes()), &record, now);
        let limits = t
            .run_mut(&record.run)
            .map(|r| tally_policy::apply::standing(r, now))
            .unwrap_or_default();
        let answer = Logged {
            seq: 0,
            hash: String::new(),
            limits,
            overrun_nanos: record.overrun_nanos,
        };
        // Only for a backend that keeps them (a copy per outcome otherwise for nothing).
        let observed = (touched.tool.as_ref())
            .filter(|_| self.backend.observes())
            .zip(record.status)
            .map(|(tool, status)| Observed {
                tool: tool.clone(),
                run: record.run.clone(),
                attempt: record.attempt.unwrap_or(0),
                status,
                now,
            });
        let commit = Commit::new(vec![record], vec![touched], answer);
        Ok(match observed {
            Some(o) => commit.observing(o),
            None => commit,
        })
    }

    /// The scopes an outcome of `run` reads and writes, read into the transaction: the
    /// run, the attempt's tool, the run's credential and its owner's principal where the
    /// policy gives them state.
    fn outcome_scopes(
        &self,
        t: &mut Work<B::Txn<'_>>,
        run: &str,
        tool: Option<String>,
        credential: Option<String>,
        owner: Option<u32>,
        now: Now,
    ) -> Result<Touched, GateError> {
        let policy = &self.policy.policy;
        let credential = credential.filter(|c| tracks_credential(policy, c));
        let principal = principal_scope(policy, owner);
        // Tool, credential, principal: one load, in the fixed order.
        t.ensure(
            tool.as_deref(),
            credential.as_deref(),
            principal.as_deref(),
            now.wall_ms,
            policy,
        )?;
        Ok(Touched {
            run: run.to_owned(),
            tool,
            credential,
            principal,
        })
    }

    /// The outcome record `req` asks for, checked to encode.
    fn outcome_record(
        &self,
        req: OutcomeRequest,
        caller: Caller,
        by_operator: bool,
        now: Now,
    ) -> Result<Decision, GateError> {
        let mut record = Decision {
            run: req.run,
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
            usage: req.usage.filter(|_| caller.proxied).map(Box::new),
            uid: caller.uid,
            policy: Some(self.policy.digest.clone()),
            ..Decision::default()
        };
        encodable(&mut record)?;
        Ok(record)
    }
}
