//! The runs the gateway's sessions act in, each with a count of what holds it: an
//! `initialize` being answered, then the session it opened. A run the gateway started
//! (a key's new run) is stopped when the last of them lets go, and only then: two
//! sessions of one key share its run, and the first to end does not stop it under the
//! other. Each hold is given back exactly once (its drop), so the stop is made exactly
//! once; the gateway's shutdown waits until every hold is given back and every stop
//! made. A run whose stop is under way stays in the table, marked, until the stop is
//! recorded: a new hold on it is refused until then ([`Stopping`]), and a hold on a run
//! read as running before a stop was recorded is refused as stale ([`Runs::hold`]), so
//! that no new session acts in a run stopped under it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tally_record::{Action, Reason};
use tokio::sync::watch;

use super::Authorized;
use crate::gate::Gate;

/// How many of the last stops a hold can tell apart by run: past them, a run read before
/// more stops than this were made is read again.
const RECENT_STOPS: usize = 1024;

/// How a run's sessions left it: the gate's last refusal in it (an allow clears it) and
/// whether a non-idempotent write's outcome is unknown. Shared by the run's sessions.
#[derive(Default)]
pub(super) struct Ending {
    pub(super) last_refusal: Option<(Reason, Action)>,
    pub(super) unknown_write: bool,
}

/// A run's ending, shared.
pub(super) type Shared = Arc<Mutex<Ending>>;

struct Entry {
    holds: usize,
    /// Whether an `initialize` of the gateway started the run: it is then stopped when
    /// its last hold is given back.
    started: bool,
    ending: Shared,
    /// Its last hold was given back and its stop is under way, not recorded yet.
    stopping: bool,
}

/// Why a run cannot be held now: read again (its state may have changed), after
/// [`Runs::stop_recorded`] for a run whose stop is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotHeld {
    /// Its stop is under way.
    Stopping,
    /// A stop was recorded since the run was read as running: the reading is stale.
    Stale,
}

/// The runs held, by name.
pub(super) struct Runs {
    inner: Mutex<HashMap<String, Entry>>,
    /// Holds not given back and stops not made yet.
    pending: watch::Sender<usize>,
    /// How many stops the gateway made (recorded or failed) so far: changed under the
    /// table's lock.
    stops: AtomicU64,
    /// The last stops made, by number (1, 2, ...) and run: a hold asks whether its own
    /// run is among those made since it was read. Changed under the table's lock.
    recent: Mutex<VecDeque<(u64, String)>>,
    /// Told each time a stop is made (after the table's lock is let go).
    made: watch::Sender<()>,
    /// The worker name the gateway's stops are recorded with.
    worker: Option<String>,
}

/// One hold on a run: given back (and the run stopped if it was the last and the
/// gateway started it) when dropped.
pub(super) struct Hold {
    runs: Arc<Runs>,
    run: Authorized,
    ending: Shared,
    /// The session's gate worker, once bound: flushed before the stop, so that the
    /// outcomes it queued are recorded first.
    gate: OnceLock<Gate>,
}

impl Runs {
    pub(super) fn new(worker: Option<String>) -> Runs {
        Runs {
            inner: Mutex::default(),
            pending: watch::Sender::new(0),
            stops: AtomicU64::new(0),
            recent: Mutex::default(),
            made: watch::Sender::new(()),
            worker,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many stops the gateway made so far: read before a run's state is read, and
    /// given to [`Runs::hold`].
    pub(super) fn stops(&self) -> u64 {
        self.stops.load(Ordering::SeqCst)
    }

    /// One more hold on `run` (its `started` counts: the run is then the gateway's to
    /// stop), read as running when [`Runs::stops`] was `seen`. Refused while the run's
    /// stop is under way, and for a run the gateway did not start when a stop of it may
    /// have been recorded since `seen` (read it again). Stops of other runs do not
    /// count, so that sessions ending elsewhere never refuse this one.
    pub(super) fn hold(self: &Arc<Self>, run: Authorized, seen: u64) -> Result<Hold, NotHeld> {
        let ending = {
            let mut inner = self.lock();
            if inner.get(&run.run).is_some_and(|e| e.stopping) {
                return Err(NotHeld::Stopping);
            }
            // Read under the table's lock: a stop recorded later finds this hold.
            if !run.started && self.stopped_since(&run.run, seen) {
                return Err(NotHeld::Stale);
            }
            let entry = inner.entry(run.run.clone()).or_insert_with(|| Entry {
                holds: 0,
                started: false,
                ending: Shared::default(),
                stopping: false,
            });
            entry.holds += 1;
            entry.started |= run.started;
            Arc::clone(&entry.ending)
        };
        self.pending.send_modify(|n| *n += 1);
        Ok(Hold {
            runs: Arc::clone(self),
            run,
            ending,
            gate: OnceLock::new(),
        })
    }

    /// Wait until `run`'s stop, if one is under way, is recorded (or failed), at most
    /// `bound`.
    pub(super) async fn stop_recorded(&self, run: &str, bound: Duration) {
        let mut made = self.made.subscribe();
        let _ = tokio::time::timeout(
            bound,
            made.wait_for(|_| !self.lock().get(run).is_some_and(|e| e.stopping)),
        )
        .await;
    }

    /// Whether a stop of `run` may have been made since [`Runs::stops`] was `seen`: one
    /// remembered under its name, or more stops than are remembered (the conservative
    /// side). Called under the table's lock.
    fn stopped_since(&self, run: &str, seen: u64) -> bool {
        let now = self.stops();
        if now == seen {
            return false;
        }
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = recent.front().map_or(now.saturating_add(1), |(n, _)| *n);
        oldest > seen.saturating_add(1)
            || recent
                .iter()
                .rev()
                .take_while(|(n, _)| *n > seen)
                .any(|(_, r)| r == run)
    }

    /// How many holds `run` has.
    #[cfg(test)]
    fn holds(&self, run: &str) -> usize {
        self.lock().get(run).map_or(0, |e| e.holds)
    }

    /// A hold on `run` given back: whether it was the last of a run the gateway started
    /// (then the caller stops it), and how.
    fn release(&self, run: &str) -> Option<Reason> {
        let mut inner = self.lock();
        let entry = inner.get_mut(run)?;
        if entry.stopping {
            return None;
        }
        entry.holds = entry.holds.saturating_sub(1);
        if entry.holds > 0 {
            return None;
        }
        if !entry.started {
            inner.remove(run);
            return None;
        }
        let reason = {
            let ending = entry.ending.lock().unwrap_or_else(|p| p.into_inner());
            crate::call::end_reason(ending.unknown_write, ending.last_refusal)
        };
        match reason {
            // Its stop is under way: marked until it is recorded.
            Some(_) => entry.stopping = true,
            None => {
                inner.remove(run);
            }
        }
        reason
    }

    /// `run`'s stop is recorded (or failed): out of the table, and the stop counted
    /// (under the table's lock, so that a hold reads the two together).
    fn stopped(&self, run: &str) {
        {
            let mut inner = self.lock();
            if inner.get(run).is_some_and(|e| e.stopping) {
                inner.remove(run);
            }
            let made = self.stops.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() == RECENT_STOPS {
                recent.pop_front();
            }
            recent.push_back((made, run.to_owned()));
        }
        self.made.send_replace(());
    }

    fn done(&self) {
        self.pending.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Wait until every hold is given back and every stop made, at most `bound`: how
    /// many were still pending then.
    pub(super) async fn settled(&self, bound: Duration) -> usize {
        let mut pending = self.pending.subscribe();
        let _ = tokio::time::timeout(bound, pending.wait_for(|n| *n == 0)).await;
        let left = *pending.borrow();
        left
    }
}

impl Hold {
    /// The run's ending, shared by its sessions.
    pub(super) fn ending(&self) -> &Shared {
        &self.ending
    }

    /// The session's gate worker: its queue goes before the run's stop.
    pub(super) fn bind(&self, gate: Gate) {
        let _ = self.gate.set(gate);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(reason) = self.runs.release(&self.run.run) else {
            self.runs.done();
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            crate::log(&format!(
                "gateway: run {} could not be stopped: no runtime",
                self.run.run
            ));
            self.runs.stopped(&self.run.run);
            self.runs.done();
            return;
        };
        let (runs, run, gate) = (Arc::clone(&self.runs), self.run.clone(), self.gate.take());
        runtime.spawn(async move {
            if let Some(gate) = gate {
                gate.flush().await;
            }
            let stopped = (run.gate)()
                .stop(&run.run, reason, runs.worker.as_deref())
                .await;
            crate::log(&match stopped {
                Ok(_) => format!(
                    "gateway: the last session on run {} ended: stopped ({reason})",
                    run.run
                ),
                Err(e) => format!(
                    "gateway: the last session on run {} ended: it could not be stopped: {e}",
                    run.run
                ),
            });
            runs.stopped(&run.run);
            runs.done();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, started: bool) -> Authorized {
        Authorized {
            run: name.to_owned(),
            started,
            gate: Arc::new(|| tally_api::GateClient::new("/nonexistent")),
        }
    }

    #[test]
    fn a_run_is_stopped_when_its_last_hold_goes_and_only_if_the_gateway_started_it() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", true), 0).expect("held");
        let b = runs.hold(run("r", false), 0).expect("held");
        assert_eq!(runs.holds("r"), 2);
        assert_eq!(runs.release("r"), None, "one left");
        assert_eq!(runs.release("r"), Some(Reason::Completed), "the last");
        assert_eq!(
            runs.release("r"),
            None,
            "given back once: nothing to stop twice"
        );
        std::mem::forget((a, b));
        let _c = runs.hold(run("t", false), 0).expect("held");
        assert_eq!(runs.release("t"), None, "a run the gateway did not start");
    }

    #[test]
    fn the_runs_sessions_share_how_it_ended() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", true), 0).expect("held");
        let b = runs.hold(run("r", false), 0).expect("held");
        b.ending().lock().expect("lock").last_refusal = Some((Reason::Completed, Action::Ask));
        assert!(a.ending().lock().expect("lock").last_refusal.is_some());
        assert_eq!(runs.release("r"), None);
        assert_eq!(
            runs.release("r"),
            None,
            "a refusal waiting for a human: left open"
        );
        std::mem::forget((a, b));
    }

    #[tokio::test]
    async fn a_run_whose_stop_is_under_way_or_was_made_since_it_was_read_is_not_held() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", true), 0).expect("held");
        assert_eq!(runs.release("r"), Some(Reason::Completed));
        // Its stop is under way: a session reading it as running does not attach.
        assert_eq!(runs.hold(run("r", false), 0).err(), Some(NotHeld::Stopping));
        let seen = runs.stops();
        let waiting = {
            let runs = Arc::clone(&runs);
            tokio::spawn(async move { runs.stop_recorded("r", Duration::from_secs(30)).await })
        };
        runs.stopped("r");
        waiting.await.expect("waited");
        // Read as running before the stop was recorded: stale.
        assert_eq!(runs.hold(run("r", false), seen).err(), Some(NotHeld::Stale));
        // Read after: held (the caller read its state again).
        let _b = runs.hold(run("r", false), runs.stops()).expect("held");
        std::mem::forget(a);
    }

    #[test]
    fn stops_of_other_runs_leave_a_reading_fresh_until_too_many_to_tell() {
        let runs = Arc::new(Runs::new(None));
        let seen = runs.stops();
        runs.stopped("other");
        let _a = runs
            .hold(run("r", false), seen)
            .expect("another run's stop: fresh");
        for i in 0..RECENT_STOPS {
            runs.stopped(&format!("o{i}"));
        }
        assert_eq!(
            runs.hold(run("r", false), seen).err(),
            Some(NotHeld::Stale),
            "more stops than remembered since it was read: read again"
        );
        let seen = runs.stops();
        runs.stopped("r");
        runs.stopped("later");
        assert_eq!(runs.hold(run("r", false), seen).err(), Some(NotHeld::Stale));
        let _b = runs.hold(run("q", false), seen).expect("fresh");
    }

    #[tokio::test]
    async fn shutdown_waits_for_every_hold() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", false), 0).expect("held");
        assert_eq!(runs.settled(Duration::from_millis(1)).await, 1);
        drop(a);
        assert_eq!(runs.settled(Duration::from_secs(5)).await, 0);
    }
}
