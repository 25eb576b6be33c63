//! What counts against a leased slice (docs/FLEET.md, "Leases in the ledger"): what a
//! decision made on a slice uses of it, whether a slice's use stays within its bounds,
//! and whether the slices open on a scope at once stay within the scope's cap. The gate
//! deciding inside its slices and `tally verify` holding each host's ledger to them ask
//! these, and nothing else compares a slice's use to its bounds.
//!
//! A decision uses of its slice exactly what it changes in its run's count: an allow
//! takes an attempt (unless its tool is exempt or it is a poll), a side effect for a
//! write and its reservation; its outcome settles the reservation (more or less than
//! reserved), a rejected call or a refund gives back what it took. A poll is one of
//! the slice's polls.

use tally_record::decision::{Budget, SliceAmounts};

use crate::principals::PrincipalLimits;
use crate::state::RunState;

/// What a run counts that slices are cut from: attempts used (refunds given back),
/// nanodollars settled and held, side effects used. Polls are counted per decision
/// ([`SliceUse::add`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCount {
    attempts: u64,
    nanos: u64,
    side_effects: u64,
}

impl RunCount {
    /// What `run` counts now.
    pub fn of(run: &RunState) -> RunCount {
        RunCount {
            attempts: run.attempts_used,
            nanos: run.settled_nanos.saturating_add(run.held_nanos),
            side_effects: run.side_effects_used,
        }
    }
}

/// What the decisions made on one slice have used of it so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceUse {
    /// Attempts.
    pub attempts: u64,
    /// Nanodollars reserved and not given back, or settled.
    pub nanos: u64,
    /// Side effects.
    pub side_effects: u64,
    /// Polls.
    pub polls: u64,
}

/// A dimension past its bound or its cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Past {
    /// The dimension's name (one of [`SliceAmounts::NAMES`]).
    pub dimension: &'static str,
    /// Used (or leased at once).
    pub used: u64,
    /// The bound (or the cap).
    pub bound: u64,
}

impl SliceUse {
    /// One decision's use added: the change it made to its run's count, from `before`
    /// to `after` (what it gave back comes off), and a poll if `poll`.
    pub fn add(&mut self, before: RunCount, after: RunCount, poll: bool) {
        let step =
            |used: u64, before: u64, after: u64| used.saturating_add(after).saturating_sub(before);
        self.attempts = step(self.attempts, before.attempts, after.attempts);
        self.nanos = step(self.nanos, before.nanos, after.nanos);
        self.side_effects = step(self.side_effects, before.side_effects, after.side_effects);
        self.polls = self.polls.saturating_add(u64::from(poll));
    }

    /// The four in the order of [`SliceAmounts::NAMES`].
    pub fn each(&self) -> [u64; 4] {
        [self.attempts, self.nanos, self.side_effects, self.polls]
    }

    /// The first dimension the slice bounds whose use is past its bound (a dimension it
    /// does not bound is decided centrally, not on the slice).
    pub fn past(&self, bounds: &SliceAmounts) -> Option<Past> {
        first_past(self.each(), bounds)
    }
}

/// The first dimension in which `leased` (the sum of the bounds of the slices of one
/// scope open at one moment) is past the scope's `cap`; a dimension without a cap is
/// never past.
pub fn slices_past_cap(leased: [u64; 4], cap: &SliceAmounts) -> Option<Past> {
    first_past(leased, cap)
}

fn first_past(used: [u64; 4], bounds: &SliceAmounts) -> Option<Past> {
    (0..4).find_map(|i| {
        let bound = bounds.each()[i]?;
        (used[i] > bound).then_some(Past {
            dimension: SliceAmounts::NAMES[i],
            used: used[i],
            bound,
        })
    })
}

/// A run's cap per dimension, from its budget at start: its attempts, spend, side
/// effects and polls.
pub fn run_cap(budget: &Budget) -> SliceAmounts {
    SliceAmounts {
        attempts: budget.attempts,
        nanos: budget.spend().map(|n| n.0),
        side_effects: budget.side_effects,
        polls: budget.polls,
    }
}

/// A principal's cap per dimension, from the policy's principal limits: its attempts
/// and spend per period (it has no side effect or poll cap).
pub fn principal_cap(limits: &PrincipalLimits) -> SliceAmounts {
    SliceAmounts {
        attempts: limits.attempts,
        nanos: limits.spend_nanos,
        side_effects: None,
        polls: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(attempts: u64, nanos: u64, side_effects: u64) -> RunCount {
        RunCount {
            attempts,
            nanos,
            side_effects,
        }
    }

    #[test]
    fn a_decision_uses_what_it_changes_in_its_run() {
        let mut used = SliceUse::default();
        // An allow: an attempt, a write, 500 reserved.
        used.add(count(0, 0, 0), count(1, 500, 1), false);
        // Its outcome settles 300: 200 given back.
        used.add(count(1, 500, 1), count(1, 300, 1), false);
        // A poll.
        used.add(count(1, 300, 1), count(1, 300, 1), true);
        assert_eq!(used.each(), [1, 300, 1, 1]);
        // A refund of the attempt.
        used.add(count(1, 300, 1), count(0, 300, 1), false);
        assert_eq!(used.attempts, 0);
    }

    #[test]
    fn only_bounded_dimensions_are_held_to_their_bound() {
        let used = SliceUse {
            attempts: 3,
            nanos: 10,
            side_effects: 0,
            polls: 9,
        };
        let bounds = SliceAmounts {
            attempts: Some(3),
            nanos: Some(9),
            ..SliceAmounts::default()
        };
        let past = used.past(&bounds).expect("spend past its bound");
        assert_eq!((past.dimension, past.used, past.bound), ("nanos", 10, 9));
        let within = SliceAmounts {
            nanos: Some(10),
            ..bounds
        };
        assert_eq!(used.past(&within), None);
        assert_eq!(
            slices_past_cap([4, 0, 0, 0], &within).map(|p| p.dimension),
            Some("attempts")
        );
        assert_eq!(
            slices_past_cap([u64::MAX; 4], &SliceAmounts::default()),
            None
        );
    }
}
