//! A run's start at the gate: the caller's expired runs stopped first, then the grant
//! the core allows, folded into the transaction (the run inserted, its parent's budget
//! carved, its owner's principal counted).

use tally_ledger::decision::Budget;
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{apply, Now, PrincipalState, RunState, ViewMut};

use crate::backend::{Scopes, StateBackend};
use crate::commit::Commit;
use crate::work::Work;
use crate::{
    clock, encodable, held, principal_scope, start_refused, Caller, Done, Gate, GateError,
    StartRequest, Started, Touched,
};

/// What a granted start records, writes and is given.
type Granted = (Decision, Vec<Touched>, Budget);

impl<B: StateBackend> Gate<B> {
    /// Start a run. `done` gets the granted budget once the start record is durable.
    ///
    /// The caller's runs past their deadline are stopped first (`run_deadline_exhausted`,
    /// in the same commit, before the start; recorded even if the start is refused), so
    /// they no longer count toward its open runs (docs/GATE.md, "Deadlines").
    pub fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        self.transact(done, |t| self.start_run(t, caller, req))
    }

    /// A start's step: the expired runs' stops, then the start if the core grants it.
    fn start_run(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        req: StartRequest,
    ) -> Result<Commit<Started>, GateError> {
        if !t.is_new(&req.run)? {
            return Err(GateError::RunExists(req.run.clone()));
        }
        // The operator in-process is not counted; everyone else is, TCP peers as one.
        // (Read first: a networked backend holds the uid's count from here.)
        let (open_runs_of_uid, mut records, mut writes) = if caller.operator {
            (None, Vec::new(), Vec::new())
        } else {
            let open = t.open_runs_of(caller.uid)?;
            let (stops, writes) = self.stop_expired(t, caller)?;
            let open = open.saturating_sub(stops.len() as u64);
            (Some(open), stops, writes)
        };
        match self.grant(t, caller, &req, open_runs_of_uid) {
            // The stops stand whether or not the run starts.
            Err(e) => Ok(Commit::refused(records, writes, e)),
            Ok((record, touched, budget)) => {
                records.push(record);
                writes.extend(touched);
                Ok(Commit::new(records, writes, self.started(req.run, budget)))
            }
        }
    }

    /// The answer to a granted start of `run` with `budget` under this gate's policy (a
    /// start or a continuation); its seq and hash are the start record's, set once that
    /// is receipted.
    pub(crate) fn started(&self, run: String, budget: Budget) -> Started {
        Started {
            run,
            budget,
            policy: self.policy.digest.clone(),
            seq: 0,
            hash: String::new(),
            token: None,
        }
    }

    /// Stop the caller's open runs that are past their deadline: their stop records
    /// (`run_deadline_exhausted`), folded into the transaction, and the runs to write.
    fn stop_expired(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
    ) -> Result<(Vec<Decision>, Vec<Touched>), GateError> {
        let wall = self.time.now_ms();
        let expired = t.expired_runs_of(caller.uid, &|r| deadline_stop(r, wall).is_some())?;
        let mut stops = Vec::with_capacity(expired.len());
        let mut writes = Vec::with_capacity(expired.len());
        for name in expired {
            let state = held(t, &name, caller)?.clone();
            let Some(reason) = deadline_stop(&state, wall) else {
                continue;
            };
            stops.push(self.stop_one(t, &name, &state, reason, None, caller)?);
            writes.push(Touched::run(&name));
        }
        Ok((stops, writes))
    }

    /// What a start is granted, once the core allows it: its record, folded into the
    /// transaction ([`Gate::fold_start`]), the scopes it touched, and the budget.
    pub(crate) fn grant(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        req: &StartRequest,
        open_runs_of_uid: Option<u64>,
    ) -> Result<Granted, GateError> {
        let policy = &self.policy.policy;
        if let Some(b) = &req.budget {
            // Spend asked in one unit, and cents that fit in nanodollars.
            tally_ledger::decision::one_amount(
                "budget.spend_cents",
                b.spend_cents,
                "budget.spend_nanos",
                b.spend_nanos,
            )?;
        }
        let parent = match &req.parent {
            Some(p) => Some(held(t, p, caller)?.clone()),
            None => None,
        };
        let continued = match &req.continues {
            Some(c) => Some(held(t, c, caller)?.clone()),
            None => None,
        };
        // One rule for what a run is granted and whether it may start: the core's, the
        // one replay holds every recorded start to.
        let now = Now {
            wall_ms: self.time.now_ms(),
            at_ms: Some(0),
        };
        let principal = principal_scope(policy, caller.uid);
        let principal_now = self.principal_now(t, caller, &req.run, principal.as_deref(), now)?;
        let ask = tally_policy::Ask {
            budget: req.budget.as_ref(),
            credential: req.credential.as_deref(),
            depth: req.depth,
            uid: caller.uid,
            operator: caller.operator,
        };
        // A continuation of a run a refusal stopped: the chain it ends, looked up here,
        // counted by the core.
        let refill = continued.as_ref().and_then(|c| {
            tally_policy::refill::refill(policy, c, Some(&req.run), |n| t.run(n).ok().cloned())
        });
        let family = tally_policy::Family {
            parent: parent.as_ref(),
            continued: continued.as_ref(),
            open_runs_of_uid,
            principal: principal_now,
            refill,
        };
        let budget = tally_policy::start(policy, &ask, &family)
            .map_err(|r| start_refused(r, req, parent.as_ref(), caller))?;
        let record = self.start_record(req, caller, &budget)?;
        let writes = self.fold_start(t, req, &record, principal, principal_now, continued, now)?;
        Ok((record, writes, budget))
    }

    /// The starting uid's budget across its runs, as it stands now, where the policy
    /// gives the uid one (`principal`: its scope), read into the transaction.
    fn principal_now(
        &self,
        t: &mut Work<B::Txn<'_>>,
        caller: Caller,
        run: &str,
        principal: Option<&str>,
        now: Now,
    ) -> Result<Option<PrincipalState>, GateError> {
        let limits = caller.uid.and_then(|u| self.policy.policy.principal(u));
        let (Some(p), Some(limits)) = (principal, limits) else {
            return Ok(None);
        };
        t.ensure_principal(p)?;
        let scopes = Scopes {
            principal: Some(p),
            ..Scopes::run(run)
        };
        Ok(t.view(&scopes)
            .principal
            .map(|s| s.at(now.wall_ms, limits.period_ms)))
    }

    /// The start record of a granted `budget`, checked to encode.
    fn start_record(
        &self,
        req: &StartRequest,
        caller: Caller,
        budget: &Budget,
    ) -> Result<Decision, GateError> {
        let mut record = Decision {
            run: req.run.clone(),
            kind: Some(Kind::Start),
            worker: req.worker.clone(),
            at_ms: Some(0),
            goal: req.goal.clone(),
            budget: Some(Box::new(budget.clone())),
            parent: req.parent.clone(),
            policy: Some(self.policy.digest.clone()),
            uid: caller.uid,
            credential: req.credential.clone(),
            continues: req.continues.clone(),
            ..Decision::default()
        };
        encodable(&mut record)?;
        Ok(record)
    }

    /// Fold a granted start into the transaction: the run inserted, its parent's budget
    /// carved, its owner's principal counted. The scopes it wrote.
    #[allow(clippy::too_many_arguments)]
    fn fold_start(
        &self,
        t: &mut Work<B::Txn<'_>>,
        req: &StartRequest,
        record: &Decision,
        principal: Option<String>,
        principal_now: Option<PrincipalState>,
        continued: Option<RunState>,
        now: Now,
    ) -> Result<Vec<Touched>, GateError> {
        let mut run = RunState::new(&req.run);
        // The principal is folded on a copy (the parent is borrowed from the transaction
        // beside it) and written back once the run is in.
        let mut principal_state = principal_now;
        let parent = match &req.parent {
            Some(p) => Some(
                t.run_mut(p)
                    .ok_or_else(|| GateError::RunNotFound(p.clone()))?,
            ),
            None => None,
        };
        let view = ViewMut {
            run: &mut run,
            tool: None,
            credential: None,
            principal: principal_state.as_mut(),
            parent,
            continued: continued.as_ref(),
        };
        let found = apply(&self.policy.policy, view, record, now);
        debug_assert!(found.is_empty(), "a start the core granted: {found:?}");
        t.insert_run(run);
        if let (Some(name), Some(state)) = (&principal, principal_state) {
            let scopes = Scopes {
                principal: Some(name),
                ..Scopes::run(&req.run)
            };
            if let Some(p) = t.view_mut(&scopes).principal {
                *p = state;
            }
        }
        let mut writes = vec![Touched {
            principal,
            ..Touched::run(&req.run)
        }];
        if let Some(p) = &req.parent {
            writes.push(Touched::run(p));
        }
        Ok(writes)
    }
}

/// The stop the core owes `run` at wall time `wall` on the run's clock, if any (past
/// its deadline: its next check would be refused `run_deadline_exhausted`).
fn deadline_stop(run: &RunState, wall: u64) -> Option<Reason> {
    let at = clock::run_clock(wall, run).at_ms.unwrap_or(0);
    tally_policy::deadline_stop(run, at)
}
