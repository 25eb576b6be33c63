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

use tally_record::decision::{Budget, LeaseScope, SliceAmounts};

use crate::inconsistency::OutsideLease;
use crate::principals::PrincipalLimits;
use crate::state::{PrincipalState, RunState};

/// What a run counts that slices are cut from: attempts used (refunds given back),
/// nanodollars settled and held, side effects used, and its open polls (a poll allowed
/// opens one: what a decision adds to them is a poll used).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCount {
    attempts: u64,
    nanos: u64,
    side_effects: u64,
    polls_open: u64,
}

impl RunCount {
    /// What `run` counts now.
    pub fn of(run: &RunState) -> RunCount {
        RunCount {
            attempts: run.attempts_used,
            nanos: run.settled_nanos.saturating_add(run.held_nanos),
            side_effects: run.side_effects_used,
            polls_open: run.open.values().filter(|a| a.poll.is_some()).count() as u64,
        }
    }
}

/// What applying one decision took of its run's budget, and what it gave back: `before`
/// and `after` are the run's counts around the policy's own apply. An allow takes an
/// attempt, its reservation, a side effect or a poll; an outcome that settles below its
/// reservation gives the difference back (one above it takes the overrun), a refund
/// gives its attempt back. A poll, once allowed, is used: closing it gives nothing back.
pub fn slice_use(before: RunCount, after: RunCount) -> (SliceUse, SliceUse) {
    let up = |from: u64, to: u64| to.saturating_sub(from);
    let took = SliceUse {
        attempts: up(before.attempts, after.attempts),
        nanos: up(before.nanos, after.nanos),
        side_effects: up(before.side_effects, after.side_effects),
        polls: up(before.polls_open, after.polls_open),
    };
    let gave = SliceUse {
        attempts: up(after.attempts, before.attempts),
        nanos: up(after.nanos, before.nanos),
        side_effects: up(after.side_effects, before.side_effects),
        polls: 0,
    };
    (took, gave)
}

/// What one decision took of a principal's leased scope and gave back, from the
/// principal's own counts around the decision (`None`: the decision did not read them;
/// then its runs' attempts and nanodollars stand in for them) and what it took and gave
/// of its runs owned by the principal (`runs`: side effects and polls, which a
/// principal does not count itself). A principal's attempts are never given back (a
/// refund or a rejected call gives back its run's, not its period's); a new period
/// counts from nothing, so what its counts show is taken.
pub fn principal_use(
    counts: Option<(&PrincipalState, &PrincipalState)>,
    runs: (SliceUse, SliceUse),
) -> (SliceUse, SliceUse) {
    let up = |from: u64, to: u64| to.saturating_sub(from);
    let (took, gave) = runs;
    let (attempts, nanos, nanos_back) = match counts {
        Some((before, after)) if before.period_start_ms != after.period_start_ms => {
            (after.attempts, after.spent_nanos, 0)
        }
        Some((before, after)) => (
            up(before.attempts, after.attempts),
            up(before.spent_nanos, after.spent_nanos),
            up(after.spent_nanos, before.spent_nanos),
        ),
        None => (took.attempts, took.nanos, gave.nanos),
    };
    let took = SliceUse {
        attempts,
        nanos,
        ..took
    };
    let gave = SliceUse {
        attempts: 0,
        nanos: nanos_back,
        ..gave
    };
    (took, gave)
}

/// Whether a decision from `before` to `after` settled what its run had already done
/// rather than asked for more: it opened no attempt (an outcome, a refund, a stop). What
/// such a decision takes (an outcome settled above its reservation) was spent before it
/// was recorded, so it is counted whatever room is left, and later uses are refused
/// instead; only an allow, which opens its attempt, is held to the room left.
pub fn incurred(before: &RunState, after: &RunState) -> bool {
    after.open.keys().all(|a| before.open.contains_key(a))
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

/// Whether an outcome or refund of an attempt may be decided on slice `named`: only
/// when its allow took the attempt on that slice (`allowed_on`; `None`: its allow named
/// no slice, or none is known). What it gives back is credited to the slice that took
/// it and never to another, so a give-back cannot make room on a slice it never used.
pub fn gives_back_on(allowed_on: Option<u64>, named: u64) -> Result<(), OutsideLease> {
    if allowed_on == Some(named) {
        Ok(())
    } else {
        Err(OutsideLease::NotTheAllows)
    }
}

/// Whether a decision of run `run` (owned by `owner_uid`, under `credential`) may be
/// decided on a slice cut from scope `kind`, `key`: a run slice only for that run, a
/// principal slice only for a run that uid owns (the uid in decimal, as the ledger
/// records it), a credential slice only for a run under that credential. A bucket
/// slice is not held to a run: no record says which bucket a call counts against.
pub fn in_scope(
    (kind, key): (LeaseScope, &str),
    run: &str,
    owner_uid: Option<u32>,
    credential: Option<&str>,
) -> Result<(), OutsideLease> {
    let inside = match kind {
        LeaseScope::Run => key == run,
        LeaseScope::Principal => owner_uid.is_some_and(|uid| uid.to_string() == key),
        LeaseScope::Credential => credential == Some(key),
        _ => true,
    };
    if inside {
        Ok(())
    } else {
        Err(OutsideLease::OtherScope)
    }
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
    /// One decision's use added: what it took of its run's count from `before` to
    /// `after`, less what it gave back ([`slice_use`]).
    pub fn add(&mut self, before: RunCount, after: RunCount) {
        let (took, gave) = slice_use(before, after);
        let (u, t, g) = (self.each(), took.each(), gave.each());
        let d = |i: usize| u[i].saturating_add(t[i]).saturating_sub(g[i]);
        *self = SliceUse {
            attempts: d(0),
            nanos: d(1),
            side_effects: d(2),
            polls: d(3),
        };
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

/// A run's cap per dimension now: the limits the core holds the run to (its budget
/// plus what approvals granted, less what it carved out for children), its polls from
/// its budget. A leased run's scope is raised to this when a decision raised it.
pub fn run_limit(run: &RunState) -> SliceAmounts {
    SliceAmounts {
        attempts: run.attempts_limit(),
        nanos: run.spend_limit(),
        side_effects: run.side_effects_limit(),
        polls: run.budget.polls,
    }
}

/// The run's limit after a decision that raised it in some dimension (an approval's
/// grant used), or `None` if the decision raised none.
pub fn raised_limit(before: &RunState, after: &RunState) -> Option<SliceAmounts> {
    let (b, a) = (run_limit(before).each(), run_limit(after).each());
    let rose = (0..4).any(|i| matches!((b[i], a[i]), (Some(x), Some(y)) if y > x));
    rose.then(|| run_limit(after))
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

    fn count(attempts: u64, nanos: u64, side_effects: u64, polls_open: u64) -> RunCount {
        RunCount {
            attempts,
            nanos,
            side_effects,
            polls_open,
        }
    }

    #[test]
    fn a_decision_uses_what_it_changes_in_its_run() {
        let mut used = SliceUse::default();
        // An allow: an attempt, a write, 500 reserved.
        used.add(count(0, 0, 0, 0), count(1, 500, 1, 0));
        // Its outcome settles 300: 200 given back.
        used.add(count(1, 500, 1, 0), count(1, 300, 1, 0));
        // A poll allowed opens one, and its outcome closing it gives nothing back.
        used.add(count(1, 300, 1, 0), count(1, 300, 1, 1));
        used.add(count(1, 300, 1, 1), count(1, 300, 1, 0));
        assert_eq!(used.each(), [1, 300, 1, 1]);
        // A refund of the attempt.
        used.add(count(1, 300, 1, 0), count(0, 300, 1, 0));
        assert_eq!(used.attempts, 0);
    }

    #[test]
    fn a_decision_takes_and_gives_back_what_the_fold_changed() {
        let mut before = RunState::new("r");
        before.held_nanos = 10;
        let mut after = before.clone();
        after.attempts_used = 1;
        after.side_effects_used = 1;
        after.held_nanos = 25;
        let (took, gave) = slice_use(RunCount::of(&before), RunCount::of(&after));
        assert_eq!(took.each(), [1, 15, 1, 0]);
        assert_eq!(gave, SliceUse::default());
        // Settled below the reservation: the rest comes back.
        let mut settled = after.clone();
        settled.held_nanos = 10;
        settled.settled_nanos = 5;
        let (took, gave) = slice_use(RunCount::of(&after), RunCount::of(&settled));
        assert_eq!(took, SliceUse::default());
        assert_eq!(gave.each(), [0, 10, 0, 0]);
    }

    #[test]
    fn only_a_decision_that_opens_an_attempt_asks_for_room() {
        let before = RunState::new("r");
        let mut allowed = before.clone();
        let attempt = crate::state::Attempt {
            tool: None,
            op: 0,
            effect: None,
            reserved: 5,
            held: 5,
            counted: true,
            write: false,
            poll: None,
            settled: false,
            status: None,
            registered: None,
        };
        allowed.open.insert(1, attempt.clone());
        let settled = crate::state::Attempt {
            held: 0,
            settled: true,
            ..attempt
        };
        let mut pending = allowed.clone();
        pending.open.insert(1, settled);
        assert!(incurred(&allowed, &pending));
        assert!(!incurred(&before, &allowed));
        // Its outcome closes it (whatever it settles): a bill already incurred.
        assert!(incurred(&allowed, &before));
        assert!(incurred(&before, &before));
    }

    #[test]
    fn a_give_back_is_on_the_slice_its_allow_took_only() {
        assert_eq!(gives_back_on(Some(7), 7), Ok(()));
        assert_eq!(gives_back_on(Some(6), 7), Err(OutsideLease::NotTheAllows));
        assert_eq!(gives_back_on(None, 7), Err(OutsideLease::NotTheAllows));
    }

    #[test]
    fn a_slice_is_decided_on_for_its_scope_only() {
        let on = |kind, key| in_scope((kind, key), "r1", Some(1000), Some("c1"));
        assert_eq!(on(LeaseScope::Run, "r1"), Ok(()));
        assert_eq!(on(LeaseScope::Run, "r2"), Err(OutsideLease::OtherScope));
        assert_eq!(on(LeaseScope::Principal, "1000"), Ok(()));
        assert_eq!(
            on(LeaseScope::Principal, "1001"),
            Err(OutsideLease::OtherScope)
        );
        assert_eq!(on(LeaseScope::Credential, "c1"), Ok(()));
        assert_eq!(
            on(LeaseScope::Credential, "c2"),
            Err(OutsideLease::OtherScope)
        );
        assert_eq!(on(LeaseScope::Bucket, "b"), Ok(()));
        let unowned = in_scope((LeaseScope::Principal, "1000"), "r1", None, None);
        assert_eq!(unowned, Err(OutsideLease::OtherScope));
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

    #[test]
    fn a_principal_scope_moves_by_the_principals_own_counts_never_its_attempts_down() {
        let before = PrincipalState {
            period_start_ms: 1,
            runs: 1,
            attempts: 5,
            spent_nanos: 900,
        };
        // A refund: its run gives back an attempt and 300; the principal's attempts stay.
        let after = PrincipalState {
            spent_nanos: 600,
            ..before
        };
        let run_gave = SliceUse {
            attempts: 1,
            nanos: 300,
            side_effects: 1,
            polls: 0,
        };
        let (took, gave) = principal_use(Some((&before, &after)), (SliceUse::default(), run_gave));
        assert_eq!((took.each(), gave.each()), ([0; 4], [0, 300, 1, 0]));
        // An allow in a new period counts what the period shows.
        let fresh = PrincipalState {
            period_start_ms: 2,
            runs: 0,
            attempts: 1,
            spent_nanos: 70,
        };
        let run_took = SliceUse {
            attempts: 1,
            nanos: 70,
            side_effects: 0,
            polls: 1,
        };
        let (took, gave) = principal_use(Some((&before, &fresh)), (run_took, SliceUse::default()));
        assert_eq!((took.each(), gave.each()), ([1, 70, 0, 1], [0; 4]));
        // Unread counts: the run's stand in, its attempts never given back.
        let (took, gave) = principal_use(None, (run_took, run_gave));
        assert_eq!((took.each(), gave.each()), ([1, 70, 0, 1], [0, 300, 1, 0]));
    }
}
