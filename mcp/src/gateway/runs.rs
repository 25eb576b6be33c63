//! The runs the gateway's sessions act in, each with a count of what holds it: an
//! `initialize` being answered, then the session it opened. A run the gateway started
//! (a key's new run) is stopped when the last of them lets go, and only then: two
//! sessions of one key share its run, and the first to end does not stop it under the
//! other. Each hold is given back exactly once (its drop), so the stop is made exactly
//! once; the gateway's shutdown waits until every hold is given back and every stop
//! made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tally_record::{Action, Reason};
use tokio::sync::watch;

use super::Authorized;
use crate::gate::Gate;

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
}

/// The runs held, by name.
pub(super) struct Runs {
    inner: Mutex<HashMap<String, Entry>>,
    /// Holds not given back and stops not made yet.
    pending: watch::Sender<usize>,
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
            worker,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more hold on `run` (its `started` counts: the run is then the gateway's to
    /// stop).
    pub(super) fn hold(self: &Arc<Self>, run: Authorized) -> Hold {
        let ending = {
            let mut inner = self.lock();
            let entry = inner.entry(run.run.clone()).or_insert_with(|| Entry {
                holds: 0,
                started: false,
                ending: Shared::default(),
            });
            entry.holds += 1;
            entry.started |= run.started;
            Arc::clone(&entry.ending)
        };
        self.pending.send_modify(|n| *n += 1);
        Hold {
            runs: Arc::clone(self),
            run,
            ending,
            gate: OnceLock::new(),
        }
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
        entry.holds = entry.holds.saturating_sub(1);
        if entry.holds > 0 {
            return None;
        }
        let entry = inner.remove(run)?;
        if !entry.started {
            return None;
        }
        let ending = entry.ending.lock().unwrap_or_else(|p| p.into_inner());
        crate::call::end_reason(ending.unknown_write, ending.last_refusal)
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
        let a = runs.hold(run("r", true));
        let b = runs.hold(run("r", false));
        assert_eq!(runs.holds("r"), 2);
        assert_eq!(runs.release("r"), None, "one left");
        assert_eq!(runs.release("r"), Some(Reason::Completed), "the last");
        assert_eq!(
            runs.release("r"),
            None,
            "given back once: nothing to stop twice"
        );
        std::mem::forget((a, b));
        let _c = runs.hold(run("t", false));
        assert_eq!(runs.release("t"), None, "a run the gateway did not start");
    }

    #[test]
    fn the_runs_sessions_share_how_it_ended() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", true));
        let b = runs.hold(run("r", false));
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
    async fn shutdown_waits_for_every_hold() {
        let runs = Arc::new(Runs::new(None));
        let a = runs.hold(run("r", false));
        assert_eq!(runs.settled(Duration::from_millis(1)).await, 1);
        drop(a);
        assert_eq!(runs.settled(Duration::from_secs(5)).await, 0);
    }
}
