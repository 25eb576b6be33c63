//! A group whose run was taken back: only that run's decisions are refused
//! (docs/FLEET.md, "Group commit"). The server refused one decision's guarded write
//! (`tally_home_write`: the run's home is no longer this daemon, a pause, resume, stop or
//! kill through another gate took it back, or another host took it over), so the
//! transaction rolled back for certain and every statement was answered. That decision
//! is refused, and so is every decision after it, in the group or queued behind it, that
//! writes one of its runs (each was made on the copy the refused one left); the runs'
//! copies are let go (read again from their rows next time), and the other decisions
//! are committed again, in a transaction of their own, as if the refused ones had been
//! made one at a time and refused by their guards.

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
    let mut runs = BTreeSet::new();
    {
        let mut q = lock(&s.queue);
        for (i, item) in batch.into_iter().enumerate() {
            match i == at || (i > at && writes_any(&item, &runs)) {
                true => refused.push(with_runs(item, &mut runs)),
                false => kept.push(item),
            }
        }
        let queued = std::mem::take(&mut q.items);
        for item in queued {
            match writes_any(&item, &runs) {
                true => refused.push(with_runs(item, &mut runs)),
                false => q.items.push(item),
            }
        }
        let mut homes = lock(&s.homes);
        for run in &runs {
            homes.remove(run);
        }
        drop(homes);
        for item in &mut refused {
            std::mem::replace(&mut item.undo, Box::new(|| ()))();
        }
        // A refused decision that also wrote a run still at home here left that run's
        // copy holding it: a decision that took the copy before it was let go is
        // refused ([`super::Group::queue`]), as after any failed commit.
        if runs.len() > 1 {
            q.generation += 1;
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

/// Whether `item` writes one of `runs`.
fn writes_any(item: &Item, runs: &BTreeSet<String>) -> bool {
    item.homes.iter().any(|h| runs.contains(&h.run))
}

/// `item`, its runs added to `runs`.
fn with_runs(item: Item, runs: &mut BTreeSet<String>) -> Item {
    runs.extend(item.homes.iter().map(|h| h.run.clone()));
    item
}
