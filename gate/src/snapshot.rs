//! The gate's own value of the state a decision touches ([`Snapshot`]), the keys it
//! names to a backend's load ([`Keys`]), and when a tool or credential is idle
//! ([`Idle`]), for a backend that bounds what it keeps in memory.

use std::collections::BTreeMap;

use tally_policy::state::Breaker;
use tally_policy::{CredentialState, Policy, PrincipalState, RunState, ToolState, View, ViewMut};

use crate::scopes::Scopes;

/// The state of the scopes one decision touches, as the policy core's values, by name:
/// a plain value the gate holds, reads, changes and hands back to the backend's
/// commit. Nothing in it refers to where it was read from, so it can be kept (a holder
/// of a leased run keeps its run's snapshot at home) and written back later.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Runs.
    pub runs: BTreeMap<String, RunState>,
    /// Downstream tools.
    pub tools: BTreeMap<String, ToolState>,
    /// Credentials the policy gives state (a backstop or a bucket).
    pub credentials: BTreeMap<String, CredentialState>,
    /// Principals (a uid, in decimal) the policy gives a budget.
    pub principals: BTreeMap<String, PrincipalState>,
}

impl Snapshot {
    /// Take in what `other` holds (a later load): a scope already held is kept as it is
    /// here (it may have changed since it was read).
    pub fn absorb(&mut self, other: Snapshot) {
        for (k, v) in other.runs {
            self.runs.entry(k).or_insert(v);
        }
        for (k, v) in other.tools {
            self.tools.entry(k).or_insert(v);
        }
        for (k, v) in other.credentials {
            self.credentials.entry(k).or_insert(v);
        }
        for (k, v) in other.principals {
            self.principals.entry(k).or_insert(v);
        }
    }

    /// The scopes `s` names, to decide from (a run not held reads as a fresh one).
    pub fn view(&self, s: &Scopes<'_>) -> View<'_> {
        static EMPTY: std::sync::OnceLock<RunState> = std::sync::OnceLock::new();
        View {
            run: self
                .runs
                .get(s.run)
                .unwrap_or_else(|| EMPTY.get_or_init(RunState::default)),
            tool: s.tool.and_then(|t| self.tools.get(t)),
            credential: s.credential.and_then(|c| self.credentials.get(c)),
            principal: s.principal.and_then(|p| self.principals.get(p)),
            family: Default::default(),
        }
    }

    /// The scopes `s` names, to apply a decision to (a run not held is added fresh).
    pub fn view_mut(&mut self, s: &Scopes<'_>) -> ViewMut<'_> {
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
}

/// The scopes a load names, read (and, where the backend locks, locked) in this fixed
/// order: runs, then tools, then credentials, then principals, each in the order given.
/// A run that does not exist is left out of the snapshot; a tool, credential or
/// principal that does not exist is created fresh.
#[derive(Clone, Debug, Default)]
pub struct Keys<'a> {
    /// Runs.
    pub runs: Vec<&'a str>,
    /// Tools.
    pub tools: Vec<&'a str>,
    /// Credentials.
    pub credentials: Vec<&'a str>,
    /// Principals (a uid, in decimal).
    pub principals: Vec<&'a str>,
    /// When a tool or credential is idle, for a backend that bounds how many it keeps
    /// in memory and makes room for a new one (`None`: none is dropped).
    pub idle: Option<Idle<'a>>,
}

impl<'a> Keys<'a> {
    /// One run.
    pub fn run(run: &'a str) -> Keys<'a> {
        Keys {
            runs: vec![run],
            ..Keys::default()
        }
    }
}

/// When a tool or a credential is idle, at `now_ms` under `policy`: its state is what a
/// fresh one would be as far as any decision can tell, so a backend that bounds how
/// many it keeps in memory may drop it to make room.
#[derive(Clone, Copy, Debug)]
pub struct Idle<'a> {
    /// The policy in force.
    pub policy: &'a Policy,
    /// The wall time, in ms.
    pub now_ms: u64,
}

impl Idle<'_> {
    /// A closed breaker (its count of recent failures is forgotten, as after any
    /// success), nothing in flight, a full bucket.
    pub fn tool(&self, t: &ToolState) -> bool {
        let (policy, now_ms) = (self.policy, self.now_ms);
        matches!(
            t.breaker.at(now_ms, policy.breaker.open_ms),
            Breaker::Closed { .. }
        ) && t.in_flight_at(now_ms) == 0
            && t.bucket.is_full(policy.rate.tool_per_sec, now_ms)
    }

    /// Nothing spent in its period (its backstop has nothing to remember) and a full
    /// bucket.
    pub fn credential(&self, c: &CredentialState) -> bool {
        c.spent_nanos == 0
            && c.bucket
                .is_full(self.policy.rate.credential_per_sec, self.now_ms)
    }
}
