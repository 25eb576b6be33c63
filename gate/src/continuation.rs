//! A continuation grant at the gate: an approver's yes to a new run continuing a run
//! (docs/GATE.md, "Refill chains"). In one commit, in order: the grant, an `override`
//! on the old run whose scope names the new one; the old run's stop if it was live (the
//! operator's kill, its open descendants first); the new run's start, continuing the old
//! one with the granted allocation as its budget. A grant never revives the old run.

use tally_ledger::decision::{Budget, Scope};
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{apply, judge, RunState};

use crate::backend::{Scopes, StateBackend};
use crate::commit::Commit;
use crate::work::Work;
use crate::{
    encodable, held, inconsistent, open_descendants, Approval, Caller, Done, Gate, GateError,
    StartRequest, Started, Touched,
};

/// The budget a continuation grant allocates: its attempts and spend, nothing else.
fn allocation(scope: &Scope) -> Budget {
    Budget {
        attempts: scope.attempts,
        spend_nanos: scope.spend().map(|n| n.0),
        ..Budget::default()
    }
}

/// A ceiling's attempts and spend, as an approver reads them.
fn ceiling_text(most: &Budget) -> String {
    let attempts = most
        .attempts
        .map_or("any number of attempts".to_owned(), |n| {
            format!("{n} attempts")
        });
    let spend = most
        .spend()
        .map_or("any spend".to_owned(), |n| n.to_string());
    format!("{attempts}, {spend}")
}

impl<B: StateBackend> Gate<B> {
    /// Record a continuation grant and start the new run it names. `done` gets the new
    /// run's start once the records are durable; a grant refused records nothing.
    pub fn continue_run(&self, caller: Caller, grant: Approval, done: Done<Started>) {
        if let Err(e) = caller.operator_only("continuation grants arrive on the operator socket") {
            return done(Err(e));
        }
        self.transact(done, |t| self.continue_step(t, caller, grant))
    }

    /// The grant's step: the grant, the old run's stop if live, the new run's start.
    fn continue_step(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        a: Approval,
    ) -> Result<Commit<Started>, GateError> {
        let Some(new_run) = a.scope.new_run.clone() else {
            return Err(GateError::ApprovalRefused(
                "this approval names no new run: it is an ordinary approval for its run; \
                 record it with `tally approve` without --new-run (POST /v1/approvals)"
                    .into(),
            ));
        };
        if !t.is_new(&new_run)? {
            return Err(GateError::RunExists(new_run));
        }
        let old = a.run.clone();
        let state = held(t, &old, caller)?.clone();
        self.approval_expiry(&a, self.clock(&state).at_ms.unwrap_or(0))?;
        let budget = allocation(&a.scope);
        if let Some(most) = tally_policy::above_ceiling(&self.policy.policy, &budget, None) {
            return Err(GateError::ApprovalRefused(format!(
                "the grant asks more than the policy's ceiling for a run ({}): grant at most that",
                ceiling_text(&most)
            )));
        }
        let mut records = vec![self.grant_record(t, caller, a, &state)?];
        let mut writes = vec![Touched::run(&old)];
        if state.stop.is_none() {
            for run in open_descendants(t, &old)?.iter().rev().chain([&old]) {
                let s = held(t, run, caller)?.clone();
                let reason = Reason::KilledByOperator;
                records.push(self.stop_one(t, run, &s, reason, None, caller)?);
                writes.push(Touched::run(run));
            }
        }
        let req = StartRequest {
            run: new_run,
            budget: Some(budget),
            continues: Some(old),
            ..StartRequest::default()
        };
        // The new run is the old run's owner's, as a run its agent started would be.
        let owner = Caller {
            uid: state.owner_uid,
            ..caller
        };
        let (start, touched, budget) = self.grant(t, owner, &req, None)?;
        records.push(start);
        writes.extend(touched);
        Ok(Commit::new(records, writes, self.started(req.run, budget)))
    }

    /// The grant's `override` record on the old run, judged by the core (approver,
    /// digest, signature, one use) and folded into the transaction.
    fn grant_record(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        a: Approval,
        state: &RunState,
    ) -> Result<Decision, GateError> {
        let now = self.clock(state);
        let run = a.run.clone();
        let mut record = Decision {
            run: a.run,
            kind: Some(Kind::Override),
            at_ms: now.at_ms,
            approver: Some(a.approver),
            scope: Some(Box::new(a.scope)),
            digest: Some(a.digest),
            expires_ms: Some(a.expires_ms),
            signature: Some(a.signature),
            note: a.note,
            uid: caller.uid,
            policy: Some(self.policy.digest.clone()),
            ..Decision::default()
        };
        encodable(&mut record)?;
        let policy = &self.policy.policy;
        if let Some(found) = judge(policy, t.view(&Scopes::run(&run)), &record, now)
            .into_iter()
            .next()
        {
            return Err(inconsistent(&run, found));
        }
        apply(policy, t.view_mut(&Scopes::run(&run)), &record, now);
        Ok(record)
    }
}
