//! The leased state backend (docs/FLEET.md, "The leased mode"): the gate's state seam
//! over PostgreSQL, where a run with a lease scope is decided at home on this holder
//! ([`super::home`]) and every use it makes of its budget is counted in the holder's
//! slice of the run's scope ([`Slices::take_on`]); whatever no slice covers is refused
//! as unavailable (retry), nothing recorded. A tool's breaker is read from this
//! holder's view where the policy counts nothing per call for tools ([`super::breakers`]:
//! no rate bucket, no limit on calls in flight) and every run the decision named before
//! the tool is at home
//! here; otherwise tools, and always credentials and principals, stay central (their
//! rows locked per decision, as without leases), and so do run starts, pauses, stops
//! and kills of runs at home elsewhere, which take the home back.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use tally_gate::backend::{
    Committed, Keys, Observed, Overview, Records, Refuse, Snapshot, StateBackend, StateReads,
    StateTxn, Write,
};
use tally_gate::GateError;
use tally_policy::{RunState, ToolState};

use super::breakers::{self, BreakersTicked, ViewLimits, Views};
use super::group::{Group, Item, Outcome};
use super::holder::Slices;
use super::home::{self, Found, Home, TakenOn, TakenOns};
use super::types::{Amounts, Caps, Scope, ScopeKind};
use crate::schema::{decode, encode};
use crate::txn::{cap_params, Extra, HomeWrite, LeaseStep, PostgresTxn};
use crate::Postgres;

/// The gate's state in PostgreSQL with leased runs decided at home on this holder.
pub struct Leased {
    central: Arc<Postgres>,
    slices: Arc<Slices>,
    /// The tools' breakers as this holder sees them ([`super::breakers`]).
    views: Arc<Views>,
    homes: Arc<Mutex<BTreeMap<String, Home>>>,
    /// Where each open attempt's use was counted, apart from the copies (which an
    /// uncommitted decision lets go).
    taken: Arc<Mutex<TakenOns>>,
    /// The group commit of the decisions at home that lock no shared row ([`super::group`]).
    group: Group,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("central", &self.central)
            .field("holder", &self.slices.leases().holder())
            .finish_non_exhaustive()
    }
}

impl Leased {
    /// The central backend, with this holder's slices. Every tick of the slices ends
    /// with the tools' breakers' views flushed and refreshed.
    /// The tick's report says what the views did ([`BreakersTicked`]), and the
    /// holder's lease metrics count it. Fails only if the group commit's thread cannot
    /// be started.
    pub fn new(
        central: Postgres,
        slices: Arc<Slices>,
        limits: ViewLimits,
    ) -> std::io::Result<Leased> {
        let (central, views) = (Arc::new(central), Arc::new(Views::new(limits)));
        let (c, v, s) = (
            Arc::downgrade(&central),
            Arc::downgrade(&views),
            Arc::downgrade(&slices),
        );
        slices.after_tick(Box::new(move |ticked| {
            if let (Some(c), Some(v)) = (Weak::upgrade(&c), Weak::upgrade(&v)) {
                breakers::flush(&c, &v, &mut ticked.breakers);
                breakers::refresh(&c, &v, &mut ticked.breakers);
                if let Some(s) = Weak::upgrade(&s) {
                    s.metrics().breakers(&ticked.breakers);
                }
            }
        }));
        let homes = Arc::new(Mutex::new(BTreeMap::new()));
        let group = Group::start(&central, Arc::clone(&homes))?;
        Ok(Leased {
            central,
            slices,
            views,
            homes,
            taken: Arc::new(Mutex::new(BTreeMap::new())),
            group,
        })
    }

    /// The holder's slices (its counters, its ticks).
    pub fn slices(&self) -> &Arc<Slices> {
        &self.slices
    }

    /// Outcomes seen here whose breaker's fold has not reached the tool's row yet (the
    /// next tick, or [`StateBackend::close`], folds them there).
    pub fn unflushed(&self) -> usize {
        self.views.pending()
    }

    /// Decisions waiting in the group commit now, and whether a commit of them is in
    /// flight ([`super::group`]).
    pub fn group_pending(&self) -> (usize, bool) {
        self.group.pending()
    }

    /// Decisions waiting now for the group commit to drain before they send anything
    /// ([`super::group`]).
    pub fn group_draining(&self) -> usize {
        self.group.draining()
    }

    /// The runs at home here now, by name.
    pub fn at_home(&self) -> Vec<String> {
        self.homes().keys().cloned().collect()
    }

    /// This process as a run's home: its holder's name and epoch (two processes under
    /// one name never pass each other's guard).
    fn me_now(&self) -> (String, i64) {
        let leases = self.slices.leases();
        (leases.holder().to_owned(), leases.epoch())
    }

    fn homes(&self) -> MutexGuard<'_, BTreeMap<String, Home>> {
        self.homes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A use of `run` refused for want of a slice (counted as the slices' own refusals).
    fn refused(&self, run: &str) {
        let scope = vec![Scope::new(ScopeKind::Run, run)];
        self.slices.event(super::LeaseEvent::Refused { scope });
    }

    fn taken(&self) -> MutexGuard<'_, TakenOns> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A run read from its row: where its attempts no longer open were counted is
    /// forgotten (they closed elsewhere).
    fn prune(&self, run: &str, state: &RunState) {
        let mut taken = self.taken();
        if let Some(on) = taken.get_mut(run) {
            on.retain(|a, _| state.open.contains_key(a));
        }
    }

    /// The copy of `run` kept here, while this holder holds a slice of the run's scope:
    /// once its slice went back (idle, near its deadline, revoked), another daemon may
    /// take the run, so the copy is let go and the row read again.
    fn kept(&self, run: &str) -> Option<Home> {
        let scope = Scope::new(ScopeKind::Run, run);
        let mut homes = self.homes();
        if self.slices.held(&scope).is_none() {
            homes.remove(run);
        }
        homes.get(run).cloned()
    }
}

impl StateBackend for Leased {
    type Txn<'a> = LeasedTxn<'a>;

    fn begin(&self) -> Result<LeasedTxn<'_>, GateError> {
        let inner = self.central.begin()?;
        Ok(LeasedTxn {
            generation: self.group.generation(),
            drained: false,
            inner,
            backend: self,
            homed: BTreeMap::new(),
            elsewhere: BTreeMap::new(),
            viewed: BTreeSet::new(),
            watched: BTreeSet::new(),
            committed: false,
        })
    }

    fn round_trips(&self) -> Option<u64> {
        self.central.round_trips()
    }

    fn networked(&self) -> bool {
        true
    }

    fn overview(&self) -> Option<Result<Overview, GateError>> {
        self.central.overview()
    }

    fn overview_apart(&self) -> bool {
        true
    }

    /// Outcomes folded into a view's breaker are kept to fold into the tool's row.
    fn observes(&self) -> bool {
        true
    }

    /// The slices' and the views' events, then the group commit's counts.
    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        let mut counts = self.slices.metrics().counts();
        counts.extend(self.group.counts());
        Some(counts)
    }

    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        Some(u64::try_from(self.unflushed()).unwrap_or(u64::MAX))
    }

    /// Every slice given back, saying what was used (the runs' rows are already
    /// written through): what was left of them is the fleet's again at once.
    fn close(&self) {
        self.group.close();
        let mut flushed = BreakersTicked::default();
        breakers::flush(&self.central, &self.views, &mut flushed);
        self.slices.metrics().breakers(&flushed);
        self.slices.close();
    }
}

/// One decision's transaction: the central one, and the runs it decides at home.
pub struct LeasedTxn<'a> {
    inner: PostgresTxn<'a>,
    backend: &'a Leased,
    /// Runs decided on their copy at home, as they were before the decision.
    homed: BTreeMap<String, Home>,
    /// Runs at home on another holder (by name: that holder), read and locked: only a
    /// pause, resume or stop of them is decided (it takes the home back).
    elsewhere: BTreeMap<String, String>,
    /// Tools decided from this holder's view of their breaker (their rows neither
    /// locked nor written).
    viewed: BTreeSet<String>,
    /// Tools that could be viewed, read and locked centrally here: their views follow
    /// what this transaction writes.
    watched: BTreeSet<String>,
    /// Committed (or queued in the group commit): the copies kept are what the rows
    /// hold, or will once the group commits (a failed group commit lets them go).
    committed: bool,
    /// The group commit's generation when this began ([`Group::queue`]).
    generation: u64,
    /// Every decision queued in the group commit was committed before this one sent
    /// its first statement ([`LeasedTxn::central`]).
    drained: bool,
}

impl Drop for LeasedTxn<'_> {
    /// Not committed (refused, unavailable, its home moved): the copies of its runs are
    /// let go and read again next time (one round trip), never decided on stale.
    fn drop(&mut self) {
        if !self.committed {
            self.forget();
        }
    }
}

impl StateReads for LeasedTxn<'_> {
    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        if self.homed.contains_key(run) || self.backend.homes().contains_key(run) {
            return Ok(true);
        }
        self.central()?.governs(run)
    }
    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        self.central()?.open_runs_of(uid)
    }
    fn open_runs_listed(&mut self, uid: Option<u32>) -> Result<Vec<RunState>, GateError> {
        self.central()?.open_runs_listed(uid)
    }
    fn runs(&mut self) -> Result<Vec<RunState>, GateError> {
        self.central()?.runs()
    }
    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        self.central()?.runs_named(prefix)
    }
    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        self.central()?.open_children(run)
    }
    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        self.central()?.breakers()
    }
}

impl StateTxn for LeasedTxn<'_> {
    fn claim(&mut self, run: &str) -> Result<bool, GateError> {
        if self.homed.contains_key(run) {
            return Ok(false);
        }
        self.central()?.claim(run)
    }

    fn load(&mut self, keys: &Keys<'_>) -> Result<Snapshot, GateError> {
        let mut s = Snapshot::default();
        for &run in &keys.runs {
            if let Some(state) = self.find(run)? {
                s.runs.insert(run.to_owned(), state);
            }
        }
        let mut rest = Keys {
            runs: Vec::new(),
            ..keys.clone()
        };
        rest.tools.retain(|tool| match self.view_of(tool, keys) {
            Some(state) => {
                s.tools.insert((*tool).to_owned(), state);
                false
            }
            None => true,
        });
        let named =
            !(rest.tools.is_empty() && rest.credentials.is_empty() && rest.principals.is_empty());
        if named {
            s.absorb(self.central()?.load(&rest)?);
        }
        Ok(s)
    }

    fn commit(mut self, write: Write<'_>, done: Committed) -> Result<(), GateError> {
        let Write {
            mut snapshot,
            durable,
            records,
            deferred,
            observed,
            refuse,
        } = write;
        let viewed = self.viewed_after(&mut snapshot.tools, observed);
        let mut runs = snapshot.runs;
        let after: BTreeMap<String, RunState> = self
            .homed
            .keys()
            .filter_map(|n| runs.remove(n).map(|r| (n.clone(), r)))
            .collect();
        self.refuse_elsewhere(&mut runs)?;
        self.define_new(&runs)?;
        self.inner.runs.extend(runs);
        self.inner.tools.extend(snapshot.tools);
        self.inner.credentials.extend(snapshot.credentials);
        self.inner.principals.extend(snapshot.principals);
        let mut moves = Moves::default();
        if let Err(e) = self.take(&after, &mut moves) {
            self.untake(&moves);
            return Err(e);
        }
        // A decision sent nothing while it was made, and writes its runs at home only:
        // into the group commit. Anything else waits for the group to drain first.
        let apart = moves.extra.steps.is_empty() && !moves.extra.homes.is_empty();
        if !deferred && apart && self.inner.untouched() {
            return self.grouped(moves, viewed, records, done, refuse);
        }
        if let Err(e) = self.central() {
            self.untake(&moves);
            return Err(e);
        }
        let version = match self.inner.persist(durable, &moves.extra) {
            Ok(v) => v,
            Err(e) => {
                if self.inner.unsure {
                    // It may have committed: its outcomes count in the view (the closed
                    // side: if it rolled back, the breaker counts outcomes no ledger
                    // holds, each once; docs/FLEET.md, "Breakers from a view").
                    self.seen_here(viewed);
                } else {
                    self.untake(&moves);
                }
                return Err(e);
            }
        };
        self.committed = true;
        self.seen_here(viewed);
        if !durable.is_empty() {
            self.seen_central();
        }
        self.settled(moves);
        let batch = (records)(version)?;
        let ledger = &self.backend.central.ledger;
        if deferred {
            ledger.submit_deferred(batch.plaintexts, batch.ledger_state, done);
        } else {
            ledger.submit_with_state(batch.plaintexts, batch.ledger_state, done);
        }
        Ok(())
    }
}

impl<'a> LeasedTxn<'a> {
    /// The central transaction, once every decision queued in the group commit was
    /// committed and handed to the ledger (so this one's version and records come after
    /// theirs, and no row they write is locked here first).
    /// A decision that took a run's kept copy before a commit of the group failed is
    /// refused: that copy may hold a queued decision the failure rolled back (the
    /// transaction's drop lets the copies go, read again from their rows next time).
    fn central(&mut self) -> Result<&mut PostgresTxn<'a>, GateError> {
        if !self.drained {
            self.backend.group.drain()?;
            if !self.homed.is_empty() && self.backend.group.generation() != self.generation {
                return Err(GateError::Unavailable(
                    "a commit of decisions made before this one failed: retry".into(),
                ));
            }
            self.drained = true;
        }
        Ok(&mut self.inner)
    }

    /// Into the group commit ([`super::group`]): the copies kept now (later decisions
    /// on these runs are made on them), and once the group committed: what was given
    /// back credited, the records made at the version the group took for it and handed
    /// to the ledger. A group that did not commit refuses it (`refuse`), what it took
    /// given back if that rolled back for certain ([`Queued::answered`]).
    fn grouped(
        &mut self,
        mut moves: Moves,
        viewed: Vec<ViewedTool>,
        records: Records,
        done: Committed,
        refuse: Refuse,
    ) -> Result<(), GateError> {
        let ticket = self.backend.views.ticket();
        let tools: Vec<String> = viewed.iter().map(|(tool, _, _)| tool.clone()).collect();
        let queued = Queued {
            ledger: Arc::clone(&self.backend.central.ledger),
            slices: Arc::clone(&self.backend.slices),
            taken: Arc::clone(&self.backend.taken),
            takes: moves.takes.clone(),
            gives: std::mem::take(&mut moves.gives),
            closed: self.closed_on(&moves.closed),
            views: Arc::clone(&self.backend.views),
            ticket,
            viewed: tools.clone(),
            records,
            done,
            refuse,
        };
        let then = Box::new(move |o: Outcome| queued.answered(o));
        let homes = moves.extra.homes.clone();
        let untaken = moves.takes.clone();
        let views = Arc::clone(&self.backend.views);
        let undo = Box::new(move || {
            for tool in tools {
                views.undone(&tool, ticket);
            }
        });
        let item = Item { homes, undo, then };
        let queued = self.backend.group.queue(self.generation, item, || {
            self.copies_settled(moves);
            for (tool, _, observed) in viewed {
                self.backend.views.queued(&tool, ticket, observed);
            }
        });
        if let Err(e) = queued {
            // Not queued: nothing was sent, nothing kept.
            untake(&self.backend.slices, &untaken);
            return Err(e);
        }
        self.committed = true;
        Ok(())
    }

    /// Where each attempt of `closed` was counted (forgotten once the decision that
    /// closes them is queued, reinstated if its group does not commit).
    fn closed_on(&self, closed: &[(String, u64)]) -> Vec<(String, u64, TakenOn)> {
        let taken = self.backend.taken();
        closed
            .iter()
            .filter_map(|(run, a)| {
                let on = *taken.get(run)?.get(a)?;
                Some((run.clone(), *a, on))
            })
            .collect()
    }
}

/// A decision queued in the group commit: what follows its commit, or its failure.
struct Queued {
    ledger: Arc<tally_ledger::Ledger>,
    slices: Arc<Slices>,
    taken: Arc<Mutex<TakenOns>>,
    takes: Vec<(Scope, Option<i64>, Amounts)>,
    gives: Vec<(Scope, i64, Amounts)>,
    closed: Vec<(String, u64, TakenOn)>,
    /// The tools decided from the view, their outcomes queued there under `ticket`.
    views: Arc<Views>,
    ticket: u64,
    viewed: Vec<String>,
    records: Records,
    done: Committed,
    refuse: Refuse,
}

impl Queued {
    /// Committed: its outcomes kept for the tools' rows, what was given back credited,
    /// its records made (now, in the order queued: the state is ahead if they fail) and
    /// handed to the ledger. Not committed: where the attempts it closed were counted
    /// is known again (the row still holds them open, or, its `COMMIT` unanswered, may:
    /// a closed one is pruned when the row is next read), its outcomes kept for the
    /// tools' rows only if it may have committed (as a central decision's), what it
    /// took given back if it rolled back for certain, and it is refused.
    fn answered(self, o: Outcome) {
        // A certain rollback's outcomes were taken out of the views already, under the
        // queue's lock ([`Item::undo`]).
        if !matches!(o, Outcome::RolledBack(_)) {
            for tool in self.viewed {
                self.views.observed(&tool, self.ticket);
            }
        }
        let e = match o {
            Outcome::Committed(version) => {
                for (scope, id, gave) in self.gives {
                    self.slices.give_on(&scope, id, gave);
                }
                match (self.records)(version) {
                    Ok(b) => {
                        let (plaintexts, state) = (b.plaintexts, b.ledger_state);
                        return self.ledger.submit_with_state(plaintexts, state, self.done);
                    }
                    Err(e) => e,
                }
            }
            Outcome::RolledBack(e) => {
                reinstate(&self.taken, self.closed);
                untake(&self.slices, &self.takes);
                e
            }
            Outcome::Unsure(e) => {
                reinstate(&self.taken, self.closed);
                e
            }
        };
        (self.refuse)(e);
    }
}

/// Where attempts were counted, known again (unless known already).
fn reinstate(taken: &Mutex<TakenOns>, closed: Vec<(String, u64, TakenOn)>) {
    let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
    for (run, a, on) in closed {
        taken.entry(run).or_default().entry(a).or_insert(on);
    }
}

/// A tool decided from the view: its breaker as the decision left it, and the outcomes
/// it folded there.
type ViewedTool = (String, ToolState, Vec<Observed>);

impl LeasedTxn<'_> {
    /// The tool's state from this holder's view, if the decision may read it there: the
    /// policy counts nothing per call for tools (no rate bucket, no calls in flight),
    /// every run the transaction named so far is at home here (checked when the tool is
    /// loaded, not again at commit: a run read centrally after it, as a parent's is,
    /// changes nothing for the tool, whose breaker alone is read and whose row is
    /// neither locked nor written), and the view is not half-open.
    /// A tool that could be viewed but is read centrally is watched: its view follows.
    fn view_of(&mut self, tool: &str, keys: &Keys<'_>) -> Option<ToolState> {
        let idle = keys.idle.as_ref()?;
        if tally_policy::tools_counted_per_call(idle.policy) {
            return None;
        }
        let views = &self.backend.views;
        views.remember(idle.policy);
        let home_only = self.inner.runs.is_empty() && !self.homed.is_empty();
        let open_ms = idle.policy.breaker.open_ms;
        match home_only.then(|| views.decide_from(tool, idle.now_ms, open_ms)) {
            Some(Some(state)) => {
                self.viewed.insert(tool.to_owned());
                Some(state)
            }
            _ => {
                self.watched.insert(tool.to_owned());
                None
            }
        }
    }

    /// The tools decided from the view, taken out of what is written: each with its
    /// state after the decision and the outcomes folded into it.
    fn viewed_after(
        &self,
        tools: &mut BTreeMap<String, ToolState>,
        observed: Vec<Observed>,
    ) -> Vec<ViewedTool> {
        let mut out: Vec<ViewedTool> = self
            .viewed
            .iter()
            .filter_map(|t| tools.remove(t).map(|s| (t.clone(), s, Vec::new())))
            .collect();
        for o in observed {
            if let Some(v) = out.iter_mut().find(|v| v.0 == o.tool) {
                v.2.push(o);
            }
        }
        out
    }

    /// The views of the tools decided here take what the decision left.
    fn seen_here(&self, viewed: Vec<ViewedTool>) {
        for (tool, state, observed) in viewed {
            self.backend.views.decided(&tool, state.breaker, observed);
        }
    }

    /// The watched tools' rows as this transaction wrote them: their views follow.
    fn seen_central(&self) {
        for tool in &self.watched {
            if let Some(t) = self.inner.tools.get(tool) {
                self.backend.views.seen(tool, t.breaker.clone());
            }
        }
    }
}

/// What the runs decided at home moved: what to write, the copies to keep, what to
/// give back on which slice once the decision is committed, what was taken on this
/// holder's slices (given back if it rolled back), and where the attempts it opened
/// were counted and which it closed.
#[derive(Default)]
struct Moves {
    extra: Extra,
    keep: Vec<(String, Option<Home>)>,
    gives: Vec<(Scope, i64, Amounts)>,
    takes: Vec<(Scope, Option<i64>, Amounts)>,
    opened: Vec<(String, u64, TakenOn)>,
    closed: Vec<(String, u64)>,
}

impl LeasedTxn<'_> {
    /// A run named by the gate: at home here (kept: its row locked with the next
    /// statement; or taken in now), central, or at home elsewhere (read and locked).
    fn find(&mut self, run: &str) -> Result<Option<RunState>, GateError> {
        if let Some(h) = self.homed.get(run) {
            return Ok(Some(h.state.clone()));
        }
        if self.inner.runs.contains_key(run) {
            return self.central()?.load_run(run);
        }
        let kept = self.backend.kept(run);
        if let Some(h) = kept {
            let state = h.state.clone();
            self.homed.insert(run.to_owned(), h);
            self.inner
                .guards
                .push((run.to_owned(), self.backend.me_now()));
            return Ok(Some(state));
        }
        let rows = self
            .central()?
            .rows("to read a run", |s| &s.home_read, &[&run])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: RunState = decode(&format!("run `{run}`"), row.get::<_, &[u8]>(0))?;
        let home: Option<(String, i64)> = row.get::<_, Option<String>>(1).zip(row.get(4));
        match home::found(
            state.clone(),
            home,
            row.get(2),
            row.get(3),
            &self.backend.me_now(),
        ) {
            Found::Home(h) => {
                self.backend.prune(run, &h.state);
                self.homed.insert(run.to_owned(), *h);
            }
            found => {
                if let Found::Elsewhere(holder) = found {
                    self.elsewhere.insert(run.to_owned(), holder);
                }
                self.inner.before.insert(run.to_owned(), state.clone());
                self.inner.runs.insert(run.to_owned(), state.clone());
            }
        }
        Ok(Some(state))
    }

    /// A run at home elsewhere (read and locked) is decided here only to pause, resume
    /// or stop it: the write takes its home back. Any other change waits for its home
    /// to give it back. One left as it was is not written at all (its home stays).
    /// The holder's name goes to the operator's log only, never to the agent.
    fn refuse_elsewhere(&mut self, runs: &mut BTreeMap<String, RunState>) -> Result<(), GateError> {
        for (name, holder) in &self.elsewhere {
            let (Some(before), Some(after)) = (self.inner.before.get(name), runs.get(name)) else {
                continue;
            };
            if before == after {
                runs.remove(name);
                self.inner.runs.remove(name);
                self.inner.before.remove(name);
            } else if home::held(before) == home::held(after) {
                let _ = holder;
                self.backend.refused(name);
                return Err(GateError::Unavailable(format!(
                    "run `{name}` is decided on another gate of the fleet, which holds its slice: retry once it is given back (an idle run's slice goes back within the lease's idle time)"
                )));
            }
        }
        Ok(())
    }

    /// A run started now gets its lease scope (its budget's caps, nothing used) before
    /// its row is committed, so no decision on it is ever outside its scope. A run
    /// with no cap has none: it is decided centrally.
    fn define_new(&self, runs: &BTreeMap<String, RunState>) -> Result<(), GateError> {
        for (name, run) in runs {
            if self.inner.before.contains_key(name) {
                continue;
            }
            let cap = tally_policy::run_cap(&run.budget);
            let caps = Caps {
                attempts: cap.attempts,
                nanos: cap.nanos,
                effects: cap.side_effects,
                polls: cap.polls,
            };
            if caps == Caps::default() {
                continue;
            }
            let none = Amounts::default();
            let scope = Scope::new(ScopeKind::Run, name);
            self.backend
                .slices
                .leases()
                .define(&scope, caps, none, none)
                .map_err(|e| GateError::Unavailable(e.to_string()))?;
        }
        Ok(())
    }

    /// Each run decided at home: its use counted in its slice (refused, nothing
    /// recorded, where no slice covers it), its bill and revocation stepped centrally,
    /// its state written through.
    fn take(&self, after: &BTreeMap<String, RunState>, moves: &mut Moves) -> Result<(), GateError> {
        for (name, now) in after {
            if let Some(was) = self.homed.get(name) {
                self.take_one(name, was, now, moves)?;
            }
        }
        Ok(())
    }

    /// One run decided at home. A decision that raised the run's limit (an approval's
    /// grant used) raises its scope's cap to the core's limit and settles its use
    /// centrally, both in the decision's own transaction; a bill is settled centrally
    /// too; any other use is counted in this holder's slice.
    fn take_one(
        &self,
        name: &str,
        was: &Home,
        now: &RunState,
        moves: &mut Moves,
    ) -> Result<(), GateError> {
        let scope = Scope::new(ScopeKind::Run, name);
        let m = home::moved(&was.state, now);
        let raise = tally_policy::raised_limit(&was.state, now).map(|l| cap_params(l.each()));
        let mut delta = [0i64; 4];
        if m.took != Amounts::default() {
            let on = if m.bill || raise.is_some() {
                delta = signed(&m.took);
                TakenOn::Central
            } else {
                self.take_on(&scope, m.took, moves)?
            };
            for a in home::opened(&was.state, now) {
                moves.opened.push((name.to_owned(), a, on));
            }
        }
        let closed = home::closed(&was.state, now);
        if m.gave != Amounts::default() {
            match self.gave_on(name, &scope, &closed) {
                Some(TakenOn::Slice(id)) => moves.gives.push((scope, id, m.gave)),
                Some(TakenOn::Central) => {
                    let g = signed(&m.gave);
                    delta = [0, 1, 2, 3].map(|i| delta[i].saturating_sub(g[i]));
                }
                None => {}
            }
        }
        moves
            .closed
            .extend(closed.into_iter().map(|a| (name.to_owned(), a)));
        let revoked = (home::held(&was.state) != home::held(now)).then(|| home::held(now));
        if delta != [0; 4] || revoked.is_some() || raise.is_some() {
            moves.extra.steps.push(LeaseStep {
                kind: "run",
                key: name.to_owned(),
                delta,
                bill: m.bill,
                revoked,
                raise,
            });
        }
        moves.extra.homes.push(self.home_write(name, was, now));
        let kept = now.stop.is_none().then(|| Home {
            state: now.clone(),
            expected: Some(self.backend.me_now()),
        });
        moves.keep.push((name.to_owned(), kept));
        Ok(())
    }

    /// `need` counted in this holder's slice of `scope` (or, the scope's last units,
    /// settled centrally at once): where it was counted.
    fn take_on(
        &self,
        scope: &Scope,
        need: Amounts,
        moves: &mut Moves,
    ) -> Result<TakenOn, GateError> {
        let scopes = [scope.clone()];
        match self.backend.slices.take_on(&scopes, need, Instant::now) {
            Ok((_, Some(id))) => {
                moves.takes.push((scope.clone(), Some(id), need));
                Ok(TakenOn::Slice(id))
            }
            Ok((_, None)) => {
                moves.takes.push((scope.clone(), None, need));
                Ok(TakenOn::Central)
            }
            Err(e) => Err(GateError::Unavailable(format!(
                "{e}: no slice covers this use, nothing recorded (retry)"
            ))),
        }
    }

    /// Where what closing `closed` gives back is credited: where every one of them was
    /// counted (a slice gone back since: its use was settled, so centrally), or none
    /// (then nothing is given back: the conservative side).
    fn gave_on(&self, run: &str, scope: &Scope, closed: &[u64]) -> Option<TakenOn> {
        let taken = self.backend.taken();
        let of = taken.get(run)?;
        let first = *of.get(closed.first()?)?;
        if !closed.iter().all(|a| of.get(a) == Some(&first)) {
            return None;
        }
        match first {
            TakenOn::Slice(id) if !self.backend.slices.holds(scope, id) => Some(TakenOn::Central),
            on => Some(on),
        }
    }

    /// Rolled back for certain: what was taken on this holder's slices for it is
    /// given back on them.
    fn untake(&self, moves: &Moves) {
        untake(&self.backend.slices, &moves.takes);
    }

    fn home_write(&self, name: &str, was: &Home, now: &RunState) -> HomeWrite {
        let open = now.stop.is_none();
        HomeWrite {
            run: name.to_owned(),
            state: encode(now),
            open,
            home: open.then(|| self.backend.me_now()),
            expected: was.expected.clone(),
        }
    }

    /// Committed: the copies kept (a stopped run's let go), what was given back
    /// credited to the slices that took it.
    fn settled(&self, mut moves: Moves) {
        let gives = std::mem::take(&mut moves.gives);
        self.copies_settled(moves);
        for (scope, id, gave) in gives {
            self.backend.slices.give_on(&scope, id, gave);
        }
    }

    /// The copies kept (a stopped run's let go), and where the attempts it opened were
    /// counted (those it closed forgotten).
    fn copies_settled(&self, moves: Moves) {
        let mut homes = self.backend.homes();
        for (name, kept) in moves.keep {
            match kept {
                Some(h) => homes.insert(name, h),
                None => homes.remove(&name),
            };
        }
        drop(homes);
        let mut taken = self.backend.taken();
        for (run, a) in moves.closed {
            if let Some(on) = taken.get_mut(&run) {
                on.remove(&a);
            }
        }
        for (run, a, on) in moves.opened {
            taken.entry(run).or_default().insert(a, on);
        }
        taken.retain(|_, on| !on.is_empty());
    }

    /// Not committed: the copies of this transaction's runs are let go (read again
    /// next time: the row is never behind what was answered).
    fn forget(&self) {
        let mut homes = self.backend.homes();
        for name in self.homed.keys() {
            homes.remove(name);
        }
    }
}

/// What was taken on `slices` for a decision that rolled back for certain, given back
/// where it was taken.
fn untake(slices: &Slices, takes: &[(Scope, Option<i64>, Amounts)]) {
    for (scope, on, need) in takes {
        slices.untake(scope, *on, *need);
    }
}

/// An amount as the database's signed counts.
fn signed(a: &Amounts) -> [i64; 4] {
    a.each().map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}
