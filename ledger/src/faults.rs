//! Fault points for tests (feature `faults`; never compiled into a release build).
//!
//! A test that must stop a child process at an exact point of its work, rather than
//! race a `kill` against the clock, runs a test build of the child with an environment
//! variable naming the point. The process then aborts there (`std::process::abort`: no
//! destructor runs and nothing more is written, as with `kill -9`).

use std::sync::OnceLock;

/// Abort once this many state frames have been replayed into the index on open (or by a
/// reindex): `TALLY_FAULT_REPLAY_ABORT_AFTER=N`. With `N/flushed`, sled first writes out
/// what it holds (as its periodic flush does), so the index on disk holds part of the
/// replay: a kill landing just after such a flush.
pub const REPLAY_ABORT_AFTER: &str = "TALLY_FAULT_REPLAY_ABORT_AFTER";

/// Called after each state frame a replay applies; `n` counts them from 1. `flush`
/// writes out what sled holds.
pub(crate) fn replayed_state_frame(n: u64, flush: impl FnOnce()) {
    static AT: OnceLock<Option<(u64, bool)>> = OnceLock::new();
    let at = AT.get_or_init(|| {
        let value = std::env::var(REPLAY_ABORT_AFTER).ok()?;
        let (count, flushed) = match value.strip_suffix("/flushed") {
            Some(count) => (count, true),
            None => (value.as_str(), false),
        };
        Some((count.parse().ok()?, flushed))
    });
    if let Some((at, flushed)) = *at {
        if at == n {
            if flushed {
                flush();
            }
            std::process::abort();
        }
    }
}
