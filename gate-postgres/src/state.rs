//! The gate's state seam ([`StateTxn`]) over a [`PostgresTxn`]: runs, tools and
//! credentials read and locked in one fixed order, written back with their versions.

use std::collections::BTreeSet;

use tally_gate::backend::{Committed, Scopes, StateTxn};
use tally_gate::GateError;
use tally_policy::{CredentialState, Policy, PrincipalState, RunState, ToolState, View, ViewMut};

use crate::schema::{decode, encode, NO_UID};
use crate::txn::{tool_from, PostgresTxn};

impl StateTxn for PostgresTxn<'_> {
    fn is_new(&mut self, run: &str) -> Result<bool, GateError> {
        let raw = self
            .backend
            .ledger
            .state_get(&tally_gate::raw_run_entry(run).0)?;
        if raw.is_some() || self.runs.contains_key(run) {
            return Ok(false);
        }
        // Claiming the name inserts its row: a second daemon starting the same name waits
        // for this transaction, then finds the name taken.
        let claimed = self.rows("to claim a run's name", |s| &s.run_claim, &[&run])?;
        Ok(!claimed.is_empty())
    }

    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        if self.runs.contains_key(run) {
            return Ok(true);
        }
        Ok(!self
            .rows("to look a run up", |s| &s.run_exists, &[&run])?
            .is_empty())
    }

    fn run(&mut self, run: &str) -> Result<&RunState, GateError> {
        if !self.runs.contains_key(run) {
            let rows = self.rows("to read a run", |s| &s.run_lock, &[&run])?;
            let row = rows
                .first()
                .ok_or_else(|| GateError::RunNotFound(run.to_owned()))?;
            let state: RunState = decode(&format!("run `{run}`"), row.get::<_, &[u8]>(0))?;
            self.before.insert(run.to_owned(), state.clone());
            self.runs.insert(run.to_owned(), state);
        }
        self.runs
            .get(run)
            .ok_or_else(|| GateError::RunNotFound(run.to_owned()))
    }

    fn run_mut(&mut self, run: &str) -> Option<&mut RunState> {
        self.runs.get_mut(run)
    }

    fn insert_run(&mut self, run: RunState) {
        self.runs.insert(run.run.clone(), run);
    }

    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        // The owner's row is held to the end of the transaction: two daemons never both
        // start its last allowed run.
        let owner = uid.map_or(NO_UID, i64::from);
        self.rows("to lock a uid's runs", |s| &s.owner_lock, &[&owner])?;
        let uid = uid.map(i64::from);
        let rows = self.rows("to count a uid's runs", |s| &s.owner_count, &[&uid])?;
        let n: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn expired_runs_of(
        &mut self,
        uid: Option<u32>,
        expired: &dyn Fn(&RunState) -> bool,
    ) -> Result<Vec<String>, GateError> {
        let uid = uid.map(i64::from);
        let rows = self.rows("to list a uid's runs", |s| &s.owner_runs, &[&uid])?;
        let mut names = Vec::new();
        for row in &rows {
            let name: String = row.get(0);
            // What this transaction changed wins over what the database held.
            let state = match self.runs.get(&name) {
                Some(r) => r.clone(),
                None => decode::<RunState>("a run", row.get::<_, &[u8]>(1))?,
            };
            if state.stop.is_none() && expired(&state) {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn runs(&mut self) -> Result<Vec<&RunState>, GateError> {
        let rows = self.rows("to list the open runs", |s| &s.runs_open, &[])?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            listed.push(decode::<RunState>("a run", row.get::<_, &[u8]>(0))?);
        }
        self.listed = listed;
        Ok(self.listed.iter().collect())
    }

    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError> {
        let rows = self.rows("to list runs by name", |s| &s.runs_named, &[&prefix])?;
        let mut out = std::collections::BTreeMap::new();
        for row in &rows {
            let state = decode::<RunState>("a run", row.get::<_, &[u8]>(0))?;
            out.insert(state.run.clone(), state);
        }
        // What this transaction changed wins over what the database held.
        for r in self.runs.values().filter(|r| r.run.starts_with(prefix)) {
            out.insert(r.run.clone(), r.clone());
        }
        Ok(out.into_values().collect())
    }

    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        let rows = self.rows("to list a run's children", |s| &s.children, &[&run])?;
        let mut children: BTreeSet<String> = rows.iter().map(|r| r.get(0)).collect();
        // What this transaction changed wins over what the database held at its start.
        for r in self.runs.values() {
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

    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        let rows = self.rows("to list the tools", |s| &s.breakers, &[])?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let tool: ToolState = decode("a tool", row.get::<_, &[u8]>(1))?;
            out.push((row.get::<_, String>(0), tool.breaker));
        }
        Ok(out)
    }

    fn ensure_tool(&mut self, tool: &str, _now_ms: u64, _policy: &Policy) -> Result<(), GateError> {
        if self.tools.contains_key(tool) {
            return Ok(());
        }
        let mut rows = self.rows("to read a tool", |s| &s.tool_lock, &[&tool])?;
        if rows.is_empty() {
            let fresh = ToolState::default();
            let (state, flight) = (encode(&fresh), encode(&fresh.in_flight));
            rows = self.rows(
                "to create a tool",
                |s| &s.tool_insert,
                &[&tool, &state, &flight],
            )?;
        }
        let row = rows.first().ok_or_else(|| {
            self.backend
                .unavailable("to read a tool", "no row came back")
        })?;
        let state = tool_from(row)?;
        self.tools.insert(tool.to_owned(), state);
        Ok(())
    }

    fn ensure_credential(
        &mut self,
        credential: &str,
        _now_ms: u64,
        _policy: &Policy,
    ) -> Result<(), GateError> {
        if self.credentials.contains_key(credential) {
            return Ok(());
        }
        let mut rows = self.rows(
            "to read a credential",
            |s| &s.credential_lock,
            &[&credential],
        )?;
        if rows.is_empty() {
            let state = encode(&CredentialState::default());
            rows = self.rows(
                "to create a credential",
                |s| &s.credential_insert,
                &[&credential, &state],
            )?;
        }
        let row = rows.first().ok_or_else(|| {
            self.backend
                .unavailable("to read a credential", "no row came back")
        })?;
        let state: CredentialState = decode("a credential", row.get::<_, &[u8]>(0))?;
        self.credentials.insert(credential.to_owned(), state);
        Ok(())
    }

    fn ensure_principal(&mut self, principal: &str) -> Result<(), GateError> {
        if self.principals.contains_key(principal) {
            return Ok(());
        }
        let uid: i64 = principal.parse().map_err(|_| {
            GateError::Unavailable(format!("a principal is a uid, not `{principal}`"))
        })?;
        // Locked to the end of the transaction: the fleet's daemons take turns at one
        // uid's budget, so two can never both spend its last attempt.
        let mut rows = self.rows("to read a principal", |s| &s.principal_lock, &[&uid])?;
        if rows.is_empty() {
            let state = encode(&PrincipalState::default());
            rows = self.rows(
                "to create a principal",
                |s| &s.principal_insert,
                &[&uid, &state],
            )?;
        }
        let row = rows.first().ok_or_else(|| {
            self.backend
                .unavailable("to read a principal", "no row came back")
        })?;
        let state: PrincipalState = decode("a principal", row.get::<_, &[u8]>(0))?;
        self.principals_before.insert(principal.to_owned(), state);
        self.principals.insert(principal.to_owned(), state);
        Ok(())
    }

    fn view(&self, s: &Scopes<'_>) -> View<'_> {
        View {
            run: self.runs.get(s.run).unwrap_or(&self.empty),
            tool: s.tool.and_then(|t| self.tools.get(t)),
            credential: s.credential.and_then(|c| self.credentials.get(c)),
            principal: s.principal.and_then(|p| self.principals.get(p)),
            family: Default::default(),
        }
    }

    fn view_mut(&mut self, s: &Scopes<'_>) -> ViewMut<'_> {
        let run = self
            .runs
            .entry(s.run.to_owned())
            .or_insert_with(|| RunState::new(s.run));
        ViewMut {
            run,
            tool: s.tool.and_then(|t| self.tools.get_mut(t)),
            credential: s.credential.and_then(|c| self.credentials.get_mut(c)),
            principal: s.principal.and_then(|p| self.principals.get_mut(p)),
            parent: None,
            continued: None,
        }
    }

    fn mark_stopped(&mut self, _run: &str) {
        // Nothing is kept in memory past the transaction.
    }

    fn pause_changed(&mut self, _run: &str, _paused: bool) -> Result<(), GateError> {
        // The run's row, pause included, is written with the record (`persist`).
        Ok(())
    }

    fn persist(&mut self, scopes: &[Scopes<'_>]) -> Result<u64, GateError> {
        if !self.open {
            return Err(GateError::Unavailable(
                "the gate's transaction already ended".into(),
            ));
        }
        let mut runs: Vec<String> = scopes.iter().map(|s| s.run.to_owned()).collect();
        runs.dedup();
        // Every tool and credential this transaction read is locked and may have
        // changed (a stop frees its calls' slots): write them all. Rows go three to a
        // statement (a run, a tool, a credential): a check writes, takes its version and
        // commits in one round trip.
        let (tools, creds) = if scopes.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            (
                self.tools.keys().cloned().collect::<Vec<_>>(),
                self.credentials.keys().cloned().collect::<Vec<_>>(),
            )
        };
        if !scopes.is_empty() {
            // Every principal this transaction read is locked: write them back (one
            // statement each; a uid's budget is one row).
            let principals: Vec<(i64, Vec<u8>)> = self
                .principals
                .iter()
                .filter_map(|(n, p)| n.parse::<i64>().ok().map(|u| (u, encode(p))))
                .collect();
            for (uid, state) in principals {
                self.rows(
                    "to write a principal",
                    |s| &s.principal_write,
                    &[&uid, &state],
                )?;
            }
        }
        let n = runs.len().max(tools.len()).max(creds.len());
        for i in 0..n.saturating_sub(1) {
            self.write(
                runs.get(i).map(String::as_str),
                tools.get(i).map(String::as_str),
                creds.get(i).map(String::as_str),
                false,
            )?;
        }
        let last = n.checked_sub(1).and_then(|i| {
            self.row(
                runs.get(i).map(String::as_str),
                tools.get(i).map(String::as_str),
                creds.get(i).map(String::as_str),
            )
        });
        let steps = self.lease_steps(&runs);
        self.seal(last, &steps)
    }

    fn commit(
        self,
        plaintexts: Vec<Vec<u8>>,
        scopes: &[Scopes<'_>],
        ledger_state: Vec<(Vec<u8>, Vec<u8>)>,
        deferred: bool,
        done: Committed,
    ) {
        let _ = scopes;
        if self.open {
            // The gate persists first (and so numbers the decision); a caller that did
            // not is refused, not recorded. Dropping the transaction rolls it back.
            return done(Err(tally_ledger::Error::Store(
                "a decision was committed before its state was persisted".into(),
            )));
        }
        // Queued under the local lock: this ledger's order is the order state changed.
        let ledger = &self.backend.ledger;
        if deferred {
            ledger.submit_deferred(plaintexts, ledger_state, done);
        } else {
            ledger.submit_with_state(plaintexts, ledger_state, done);
        }
        drop(self);
    }
}
