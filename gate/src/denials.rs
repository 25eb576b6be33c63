//! Denials (docs/APPROVALS.md): an approver's signed no to a pending approval request,
//! recorded as an `override` with reason `denied_by_approver` naming the request's call.
//! The policy core judges it as it judges an approval and folds it into the run, whose
//! next check of exactly that call it refuses.

use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{apply, judge};
use tally_wire::Denial;

use crate::backend::{Scopes, StateBackend};
use crate::commit::Commit;
use crate::work::Work;
use crate::{encodable, inconsistent, live, Caller, Done, Gate, GateError, Logged, Touched};

impl<B: StateBackend> Gate<B> {
    /// Record an approver's denial of a pending approval request, once its signature,
    /// approver and digest check out: the run's next check of that exact call is
    /// refused `denied_by_approver` with the note. The request is `denied` once durable.
    pub fn deny(&self, caller: Caller, d: Denial, done: Done<Logged>) {
        if let Err(e) = caller.operator_only("denials arrive on the operator socket") {
            return done(Err(e));
        }
        self.transact(done, |t| self.deny_run(t, caller, d))
    }

    /// A denial's step: its `override` record, judged by the core and folded into the
    /// transaction.
    fn deny_run(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        d: Denial,
    ) -> Result<Commit<Logged>, GateError> {
        let policy = &self.policy.policy;
        let state = live(t, &d.run, caller)?.clone();
        let now = self.clock(&state);
        let entry = self.pending_request(&d.request, &d.run, &state, now)?;
        let asked = entry.record;
        let run = d.run.clone();
        let mut record = Decision {
            run: d.run,
            kind: Some(Kind::Override),
            at_ms: now.at_ms,
            reason: Some(Reason::DeniedByApprover),
            tool: asked.tool,
            operation: asked.operation,
            args_digest: asked.args_digest,
            approver: Some(d.approver),
            digest: Some(d.digest),
            signature: Some(d.signature),
            note: Some(d.note),
            answers: Some(d.request),
            uid: caller.uid,
            policy: Some(self.policy.digest.clone()),
            ..Decision::default()
        };
        encodable(&mut record)?;
        if let Some(found) = judge(policy, t.view(&Scopes::run(&run)), &record, now)
            .into_iter()
            .next()
        {
            return Err(inconsistent(&run, found));
        }
        if let Some(id) = &record.answers {
            self.claim_request(id)?;
        }
        apply(policy, t.view_mut(&Scopes::run(&run)), &record, now);
        let logged = Logged {
            seq: 0,
            hash: String::new(),
            limits: tally_policy::apply::standing(&state, now),
            overrun_nanos: None,
        };
        let mark = self.noting(&record);
        Ok(Commit::new(vec![record], vec![Touched::run(&run)], logged).then_durable(mark))
    }
}
