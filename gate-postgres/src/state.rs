//! The gate's state seam ([`StateTxn`], [`StateReads`]) over a [`PostgresTxn`]: runs,
//! tools, credentials and principals read and locked in one fixed order, written back
//! with their versions.

use tally_gate::backend::{Committed, Keys, Scopes, Snapshot, StateReads, StateTxn, Write};
use tally_gate::GateError;
use tally_policy::{CredentialState, PrincipalState, RunState, ToolState};

use crate::schema::{decode, encode, NO_UID};
use crate::txn::{tool_from, Extra, PostgresTxn};

/// A tool's name and its breaker, or why its row could not be decoded.
pub(crate) type BreakerRow = (String, Result<tally_policy::Breaker, GateError>);

impl StateReads for PostgresTxn<'_> {
    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        Ok(!self
            .rows("to look a run up", |s| &s.run_exists, &[&run])?
            .is_empty())
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

    fn open_runs_listed(&mut self, uid: Option<u32>) -> Result<Vec<RunState>, GateError> {
        let uid = uid.map(i64::from);
        let rows = self.rows("to list a uid's runs", |s| &s.owner_runs, &[&uid])?;
        let mut runs = Vec::with_capacity(rows.len());
        for row in &rows {
            runs.push(decode::<RunState>("a run", row.get::<_, &[u8]>(1))?);
        }
        Ok(runs)
    }

    fn runs(&mut self) -> Result<Vec<RunState>, GateError> {
        let rows = self.rows("to list the open runs", |s| &s.runs_open, &[])?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            listed.push(decode::<RunState>("a run", row.get::<_, &[u8]>(0))?);
        }
        Ok(listed)
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
        Ok(rows.iter().map(|r| r.get(0)).collect())
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
}

impl StateTxn for PostgresTxn<'_> {
    fn claim(&mut self, run: &str) -> Result<bool, GateError> {
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

    fn load(&mut self, keys: &Keys<'_>) -> Result<Snapshot, GateError> {
        let mut s = Snapshot::default();
        for &run in &keys.runs {
            if let Some(state) = self.load_run(run)? {
                s.runs.insert(run.to_owned(), state);
            }
        }
        for &tool in &keys.tools {
            s.tools.insert(tool.to_owned(), self.load_tool(tool)?);
        }
        for &c in &keys.credentials {
            s.credentials.insert(c.to_owned(), self.load_credential(c)?);
        }
        for &p in &keys.principals {
            s.principals.insert(p.to_owned(), self.load_principal(p)?);
        }
        Ok(s)
    }

    fn commit(mut self, write: Write<'_>, done: Committed) -> Result<(), GateError> {
        // What the decision left wins over the rows as read; what is written back is
        // every row this transaction read (see `persist`).
        self.runs.extend(write.snapshot.runs);
        self.tools.extend(write.snapshot.tools);
        self.credentials.extend(write.snapshot.credentials);
        self.principals.extend(write.snapshot.principals);
        let version = self.persist(write.durable, &Extra::default())?;
        let batch = (write.records)(version)?;
        // Queued under the local lock: this ledger's order is the order state changed.
        let ledger = &self.backend.ledger;
        if write.deferred {
            ledger.submit_deferred(batch.plaintexts, batch.ledger_state, done);
        } else {
            ledger.submit_with_state(batch.plaintexts, batch.ledger_state, done);
        }
        drop(self);
        Ok(())
    }
}

/// Each scope read (and locked) once per transaction, a missing tool, credential or
/// principal row inserted first so there is always a row to lock.
impl PostgresTxn<'_> {
    /// A run's state (locked), if the run exists.
    pub(crate) fn load_run(&mut self, run: &str) -> Result<Option<RunState>, GateError> {
        if let Some(r) = self.runs.get(run) {
            return Ok(Some(r.clone()));
        }
        let rows = self.rows("to read a run", |s| &s.run_lock, &[&run])?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: RunState = decode(&format!("run `{run}`"), row.get::<_, &[u8]>(0))?;
        self.before.insert(run.to_owned(), state.clone());
        self.runs.insert(run.to_owned(), state.clone());
        Ok(Some(state))
    }

    /// A tool's state (locked).
    /// The breakers of the tools named (not locked), each row decoded apart: a row the
    /// decoder refuses is that tool's error, never the others'.
    pub(crate) fn breakers_of(&mut self, names: &[String]) -> Result<Vec<BreakerRow>, GateError> {
        let rows = self.rows("to read the tools' breakers", |s| &s.breakers_of, &[&names])?;
        Ok(rows
            .iter()
            .map(|row| {
                let tool = decode::<ToolState>("a tool", row.get::<_, &[u8]>(1));
                (row.get::<_, String>(0), tool.map(|t| t.breaker))
            })
            .collect())
    }

    pub(crate) fn load_tool(&mut self, tool: &str) -> Result<ToolState, GateError> {
        if let Some(t) = self.tools.get(tool) {
            return Ok(t.clone());
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
        self.tools.insert(tool.to_owned(), state.clone());
        Ok(state)
    }

    /// A credential's state (locked).
    fn load_credential(&mut self, credential: &str) -> Result<CredentialState, GateError> {
        if let Some(c) = self.credentials.get(credential) {
            return Ok(c.clone());
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
        self.credentials
            .insert(credential.to_owned(), state.clone());
        Ok(state)
    }

    /// A principal's state (locked; `principal`: a uid in decimal).
    fn load_principal(&mut self, principal: &str) -> Result<PrincipalState, GateError> {
        if let Some(p) = self.principals.get(principal) {
            return Ok(*p);
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
        Ok(state)
    }

    /// Write back the state of `scopes` and every tool, credential and principal read,
    /// commit, and give the state version the decision is recorded at (taken once every
    /// row it touches is held).
    pub(crate) fn persist(
        &mut self,
        scopes: &[Scopes<'_>],
        extra: &Extra,
    ) -> Result<u64, GateError> {
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
        let mut steps = self.lease_steps(&runs);
        steps.extend(extra.steps.iter().cloned());
        let rank = |k: &str| u8::from(k != "run");
        steps.sort_by(|a, b| (rank(a.kind), &a.key).cmp(&(rank(b.kind), &b.key)));
        self.seal(last, &steps, &extra.homes)
    }
}
