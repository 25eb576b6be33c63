//! Tools' breakers from a view (docs/FLEET.md, "The leased mode", "Breakers from a
//! view"): where the policy gives tools no fleet-wide counter per call (no rate bucket,
//! no limit on calls in flight), a decision at home reads the tool's breaker from this
//! holder's view of it instead of locking the tool's row. The view is the row's breaker
//! as last read or written here, with the outcomes seen here since folded on top by the
//! policy core's own rule ([`tally_policy::breaker_outcome`]): this daemon's failures
//! count at once. Those outcomes are kept, in order, and folded into the row at the
//! next tick (and at shutdown), one transaction per tool that locks the row: then they
//! count fleet-wide. Each tick also reads every viewed tool's row again, so a breaker
//! tripped by other daemons' failures refuses here within one refresh interval.
//!
//! A view that says closed decides here; one that says open refuses here, as the core
//! does from the row (its reason); one that says half-open (its time is up) does not:
//! that decision goes the central way, which locks the row and leases the one probe.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tally_gate::backend::{Observed, StateBackend, StateReads};
use tally_gate::GateError;
use tally_policy::state::{call_id, Breaker};
use tally_policy::{Policy, ToolState};

use crate::Postgres;

/// Whether `policy` lets its tools be decided from a view: no tool rate bucket and no
/// limit on a tool's calls in flight (each would be a fleet-wide count per call).
pub(crate) fn viewable(policy: &Policy) -> bool {
    policy.rate.tool_per_sec == 0 && policy.rate.tool_in_flight == 0
}

/// One tool's view.
#[derive(Clone, Debug)]
struct View {
    /// The breaker as the tool's row held it when last read or written here.
    row: Breaker,
    /// Outcomes seen here since, not yet folded into the row, in order.
    pending: Vec<Observed>,
    /// `row` with `pending` folded in: what a decision here reads.
    now: Breaker,
}

/// This holder's views of its tools' breakers.
#[derive(Default)]
pub(crate) struct Views {
    views: Mutex<BTreeMap<String, View>>,
    /// What outcomes fold under: the policy's breaker, as last seen.
    policy: Mutex<Option<Arc<Policy>>>,
}

/// `outcomes` folded, in order, into `t` by the core's rule.
fn fold(policy: &Policy, tool: &str, mut t: ToolState, outcomes: &[Observed]) -> ToolState {
    for o in outcomes {
        let id = || call_id(&o.run, o.attempt);
        tally_policy::breaker_outcome(policy, tool, &mut t, id, o.status, o.now);
    }
    t
}

/// A tool's state holding only `breaker` (no bucket, nothing in flight: the policy
/// counts neither when it is viewable).
fn only(breaker: Breaker) -> ToolState {
    ToolState {
        breaker,
        ..ToolState::default()
    }
}

impl Views {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, View>> {
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy outcomes fold under (its breaker's part), kept once and replaced
    /// when its breaker differs.
    pub(crate) fn remember(&self, policy: &Policy) {
        let mut kept = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        if kept.as_ref().is_some_and(|p| p.breaker == policy.breaker) {
            return;
        }
        *kept = Some(Arc::new(Policy {
            breaker: policy.breaker.clone(),
            ..Policy::default()
        }));
    }

    fn policy(&self) -> Option<Arc<Policy>> {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The tool's state to decide from here at `now_ms`: its view, unless there is none
    /// yet or it is half-open (then the decision goes the central way).
    pub(crate) fn decide_from(&self, tool: &str, now_ms: u64, open_ms: u64) -> Option<ToolState> {
        let views = self.lock();
        let v = views.get(tool)?;
        match v.now.at(now_ms, open_ms) {
            Breaker::HalfOpen { .. } => None,
            _ => Some(only(v.now.clone())),
        }
    }

    /// A decision here left the tool's breaker at `after`, having folded `observed`.
    pub(crate) fn decided(&self, tool: &str, after: Breaker, observed: Vec<Observed>) {
        if let Some(v) = self.lock().get_mut(tool) {
            v.now = after;
            v.pending.extend(observed);
        }
    }

    /// The tool's row read or written with `row`: the view is `row` with what is still
    /// pending here folded on top.
    pub(crate) fn seen(&self, tool: &str, row: Breaker) {
        let policy = self.policy();
        let mut views = self.lock();
        let v = views.entry(tool.to_owned()).or_insert_with(|| View {
            row: row.clone(),
            pending: Vec::new(),
            now: row.clone(),
        });
        v.now = match &policy {
            Some(p) if !v.pending.is_empty() => {
                fold(p, tool, only(row.clone()), &v.pending).breaker
            }
            _ => row.clone(),
        };
        v.row = row;
    }

    /// The tools viewed.
    pub(crate) fn tools(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Outcomes not folded into rows yet, in all.
    pub(crate) fn pending(&self) -> usize {
        self.lock().values().map(|v| v.pending.len()).sum()
    }

    /// The tools with outcomes pending, and those outcomes (taken out).
    fn take_pending(&self) -> Vec<(String, Vec<Observed>)> {
        self.lock()
            .iter_mut()
            .filter(|(_, v)| !v.pending.is_empty())
            .map(|(t, v)| (t.clone(), std::mem::take(&mut v.pending)))
            .collect()
    }

    /// A flush of `outcomes` failed: they go back before any seen since.
    fn restore(&self, tool: &str, mut outcomes: Vec<Observed>) {
        if let Some(v) = self.lock().get_mut(tool) {
            outcomes.append(&mut v.pending);
            v.pending = outcomes;
        }
    }
}

/// Every tool's pending outcomes folded into its row, one transaction per tool (the
/// row locked, the outcomes folded in order by the core's rule, written, committed),
/// and the view set to what was written. A tool whose flush failed keeps its outcomes
/// for the next time. Whether every flush was made.
pub(crate) fn flush(central: &Postgres, views: &Views) -> bool {
    let Some(policy) = views.policy() else {
        return true;
    };
    let mut all = true;
    for (tool, outcomes) in views.take_pending() {
        if let Err(outcomes) = flush_one(central, views, &policy, &tool, outcomes) {
            views.restore(&tool, outcomes);
            all = false;
        }
    }
    all
}

/// One tool's flush, in the central backend's turn (no decision of this holder
/// between its read and its view's update).
fn flush_one(
    central: &Postgres,
    views: &Views,
    policy: &Policy,
    tool: &str,
    outcomes: Vec<Observed>,
) -> Result<(), Vec<Observed>> {
    let written = (|| {
        let mut t = central.begin()?;
        let row = t.load_tool(tool)?;
        let state = fold(policy, tool, row, &outcomes);
        let breaker = state.breaker.clone();
        t.tools.insert(tool.to_owned(), state);
        t.write(None, Some(tool), None, true)?;
        views.seen(tool, breaker);
        Ok::<(), GateError>(())
    })();
    written.map_err(|_| outcomes)
}

/// Every viewed tool's row read again (not locked): each view is the row with what is
/// pending here folded on top.
pub(crate) fn refresh(central: &Postgres, views: &Views) -> bool {
    let tools = views.tools();
    if tools.is_empty() {
        return true;
    }
    let read = (|| {
        let mut t = central.begin()?;
        let rows = t.breakers()?;
        for (name, breaker) in rows {
            if tools.contains(&name) {
                views.seen(&name, breaker);
            }
        }
        Ok::<(), GateError>(())
    })();
    read.is_ok()
}
