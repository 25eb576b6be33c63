//! A group whose run was taken back: only that run's decisions are refused
//! (docs/FLEET.md, "Group commit"). The server refused one decision's guarded write
//! (`tally_home_write`: the run's home is no longer this daemon, a pause, resume, stop or
//! kill through another gate took it back, or another host took it over), so the
//! transaction rolled back for certain and every statement was answered. That decision
//! is refused, and so is every decision after it, in the group or queued behind it, that
//! writes one of its runs (each was made on the copy the refused one left); the runs'
//! copies are let go (read again from their rows next time), and the other decisions
//! are committed again, in a transaction of their own, as if the refused ones had been
//! made one at a time and refused by their guards. A decision after a refused one that
//! decided a tool's breaker from a view the refused one changed is refused too (its
//! breaker counted an outcome no ledger will hold), and so is every decision begun on
//! such a view before it is put right ([`super::Group::queue`]'s generation, kept per
//! tool for this: decisions on other tools, and decisions that read no view, are kept).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::{lock, Item, Outcome, Shared};
use crate::txn::taken_back;

/// `batch[at]` and every later decision of `batch` and of the queue that writes one of
/// the runs refused ones write, refused (what they took given back, their outcomes
/// taken out of the breakers' views, before a later decision may begin); what is left
/// of `batch`, to commit again.
pub(super) fn refuse(s: &Shared, batch: Vec<Item>, at: usize) -> Vec<Item> {
    let mut refused = Vec::new();
    let mut kept = Vec::with_capacity(batch.len());
    let mut on = On::default();
    {
        let mut q = lock(&s.queue);
        for (i, item) in batch.into_iter().enumerate() {
            match i == at || (i > at && on.touched_by(&item)) {
                true => refused.push(on.with(item)),
                false => kept.push(item),
            }
        }
        let queued = std::mem::take(&mut q.items);
        for item in queued {
            match on.touched_by(&item) {
                true => refused.push(on.with(item)),
                false => q.items.push(item),
            }
        }
        let runs = &on.runs;
        let mut homes = lock(&s.homes);
        for run in runs {
            homes.remove(run);
        }
        drop(homes);
        for item in &mut refused {
            std::mem::replace(&mut item.undo, Box::new(|| ()))();
        }
        // A refused decision that also wrote a run still at home here left that run's
        // copy holding it, and one that decided a tool from its view left the view
        // counting its outcomes until undone: a decision that read either before is
        // refused ([`super::Group::queue`]), as after any failed commit.
        if runs.len() > 1 {
            q.generation += 1;
        }
        if !on.tools.is_empty() {
            q.taint += 1;
            let taint = q.taint;
            for tool in &on.tools {
                q.tainted.insert(tool.clone(), taint);
            }
        }
    }
    let n = u64::try_from(refused.len()).unwrap_or(u64::MAX);
    s.counts[2].fetch_add(n, Ordering::Relaxed);
    s.counts[super::GUARD_TAKEN_BACK].fetch_add(n, Ordering::Relaxed);
    for item in refused {
        (item.then)(Outcome::RolledBack(taken_back()));
    }
    kept
}

/// The runs the refused decisions write, and the tools whose views they changed (a
/// decision that only read a view changed nothing another decision read).
#[derive(Default)]
struct On {
    runs: BTreeSet<String>,
    tools: BTreeSet<String>,
}

impl On {
    /// Whether `item` writes one of the runs or decided one of the tools from its view.
    fn touched_by(&self, item: &Item) -> bool {
        item.homes.iter().any(|h| self.runs.contains(&h.run))
            || item.tools.iter().any(|t| self.tools.contains(t))
    }

    /// `item`, refused: its runs and the tools whose views it changed added.
    fn with(&mut self, item: Item) -> Item {
        self.runs.extend(item.homes.iter().map(|h| h.run.clone()));
        self.tools.extend(item.changed.iter().cloned());
        item
    }
}
