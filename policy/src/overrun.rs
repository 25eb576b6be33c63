//! Overruns: an outcome that settles its attempt above what the gate reserved for it
//! (the upstream billed more than the worst case the gate priced). A fact, never capped
//! away: the settled amount counts whole, the excess is recorded on the outcome
//! (`overrun_nanos`), and the run spends nothing more until a human grants it
//! (`budget_exceeded`). The gate, `tally verify` and every report take the overrun from
//! [`overrun`], and from nowhere else.

use serde::Serialize;
use tally_record::money::Nanos;
use tally_record::{Decision, Kind};

use crate::state::RunState;

/// An outcome's settlement above its attempt's reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Overrun {
    /// The attempt.
    pub attempt: u64,
    /// What the gate reserved for it, nanodollars.
    pub reserved_nanos: u64,
    /// What the outcome settled, nanodollars.
    pub settled_nanos: u64,
}

impl Overrun {
    /// How far the settlement is above the reservation, nanodollars (above 0).
    pub fn excess(&self) -> Nanos {
        Nanos(self.settled_nanos.saturating_sub(self.reserved_nanos))
    }
}

/// The overrun `record` makes against `run`'s state before it: `Some` for an outcome
/// that settles an attempt still open (not settled before) above its reservation.
pub fn overrun(run: &RunState, record: &Decision) -> Option<Overrun> {
    if record.kind() != Kind::Outcome {
        return None;
    }
    let attempt = record.attempt?;
    record.status?;
    let open = run.open.get(&attempt)?;
    // An outcome that names an amount settles its attempt, final or not (an `unknown`
    // the operator settles included).
    let settled = record.settled()?;
    (!open.settled && settled.0 > open.reserved).then_some(Overrun {
        attempt,
        reserved_nanos: open.reserved,
        settled_nanos: settled.0,
    })
}
