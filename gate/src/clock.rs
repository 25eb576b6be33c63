//! Where the gate reads the time: a [`Clock`] passed in (the wall clock by default), so
//! that deadlines, breakers and buckets can be tested on a clock the test moves, without
//! sleeping.

use tally_policy::{Now, RunState};

/// The time, in ms since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Now, ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A run's clock at wall time `wall`: wall time, and the run's own, never going back.
pub(crate) fn run_clock(wall: u64, run: &RunState) -> Now {
    let at = wall.saturating_sub(run.start_wall_ms).max(run.last_ms);
    Now {
        wall_ms: wall.max(run.start_wall_ms.saturating_add(at)),
        at_ms: Some(at),
    }
}
