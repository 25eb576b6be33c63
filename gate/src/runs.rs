//! A run's life at the gate after its start (start.rs): stop (a kill cascades), pause
//! and resume, approvals, and where runs stand.

use std::collections::BTreeMap;

use tally_ledger::decision::Limit;
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{apply, judge, RunState};
use tally_wire::LimitKey;

use crate::backend::{Scopes, StateBackend, StateTxn};
use crate::commit::Commit;
use crate::work::Work;
use crate::{
    encodable, held, inconsistent, live, open_descendants, principal_scope, Approval, Caller, Done,
    Gate, GateError, Logged, Standing, StopRequest, Touched,
};

/// What a stop or an approval answers, before its receipt.
fn logged(limits: BTreeMap<LimitKey, Limit>) -> Logged {
    Logged {
        seq: 0,
        hash: String::new(),
        limits,
        overrun_nanos: None,
    }
}

impl<B: StateBackend> Gate<B> {
    /// Stop a run: by its owner (any reason, usually `completed`), or by the operator
    /// (a kill: `killed_by_operator`). A kill stops the run's open descendants too, in
    /// the same commit, before the run itself: a child's budget was carved from the
    /// killed run's, and it must not go on spending it.
    pub fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        self.transact(done, |t| self.stop_run(t, caller, run, req))
    }

    /// A stop's step: the run's stop record (its open descendants' first, for a kill),
    /// folded into the transaction.
    fn stop_run(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        run: &str,
        req: StopRequest,
    ) -> Result<Commit<Logged>, GateError> {
        let state = live(t, run, caller)?.clone();
        let reason = match (caller.operator, req.reason) {
            (true, r) => r.unwrap_or(Reason::KilledByOperator),
            (false, Some(Reason::KilledByOperator)) => {
                return Err(GateError::NotAuthorized(
                    "only the operator kills a run; stop it with another reason".into(),
                ))
            }
            (false, r) => r.unwrap_or(Reason::Completed),
        };
        let descendants = if reason == Reason::KilledByOperator {
            open_descendants(t, run)?
        } else {
            Vec::new()
        };
        let mut records = Vec::with_capacity(descendants.len() + 1);
        let mut writes = Vec::with_capacity(descendants.len() + 1);
        for child in descendants.iter().rev() {
            let child_state = held(t, child, caller)?.clone();
            records.push(self.stop_one(t, child, &child_state, reason, None, caller)?);
            writes.push(Touched::run(child));
        }
        records.push(self.stop_one(t, run, &state, reason, req.worker, caller)?);
        writes.push(Touched::run(run));
        let limits = tally_policy::apply::standing(&state, self.clock(&state));
        Ok(Commit::new(records, writes, logged(limits)))
    }

    /// The stop record of one open run, folded into the transaction: the run is marked
    /// stopped and its calls give back their tools' in-flight slots.
    pub(crate) fn stop_one(
        &self,
        t: &mut Work<B::Txn<'_>>,
        run: &str,
        state: &RunState,
        reason: Reason,
        worker: Option<String>,
        caller: Caller,
    ) -> Result<Decision, GateError> {
        let policy = &self.policy.policy;
        let now = self.clock(state);
        let mut record = Decision {
            run: run.to_owned(),
            kind: Some(Kind::Stop),
            worker,
            at_ms: now.at_ms,
            reason: Some(reason),
            uid: caller.uid,
            policy: Some(self.policy.digest.clone()),
            limits: Some(tally_policy::apply::standing(state, now)),
            ..Decision::default()
        };
        encodable(&mut record)?;
        apply(policy, t.view_mut(&Scopes::run(run)), &record, now);
        // The stopped run's calls no longer hold their tools' in-flight slots (the
        // slots are not durable state: nothing more to write).
        let open: Vec<(String, u64)> = state
            .open
            .iter()
            .filter_map(|(a, o)| o.tool.clone().map(|tool| (tool, *a)))
            .collect();
        for (tool, attempt) in open {
            t.ensure_tool(&tool, now.wall_ms, policy)?;
            let scopes = Scopes {
                tool: Some(&tool),
                ..Scopes::run(run)
            };
            if let Some(ts) = t.view_mut(&scopes).tool {
                ts.in_flight
                    .remove(&tally_policy::state::call_id(run, attempt));
            }
        }
        // A backend that keeps runs in memory sees the run stopped in the snapshot it
        // commits, and lets it go later.
        Ok(record)
    }

    /// Pause (`true`) or resume a run, and every open run below it (a child's budget was
    /// carved from its parent's, so it is held, and let go, with it): a `pause` or
    /// `resume` record for each run whose state changes, descendants first, in one
    /// commit, with the state they leave (so an index rebuilt from the log gives the
    /// pause back). A paused run's next check, from any worker, is refused `run_paused`.
    /// `done` gets where the run stands once the records are durable (at once if
    /// nothing changed).
    pub fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>) {
        if let Err(e) = caller.operator_only("pause and resume are the operator's") {
            return done(Err(e));
        }
        self.transact(done, |t| self.pause_run(t, caller, run, paused))
    }

    /// A pause's (or resume's) step: a record for each run of the family whose pause
    /// changes, folded into the transaction; no records if none does.
    fn pause_run(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        run: &str,
        paused: bool,
    ) -> Result<Commit<Standing>, GateError> {
        let policy = &self.policy.policy;
        let _ = live(t, run, caller)?;
        let mut family = open_descendants(t, run)?;
        family.reverse();
        family.push(run.to_owned());
        let kind = if paused { Kind::Pause } else { Kind::Resume };
        let mut records = Vec::new();
        let mut writes = Vec::new();
        for name in &family {
            let state = held(t, name, caller)?;
            if state.paused == paused {
                continue;
            }
            let now = self.clock(state);
            let mut record = Decision {
                run: name.clone(),
                kind: Some(kind),
                at_ms: now.at_ms,
                uid: caller.uid,
                policy: Some(self.policy.digest.clone()),
                ..Decision::default()
            };
            encodable(&mut record)?;
            apply(policy, t.view_mut(&Scopes::run(name)), &record, now);
            records.push(record);
            writes.push(Touched::run(name));
        }
        let answer = self.standing(held(t, run, caller)?);
        Ok(Commit::new(records, writes, answer))
    }

    /// Record a human's approval for a run, once its signature, approver and digest
    /// check out. An approval for a stopped run or after the run's deadline is refused:
    /// it never revives a run.
    pub fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        if let Err(e) = caller.operator_only("approvals arrive on the operator socket") {
            return done(Err(e));
        }
        self.transact(done, |t| self.approve_run(t, caller, a))
    }

    /// An approval's step: its `override` record, judged by the core and folded into the
    /// transaction.
    fn approve_run(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        a: Approval,
    ) -> Result<Commit<Logged>, GateError> {
        let policy = &self.policy.policy;
        if a.scope.new_run.is_some() {
            return Err(GateError::ApprovalRefused(
                "this is a continuation grant (its scope names a new run): it starts that \
                 run, and is recorded with `tally approve --new-run` (POST \
                 /v1/approvals/continuations)"
                    .into(),
            ));
        }
        let state = live(t, &a.run, caller)?.clone();
        let now = self.clock(&state);
        if let Some(id) = &a.request {
            self.answerable(id, &a, &state, now)?;
        }
        self.approval_in_time(&state, &a, now.at_ms.unwrap_or(0))?;
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
            answers: a.request,
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
        let limits = tally_policy::apply::standing(&state, now);
        // An answer to a request marks it in the book once it is durable.
        let answered = record.answers.is_some().then(|| self.noting(&record));
        let commit = Commit::new(vec![record], vec![Touched::run(&run)], logged(limits));
        Ok(match answered {
            Some(mark) => commit.then_durable(mark),
            None => commit,
        })
    }

    /// Refused unless approval `a` may be recorded for `state` at `at` on its clock:
    /// the run within its deadline (an approval never revives a run), the approval not
    /// expired and valid no longer than the policy allows.
    fn approval_in_time(&self, state: &RunState, a: &Approval, at: u64) -> Result<(), GateError> {
        if tally_policy::past_deadline(&state.budget, at) {
            return Err(GateError::ApprovalRefused(
                "the run is past its deadline; an approval does not revive it".into(),
            ));
        }
        self.approval_expiry(a, at)
    }

    /// Refused unless approval `a`, at `at` on its run's clock, has not expired and is
    /// valid no longer than the policy allows.
    pub(crate) fn approval_expiry(&self, a: &Approval, at: u64) -> Result<(), GateError> {
        let max = self.policy.policy.approvals.max_expiry_ms;
        if a.expires_ms <= at {
            use tally_ledger::words::after_start;
            return Err(GateError::ApprovalRefused(format!(
                "the approval expired {}; the run is now {}: sign a new one (`tally approve --expires`)",
                after_start(a.expires_ms),
                after_start(at)
            )));
        }
        if a.expires_ms - at > max {
            use tally_ledger::words::duration;
            return Err(GateError::ApprovalRefused(format!(
                "the approval is valid for {}; the policy allows at most {} (approvals.max_expiry_ms): sign one with a shorter --expires",
                duration(a.expires_ms - at),
                duration(max)
            )));
        }
        Ok(())
    }

    /// Where a run stands.
    pub fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        let mut t = self.begin()?;
        let state = held(&mut t, run, caller)?.clone();
        self.standing_in(&mut t, &state)
    }

    /// The runs the gate holds in memory (open runs, and recently stopped ones): every
    /// one for the operator, the caller's own for an agent.
    pub fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError> {
        let mut t = self.begin()?;
        let runs: Vec<RunState> = t
            .runs()?
            .into_iter()
            .filter(|r| caller.operator || r.owner_uid == caller.uid)
            .collect();
        runs.iter().map(|r| self.standing_in(&mut t, r)).collect()
    }

    /// Every run named `prefix...` (for the operator), open or stopped, from the durable
    /// state too (a stopped run let go from memory is read back): read only.
    pub fn runs_named(&self, prefix: &str) -> Result<Vec<Standing>, GateError> {
        let mut t = self.begin()?;
        let runs = t.runs_named(prefix)?;
        Ok(runs.iter().map(|r| self.standing(r)).collect())
    }

    /// Where a run stands now, with its owner's principal usage where the policy gives
    /// the owner a budget (the policy core's count, [`tally_policy::principal_limits`]).
    /// Reads only: the transaction is dropped, never committed.
    fn standing_in<T: StateTxn>(
        &self,
        t: &mut Work<T>,
        run: &RunState,
    ) -> Result<Standing, GateError> {
        let mut out = self.standing(run);
        let policy = &self.policy.policy;
        let limits = run.owner_uid.and_then(|u| policy.principal(u));
        if let (Some(key), Some(limits)) = (principal_scope(policy, run.owner_uid), limits) {
            t.ensure_principal(&key)?;
            let scopes = Scopes {
                run: &run.run,
                tool: None,
                credential: None,
                principal: Some(&key),
            };
            let state = t.view(&scopes).principal.copied();
            let wall_ms = self.clock(run).wall_ms;
            out.limits.extend(tally_policy::principal_limits(
                limits,
                state.as_ref(),
                wall_ms,
            ));
        }
        Ok(out)
    }

    /// Every downstream tool the gate holds state for, with its breaker as it stands now
    /// (time-based transitions taken: an open breaker past its expiry is half-open), by
    /// name. Read only.
    pub fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        let mut t = self.begin()?;
        let now = self.time.now_ms();
        let open_ms = self.policy.policy.breaker.open_ms;
        Ok(t.breakers()?
            .into_iter()
            .map(|(tool, b)| (tool, b.at(now, open_ms)))
            .collect())
    }

    /// Every run the gate holds (as [`Gate::runs`] for the operator) and every tool's
    /// breaker (as [`Gate::breakers`]): the operator's views. Read apart from the
    /// decisions where the backend can ([`StateBackend::overview`]), else in ordinary
    /// transactions. Read only.
    #[allow(clippy::type_complexity)]
    pub fn overview(
        &self,
    ) -> Result<(Vec<Standing>, Vec<(String, tally_policy::Breaker)>), GateError> {
        let Some(read) = self.backend.overview() else {
            let operator = Caller {
                uid: None,
                operator: true,
                proxied: false,
            };
            return Ok((self.runs(operator)?, self.breakers()?));
        };
        let (runs, breakers) = read?;
        let now = self.time.now_ms();
        let open_ms = self.policy.policy.breaker.open_ms;
        Ok((
            runs.iter().map(|r| self.standing(r)).collect(),
            breakers
                .into_iter()
                .map(|(tool, b)| (tool, b.at(now, open_ms)))
                .collect(),
        ))
    }

    /// Whether the gate governs `run` (it started through the gate): raw appends for it
    /// are refused.
    pub fn governs(&self, run: &str) -> Result<bool, GateError> {
        let mut t = self.begin()?;
        t.governs(run)
    }
}
