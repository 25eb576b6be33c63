//! A leased run's home (docs/FLEET.md, "The leased mode"): the one holder deciding the
//! run on its own copy of the run's state, folded by the same core. The copy is read
//! from the run's row when the holder takes the run in ([`HOME_READ`]), and every
//! decision the holder makes writes it through, guarded ([`HOME_WRITE`]): the write
//! fails, and the decision is refused (retry), unless the row's home is still what the
//! copy was read under. A central write of the run sets the home to NULL, so a copy a
//! central decision (a pause, a stop, a kill through any gate) made stale is never
//! written: the holder's next decision fails its guard, drops the copy and reads the
//! row again. The row is never behind a decision the holder answered.
//!
//! What a decision used of the run's budget is read off the fold
//! ([`tally_policy::slice_use`]) and counted in the holder's slice of the run's scope;
//! what it gives back is given back on the slice the attempt was counted on, only.

use std::collections::BTreeMap;

use tally_policy::{RunCount, RunState, SliceUse};

use super::types::Amounts;

/// A run's row (locked), its home, whether a lease scope is defined for it, and whether
/// its home's holder has a slice of it out (a home whose holder has none is free to
/// take): $1 the run.
pub(crate) const HOME_READ: &str = "
SELECT r.state, r.home,
    EXISTS (SELECT 1 FROM tally_lease_scopes s WHERE s.kind = 'run' AND s.key = r.name),
    EXISTS (SELECT 1 FROM tally_leases l
            WHERE l.kind = 'run' AND l.key = r.name AND l.state = 'held' AND l.holder = r.home
              AND l.epoch = r.home_epoch),
    r.home_epoch
FROM tally_runs r WHERE r.name = $1 AND r.state IS NOT NULL FOR UPDATE OF r";

/// A run decided on its copy at home locks its row first, sent with the transaction's
/// first other statement (no round trip of its own): no row, its home moved since the
/// copy was written ($1 the run, $2 this holder, $3 its epoch). Every gate then locks a run before
/// its tool, as a central decision does: two never wait on each other in a cycle.
pub(crate) const HOME_GUARD: &str =
    "SELECT 1 FROM tally_runs WHERE name = $1 AND home = $2 AND home_epoch = $3 FOR UPDATE";

/// [`HOME_GUARD`] as the last round trip sends it, beside its COMMIT: a run no longer
/// at home here fails the statement (a division by zero, SQLSTATE 22012), so the
/// transaction rolls back instead of committing what was sent with it.
pub(crate) const HOME_GUARD_SEALED: &str = "SELECT 1 / count(*)::int FROM (SELECT 1 FROM tally_runs WHERE name = $1 AND home = $2 AND home_epoch = $3 FOR UPDATE) g";

/// A run's state written by the holder it is at home on: $1 run, $2 state, $3 open,
/// $4 and $5 the home after and its epoch (NULL once stopped), $6 and $7 the home the
/// copy was read under, $8 and $9 this holder and its epoch, $10 and $11 the slice the
/// decision took on and what (attempts, nanodollars, side effects, polls), $12 and $13
/// the slice it gave back on and what, $14 the lease clock's time. Fails the
/// transaction if the row's home is not $6 and $7 (`schema::SCHEMA_V9`), or the slice
/// taken on is no longer held by this holder at this epoch (`schema::SCHEMA_V11`).
pub(crate) const HOME_WRITE: &str =
    "SELECT tally_home_write($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// A run at home on this holder: its state as the last decision left it.
#[derive(Clone, Debug)]
pub(crate) struct Home {
    pub(crate) state: RunState,
    /// The home its row holds (this holder's name and epoch), as the guard expects it.
    pub(crate) expected: Option<(String, i64)>,
}

/// Where an open attempt's use of its run's scope was counted: what it gives back is
/// given back there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakenOn {
    /// On this holder's slice with this id (while the slice is held; once it went back,
    /// its use was settled in the scope: given back centrally).
    Slice(i64),
    /// Settled in the scope centrally (the scope's last units, a bill, a decision that
    /// raised the run's limit): given back centrally, in the decision's transaction.
    Central,
}

/// Per run at home here (or once at home here), per open attempt: where its use was
/// counted. Kept by the holder apart from the copies, which an uncommitted decision
/// lets go: an attempt's give-back is never lost with its copy.
pub(crate) type TakenOns = BTreeMap<String, BTreeMap<u64, TakenOn>>;

/// How the gate found a run it named.
#[derive(Clone, Debug)]
pub(crate) enum Found {
    /// No lease scope: decided centrally, as without leases.
    Central,
    /// At home here (taken in now): decided on the copy.
    Home(Box<Home>),
    /// At home on another holder (or another process of this one), which has a slice
    /// of it out: that holder.
    Elsewhere(String),
}

/// What [`HOME_READ`] found: the row's state, home, whether it has a scope and whether
/// its home's holder has a slice of it out; `me`, this holder.
pub(crate) fn found(
    state: RunState,
    home: Option<(String, i64)>,
    scoped: bool,
    live: bool,
    me: &(String, i64),
) -> Found {
    match home {
        _ if !scoped => Found::Central,
        Some(h) if live && h != *me => Found::Elsewhere(h.0),
        expected => Found::Home(Box::new(Home { state, expected })),
    }
}

/// What a decision moved in its run's budget, read off the fold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Taken (an allow's attempt, reservation, side effect, poll; an outcome's overrun).
    pub(crate) took: Amounts,
    /// Given back (an outcome below its reservation, a refund, a rejected call).
    pub(crate) gave: Amounts,
    /// Settled what was already done (it opened no attempt): a bill, applied whatever
    /// room is left ([`tally_policy::incurred`]).
    pub(crate) bill: bool,
}

/// What the decision from `before` to `after` moved.
pub(crate) fn moved(before: &RunState, after: &RunState) -> Moved {
    let (took, gave) = tally_policy::slice_use(RunCount::of(before), RunCount::of(after));
    Moved {
        took: amounts(took),
        gave: amounts(gave),
        bill: tally_policy::incurred(before, after),
    }
}

fn amounts(u: SliceUse) -> Amounts {
    Amounts {
        attempts: u.attempts,
        nanos: u.nanos,
        effects: u.side_effects,
        polls: u.polls,
    }
}

pub(crate) use crate::txn::held;

/// The attempts `after` opened that `before` did not have.
pub(crate) fn opened(before: &RunState, after: &RunState) -> Vec<u64> {
    after
        .open
        .keys()
        .filter(|a| !before.open.contains_key(a))
        .copied()
        .collect()
}

/// The attempts `before` had open that `after` closed.
pub(crate) fn closed(before: &RunState, after: &RunState) -> Vec<u64> {
    opened(after, before)
}
