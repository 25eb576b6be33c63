//! The embedded state backend: the gate's tables in memory, durable in the ledger's own
//! store (written with the decisions, see [`tally_ledger::Ledger::submit_with_state`]).
//!
//! Memory: open runs are bounded by the policy's per-uid quota; stopped runs are kept a
//! while for outcomes still to come, then dropped from memory (their state stays on
//! disk and is read back on demand, so dropping never resets anything); tools and
//! credentials are bounded, and only entries equal to a fresh one are ever dropped.

use std::collections::{BTreeMap, VecDeque};

use tally_ledger::Ledger;
use tally_policy::{CredentialState, PrincipalState, RunState, ToolState};

use crate::scopes::Scopes;
use crate::snapshot::{Idle, Snapshot};

use crate::GateError;

/// The key under which the digest of the last recorded policy is kept.
pub(crate) const POLICY_KEY: &[u8] = b"policy";
/// Most tools tracked at once.
pub(crate) const MAX_TOOLS: usize = 10_000;
/// Most credentials tracked at once.
pub(crate) const MAX_CREDENTIALS: usize = 10_000;
/// Stopped runs kept in memory.
pub(crate) const MAX_STOPPED: usize = 10_000;

pub(crate) fn run_key(run: &str) -> Vec<u8> {
    [b"r/", run.as_bytes()].concat()
}

/// The pause builds before `pause` records kept outside the log, in the index alone: where
/// a run has one, it still decides (and is kept in step with the records).
fn pause_key(run: &str) -> Vec<u8> {
    [b"p/", run.as_bytes()].concat()
}

pub(crate) fn run_entry(run: &RunState) -> (Vec<u8>, Vec<u8>) {
    (run_key(&run.run), encode(run))
}

pub(crate) fn raw_run_entry(run: &str) -> (Vec<u8>, Vec<u8>) {
    ([b"x/", run.as_bytes()].concat(), vec![1])
}

pub(crate) fn pause_entry(run: &str, paused: bool) -> (Vec<u8>, Vec<u8>) {
    (pause_key(run), vec![u8::from(paused)])
}

/// A state value as stored: compact (the state of every scope a decision touches is
/// written with it, so its size is paid on every call). The format is the policy
/// core's ([`tally_policy::state::encode_frame`]): state kept in cents by an earlier
/// tally is read exactly in nanodollars; a format it cannot read is refused with its
/// cause.
fn encode<T: tally_policy::state::Stored>(v: &T) -> Vec<u8> {
    tally_policy::state::encode_frame(v)
}

fn decode<T: tally_policy::state::Stored>(key: &[u8], bytes: &[u8]) -> Result<T, GateError> {
    tally_policy::state::decode_frame(bytes).map_err(|why| {
        GateError::Unavailable(format!(
            "the gate's stored state under `{}` is unreadable: {why}",
            String::from_utf8_lossy(key)
        ))
    })
}

#[derive(Default)]
pub(crate) struct Tables {
    pub runs: BTreeMap<String, RunState>,
    tools: BTreeMap<String, ToolState>,
    credentials: BTreeMap<String, CredentialState>,
    principals: BTreeMap<String, PrincipalState>,
    stopped: VecDeque<String>,
}

impl Tables {
    /// Read the durable state: every open run, every tool and credential.
    pub fn load(ledger: &Ledger) -> Result<Tables, GateError> {
        let mut t = Tables::default();
        for (k, v) in ledger.state(b"r/")? {
            let run: RunState = decode(&k, &v)?;
            if run.stop.is_none() {
                t.runs.insert(run.run.clone(), run);
            }
        }
        for (k, v) in ledger.state(b"p/")? {
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            if let Some(run) = t.runs.get_mut(&name) {
                run.paused = v.first() == Some(&1);
            }
        }
        for (k, v) in ledger.state(b"t/")? {
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            t.tools.insert(name, decode(&k, &v)?);
        }
        for (k, v) in ledger.state(b"c/")? {
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            t.credentials.insert(name, decode(&k, &v)?);
        }
        for (k, v) in ledger.state(b"u/")? {
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            t.principals.insert(name, decode(&k, &v)?);
        }
        Ok(t)
    }

    fn stored(ledger: &Ledger, run: &str) -> Result<Option<RunState>, GateError> {
        let key = run_key(run);
        match ledger.state_get(&key)? {
            Some(v) => {
                let mut state: RunState = decode(&key, &v)?;
                if let Some(p) = ledger.state_get(&pause_key(run))? {
                    state.paused = p.first() == Some(&1);
                }
                Ok(Some(state))
            }
            None => Ok(None),
        }
    }

    pub fn check_new_run(&self, ledger: &Ledger, run: &str) -> Result<(), GateError> {
        let raw = ledger.state_get(&raw_run_entry(run).0)?.is_some();
        if raw || self.runs.contains_key(run) || Tables::stored(ledger, run)?.is_some() {
            return Err(GateError::RunExists(run.to_owned()));
        }
        Ok(())
    }

    /// Whether a run of this name was started through the gate (held, or on disk).
    pub fn governs(&self, ledger: &Ledger, run: &str) -> Result<bool, GateError> {
        Ok(self.runs.contains_key(run) || Tables::stored(ledger, run)?.is_some())
    }

    /// Open runs started by `uid` (`None`: by loopback TCP peers, one identity).
    pub fn open_runs_of(&self, uid: Option<u32>) -> u64 {
        self.runs
            .values()
            .filter(|r| r.stop.is_none() && r.owner_uid == uid)
            .count() as u64
    }

    /// Any run the gate governs, read into memory if it was only on disk (a stopped
    /// run: it is let go again later).
    pub fn loaded(&mut self, ledger: &Ledger, run: &str) -> Result<&RunState, GateError> {
        if !self.runs.contains_key(run) {
            let state = Tables::stored(ledger, run)?
                .ok_or_else(|| GateError::RunNotFound(run.to_owned()))?;
            self.runs.insert(run.to_owned(), state);
            self.mark_stopped(run);
        }
        self.runs
            .get(run)
            .ok_or_else(|| GateError::RunNotFound(run.to_owned()))
    }

    /// Every run named `prefix...`: those in memory as they stand, the others (stopped
    /// runs let go) as the durable state holds them.
    pub fn runs_named(&self, ledger: &Ledger, prefix: &str) -> Result<Vec<RunState>, GateError> {
        let mut out: BTreeMap<String, RunState> = self
            .runs
            .range(prefix.to_owned()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, r)| (name.clone(), r.clone()))
            .collect();
        for (k, v) in ledger.state(&run_key(prefix))? {
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            if let std::collections::btree_map::Entry::Vacant(e) = out.entry(name) {
                e.insert(decode(&k, &v)?);
            }
        }
        Ok(out.into_values().collect())
    }

    /// The run stopped: keep it in memory a while, then let it go (it is on disk).
    fn mark_stopped(&mut self, run: &str) {
        self.stopped.push_back(run.to_owned());
        while self.stopped.len() > MAX_STOPPED {
            if let Some(old) = self.stopped.pop_front() {
                if self.runs.get(&old).is_some_and(|r| r.stop.is_some()) {
                    self.runs.remove(&old);
                }
            }
        }
    }

    pub fn breakers(&self) -> Vec<(String, tally_policy::Breaker)> {
        self.tools
            .iter()
            .map(|(name, t)| (name.clone(), t.breaker.clone()))
            .collect()
    }

    /// Read (or create) a tool's state. When [`MAX_TOOLS`] are held, the idle ones
    /// (as `idle` says; none without it) make room.
    pub fn ensure_tool(
        &mut self,
        tool: &str,
        idle: Option<&Idle<'_>>,
    ) -> Result<ToolState, GateError> {
        if let Some(t) = self.tools.get(tool) {
            return Ok(t.clone());
        }
        if self.tools.len() >= MAX_TOOLS {
            if let Some(idle) = idle {
                self.tools.retain(|_, t| !idle.tool(t));
            }
            if self.tools.len() >= MAX_TOOLS {
                return Err(GateError::TooManyNames {
                    what: "tools",
                    max: MAX_TOOLS,
                });
            }
        }
        self.tools.insert(tool.to_owned(), ToolState::default());
        Ok(ToolState::default())
    }

    /// Read (or create) a credential's state. When [`MAX_CREDENTIALS`] are held, the
    /// idle ones (as `idle` says; none without it) make room.
    pub fn ensure_credential(
        &mut self,
        credential: &str,
        idle: Option<&Idle<'_>>,
    ) -> Result<CredentialState, GateError> {
        if let Some(c) = self.credentials.get(credential) {
            return Ok(c.clone());
        }
        if self.credentials.len() >= MAX_CREDENTIALS {
            if let Some(idle) = idle {
                self.credentials.retain(|_, c| !idle.credential(c));
            }
        }
        if self.credentials.len() >= MAX_CREDENTIALS {
            return Err(GateError::TooManyNames {
                what: "credentials",
                max: MAX_CREDENTIALS,
            });
        }
        self.credentials
            .insert(credential.to_owned(), CredentialState::default());
        Ok(CredentialState::default())
    }

    /// Read (or create) a principal's state. One per uid the policy budgets, and a uid
    /// is a u32: bounded by the uids that start runs, never dropped (its period's counts
    /// are its budget).
    pub fn ensure_principal(&mut self, principal: &str) -> PrincipalState {
        *self.principals.entry(principal.to_owned()).or_default()
    }

    /// The runs of `snapshot` whose pause differs from the one held, with their new one.
    pub fn pause_changes(&self, snapshot: &Snapshot) -> Vec<(String, bool)> {
        snapshot
            .runs
            .iter()
            .filter(|(name, run)| self.runs.get(*name).is_some_and(|r| r.paused != run.paused))
            .map(|(name, run)| (name.clone(), run.paused))
            .collect()
    }

    /// Keep what a committed decision left: every scope of its snapshot. A run it
    /// stopped is let go from memory a while later ([`Tables::mark_stopped`]).
    pub fn put(&mut self, snapshot: Snapshot) {
        for (name, run) in snapshot.runs {
            let before = self.runs.get(&name);
            let stopped = run.stop.is_some() && before.is_none_or(|r| r.stop.is_none());
            self.runs.insert(name.clone(), run);
            if stopped {
                self.mark_stopped(&name);
            }
        }
        self.tools.extend(snapshot.tools);
        self.credentials.extend(snapshot.credentials);
        self.principals.extend(snapshot.principals);
    }

    /// The durable entries of the scopes a decision touched.
    pub fn entries(&self, s: &Scopes<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let (run, tool, credential) = (s.run, s.tool, s.credential);
        let mut out = Vec::with_capacity(4);
        if let Some((name, p)) = s
            .principal
            .and_then(|n| self.principals.get(n).map(|p| (n, p)))
        {
            out.push(([b"u/", name.as_bytes()].concat(), encode(p)));
        }
        if let Some(r) = self.runs.get(run) {
            out.push(run_entry(r));
        }
        if let Some((name, t)) = tool.and_then(|n| self.tools.get(n).map(|t| (n, t))) {
            out.push(([b"t/", name.as_bytes()].concat(), encode(t)));
        }
        if let Some((name, c)) = credential.and_then(|n| self.credentials.get(n).map(|c| (n, c))) {
            out.push(([b"c/", name.as_bytes()].concat(), encode(c)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_in_its_own_format_only() {
        let mut run = RunState::new("r");
        run.attempts_used = 3;
        run.overrun_nanos = 7;
        let (key, bytes) = run_entry(&run);
        let back: RunState = decode(&key, &bytes).expect("reads its own format");
        assert_eq!((back.attempts_used, back.overrun_nanos), (3, 7));

        // The same body under the format before it is refused with its cause, not read.
        let mut old = bytes.clone();
        old[0] = 1;
        let err = decode::<RunState>(&key, &old).unwrap_err().to_string();
        assert!(err.contains("older tally") && err.contains("r/r"), "{err}");
        old[0] = 9;
        let err = decode::<RunState>(&key, &old).unwrap_err().to_string();
        assert!(err.contains("unknown state format 9"), "{err}");
        assert!(decode::<RunState>(&key, &[]).is_err());
    }
}
