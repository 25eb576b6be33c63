//! The leased state backend (docs/FLEET.md, "The leased mode"): the gate's state seam
//! over PostgreSQL, where a run with a lease scope is decided at home on this holder
//! ([`super::home`]) and every use it makes of its budget is counted in the holder's
//! slice of the run's scope ([`Slices::take_on`]); whatever no slice covers is refused
//! as unavailable (retry), nothing recorded. A tool's breaker is read from this
//! holder's view where the policy counts nothing per call for tools ([`super::breakers`]:
//! no rate bucket, no limit on calls in flight) and every run the decision named before
//! the tool is at home
//! here; otherwise tools, and always credentials and principals, stay central (their
//! rows locked per decision, as without leases), and so do run starts, pauses, stops
//! and kills of runs at home elsewhere, which take the home back.

mod queued;
mod runs;
mod state;
pub(super) mod txn;
mod view;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tally_policy::RunState;

use super::breakers::{self, ViewLimits, Views};
use super::group::Group;
use super::holder::Slices;
use super::home::{Home, TakenOns};
use super::types::{Scope, ScopeKind};
use crate::Postgres;

/// The gate's state in PostgreSQL with leased runs decided at home on this holder.
pub struct Leased {
    central: Arc<Postgres>,
    slices: Arc<Slices>,
    /// The tools' breakers as this holder sees them ([`super::breakers`]).
    views: Arc<Views>,
    homes: Arc<Mutex<BTreeMap<String, Home>>>,
    /// Where each open attempt's use was counted, apart from the copies (which an
    /// uncommitted decision lets go).
    taken: Arc<Mutex<TakenOns>>,
    /// The group commit of the decisions at home that lock no shared row ([`super::group`]).
    group: Group,
    /// Scopes whose uses are refused for want of room, slices out or not: since when,
    /// and the last tick that found it so ([`Leased::exhausted`]).
    exhausted: Arc<Mutex<BTreeMap<String, Exhausted>>>,
    /// This holder's ticks so far, and the time the last one was run at.
    ticks: Arc<Mutex<(u64, Option<Instant>)>>,
}

/// A scope found with no room left: since the time of the first tick after the first
/// use refused (on the clock passed to the ticks; none before it), the tick count when a
/// use was last refused, and the time of the first tick after that refusal (no earlier
/// than the refusal itself).
#[derive(Clone, Copy, Debug)]
struct Exhausted {
    since: Option<Instant>,
    tick: u64,
    last: Option<Instant>,
}

/// How long a scope found with no room is refused as unavailable first, for a database
/// timeout of `timeout` ([`Leased::grace`]).
fn grace(timeout: Duration) -> Duration {
    timeout.saturating_mul(5)
}

/// Tick `n`, run at `at`, over the scopes found with no room: a scope refused since the
/// last tick is stamped with this tick's time (its grace starts here if it had not), and
/// a scope with no use refused for `forget` on the ticks' clock (twice the grace) is
/// forgotten: its run stopped, got room, or is no longer asked for. A client that retries
/// slowly (even waiting a whole grace between tries) keeps its window.
fn forget_exhausted(
    scopes: &mut BTreeMap<String, Exhausted>,
    n: u64,
    at: Option<Instant>,
    forget: Duration,
) {
    for e in scopes.values_mut() {
        // Refused since the last tick (a refusal reads the tick count holding the
        // scopes' lock): this tick's time is no earlier than it.
        if e.tick + 1 == n {
            e.last = at.or(e.last);
        }
        e.since = e.since.or(at);
    }
    scopes.retain(|_, e| match (e.last, at) {
        (Some(last), Some(now)) => now.saturating_duration_since(last) < forget,
        _ => true,
    });
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("central", &self.central)
            .field("holder", &self.slices.leases().holder())
            .finish_non_exhaustive()
    }
}

impl Leased {
    /// The central backend, with this holder's slices. Every tick of the slices ends
    /// with the tools' breakers' views flushed and refreshed.
    /// The tick's report says what the views did ([`BreakersTicked`](super::BreakersTicked)), and the
    /// holder's lease metrics count it. Fails only if the group commit's thread cannot
    /// be started.
    pub fn new(
        central: Postgres,
        slices: Arc<Slices>,
        limits: ViewLimits,
    ) -> std::io::Result<Leased> {
        // Every use of its slices is committed with its decision (`runs`): its slices
        // count their committed use, which a reclaim settles.
        slices.leases().commits_use();
        let (central, views) = (Arc::new(central), Arc::new(Views::new(limits)));
        let (c, v, s) = (
            Arc::downgrade(&central),
            Arc::downgrade(&views),
            Arc::downgrade(&slices),
        );
        let ticks = Arc::new(Mutex::new((0, None)));
        let exhausted: Arc<Mutex<BTreeMap<String, Exhausted>>> = Arc::default();
        let (t, x) = (Arc::downgrade(&ticks), Arc::downgrade(&exhausted));
        let forget = grace(central.timeout).saturating_mul(2);
        slices.after_tick(Box::new(move |ticked| {
            if let (Some(t), Some(x)) = (Weak::upgrade(&t), Weak::upgrade(&x)) {
                let n = {
                    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                    *t = (t.0 + 1, ticked.at.or(t.1));
                    t.0
                };
                let mut x = x.lock().unwrap_or_else(|e| e.into_inner());
                forget_exhausted(&mut x, n, ticked.at, forget);
            }
            if let (Some(c), Some(v)) = (Weak::upgrade(&c), Weak::upgrade(&v)) {
                breakers::flush(&c, &v, &mut ticked.breakers);
                breakers::refresh(&c, &v, &mut ticked.breakers);
                if let Some(s) = Weak::upgrade(&s) {
                    s.metrics().breakers(&ticked.breakers);
                }
            }
        }));
        let homes = Arc::new(Mutex::new(BTreeMap::new()));
        let group = Group::start(&central, Arc::clone(&homes))?;
        Ok(Leased {
            central,
            slices,
            views,
            homes,
            taken: Arc::new(Mutex::new(BTreeMap::new())),
            group,
            exhausted,
            ticks,
        })
    }

    /// The holder's slices (its counters, its ticks).
    pub fn slices(&self) -> &Arc<Slices> {
        &self.slices
    }

    /// Outcomes seen here whose breaker's fold has not reached the tool's row yet (the
    /// next tick, or [`StateBackend::close`], folds them there).
    pub fn unflushed(&self) -> usize {
        self.views.pending()
    }

    /// Decisions waiting in the group commit now, and whether a commit of them is in
    /// flight ([`super::group`]).
    pub fn group_pending(&self) -> (usize, bool) {
        self.group.pending()
    }

    /// Decisions waiting now for the group commit to drain before they send anything
    /// ([`super::group`]).
    pub fn group_draining(&self) -> usize {
        self.group.draining()
    }

    /// The runs at home here now, by name.
    pub fn at_home(&self) -> Vec<String> {
        self.homes().keys().cloned().collect()
    }

    /// This process as a run's home: its holder's name and epoch (two processes under
    /// one name never pass each other's guard).
    fn me_now(&self) -> (String, i64) {
        let leases = self.slices.leases();
        (leases.holder().to_owned(), leases.epoch())
    }

    fn homes(&self) -> MutexGuard<'_, BTreeMap<String, Home>> {
        self.homes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A use of `run` refused for want of a slice (counted as the slices' own refusals).
    fn refused(&self, run: &str) {
        let scope = vec![Scope::new(ScopeKind::Run, run)];
        self.slices.event(super::LeaseEvent::Refused { scope });
    }

    /// A use refused because its scope (`kind`, `key`) has no room left even with no
    /// slice out (`SliceError::Exhausted`). Refused as unavailable (retry; the run's
    /// copy is let go) until [`Leased::grace`] has passed on the clock the ticks are run
    /// with, from the first tick after this holder first found it so (a scope with no use
    /// refused so for twice the grace is forgotten, and starts again): for a moment the scope may count a use the
    /// run's row does not hold yet (a decision of another daemon, counted in a slice it
    /// gave back, whose group commit is still writing the row, or refused and about to
    /// give the use back). After that, the budget's own refusal
    /// ([`crate::txn::out_of_room`]: action ask), every time, not a retry that would be
    /// refused forever.
    fn exhausted(&self, kind: &'static str, key: String) -> tally_gate::GateError {
        let grace = self.grace();
        let (since, at) = {
            let mut scopes = self.exhausted.lock().unwrap_or_else(|e| e.into_inner());
            let (tick, at) = *self.ticks.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = Exhausted {
                since: None,
                tick,
                last: None,
            };
            let seen = scopes.entry(key.clone()).or_insert(fresh);
            seen.tick = tick;
            (seen.since, at)
        };
        let out = matches!((since, at), (Some(s), Some(now)) if now.saturating_duration_since(s) >= grace);
        if out {
            return tally_gate::GateError::Refused(crate::txn::out_of_room(kind));
        }
        tally_gate::GateError::Unavailable(format!(
            "lease scope {kind} `{key}` has no room left for this use, though the run's row may be behind it for a moment: retry (if it stays so, the budget's own refusal follows after {} ms of lease ticks)",
            grace.as_millis()
        ))
    }

    /// How long a scope found with no room is refused as unavailable first: twice the
    /// group commit's drain bound (two database timeouts each) and one database timeout,
    /// so a decision counted in a slice given back has written its run's row, or given
    /// the use back, by then.
    fn grace(&self) -> Duration {
        grace(self.central.timeout)
    }

    /// A use of `run`'s scope counted: its scope had room.
    fn has_room(&self, run: &str) {
        let mut runs = self.exhausted.lock().unwrap_or_else(|e| e.into_inner());
        runs.remove(run);
    }

    fn taken(&self) -> MutexGuard<'_, TakenOns> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A run read from its row: where its attempts no longer open were counted is
    /// forgotten (they closed elsewhere).
    fn prune(&self, run: &str, state: &RunState) {
        let mut taken = self.taken();
        if let Some(on) = taken.get_mut(run) {
            on.retain(|a, _| state.open.contains_key(a));
        }
    }

    /// The copy of `run` kept here, while this holder holds a slice of the run's scope:
    /// once its slice went back (idle, near its deadline, revoked), another daemon may
    /// take the run, so the copy is let go and the row read again.
    fn kept(&self, run: &str) -> Option<Home> {
        let scope = Scope::new(ScopeKind::Run, run);
        let mut homes = self.homes();
        if self.slices.held(&scope).is_none() {
            homes.remove(run);
        }
        homes.get(run).cloned()
    }
}
