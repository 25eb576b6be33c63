//! What each key's runs used this UTC day, for its own budget per day (docs/KEYS.md, "A
//! key's budget per day"), and how many of its calls were refused, by reason. The rule
//! (does a call or a start fit the day) is the policy core's
//! ([`tally_policy::key_call_fits`], [`tally_policy::key_run_fits`]); this holds the
//! counts it is asked with, under one lock, so the count read and the reservation taken
//! are one step: concurrent calls of one key never reserve past its budget together.
//!
//! A call's reservation is held at its check and settled by its outcome (what the
//! upstream reported, an overrun in full; an `unknown` outcome keeps it held). The
//! counts of a key are read from the gate's runs of the day the first time the key is
//! used after the daemon starts ([`KeySpend::seed`]): a restart never resets them.
//! One entry per key: memory is bounded by the keys made.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tally_policy::{
    key_call_day, key_call_fits, key_run_fits, KeyDayExceeded, KeyDayLimits, KeyDayUse,
};

/// Why a call with a key was refused: the only values of the metric's `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRefusal {
    /// Spelt as a key, but not a key of this tally (or the wrong secret).
    InvalidKey,
    /// A revoked key.
    KeyRevoked,
    /// The key's budget per day.
    BudgetExceeded,
    /// The key's runs per day.
    RunsExceeded,
    /// The key's principal has no budget in the policy.
    PrincipalUnbounded,
    /// A bad `x-tally-task`.
    InvalidTask,
}

impl KeyRefusal {
    /// Every reason, in the order they are listed.
    pub const ALL: [KeyRefusal; 6] = [
        KeyRefusal::InvalidKey,
        KeyRefusal::KeyRevoked,
        KeyRefusal::BudgetExceeded,
        KeyRefusal::RunsExceeded,
        KeyRefusal::PrincipalUnbounded,
        KeyRefusal::InvalidTask,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRefusal::InvalidKey => "invalid_key",
            KeyRefusal::KeyRevoked => "key_revoked",
            KeyRefusal::BudgetExceeded => "budget_exceeded",
            KeyRefusal::RunsExceeded => "runs_exceeded",
            KeyRefusal::PrincipalUnbounded => "principal_unbounded",
            KeyRefusal::InvalidTask => "invalid_task",
        }
    }

    fn index(self) -> usize {
        KeyRefusal::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
}

/// A call's reservation held against its key's day, until its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyCharge {
    id: String,
    day: u64,
    held: u64,
}

/// A call's charge on its key's day, owned: given back when dropped unless its outcome
/// took it over ([`KeyHold::settle`]). A call dropped between its hold and its settle
/// (the client gone during the gate's check, an early return) never keeps its hold.
#[derive(Debug)]
pub struct KeyHold {
    spend: Arc<KeySpend>,
    charge: Option<KeyCharge>,
}

impl KeyHold {
    /// `charge`, held on `spend`, given back unless settled.
    pub fn new(spend: Arc<KeySpend>, charge: KeyCharge) -> KeyHold {
        KeyHold {
            spend,
            charge: Some(charge),
        }
    }

    /// The call's outcome takes the charge over ([`KeySpend::settle`]: `None` keeps it
    /// held, as the run keeps its reservation).
    pub fn settle(mut self, settled: Option<u64>) {
        if let Some(c) = self.charge.take() {
            self.spend.settle(&c, settled);
        }
    }
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        if let Some(c) = self.charge.take() {
            self.spend.release(&c);
        }
    }
}

/// A run start counted against its key's day, owned: given back when dropped unless the
/// run was started ([`RunSlot::started`]). Exactly once: a start refused, one another
/// call made first, a client gone before the gate answered, a start the gate never
/// answered each give it back when the slot is dropped, wherever that happens (move it
/// into the gate's answer, so a client that goes away changes nothing).
#[derive(Debug)]
pub struct RunSlot {
    spend: Arc<KeySpend>,
    id: String,
    day: u64,
    started: bool,
}

impl RunSlot {
    /// The run was started: the slot stays counted.
    pub fn started(mut self) {
        self.started = true;
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        if !self.started {
            self.spend.unstart(&self.id, self.day);
        }
    }
}

/// Each key's counts of the day, and the refusals of key calls.
#[derive(Debug, Default)]
pub struct KeySpend {
    days: Mutex<BTreeMap<String, KeyDayUse>>,
    refusals: [AtomicU64; 6],
}

impl KeySpend {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KeyDayUse>> {
        self.days.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the key `id` has counts here (else they are to be read from the gate, once).
    pub fn seeded(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The key's counts as read from the gate's runs of the day (`used`), unless it has
    /// counts already: a call that raced this one to seed them may have reserved since.
    pub fn seed(&self, id: &str, used: KeyDayUse) {
        self.lock().entry(id.to_owned()).or_insert(used);
    }

    /// The key's counts as of `now_ms`, if it has any.
    pub fn usage(&self, id: &str, now_ms: u64) -> Option<KeyDayUse> {
        self.lock().get(id).map(|u| u.at(now_ms))
    }

    /// Hold `reserve` nanodollars against the key's day, if the call fits it and its
    /// run, named at `named_ms`, is of the day of `now_ms` ([`key_call_day`]).
    pub fn hold(
        &self,
        id: &str,
        limits: &KeyDayLimits,
        (named_ms, now_ms): (u64, u64),
        reserve: u64,
    ) -> Result<KeyCharge, KeyDayExceeded> {
        key_call_day(named_ms, now_ms)?;
        let mut days = self.lock();
        let entry = days.entry(id.to_owned()).or_default();
        let mut used = entry.at(now_ms);
        key_call_fits(limits, &used, reserve)?;
        used.held_nanos = used.held_nanos.saturating_add(reserve);
        *entry = used;
        Ok(KeyCharge {
            id: id.to_owned(),
            day: used.day,
            held: reserve,
        })
    }

    /// The charge released: the call was refused or never made.
    pub fn release(&self, charge: &KeyCharge) {
        self.settle(charge, Some(0));
    }

    /// The charge's outcome: `Some(n)` settles `n` (an overrun in full) and releases the
    /// reservation; `None` (nothing known of what the upstream did) keeps it held. A
    /// charge of a day past is dropped with that day.
    pub fn settle(&self, charge: &KeyCharge, settled: Option<u64>) {
        let Some(n) = settled else { return };
        let mut days = self.lock();
        if let Some(u) = days.get_mut(&charge.id).filter(|u| u.day == charge.day) {
            u.held_nanos = u.held_nanos.saturating_sub(charge.held);
            u.settled_nanos = u.settled_nanos.saturating_add(n);
        }
    }

    /// Count a run start against the key's day, if the key may start one more.
    pub fn start_run(
        self: &Arc<Self>,
        id: &str,
        limits: &KeyDayLimits,
        now_ms: u64,
    ) -> Result<RunSlot, KeyDayExceeded> {
        let mut days = self.lock();
        let entry = days.entry(id.to_owned()).or_default();
        let mut used = entry.at(now_ms);
        key_run_fits(limits, &used)?;
        used.runs = used.runs.saturating_add(1);
        *entry = used;
        Ok(RunSlot {
            spend: Arc::clone(self),
            id: id.to_owned(),
            day: used.day,
            started: false,
        })
    }

    /// A start counted on `day` of key `id` did not happen (refused, or another call
    /// started the run): its slot dropped unstarted.
    fn unstart(&self, id: &str, day: u64) {
        let mut days = self.lock();
        if let Some(u) = days.get_mut(id).filter(|u| u.day == day) {
            u.runs = u.runs.saturating_sub(1);
        }
    }

    /// A key call refused for `why`.
    pub fn refused(&self, why: KeyRefusal) {
        self.refusals[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The key calls refused so far, by reason (every reason, 0 too).
    pub fn refusals(&self) -> [(KeyRefusal, u64); 6] {
        KeyRefusal::ALL.map(|r| (r, self.refusals[r.index()].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_policy::key_day::DAY_MS;

    const LIMITS: KeyDayLimits = KeyDayLimits {
        spend_nanos: Some(1_000),
        runs: Some(1),
    };

    #[test]
    fn holds_settle_and_release_within_the_day_and_a_new_day_starts_from_nothing() {
        let s = Arc::new(KeySpend::default());
        let now = 10 * DAY_MS + 5;
        s.seed("k", KeyDayUse::default().at(now));
        let a = s.hold("k", &LIMITS, (now, now), 500).expect("fits");
        let b = s.hold("k", &LIMITS, (now, now), 500).expect("fits exactly");
        assert!(s.hold("k", &LIMITS, (now, now), 1).is_err(), "1000 held");
        s.release(&b);
        // An overrun settles in full: 700 for a reservation of 500.
        s.settle(&a, Some(700));
        let used = s.usage("k", now).expect("seeded");
        assert_eq!((used.settled_nanos, used.held_nanos), (700, 0));
        assert!(s.hold("k", &LIMITS, (now, now), 301).is_err());
        // An unknown outcome keeps its reservation held.
        let c = s.hold("k", &LIMITS, (now, now), 300).expect("fits");
        s.settle(&c, None);
        assert_eq!(s.usage("k", now).map(|u| u.held_nanos), Some(300));
        // One run a day; the day turns on the time passed in, not a sleep.
        s.start_run("k", &LIMITS, now).expect("first run").started();
        assert!(s.start_run("k", &LIMITS, now).is_err());
        let tomorrow = 11 * DAY_MS;
        assert!(s
            .hold("k", &LIMITS, (tomorrow - 1, tomorrow - 1), 1)
            .is_err());
        let d = s
            .hold("k", &LIMITS, (tomorrow, tomorrow), 1_000)
            .expect("a new day");
        let slot = s
            .start_run("k", &LIMITS, tomorrow)
            .expect("a new day's run");
        drop(slot);
        s.start_run("k", &LIMITS, tomorrow)
            .expect("the slot was given back")
            .started();
        // Yesterday's charge settling today changes nothing of today.
        s.settle(&c, Some(5));
        s.settle(&d, Some(10));
        let used = s.usage("k", tomorrow).expect("seeded");
        assert_eq!((used.settled_nanos, used.held_nanos, used.runs), (10, 0, 1));
    }

    #[test]
    fn a_hold_dropped_unsettled_is_given_back_and_a_settled_one_is_not() {
        let s = Arc::new(KeySpend::default());
        let now = 3 * DAY_MS;
        let dropped = s.hold("k", &LIMITS, (now, now), 400).expect("fits");
        drop(KeyHold::new(Arc::clone(&s), dropped));
        assert_eq!(s.usage("k", now).map(|u| u.held_nanos), Some(0));
        let unknown = s.hold("k", &LIMITS, (now, now), 400).expect("fits");
        KeyHold::new(Arc::clone(&s), unknown).settle(None);
        let settled = s.hold("k", &LIMITS, (now, now), 100).expect("fits");
        KeyHold::new(Arc::clone(&s), settled).settle(Some(60));
        let used = s.usage("k", now).expect("counts");
        assert_eq!((used.held_nanos, used.settled_nanos), (400, 60));
    }

    /// A slot is given back exactly once, whether the start was refused, never answered,
    /// or answered after its client went away; a started one stays counted.
    #[test]
    fn a_run_slot_not_started_is_given_back_once_wherever_it_is_dropped() {
        let s = Arc::new(KeySpend::default());
        let limits = KeyDayLimits {
            spend_nanos: None,
            runs: Some(2),
        };
        let now = 5 * DAY_MS;
        let runs = |s: &KeySpend| s.usage("k", now).map(|u| u.runs);
        let first = s.start_run("k", &limits, now).expect("fits");
        let second = s.start_run("k", &limits, now).expect("fits");
        assert!(s.start_run("k", &limits, now).is_err(), "two counted");
        // The gate's answer owns the slot: the client is gone, the answer (a refusal)
        // still arrives on another thread and drops it there.
        let answer = move |started: bool| {
            if started {
                second.started();
            }
        };
        std::thread::spawn(move || answer(false))
            .join()
            .expect("the answer");
        assert_eq!(runs(&s), Some(1), "given back once");
        first.started();
        assert_eq!(runs(&s), Some(1), "a started run stays counted");
        let third = s
            .start_run("k", &limits, now)
            .expect("the slot given back fits");
        drop(third);
        assert_eq!(runs(&s), Some(1));
    }

    #[test]
    fn a_call_named_before_midnight_and_held_after_it_holds_nothing() {
        let s = KeySpend::default();
        let midnight = 4 * DAY_MS;
        assert_eq!(
            s.hold("k", &LIMITS, (midnight - 1, midnight), 1),
            Err(KeyDayExceeded::DayTurned {
                named_day: 3,
                day: 4
            })
        );
        assert_eq!(s.usage("k", midnight), None, "nothing held, no day begun");
    }

    #[test]
    fn a_seed_never_overwrites_counts_a_call_made() {
        let s = KeySpend::default();
        s.seed("k", KeyDayUse::default());
        let _held = s.hold("k", &LIMITS, (0, 0), 100).expect("fits");
        s.seed(
            "k",
            KeyDayUse {
                settled_nanos: 1,
                ..KeyDayUse::default()
            },
        );
        assert_eq!(s.usage("k", 0).map(|u| u.held_nanos), Some(100));
        s.refused(KeyRefusal::BudgetExceeded);
        s.refused(KeyRefusal::BudgetExceeded);
        let counts = s.refusals();
        assert_eq!(counts[2], (KeyRefusal::BudgetExceeded, 2));
        assert_eq!(counts.iter().map(|(_, n)| n).sum::<u64>(), 2);
    }
}
