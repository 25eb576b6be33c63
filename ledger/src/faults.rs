//! Fault points for tests (feature `faults`; never compiled into a release build).
//!
//! A test that must stop a child process at an exact point of its work, rather than
//! race a `kill` against the clock, runs a test build of the child with an environment
//! variable naming the point. The process then aborts there (`std::process::abort`: no
//! destructor runs and nothing more is written, as with `kill -9`). A test in the same
//! process can also run code at a point of the writer's work ([`on_group_appended`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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

/// Abort just before the log append of the N-th commit group this process writes, its
/// tree files already written: `TALLY_FAULT_APPEND_ABORT_BEFORE=N` (from 1).
pub const APPEND_ABORT_BEFORE: &str = "TALLY_FAULT_APPEND_ABORT_BEFORE";

/// Called by the writer once a group's tree files are written, before its log append.
pub(crate) fn group_ready() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static GROUPS: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| std::env::var(APPEND_ABORT_BEFORE).ok()?.parse().ok());
    let n = GROUPS.fetch_add(1, Ordering::Relaxed) + 1;
    if *at == Some(n) {
        std::process::abort();
    }
}

/// What [`on_group_appended`] runs, by ledger directory.
type Observers = Vec<(PathBuf, Arc<dyn Fn() + Send + Sync>)>;

fn observers() -> &'static Mutex<Observers> {
    static OBSERVERS: OnceLock<Mutex<Observers>> = OnceLock::new();
    OBSERVERS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Run `f` on the writer's commit thread each time the writer of the ledger in `dir`
/// has appended a group to the log, before it does anything more: the instant a reader
/// first sees the group's checkpoint.
pub fn on_group_appended(dir: &Path, f: impl Fn() + Send + Sync + 'static) {
    let mut all = observers().lock().unwrap_or_else(|e| e.into_inner());
    all.push((dir.to_path_buf(), Arc::new(f)));
}

/// Called by the writer of the ledger in `dir` right after a group's log append.
pub(crate) fn group_appended(dir: &Path) {
    let mine: Vec<_> = {
        let all = observers().lock().unwrap_or_else(|e| e.into_inner());
        (all.iter())
            .filter(|(d, _)| d == dir)
            .map(|(_, f)| f.clone())
            .collect()
    };
    for f in mine {
        f();
    }
}
