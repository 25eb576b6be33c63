//! The tools a leased decision reads from this holder's view of their breakers
//! ([`super::super::breakers`]), and what their views take from it.

use std::collections::BTreeMap;

use tally_gate::backend::{Keys, Observed};
use tally_policy::ToolState;

use super::txn::LeasedTxn;

/// A tool decided from the view: its breaker as the decision left it, and the outcomes
/// it folded there.
pub(super) type ViewedTool = (String, ToolState, Vec<Observed>);

impl LeasedTxn<'_> {
    /// The tool's state from this holder's view, if the decision may read it there: the
    /// policy counts nothing per call for tools (no rate bucket, no calls in flight),
    /// every run the transaction named so far is at home here (checked when the tool is
    /// loaded, not again at commit: a run read centrally after it, as a parent's is,
    /// changes nothing for the tool, whose breaker alone is read and whose row is
    /// neither locked nor written), and the view is not half-open.
    /// A tool that could be viewed but is read centrally is watched: its view follows.
    pub(super) fn view_of(&mut self, tool: &str, keys: &Keys<'_>) -> Option<ToolState> {
        let idle = keys.idle.as_ref()?;
        if tally_policy::tools_counted_per_call(idle.policy) {
            return None;
        }
        let views = &self.backend.views;
        views.remember(idle.policy);
        let home_only = self.inner.runs.is_empty() && !self.homed.is_empty();
        let open_ms = idle.policy.breaker.open_ms;
        match home_only.then(|| views.decide_from(tool, idle.now_ms, open_ms)) {
            Some(Some(state)) => {
                self.viewed.insert(tool.to_owned());
                Some(state)
            }
            _ => {
                self.watched.insert(tool.to_owned());
                None
            }
        }
    }

    /// The tools decided from the view, taken out of what is written: each with its
    /// state after the decision and the outcomes folded into it.
    pub(super) fn viewed_after(
        &self,
        tools: &mut BTreeMap<String, ToolState>,
        observed: Vec<Observed>,
    ) -> Vec<ViewedTool> {
        let mut out: Vec<ViewedTool> = self
            .viewed
            .iter()
            .filter_map(|t| tools.remove(t).map(|s| (t.clone(), s, Vec::new())))
            .collect();
        for o in observed {
            if let Some(v) = out.iter_mut().find(|v| v.0 == o.tool) {
                v.2.push(o);
            }
        }
        out
    }

    /// The views of the tools decided here take what the decision left.
    pub(super) fn seen_here(&self, viewed: Vec<ViewedTool>) {
        for (tool, state, observed) in viewed {
            self.backend.views.decided(&tool, state.breaker, observed);
        }
    }

    /// The watched tools' rows as this transaction wrote them: their views follow.
    pub(super) fn seen_central(&self) {
        for tool in &self.watched {
            if let Some(t) = self.inner.tools.get(tool) {
                self.backend.views.seen(tool, t.breaker.clone());
            }
        }
    }
}
