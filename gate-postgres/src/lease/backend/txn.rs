//! One decision's transaction on the leased backend: the central transaction, and the
//! runs it decides at home on their copies ([`super::runs`]), the tools it decides from
//! this holder's view ([`super::view`]), its commit (into the group commit where it
//! can be, [`super::queued`]).

use std::collections::{BTreeMap, BTreeSet};

use tally_gate::backend::{Committed, Keys, Snapshot, StateReads, StateTxn, Write};
use tally_gate::GateError;
use tally_policy::RunState;

use super::super::group::{GUARD_STALE, GUARD_TAKEN_BACK};
use super::super::home::{Home, TakenOn};
use super::super::types::{Amounts, Scope};
use super::Leased;
use crate::txn::{Extra, PostgresTxn};

/// One decision's transaction: the central one, and the runs it decides at home.
pub struct LeasedTxn<'a> {
    pub(super) inner: PostgresTxn<'a>,
    pub(super) backend: &'a Leased,
    /// Runs decided on their copy at home, as they were before the decision.
    pub(super) homed: BTreeMap<String, Home>,
    /// Runs at home on another holder (by name: that holder), read and locked: only a
    /// pause, resume or stop of them is decided (it takes the home back).
    pub(super) elsewhere: BTreeMap<String, String>,
    /// Tools decided from this holder's view of their breaker (their rows neither
    /// locked nor written).
    pub(super) viewed: BTreeSet<String>,
    /// Tools that could be viewed, read and locked centrally here: their views follow
    /// what this transaction writes.
    pub(super) watched: BTreeSet<String>,
    /// Committed (or queued in the group commit): the copies kept are what the rows
    /// hold, or will once the group commits (a failed group commit lets them go).
    pub(super) committed: bool,
    /// The group commit's generation when this began
    /// ([`Group::queue`](super::super::group::Group::queue)).
    pub(super) generation: crate::lease::group::Generation,
    /// Every decision queued in the group commit was committed before this one sent
    /// its first statement ([`LeasedTxn::central`]).
    pub(super) drained: bool,
}

impl Drop for LeasedTxn<'_> {
    /// Not committed (refused, unavailable, its home moved): the copies of its runs are
    /// let go and read again next time (one round trip), never decided on stale; one
    /// refused by a run's guard is counted.
    fn drop(&mut self) {
        if !self.committed {
            self.forget();
            if self.inner.taken_back {
                self.backend.group.guard_refused(GUARD_TAKEN_BACK);
            }
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
    pub(super) fn central(&mut self) -> Result<&mut PostgresTxn<'a>, GateError> {
        if !self.drained {
            self.backend.group.drain()?;
            if !self.homed.is_empty() && self.backend.group.stale(self.generation, &self.viewed) {
                self.backend.group.guard_refused(GUARD_STALE);
                return Err(GateError::Unavailable(
                    "a commit of decisions made before this one failed: retry".into(),
                ));
            }
            self.drained = true;
        }
        Ok(&mut self.inner)
    }
}

/// What the runs decided at home moved: what to write, the copies to keep, what to
/// give back on which slice once the decision is committed, what was taken on this
/// holder's slices (given back if it rolled back), and where the attempts it opened
/// were counted and which it closed.
#[derive(Default)]
pub(super) struct Moves {
    pub(super) extra: Extra,
    pub(super) keep: Vec<(String, Option<Home>)>,
    pub(super) gives: Vec<(Scope, i64, Amounts)>,
    pub(super) takes: Vec<(Scope, Option<i64>, Amounts)>,
    pub(super) opened: Vec<(String, u64, TakenOn)>,
    pub(super) closed: Vec<(String, u64)>,
}
