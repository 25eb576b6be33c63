//! The runs a leased decision decides at home: found (kept, taken in, central or at
//! home elsewhere), their use counted in this holder's slices, written through, and
//! their copies settled or let go.

use std::collections::BTreeMap;
use std::time::Instant;

use tally_gate::GateError;
use tally_policy::RunState;

use super::super::holder::{SliceError, Slices};
use super::super::home::{self, Found, Home, TakenOn};
use super::super::types::{Amounts, Caps, Scope, ScopeKind};
use super::txn::{LeasedTxn, Moves};
use crate::schema::{decode, encode};
use crate::txn::{cap_params, HomeWrite, LeaseStep, SliceWrite};

impl LeasedTxn<'_> {
    /// A run named by the gate: at home here (kept: its row locked with the next
    /// statement; or taken in now), central, or at home elsewhere (read and locked).
    pub(super) fn find(&mut self, run: &str) -> Result<Option<RunState>, GateError> {
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
    pub(super) fn refuse_elsewhere(
        &mut self,
        runs: &mut BTreeMap<String, RunState>,
    ) -> Result<(), GateError> {
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
    pub(super) fn define_new(&self, runs: &BTreeMap<String, RunState>) -> Result<(), GateError> {
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
    pub(super) fn take(
        &self,
        after: &BTreeMap<String, RunState>,
        moves: &mut Moves,
    ) -> Result<(), GateError> {
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
        let mut slices = SliceWrite {
            holder: self.backend.me_now(),
            took: None,
            gave: None,
            at: self.backend.slices.leases().clock_now(),
        };
        if m.took != Amounts::default() {
            let on = if m.bill || raise.is_some() {
                delta = signed(&m.took);
                TakenOn::Central
            } else {
                self.take_on(&scope, m.took, moves)?
            };
            if let TakenOn::Slice(id) = on {
                slices.took = Some((id, signed(&m.took)));
            }
            for a in home::opened(&was.state, now) {
                moves.opened.push((name.to_owned(), a, on));
            }
        }
        let closed = home::closed(&was.state, now);
        if m.gave != Amounts::default() {
            match self.gave_on(name, &scope, &closed) {
                Some(TakenOn::Slice(id)) => {
                    slices.gave = Some((id, signed(&m.gave)));
                    moves.gives.push((scope, id, m.gave));
                }
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
        moves
            .extra
            .homes
            .push(self.home_write(name, was, now, slices));
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
                self.backend.has_room(&scope.key);
                moves.takes.push((scope.clone(), Some(id), need));
                Ok(TakenOn::Slice(id))
            }
            Ok((_, None)) => {
                self.backend.has_room(&scope.key);
                moves.takes.push((scope.clone(), None, need));
                Ok(TakenOn::Central)
            }
            Err(SliceError::Exhausted { kind, key }) => Err(self.backend.exhausted(kind, key)),
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
    pub(super) fn untake(&self, moves: &Moves) {
        untake(&self.backend.slices, &moves.takes);
    }

    fn home_write(&self, name: &str, was: &Home, now: &RunState, slices: SliceWrite) -> HomeWrite {
        let open = now.stop.is_none();
        HomeWrite {
            run: name.to_owned(),
            state: encode(now),
            open,
            home: open.then(|| self.backend.me_now()),
            expected: was.expected.clone(),
            slices,
        }
    }

    /// Committed: the copies kept (a stopped run's let go), what was given back
    /// credited to the slices that took it.
    pub(super) fn settled(&self, mut moves: Moves) {
        let gives = std::mem::take(&mut moves.gives);
        self.copies_settled(moves);
        for (scope, id, gave) in gives {
            self.backend.slices.give_on(&scope, id, gave);
        }
    }

    /// The copies kept (a stopped run's let go), and where the attempts it opened were
    /// counted (those it closed forgotten).
    pub(super) fn copies_settled(&self, moves: Moves) {
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
    pub(super) fn forget(&self) {
        let mut homes = self.backend.homes();
        for name in self.homed.keys() {
            homes.remove(name);
        }
    }
}

/// What was taken on `slices` for a decision that rolled back for certain, given back
/// where it was taken.
pub(super) fn untake(slices: &Slices, takes: &[(Scope, Option<i64>, Amounts)]) {
    for (scope, on, need) in takes {
        slices.untake(scope, *on, *need);
    }
}

/// An amount as the database's signed counts.
fn signed(a: &Amounts) -> [i64; 4] {
    a.each().map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}
