//! The leased state backend (docs/FLEET.md, "The leased mode"): the gate's state seam
//! over PostgreSQL, where a run with a lease scope is decided at home on this holder
//! ([`super::home`]) and every use it makes of its budget is counted in the holder's
//! slice of the run's scope ([`Slices::take_on`]); whatever no slice covers is refused
//! as unavailable (retry), nothing recorded. Tools, credentials and principals stay
//! central (their rows locked per decision, as without leases), and so do run starts,
//! pauses, stops and kills of runs at home elsewhere, which take the home back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tally_gate::backend::{
    Committed, Keys, Overview, Snapshot, StateBackend, StateReads, StateTxn, Write,
};
use tally_gate::GateError;
use tally_policy::RunState;

use super::holder::Slices;
use super::home::{self, Found, Home};
use super::types::{Amounts, Caps, Scope, ScopeKind};
use crate::schema::{decode, encode};
use crate::txn::{Extra, HomeWrite, LeaseStep, PostgresTxn};
use crate::Postgres;

/// The gate's state in PostgreSQL with leased runs decided at home on this holder.
pub struct Leased {
    central: Postgres,
    slices: Arc<Slices>,
    homes: Mutex<BTreeMap<String, Home>>,
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
    /// The central backend, with this holder's slices.
    pub fn new(central: Postgres, slices: Arc<Slices>) -> Leased {
        Leased {
            central,
            slices,
            homes: Mutex::new(BTreeMap::new()),
        }
    }

    /// The holder's slices (its counters, its ticks).
    pub fn slices(&self) -> &Arc<Slices> {
        &self.slices
    }

    /// The runs at home here now, by name.
    pub fn at_home(&self) -> Vec<String> {
        self.homes().keys().cloned().collect()
    }

    fn me(&self) -> &str {
        self.slices.leases().holder()
    }

    fn homes(&self) -> MutexGuard<'_, BTreeMap<String, Home>> {
        self.homes.lock().unwrap_or_else(|e| e.into_inner())
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
        Ok(LeasedTxn {
            inner: self.central.begin()?,
            backend: self,
            homed: BTreeMap::new(),
            elsewhere: BTreeMap::new(),
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

    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        Some(self.slices.metrics().counts())
    }

    /// Every slice given back, saying what was used (the runs' rows are already
    /// written through): what was left of them is the fleet's again at once.
    fn close(&self) {
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
    /// Committed: the copies kept are what the rows hold.
    committed: bool,
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
        self.inner.governs(run)
    }
    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        self.inner.open_runs_of(uid)
    }
    fn open_runs_listed(&mut self, uid: Option<u32>) -> Result<Vec<RunState>, GateError> {
        self.inner.open_runs_listed(uid)
    }
    fn runs(&mut self) -> Result<Vec<RunState>, GateError> {
        self.inner.runs()
    }
    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        self.inner.runs_named(prefix)
    }
    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        self.inner.open_children(run)
    }
    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        self.inner.breakers()
    }
}

impl StateTxn for LeasedTxn<'_> {
    fn claim(&mut self, run: &str) -> Result<bool, GateError> {
        if self.homed.contains_key(run) {
            return Ok(false);
        }
        self.inner.claim(run)
    }

    fn load(&mut self, keys: &Keys<'_>) -> Result<Snapshot, GateError> {
        let mut s = Snapshot::default();
        for &run in &keys.runs {
            if let Some(state) = self.find(run)? {
                s.runs.insert(run.to_owned(), state);
            }
        }
        let rest = Keys {
            runs: Vec::new(),
            ..keys.clone()
        };
        s.absorb(self.inner.load(&rest)?);
        Ok(s)
    }

    fn commit(mut self, write: Write<'_>, done: Committed) -> Result<(), GateError> {
        let Write {
            snapshot,
            durable,
            records,
            deferred,
        } = write;
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
        let moves = self.take(&after)?;
        let version = self.inner.persist(durable, &moves.extra)?;
        self.committed = true;
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

/// What the runs decided at home moved: what to write, the copies to keep, and what to
/// give back on which slice once the decision is committed.
struct Moves {
    extra: Extra,
    keep: Vec<(String, Option<Home>)>,
    gives: Vec<(Scope, i64, Amounts)>,
}

impl LeasedTxn<'_> {
    /// A run named by the gate: at home here (kept: its row locked with the next
    /// statement; or taken in now), central, or at home elsewhere (read and locked).
    fn find(&mut self, run: &str) -> Result<Option<RunState>, GateError> {
        if let Some(h) = self.homed.get(run) {
            return Ok(Some(h.state.clone()));
        }
        if self.inner.runs.contains_key(run) {
            return self.inner.load_run(run);
        }
        let kept = self.backend.kept(run);
        if let Some(h) = kept {
            let state = h.state.clone();
            self.homed.insert(run.to_owned(), h);
            let me = self.backend.me().to_owned();
            self.inner.guards.push((run.to_owned(), me));
            return Ok(Some(state));
        }
        let rows = self
            .inner
            .rows("to read a run", |s| &s.home_read, &[&run])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: RunState = decode(&format!("run `{run}`"), row.get::<_, &[u8]>(0))?;
        let me = self.backend.me();
        match home::found(state.clone(), row.get(1), row.get(2), row.get(3), me) {
            Found::Home(h) => {
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
    /// to give it back. One left as it was is not written.
    fn refuse_elsewhere(&self, runs: &mut BTreeMap<String, RunState>) -> Result<(), GateError> {
        for (name, holder) in &self.elsewhere {
            let (Some(before), Some(after)) = (self.inner.before.get(name), runs.get(name)) else {
                continue;
            };
            if before == after {
                runs.remove(name);
            } else if home::held(before) == home::held(after) {
                return Err(GateError::Unavailable(format!(
                    "run `{name}` is decided on `{holder}`, which holds its slice: retry once it is given back (an idle run's slice goes back within the lease's idle time)"
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
    fn take(&self, after: &BTreeMap<String, RunState>) -> Result<Moves, GateError> {
        let mut moves = Moves {
            extra: Extra::default(),
            keep: Vec::new(),
            gives: Vec::new(),
        };
        for (name, now) in after {
            let Some(was) = self.homed.get(name) else {
                continue;
            };
            let scope = Scope::new(ScopeKind::Run, name);
            let m = home::moved(&was.state, now);
            let mut taken_on = was.taken_on.clone();
            let mut step = LeaseStep {
                kind: "run",
                key: name.clone(),
                delta: [0; 4],
                bill: m.bill,
                revoked: (home::held(&was.state) != home::held(now)).then(|| home::held(now)),
            };
            if m.took != Amounts::default() {
                if m.bill {
                    step.delta = m.took.each().map(|n| i64::try_from(n).unwrap_or(i64::MAX));
                } else {
                    let on = self.take_on(&scope, m.took)?;
                    for a in home::opened(&was.state, now) {
                        taken_on.extend(on.map(|id| (a, id)));
                    }
                }
            }
            if step.delta != [0; 4] || step.revoked.is_some() {
                moves.extra.steps.push(step);
            }
            if let Some(id) = gave_on(&was.state, now, &mut taken_on) {
                if m.gave != Amounts::default() {
                    moves.gives.push((scope, id, m.gave));
                }
            }
            moves.extra.homes.push(self.home_write(name, was, now));
            let open = now.stop.is_none();
            let kept = open.then(|| Home {
                state: now.clone(),
                expected: Some(self.backend.me().to_owned()),
                taken_on,
            });
            moves.keep.push((name.clone(), kept));
        }
        Ok(moves)
    }

    fn take_on(&self, scope: &Scope, need: Amounts) -> Result<Option<i64>, GateError> {
        let scopes = [scope.clone()];
        match self.backend.slices.take_on(&scopes, need, Instant::now) {
            Ok((_, on)) => Ok(on),
            Err(e) => Err(GateError::Unavailable(format!(
                "{e}: no slice covers this use, nothing recorded (retry)"
            ))),
        }
    }

    fn home_write(&self, name: &str, was: &Home, now: &RunState) -> HomeWrite {
        let open = now.stop.is_none();
        HomeWrite {
            run: name.to_owned(),
            state: encode(now),
            open,
            home: open.then(|| self.backend.me().to_owned()),
            expected: was.expected.clone(),
        }
    }

    /// Committed: the copies kept (a stopped run's let go), what was given back
    /// credited to the slices that took it.
    fn settled(&self, moves: Moves) {
        let mut homes = self.backend.homes();
        for (name, kept) in moves.keep {
            match kept {
                Some(h) => homes.insert(name, h),
                None => homes.remove(&name),
            };
        }
        drop(homes);
        for (scope, id, gave) in moves.gives {
            self.backend.slices.give_on(&scope, id, gave);
        }
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

/// The slice what the decision gave back is credited to: the one every attempt it
/// closed was taken on (their entries dropped), or none (then nothing is given back:
/// the conservative side).
fn gave_on(before: &RunState, after: &RunState, taken_on: &mut BTreeMap<u64, i64>) -> Option<i64> {
    let closed = home::closed(before, after);
    let ids: Vec<Option<i64>> = closed.iter().map(|a| taken_on.remove(a)).collect();
    match ids.first() {
        Some(Some(id)) if ids.iter().all(|i| *i == Some(*id)) => Some(*id),
        _ => None,
    }
}
