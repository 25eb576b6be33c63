//! A decision into the group commit ([`super::super::group`]), and what follows once
//! its group answered: committed, rolled back, or unsure.

use std::sync::{Arc, Mutex};

use tally_gate::backend::{Committed, Records, Refuse};
use tally_gate::GateError;

use super::super::breakers::Views;
use super::super::group::{Item, Outcome};
use super::super::holder::Slices;
use super::super::home::{TakenOn, TakenOns};
use super::super::types::{Amounts, Scope};
use super::runs::untake;
use super::txn::{LeasedTxn, Moves};
use super::view::ViewedTool;

impl LeasedTxn<'_> {
    /// Into the group commit ([`super::super::group`]): the copies kept now (later decisions
    /// on these runs are made on them), and once the group committed: what was given
    /// back credited, the records made at the version the group took for it and handed
    /// to the ledger. A group that did not commit refuses it (`refuse`), what it took
    /// given back if that rolled back for certain ([`Queued::answered`]).
    pub(super) fn grouped(
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
        let read = tools.clone();
        let changed = viewed
            .iter()
            .filter(|(_, _, observed)| !observed.is_empty())
            .map(|(tool, _, _)| tool.clone())
            .collect();
        let undo = Box::new(move || {
            for tool in tools {
                views.undone(&tool, ticket);
            }
        });
        let item = Item {
            homes,
            tools: read,
            changed,
            undo,
            then,
        };
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
