//! Where the gate reads the time: a [`Clock`] passed in ([`SystemClock`] by default,
//! [`Gate::with_clock`](crate::Gate::with_clock)), so that deadlines, breakers, back-off,
//! buckets and approvals' expiry are tested on a [`ManualClock`] the test moves, without
//! sleeping. The trait is `tally_record::clock`'s, shared with the ledger.

use tally_policy::{Now, RunState};

pub use tally_ledger::clock::{Clock, ManualClock, SystemClock};

/// A run's clock at wall time `wall`: wall time, and the run's own, never going back.
pub(crate) fn run_clock(wall: u64, run: &RunState) -> Now {
    let at = wall.saturating_sub(run.start_wall_ms).max(run.last_ms);
    Now {
        wall_ms: wall.max(run.start_wall_ms.saturating_add(at)),
        at_ms: Some(at),
    }
}
