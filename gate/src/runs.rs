//! A run's life at the gate: start (with its grant and the caller's expired runs), stop
//! (a kill cascades), pause and resume, approvals, and where runs stand.

use tally_ledger::decision::Budget;
use tally_ledger::{Decision, Kind, Reason, Receipt};
use tally_policy::{apply, judge, Now, RunState, ViewMut};

use crate::backend::{Scopes, StateBackend, StateTxn};
use crate::{
    clock, encodable, inconsistent, live, open_descendants, principal_scope, start_refused,
    Approval, Caller, Done, Gate, GateError, Logged, Standing, StartRequest, Started, StopRequest,
    Touched,
};

impl<B: StateBackend> Gate<B> {
    /// Start a run. `done` gets the granted budget once the start record is durable.
    ///
    /// The caller's runs past their deadline are stopped first (`run_deadline_exhausted`,
    /// in the same commit, before the start; recorded even if the start is refused), so
    /// they no longer count toward its open runs (docs/GATE.md, "Deadlines").
    pub fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        let result = (|| {
            let mut t = self.begin()?;
            if !t.is_new(&req.run)? {
                return Err(GateError::RunExists(req.run.clone()));
            }
            // The operator in-process is not counted; everyone else is, TCP peers as one.
            // (Read first: a networked backend holds the uid's count from here.)
            let (open_runs_of_uid, stops, writes) = if caller.operator {
                (None, Vec::new(), Vec::new())
            } else {
                let open = t.open_runs_of(caller.uid)?;
                let (stops, writes) = self.stop_expired(&mut t, caller)?;
                let open = open.saturating_sub(stops.len() as u64);
                (Some(open), stops, writes)
            };
            let granted = self.grant(&mut t, caller, &req, open_runs_of_uid);
            Ok((t, stops, writes, granted))
        })();
        match result {
            Err(e) => done(Err(e)),
            Ok((t, stops, _, Err(e))) if stops.is_empty() => {
                drop(t);
                done(Err(e))
            }
            // The stops stand whether or not the run starts.
            Ok((t, stops, writes, Err(e))) => self.submit(
                t,
                stops,
                &writes,
                |_| (),
                Box::new(move |r: Result<(), GateError>| done(Err(r.err().unwrap_or(e)))),
            ),
            Ok((t, mut records, mut writes, Ok((record, touched, budget)))) => {
                records.push(record);
                writes.extend(touched);
                let digest = self.policy.digest.clone();
                let run = req.run;
                let answer = move |r: Receipt| Started {
                    run,
                    budget,
                    policy: digest,
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    token: None,
                };
                // Queued inside the transaction: the ledger's order is the state's order.
                self.submit(t, records, &writes, answer, done)
            }
        }
    }

    /// Stop the caller's open runs that are past their deadline: their stop records
    /// (`run_deadline_exhausted`), folded into the transaction, and the runs to write.
    fn stop_expired(
        &self,
        t: &mut B::Txn<'_>,
        caller: Caller,
    ) -> Result<(Vec<Decision>, Vec<Touched>), GateError> {
        let wall = self.time.now_ms();
        let expired = t.expired_runs_of(caller.uid, &|r| deadline_stop(r, wall).is_some())?;
        let mut stops = Vec::with_capacity(expired.len());
        let mut writes = Vec::with_capacity(expired.len());
        for name in expired {
            let state = t.run(&name, caller)?.clone();
            let Some(reason) = deadline_stop(&state, wall) else {
                continue;
            };
            stops.push(self.stop_one(t, &name, &state, reason, None, caller)?);
            writes.push(Touched::run(&name));
        }
        Ok((stops, writes))
    }

    /// What a start is granted, once the core allows it: its record, folded into the
    /// transaction (the run inserted, its parent's budget carved), the scopes it touched,
    /// and the budget.
    fn grant(
        &self,
        t: &mut B::Txn<'_>,
        caller: Caller,
        req: &StartRequest,
        open_runs_of_uid: Option<u64>,
    ) -> Result<(Decision, Vec<Touched>, Budget), GateError> {
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
            Some(p) => Some(t.run(p, caller)?.clone()),
            None => None,
        };
        let continued = match &req.continues {
            Some(c) => Some(t.run(c, caller)?.clone()),
            None => None,
        };
        // One rule for what a run is granted and whether it may start: the core's, the
        // one replay holds every recorded start to.
        let now = Now {
            wall_ms: self.time.now_ms(),
            at_ms: Some(0),
        };
        // The starting uid's budget across its runs, as it stands now.
        let principal = principal_scope(policy, caller.uid);
        let principal_now = match (&principal, caller.uid.and_then(|u| policy.principal(u))) {
            (Some(p), Some(limits)) => {
                t.ensure_principal(p)?;
                let scopes = Scopes {
                    principal: Some(p),
                    ..Scopes::run(&req.run)
                };
                t.view(&scopes)
                    .principal
                    .map(|s| s.at(now.wall_ms, limits.period_ms))
            }
            _ => None,
        };
        let ask = tally_policy::Ask {
            budget: req.budget.as_ref(),
            credential: req.credential.as_deref(),
            depth: req.depth,
            uid: caller.uid,
            operator: caller.operator,
        };
        let family = tally_policy::Family {
            parent: parent.as_ref(),
            continued: continued.as_ref(),
            open_runs_of_uid,
            principal: principal_now,
        };
        let budget = tally_policy::start(policy, &ask, &family)
            .map_err(|r| start_refused(r, req, parent.as_ref(), caller))?;
        let mut record = Decision {
            run: req.run.clone(),
            kind: Some(Kind::Start),
            worker: req.worker.clone(),
            at_ms: Some(0),
            goal: req.goal.clone(),
            budget: Some(budget.clone()),
            parent: req.parent.clone(),
            policy: Some(self.policy.digest.clone()),
            uid: caller.uid,
            credential: req.credential.clone(),
            continues: req.continues.clone(),
            ..Decision::default()
        };
        encodable(&mut record)?;
        let mut run = RunState::new(&req.run);
        let mut writes = vec![Touched {
            principal: principal.clone(),
            ..Touched::run(&req.run)
        }];
        if let Some(p) = &req.parent {
            writes.push(Touched::run(p));
        }
        // The principal is folded on a copy (the parent is borrowed from the transaction
        // beside it) and written back once the run is in.
        let mut principal_state = principal_now;
        let found = apply(
            policy,
            ViewMut {
                run: &mut run,
                tool: None,
                credential: None,
                principal: principal_state.as_mut(),
                parent: match &req.parent {
                    Some(p) => Some(
                        t.run_mut(p)
                            .ok_or_else(|| GateError::RunNotFound(p.clone()))?,
                    ),
                    None => None,
                },
                continued: continued.as_ref(),
            },
            &record,
            now,
        );
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
        Ok((record, writes, budget))
    }

    /// Stop a run: by its owner (any reason, usually `completed`), or by the operator
    /// (a kill: `killed_by_operator`). A kill stops the run's open descendants too, in
    /// the same commit, before the run itself: a child's budget was carved from the
    /// killed run's, and it must not go on spending it.
    pub fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        let result = (|| {
            let mut t = self.begin()?;
            let state = live(&mut t, run, caller)?.clone();
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
                open_descendants(&mut t, run)?
            } else {
                Vec::new()
            };
            let mut records = Vec::with_capacity(descendants.len() + 1);
            let mut writes = Vec::with_capacity(descendants.len() + 1);
            for child in descendants.iter().rev() {
                let child_state = t.run(child, caller)?.clone();
                records.push(self.stop_one(&mut t, child, &child_state, reason, None, caller)?);
                writes.push(Touched::run(child));
            }
            records.push(self.stop_one(&mut t, run, &state, reason, req.worker, caller)?);
            writes.push(Touched::run(run));
            let limits = tally_policy::apply::standing(&state, self.clock(&state));
            Ok((
                records,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                    overrun_nanos: None,
                },
                t,
            ))
        })();
        match result {
            Ok((records, writes, answer, t)) => self.submit(t, records, &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }

    /// The stop record of one open run, folded into the transaction: the run is marked
    /// stopped and its calls give back their tools' in-flight slots.
    pub(crate) fn stop_one(
        &self,
        t: &mut B::Txn<'_>,
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
        t.mark_stopped(run);
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
        let result = (|| {
            if !caller.operator {
                return Err(GateError::NotAuthorized(
                    "pause and resume are the operator's".into(),
                ));
            }
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let _ = live(&mut t, run, caller)?;
            let mut family = open_descendants(&mut t, run)?;
            family.reverse();
            family.push(run.to_owned());
            let kind = if paused { Kind::Pause } else { Kind::Resume };
            let mut records = Vec::new();
            let mut writes = Vec::new();
            for name in &family {
                let state = t.run(name, caller)?;
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
                t.pause_changed(name, paused)?;
                apply(policy, t.view_mut(&Scopes::run(name)), &record, now);
                records.push(record);
                writes.push(Touched::run(name));
            }
            let answer = self.standing(t.run(run, caller)?);
            Ok((records, writes, answer, t))
        })();
        match result {
            Ok((records, _, answer, t)) if records.is_empty() => {
                drop(t);
                done(Ok(answer))
            }
            Ok((records, writes, answer, t)) => {
                self.submit(t, records, &writes, move |_| answer, done)
            }
            Err(e) => done(Err(e)),
        }
    }

    /// Record a human's approval for a run, once its signature, approver and digest
    /// check out. An approval for a stopped run or after the run's deadline is refused:
    /// it never revives a run.
    pub fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        let result = (|| {
            if !caller.operator {
                return Err(GateError::NotAuthorized(
                    "approvals arrive on the operator socket".into(),
                ));
            }
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let state = live(&mut t, &a.run, caller)?.clone();
            let now = self.clock(&state);
            let at = now.at_ms.unwrap_or(0);
            if tally_policy::past_deadline(&state.budget, at) {
                return Err(GateError::ApprovalRefused(
                    "the run is past its deadline; an approval does not revive it".into(),
                ));
            }
            if a.expires_ms <= at {
                use tally_ledger::words::after_start;
                return Err(GateError::ApprovalRefused(format!(
                    "the approval expired {}; the run is now {}: sign a new one (`tally approve --expires`)",
                    after_start(a.expires_ms),
                    after_start(at)
                )));
            }
            if a.expires_ms - at > policy.approvals.max_expiry_ms {
                use tally_ledger::words::duration;
                return Err(GateError::ApprovalRefused(format!(
                    "the approval is valid for {}; the policy allows at most {} (approvals.max_expiry_ms): sign one with a shorter --expires",
                    duration(a.expires_ms - at),
                    duration(policy.approvals.max_expiry_ms)
                )));
            }
            let mut record = Decision {
                run: a.run.clone(),
                kind: Some(Kind::Override),
                at_ms: now.at_ms,
                approver: Some(a.approver),
                scope: Some(a.scope),
                digest: Some(a.digest),
                expires_ms: Some(a.expires_ms),
                signature: Some(a.signature),
                note: a.note,
                uid: caller.uid,
                policy: Some(self.policy.digest.clone()),
                ..Decision::default()
            };
            encodable(&mut record)?;
            if let Some(found) = judge(policy, t.view(&Scopes::run(&a.run)), &record, now)
                .into_iter()
                .next()
            {
                return Err(inconsistent(&a.run, found));
            }
            apply(policy, t.view_mut(&Scopes::run(&a.run)), &record, now);
            let writes = vec![Touched::run(&a.run)];
            let limits = tally_policy::apply::standing(&state, now);
            Ok((
                record,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                    overrun_nanos: None,
                },
                t,
            ))
        })();
        match result {
            Ok((record, writes, answer, t)) => self.submit(t, vec![record], &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }

    /// Where a run stands.
    pub fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        let mut t = self.begin()?;
        let state = t.run(run, caller)?.clone();
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
            .cloned()
            .collect();
        runs.iter().map(|r| self.standing_in(&mut t, r)).collect()
    }

    /// Where a run stands now, with its owner's principal usage where the policy gives
    /// the owner a budget (the policy core's count, [`tally_policy::principal_limits`]).
    /// Reads only: the transaction is dropped, never committed.
    fn standing_in<T: StateTxn>(&self, t: &mut T, run: &RunState) -> Result<Standing, GateError> {
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

/// The stop the core owes `run` at wall time `wall` on the run's clock, if any (past
/// its deadline: its next check would be refused `run_deadline_exhausted`).
fn deadline_stop(run: &RunState, wall: u64) -> Option<Reason> {
    let at = clock::run_clock(wall, run).at_ms.unwrap_or(0);
    tally_policy::deadline_stop(run, at)
}
