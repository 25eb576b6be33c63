//! What one operation works on: the backend's transaction and the gate's own
//! [`Snapshot`] of the scopes loaded through it. The gate loads a scope the first time
//! a step names it, reads and changes it in the snapshot, and lays the snapshot over the
//! backend's listings (what this transaction changed wins over what was committed).

use std::collections::BTreeSet;

use tally_policy::{Policy, RunState, View, ViewMut};

use crate::backend::{Idle, Keys, Scopes, Snapshot, StateTxn};
use crate::GateError;

/// One operation's transaction and the snapshot it holds.
pub(crate) struct Work<T> {
    txn: T,
    snap: Snapshot,
}

impl<T: StateTxn> Work<T> {
    /// Nothing loaded yet.
    pub fn new(txn: T) -> Work<T> {
        Work {
            txn,
            snap: Snapshot::default(),
        }
    }

    /// The transaction and the snapshot, to commit.
    pub fn into_parts(self) -> (T, Snapshot) {
        (self.txn, self.snap)
    }

    /// Whether no run of this name was ever started (a run name is never reused); the
    /// name is claimed if so.
    pub fn is_new(&mut self, run: &str) -> Result<bool, GateError> {
        if self.snap.runs.contains_key(run) {
            return Ok(false);
        }
        self.txn.claim(run)
    }

    /// Whether the gate started a run of this name.
    pub fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        if self.snap.runs.contains_key(run) {
            return Ok(true);
        }
        self.txn.governs(run)
    }

    /// A run the gate governs (`RunNotFound` if none), loaded (and, where the backend
    /// locks, locked) the first time it is named.
    pub fn run(&mut self, run: &str) -> Result<&RunState, GateError> {
        if !self.snap.runs.contains_key(run) {
            let loaded = self.txn.load(&Keys::run(run))?;
            self.snap.absorb(loaded);
        }
        self.snap
            .runs
            .get(run)
            .ok_or_else(|| GateError::RunNotFound(run.to_owned()))
    }

    /// A run already loaded, to change.
    pub fn run_mut(&mut self, run: &str) -> Option<&mut RunState> {
        self.snap.runs.get_mut(run)
    }

    /// A new run.
    pub fn insert_run(&mut self, run: RunState) {
        self.snap.runs.insert(run.run.clone(), run);
    }

    /// Load the tool, credential and principal named (those not loaded yet), in the
    /// fixed order, with `now_ms` and `policy` saying which tools and credentials are
    /// idle.
    pub fn ensure(
        &mut self,
        tool: Option<&str>,
        credential: Option<&str>,
        principal: Option<&str>,
        now_ms: u64,
        policy: &Policy,
    ) -> Result<(), GateError> {
        let s = &self.snap;
        let keys = Keys {
            runs: Vec::new(),
            tools: tool
                .filter(|t| !s.tools.contains_key(*t))
                .into_iter()
                .collect(),
            credentials: credential
                .filter(|c| !s.credentials.contains_key(*c))
                .into_iter()
                .collect(),
            principals: principal
                .filter(|p| !s.principals.contains_key(*p))
                .into_iter()
                .collect(),
            idle: Some(Idle { policy, now_ms }),
        };
        if keys.tools.is_empty() && keys.credentials.is_empty() && keys.principals.is_empty() {
            return Ok(());
        }
        let loaded = self.txn.load(&keys)?;
        self.snap.absorb(loaded);
        Ok(())
    }

    /// A tool's state, loaded (or created) if not held yet.
    pub fn ensure_tool(
        &mut self,
        tool: &str,
        now_ms: u64,
        policy: &Policy,
    ) -> Result<(), GateError> {
        self.ensure(Some(tool), None, None, now_ms, policy)
    }

    /// A principal's state (`principal`: a uid in decimal), loaded (or created) if not
    /// held yet.
    pub fn ensure_principal(&mut self, principal: &str) -> Result<(), GateError> {
        if self.snap.principals.contains_key(principal) {
            return Ok(());
        }
        let keys = Keys {
            principals: vec![principal],
            ..Keys::default()
        };
        let loaded = self.txn.load(&keys)?;
        self.snap.absorb(loaded);
        Ok(())
    }

    /// Open runs started by `uid` (see [`crate::backend::StateReads::open_runs_of`]).
    pub fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        self.txn.open_runs_of(uid)
    }

    /// The open runs started by `uid` for which `expired` holds, as this transaction
    /// left them, by name, in name order.
    pub fn expired_runs_of(
        &mut self,
        uid: Option<u32>,
        expired: &dyn Fn(&RunState) -> bool,
    ) -> Result<Vec<String>, GateError> {
        let listed = self.txn.open_runs_listed(uid)?;
        Ok(listed
            .iter()
            .map(|r| self.snap.runs.get(&r.run).unwrap_or(r))
            .filter(|r| r.stop.is_none() && expired(r))
            .map(|r| r.run.clone())
            .collect())
    }

    /// The runs held (see [`crate::backend::StateReads::runs`]).
    pub fn runs(&mut self) -> Result<Vec<RunState>, GateError> {
        self.txn.runs()
    }

    /// Every run named `prefix...`, open or stopped (see
    /// [`crate::backend::StateReads::runs_named`]).
    pub fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        self.txn.runs_named(prefix)
    }

    /// The open runs whose parent is `run`, as this transaction left them, by name.
    pub fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        let mut children: BTreeSet<String> = self.txn.open_children(run)?.into_iter().collect();
        for r in self.snap.runs.values() {
            if r.parent.as_deref() == Some(run) {
                if r.stop.is_none() {
                    children.insert(r.run.clone());
                } else {
                    children.remove(&r.run);
                }
            }
        }
        Ok(children.into_iter().collect())
    }

    /// Every tool's breaker, as stored, by name.
    pub fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        self.txn.breakers()
    }

    /// The scopes, to decide from.
    pub fn view(&self, s: &Scopes<'_>) -> View<'_> {
        self.snap.view(s)
    }

    /// The scopes, to apply a decision to.
    pub fn view_mut(&mut self, s: &Scopes<'_>) -> ViewMut<'_> {
        self.snap.view_mut(s)
    }
}
