//! The embedded backend: the gate's tables ([`crate::tables`]) in memory, durable in the
//! ledger's own store, written in the batch of the decisions they follow from.

use tally_ledger::Ledger;
use tally_policy::RunState;

use super::{Committed, Keys, Snapshot, StateBackend, StateReads, StateTxn, Write};
use crate::tables::{self, Tables};
use crate::GateError;

/// The embedded backend: the gate's tables in memory, durable in the ledger's own store,
/// written in the batch of the decisions they follow from.
pub struct Embedded {
    ledger: std::sync::Arc<Ledger>,
    tables: std::sync::Mutex<Tables>,
    /// The next state version (changed only under the tables' lock).
    next_version: std::sync::atomic::AtomicU64,
}

impl Embedded {
    /// Load the durable state from the ledger's store.
    pub fn open(ledger: std::sync::Arc<Ledger>) -> Result<Embedded, GateError> {
        let tables = Tables::load(&ledger)?;
        // Every decision the gate queued took a version and left at least one entry, so
        // the ledger's size is past every version it already holds.
        let next_version = ledger.checkpoint().size;
        Ok(Embedded {
            ledger,
            tables: std::sync::Mutex::new(tables),
            next_version: std::sync::atomic::AtomicU64::new(next_version),
        })
    }
}

/// A transaction of the embedded backend: its one lock, held until commit.
pub struct EmbeddedTxn<'a> {
    ledger: &'a Ledger,
    t: std::sync::MutexGuard<'a, Tables>,
    next_version: &'a std::sync::atomic::AtomicU64,
}

impl StateBackend for Embedded {
    type Txn<'a> = EmbeddedTxn<'a>;

    fn begin(&self) -> Result<EmbeddedTxn<'_>, GateError> {
        let t = self
            .tables
            .lock()
            .map_err(|_| GateError::Unavailable("the gate's state lock was poisoned".into()))?;
        Ok(EmbeddedTxn {
            ledger: &self.ledger,
            t,
            next_version: &self.next_version,
        })
    }
}

impl StateReads for EmbeddedTxn<'_> {
    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        self.t.governs(self.ledger, run)
    }

    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        Ok(self.t.open_runs_of(uid))
    }

    fn open_runs_listed(&mut self, uid: Option<u32>) -> Result<Vec<RunState>, GateError> {
        Ok(self
            .t
            .runs
            .values()
            .filter(|r| r.stop.is_none() && r.owner_uid == uid)
            .cloned()
            .collect())
    }

    fn runs(&mut self) -> Result<Vec<RunState>, GateError> {
        Ok(self.t.runs.values().cloned().collect())
    }

    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        self.t.runs_named(self.ledger, prefix)
    }

    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        // In name order: the runs are kept by name.
        Ok(self
            .t
            .runs
            .values()
            .filter(|r| r.stop.is_none() && r.parent.as_deref() == Some(run))
            .map(|r| r.run.clone())
            .collect())
    }

    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        Ok(self.t.breakers())
    }
}

impl StateTxn for EmbeddedTxn<'_> {
    fn claim(&mut self, run: &str) -> Result<bool, GateError> {
        match self.t.check_new_run(self.ledger, run) {
            Ok(()) => Ok(true),
            Err(GateError::RunExists(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn load(&mut self, keys: &Keys<'_>) -> Result<Snapshot, GateError> {
        let mut s = Snapshot::default();
        for &run in &keys.runs {
            match self.t.loaded(self.ledger, run) {
                Ok(state) => {
                    s.runs.insert(run.to_owned(), state.clone());
                }
                Err(GateError::RunNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let idle = keys.idle.as_ref();
        for &tool in &keys.tools {
            s.tools
                .insert(tool.to_owned(), self.t.ensure_tool(tool, idle)?);
        }
        for &c in &keys.credentials {
            s.credentials
                .insert(c.to_owned(), self.t.ensure_credential(c, idle)?);
        }
        for &p in &keys.principals {
            s.principals
                .insert(p.to_owned(), self.t.ensure_principal(p));
        }
        Ok(s)
    }

    fn commit(mut self, write: Write<'_>, done: Committed) -> Result<(), GateError> {
        // A pause an older build kept outside the log (`p/` + run) is rewritten before
        // the records are made (making them marks the policy recorded, so a failure here
        // must come first: nothing made, nothing lost) and queued, so the two never
        // disagree after a restart.
        for (run, paused) in self.t.pause_changes(&write.snapshot) {
            let entry = tables::pause_entry(&run, paused);
            if self.ledger.state_get(&entry.0)?.is_some() {
                self.ledger.put_state_durable(&[entry])?;
            }
        }
        // Under the lock, and the decision is queued before it is released: versions
        // follow the ledger's order.
        let version = self
            .next_version
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let batch = (write.records)(version)?;
        self.t.put(write.snapshot);
        let mut ledger_state = batch.ledger_state;
        for s in write.durable {
            ledger_state.extend(self.t.entries(s));
        }
        // Queued under the lock: the ledger's order is the state's order.
        if write.deferred {
            self.ledger
                .submit_deferred(batch.plaintexts, ledger_state, done);
        } else {
            self.ledger
                .submit_with_state(batch.plaintexts, ledger_state, done);
        }
        drop(self.t);
        Ok(())
    }
}
