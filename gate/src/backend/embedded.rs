//! The embedded backend: the gate's tables ([`crate::tables`]) in memory, durable in the
//! ledger's own store, written in the batch of the decisions they follow from.

use tally_ledger::Ledger;
use tally_policy::{Policy, RunState, View, ViewMut};

use super::{Committed, Scopes, StateBackend, StateTxn};
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

impl StateTxn for EmbeddedTxn<'_> {
    fn is_new(&mut self, run: &str) -> Result<bool, GateError> {
        match self.t.check_new_run(self.ledger, run) {
            Ok(()) => Ok(true),
            Err(GateError::RunExists(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        self.t.governs(self.ledger, run)
    }

    fn run(&mut self, run: &str) -> Result<&RunState, GateError> {
        self.t.loaded(self.ledger, run)
    }

    fn run_mut(&mut self, run: &str) -> Option<&mut RunState> {
        self.t.runs.get_mut(run)
    }

    fn insert_run(&mut self, run: RunState) {
        self.t.insert_run(run);
    }

    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        Ok(self.t.open_runs_of(uid))
    }

    fn expired_runs_of(
        &mut self,
        uid: Option<u32>,
        expired: &dyn Fn(&RunState) -> bool,
    ) -> Result<Vec<String>, GateError> {
        Ok(self
            .t
            .runs
            .values()
            .filter(|r| r.stop.is_none() && r.owner_uid == uid && expired(r))
            .map(|r| r.run.clone())
            .collect())
    }

    fn runs(&mut self) -> Result<Vec<&RunState>, GateError> {
        Ok(self.t.runs.values().collect())
    }

    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        self.t.runs_named(self.ledger, prefix)
    }

    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        let mut children: Vec<String> = self
            .t
            .runs
            .values()
            .filter(|r| r.stop.is_none() && r.parent.as_deref() == Some(run))
            .map(|r| r.run.clone())
            .collect();
        children.sort();
        Ok(children)
    }

    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        Ok(self.t.breakers())
    }

    fn ensure_tool(&mut self, tool: &str, now_ms: u64, policy: &Policy) -> Result<(), GateError> {
        self.t.ensure_tool(tool, now_ms, policy)
    }

    fn ensure_credential(
        &mut self,
        credential: &str,
        now_ms: u64,
        policy: &Policy,
    ) -> Result<(), GateError> {
        self.t.ensure_credential(credential, now_ms, policy)
    }

    fn ensure_principal(&mut self, principal: &str) -> Result<(), GateError> {
        self.t.ensure_principal(principal)
    }

    fn view(&self, s: &Scopes<'_>) -> View<'_> {
        self.t.view(s)
    }

    fn view_mut(&mut self, s: &Scopes<'_>) -> ViewMut<'_> {
        self.t.view_mut(s)
    }

    fn mark_stopped(&mut self, run: &str) {
        self.t.mark_stopped(run);
    }

    fn pause_changed(&mut self, run: &str, paused: bool) -> Result<(), GateError> {
        if self
            .ledger
            .state_get(&tables::pause_entry(run, paused).0)?
            .is_some()
        {
            self.ledger
                .put_state_durable(&[tables::pause_entry(run, paused)])?;
        }
        Ok(())
    }

    fn persist(&mut self, _scopes: &[Scopes<'_>]) -> Result<u64, GateError> {
        // Under the lock, and the decision is queued before it is released: versions
        // follow the ledger's order.
        Ok(self
            .next_version
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    fn commit(
        self,
        plaintexts: Vec<Vec<u8>>,
        scopes: &[Scopes<'_>],
        mut ledger_state: Vec<(Vec<u8>, Vec<u8>)>,
        deferred: bool,
        done: Committed,
    ) {
        for s in scopes {
            ledger_state.extend(self.t.entries(s));
        }
        // Queued under the lock: the ledger's order is the state's order.
        if deferred {
            self.ledger.submit_deferred(plaintexts, ledger_state, done);
        } else {
            self.ledger
                .submit_with_state(plaintexts, ledger_state, done);
        }
        drop(self.t);
    }
}
