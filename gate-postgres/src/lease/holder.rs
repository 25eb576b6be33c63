//! One daemon's side of leased slices (docs/FLEET.md, "Deciding inside slices"): the
//! slices it holds, what it used of each, and the one question a decision asks of them,
//! [`Slices::take`]: does this use fit in the slices held for every scope it touches?
//! Inside them it is answered locally, with no round trip; otherwise the holder refills
//! (one grant, sized by [`tally_policy::slice_for`] from the scope's outlook), or, when
//! the last units must not be leased to one host, spends centrally
//! ([`Leases::spend`]), or refuses.
//!
//! Time is passed in (`now`, the local monotonic clock): a slice is used only until the
//! moment its grant was asked for plus its validity, less the skew margin, so it is never
//! used past the database's expiry. While the database is away, uses that fit in a slice
//! still valid go on; any other is refused [`SliceError::Unavailable`] (retry).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tally_policy::{fits_in_slice, slice_for, SliceSize, SliceUse};

use super::events::{on_lease_event, LeaseEvent, LeaseMetrics, Sink};
use super::tick::Ticked;
use super::types::{Amounts, Grant, Lease, LeaseError, Released, Spent};
use super::{Leases, Scope};

/// How a holder sizes, keeps and gives back its slices.
#[derive(Clone, Debug)]
pub struct SliceOptions {
    /// The smallest slice worth a lease, per dimension (0 counts as 1).
    pub floor: Amounts,
    /// Hosts that were granted a slice of a scope within this window count as asking.
    pub window: Duration,
    /// A slice not used for this long is given back at the next [`Slices::tick`].
    pub idle: Duration,
    /// A slice is not used within this margin of its deadline (clock skew, latency).
    pub margin: Duration,
}

impl Default for SliceOptions {
    /// Slices of at least one unit, hosts counted over 10 s, idle after 5 s, 1 s margin.
    fn default() -> SliceOptions {
        SliceOptions {
            floor: Amounts::default(),
            window: Duration::from_secs(10),
            idle: Duration::from_secs(5),
            margin: Duration::from_secs(1),
        }
    }
}

/// How a use was allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Taken {
    /// Inside the slices held: no round trip.
    Local,
    /// In the database, one decision at a time (the last units of a scope).
    Central,
}

/// Why a use was not allowed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    /// The scope has no room left for it (slices out elsewhere count as unavailable).
    #[error("lease scope {kind} `{key}`: no room left for this use")]
    Exhausted {
        /// The scope's kind.
        kind: &'static str,
        /// Its key.
        key: String,
    },
    /// What the scope has left is in other hosts' slices: refused for now (the gate's
    /// `gate_unavailable`, retry); they return it when used up, idle or expired.
    #[error("lease scope {kind} `{key}`: what is left is leased to other hosts; retry")]
    Leased {
        /// The scope's kind.
        kind: &'static str,
        /// Its key.
        key: String,
    },
    /// The scope's slices are revoked (its run paused or killed).
    #[error("lease scope {kind} `{key}`: its slices are revoked (paused or killed)")]
    Revoked {
        /// The scope's kind.
        kind: &'static str,
        /// Its key.
        key: String,
    },
    /// The use does not fit in a slice held and the database did not answer: refused,
    /// nothing spent (the gate's `gate_unavailable`, retry).
    #[error(transparent)]
    Unavailable(LeaseError),
    /// A use of no scope: no slice would count it. Decide it centrally.
    #[error("a use of no lease scope: no slice counts it; decide it centrally")]
    NoScope,
}

/// A slice held, and what of it was used.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) lease: Lease,
    pub(super) used: Amounts,
    /// When the grant (or last renewal) was asked for, plus its validity.
    pub(super) deadline: Instant,
    pub(super) last_used: Instant,
    /// The dimensions the scope caps (when the slice was granted): only they are
    /// counted against it.
    pub(super) capped: [bool; 4],
}

#[derive(Default)]
pub(super) struct Local {
    pub(super) held: BTreeMap<Scope, Held>,
    /// Slices to give back whose return the database has not confirmed.
    pub(super) unreturned: Vec<(Lease, Amounts)>,
    /// When this holder was last granted a slice of a scope (it then counts among the
    /// hosts the outlook saw).
    granted: BTreeMap<Scope, Instant>,
    /// Slices whose return settled all this holder said it used of them
    /// ([`Released::Returned`] or [`Released::Refunded`]), and what of that a use
    /// rolled back since may still give back ([`Slices::untake`]). The latest
    /// [`COVERED`] only (a use rolls back within a group commit's time of its take).
    covered: BTreeMap<i64, Amounts>,
    /// [`Local::covered`]'s ids in the order their returns were answered, oldest first
    /// (a slice's id says when it was granted, not when it went back).
    covered_order: std::collections::VecDeque<i64>,
}

/// How many returned slices [`Local::covered`] remembers.
const COVERED: usize = 4096;

/// Slice `id`'s return answered `r`: remembered if it settled `used`.
fn cover(local: &mut Local, id: i64, used: Amounts, r: &Result<Released, LeaseError>) {
    if let Ok(Released::Returned | Released::Refunded) = r {
        if local.covered.insert(id, used).is_none() {
            local.covered_order.push_back(id);
        }
        while local.covered.len() > COVERED {
            match local.covered_order.pop_front() {
                Some(oldest) => local.covered.remove(&oldest),
                None => local.covered.pop_first().map(|(_, a)| a),
            };
        }
    }
}

/// Slices this holder stopped holding whose return the database refused (a used amount
/// it would not take: [`LeaseEvent::Lost`]): left out to be reclaimed (settling its
/// committed use, or the whole slice where that is not known), never given back at zero
/// use by a tick that finds them unseen.
pub(super) type LostIds = BTreeSet<i64>;

/// One holder's slices (one daemon), over its lease manager.
pub struct Slices {
    pub(super) leases: Leases,
    pub(super) options: SliceOptions,
    local: Mutex<Local>,
    /// Slices lost: see [`LostIds`].
    pub(super) lost: Mutex<LostIds>,
    /// One [`Slices::tick`] at a time: a tick's give-backs are off the holder's lock, so
    /// a second tick could otherwise find one in flight and take it for unseen.
    pub(super) ticking: Mutex<()>,
    metrics: LeaseMetrics,
    sink: Option<Sink>,
    /// Run at the end of every tick, on the lease thread (the leased backend's breaker
    /// views flushed and refreshed: [`Slices::after_tick`]).
    after: Mutex<Option<AfterTick>>,
}

/// Work done at the end of every tick.
pub(crate) type AfterTick = Box<dyn Fn(&mut Ticked) + Send + Sync>;

fn add(a: &Amounts, b: &Amounts) -> Amounts {
    let (a, b) = (a.each(), b.each());
    Amounts::from_each([0, 1, 2, 3].map(|i| a[i].saturating_add(b[i])))
}

/// Amounts as the policy core counts a use.
pub(super) fn use_of(a: &Amounts) -> SliceUse {
    SliceUse {
        attempts: a.attempts,
        nanos: a.nanos,
        side_effects: a.effects,
        polls: a.polls,
    }
}

impl Held {
    /// Whether `need` fits in what is left of the slice at `now`.
    fn covers(&self, need: &Amounts, now: Instant, margin: Duration) -> bool {
        now + margin < self.deadline
            && fits_in_slice(
                &use_of(&self.counted(need)),
                &use_of(&self.used),
                &use_of(&self.lease.granted),
            )
    }

    /// `need` in the dimensions the scope caps (a dimension without a cap is not leased).
    pub(super) fn counted(&self, need: &Amounts) -> Amounts {
        let n = need.each();
        Amounts::from_each([0, 1, 2, 3].map(|i| if self.capped[i] { n[i] } else { 0 }))
    }
}

impl Slices {
    /// A holder over `leases`: the slices it adopted (an earlier process of the same
    /// holder left them out) are given back first, each saying it used what `used_of`
    /// says (what this holder's ledger recorded of it, or its committed use; the whole
    /// slice when unknown). A return never settles less than the committed use.
    pub fn open(
        leases: Leases,
        options: SliceOptions,
        used_of: impl Fn(&Lease) -> Amounts,
        sink: Option<Sink>,
    ) -> Slices {
        let slices = Slices {
            leases,
            options,
            local: Mutex::new(Local::default()),
            lost: Mutex::new(LostIds::new()),
            ticking: Mutex::new(()),
            metrics: LeaseMetrics::default(),
            sink,
            after: Mutex::new(None),
        };
        let mut local = slices.lock();
        for lease in slices.leases.adopted().to_vec() {
            let used = used_of(&lease);
            slices.event(LeaseEvent::Adopted(lease.clone()));
            slices.give_back(&mut local, lease, used);
        }
        drop(local);
        slices
    }

    /// The lease manager (to define scopes, revoke, read outlooks).
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The counters of lease events so far.
    pub fn metrics(&self) -> &LeaseMetrics {
        &self.metrics
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn event(&self, event: LeaseEvent) {
        on_lease_event(&self.metrics, self.sink.as_ref(), &event);
    }

    /// Use `need` in every scope of `scopes` (a run's, its principal's), at `now`:
    /// locally if it fits in every slice held, else after refilling, else centrally.
    /// Never a use that no slice covered and the database did not settle.
    pub fn take(&self, scopes: &[Scope], need: Amounts, now: Instant) -> Result<Taken, SliceError> {
        self.take_at(scopes, need, || now)
    }

    /// [`Slices::take`], the time read by `clock` once the holder's lock is held, and
    /// again after any refill: a use that waited for the lock (behind another's refill),
    /// or for its own refills' round trips, is judged against every slice's deadline
    /// when it is decided, not when it asked. No scope: [`SliceError::NoScope`].
    pub fn take_at(
        &self,
        scopes: &[Scope],
        need: Amounts,
        clock: impl Fn() -> Instant,
    ) -> Result<Taken, SliceError> {
        self.take_on(scopes, need, clock).map(|(taken, _)| taken)
    }

    /// [`Slices::take_at`], saying also the slice of the first scope the use was
    /// counted on (`None`: taken centrally): what it gives back later is given back on
    /// that slice only ([`Slices::give_on`]). Every refusal, whatever its cause (no
    /// room, slices out elsewhere, revoked, a refill the database did not answer), is
    /// counted as [`LeaseEvent::Refused`].
    pub fn take_on(
        &self,
        scopes: &[Scope],
        need: Amounts,
        clock: impl Fn() -> Instant,
    ) -> Result<(Taken, Option<i64>), SliceError> {
        let r = self.take_counted(scopes, need, clock);
        if matches!(r, Err(ref e) if !matches!(e, SliceError::NoScope)) {
            self.event(LeaseEvent::Refused {
                scope: scopes.to_vec(),
            });
        }
        r
    }

    fn take_counted(
        &self,
        scopes: &[Scope],
        need: Amounts,
        clock: impl Fn() -> Instant,
    ) -> Result<(Taken, Option<i64>), SliceError> {
        if scopes.is_empty() {
            return Err(SliceError::NoScope);
        }
        let mut local = self.lock();
        let now = clock();
        let margin = self.options.margin;
        let short: Vec<Scope> = scopes
            .iter()
            .filter(|s| {
                !local
                    .held
                    .get(*s)
                    .is_some_and(|h| h.covers(&need, now, margin))
            })
            .cloned()
            .collect();
        let mut central = false;
        for scope in &short {
            if !self.refill(&mut local, scope, &need, now)? {
                central = true;
                break;
            }
        }
        // The refills' round trips took time: every slice covers the use at the time it
        // is decided, or it goes the central way.
        let now = if short.is_empty() { now } else { clock() };
        central = central
            || !scopes.iter().all(|s| {
                local
                    .held
                    .get(s)
                    .is_some_and(|h| h.covers(&need, now, margin))
            });
        if !central {
            for scope in scopes {
                if let Some(h) = local.held.get_mut(scope) {
                    h.used = add(&h.used, &h.counted(&need));
                    h.last_used = now;
                }
            }
            let on = scopes.first().and_then(|s| local.held.get(s));
            return Ok((Taken::Local, on.map(|h| h.lease.id)));
        }
        // The host's own slices of these scopes go back first: its remnants never keep
        // the last units from the central path.
        for scope in scopes {
            if let Some(h) = local.held.remove(scope) {
                self.give_back(&mut local, h.lease, h.used);
            }
        }
        drop(local);
        self.central(scopes, need).map(|taken| (taken, None))
    }

    fn central(&self, scopes: &[Scope], need: Amounts) -> Result<Taken, SliceError> {
        let first = scopes.first().map(|s| (s.kind.as_str(), s.key.clone()));
        let (kind, key) = first.unwrap_or(("run", String::new()));
        match self.leases.spend(scopes, need) {
            Ok(Spent::Spent) => Ok(Taken::Central),
            Ok(Spent::Revoked) => Err(SliceError::Revoked { kind, key }),
            Ok(Spent::Leased) => Err(SliceError::Leased { kind, key }),
            Ok(_) => Err(SliceError::Exhausted { kind, key }),
            Err(e) => Err(SliceError::Unavailable(e)),
        }
    }

    /// Replace the slice of `scope` by one covering `need`: `Ok(false)` when the scope's
    /// last units must be served centrally (or the grant lost a race for them).
    fn refill(
        &self,
        local: &mut Local,
        scope: &Scope,
        need: &Amounts,
        now: Instant,
    ) -> Result<bool, SliceError> {
        // A scope not known (not defined yet, or its row gone) is no scope out of room:
        // refused as unavailable (retry), never as the budget's reason.
        let unavailable = SliceError::Unavailable;
        if let Some(h) = local.held.remove(scope) {
            match self.leases.release(h.lease.id, h.used) {
                Err(e @ LeaseError::Unavailable { .. }) => {
                    local.held.insert(scope.clone(), h);
                    return Err(SliceError::Unavailable(e));
                }
                r => self.returned_in(local, h.lease, h.used, r),
            }
        }
        let outlook = self
            .leases
            .outlook(scope, self.options.window)
            .map_err(unavailable)?;
        let counted = local
            .granted
            .get(scope)
            .is_some_and(|t| now.duration_since(*t) <= self.options.window);
        let holders = outlook.holders + u64::from(!counted);
        let (left, floor, need) = (outlook.left.each(), self.options.floor.each(), need.each());
        let mut want = [0u64; 4];
        for d in 0..4 {
            let Some(left) = left[d] else { continue };
            match slice_for(left, holders, floor[d], need[d]) {
                SliceSize::Lease(n) => want[d] = n,
                _ if need[d] == 0 => {}
                _ => return Ok(false),
            }
        }
        let want = Amounts::from_each(want);
        if want == Amounts::default() {
            // Nothing to lease (no cap, or only dimensions this use does not need are
            // exhausted): decided centrally.
            return Ok(false);
        }
        match self.leases.grant(scope, want).map_err(unavailable)? {
            Grant::Granted(lease) => {
                local.granted.insert(scope.clone(), now);
                self.event(LeaseEvent::Granted(lease.clone()));
                let deadline = now + lease.valid_for;
                let used = Amounts::default();
                let held = Held {
                    lease,
                    used,
                    deadline,
                    last_used: now,
                    capped: left.map(|c| c.is_some()),
                };
                local.held.insert(scope.clone(), held);
                Ok(true)
            }
            Grant::Revoked => Err(SliceError::Revoked {
                kind: scope.kind.as_str(),
                key: scope.key.clone(),
            }),
            _ => Ok(false),
        }
    }

    /// An outcome gave back `freed` (settled below its reservation) in `scopes`: the
    /// slices held for them have that much more room (a slice returned meanwhile keeps
    /// it counted as used: the conservative side).
    pub fn give(&self, scopes: &[Scope], freed: Amounts) {
        let mut local = self.lock();
        for scope in scopes {
            if let Some(h) = local.held.get_mut(scope) {
                let (u, f) = (h.used.each(), freed.each());
                h.used = Amounts::from_each([0, 1, 2, 3].map(|i| u[i].saturating_sub(f[i])));
            }
        }
    }

    /// An outcome gave back `freed` of what a use counted on slice `lease` of `scope`:
    /// that slice has that much more room if it is still the one held (a slice
    /// returned or replaced meanwhile keeps it counted as used: the conservative side).
    /// Whether it was given back.
    pub fn give_on(&self, scope: &Scope, lease: i64, freed: Amounts) -> bool {
        let mut local = self.lock();
        let Some(h) = local.held.get_mut(scope).filter(|h| h.lease.id == lease) else {
            return false;
        };
        let (u, f) = (h.used.each(), h.counted(&freed).each());
        h.used = Amounts::from_each([0, 1, 2, 3].map(|i| u[i].saturating_sub(f[i])));
        true
    }

    /// A use of `need` in `scope` whose decision rolled back for certain, given back
    /// where it was counted: on slice `on` while this holder still holds it; taken
    /// centrally (`None`), the scope is settled down by it ([`Leases::unspend`]); its
    /// slice returned since by a return that settled the use (it said a use counting
    /// this one: [`Released::Returned`], [`Released::Refunded`]), the scope is settled
    /// down by it, within what that return said. Otherwise the room stays counted (the
    /// closed side): the slice was reclaimed (settling its committed use, which this use
    /// is not part of), lost, or its return is not answered yet. A give-back the
    /// database did not answer is not retried: the room stays counted.
    pub fn untake(&self, scope: &Scope, on: Option<i64>, need: Amounts) {
        let need = match on {
            None => need,
            Some(id) if self.give_on(scope, id, need) => return,
            Some(id) => match self.lock().covered.get_mut(&id) {
                Some(left) => {
                    let (l, n) = (left.each(), need.each());
                    let back = [0, 1, 2, 3].map(|i| l[i].min(n[i]));
                    *left = Amounts::from_each([0, 1, 2, 3].map(|i| l[i] - back[i]));
                    Amounts::from_each(back)
                }
                None => return,
            },
        };
        if need != Amounts::default() {
            let _ = self.leases.unspend(scope, need);
        }
    }

    /// Return a slice saying `used`, without the holder's lock while the database
    /// answers; kept to retry if it did not. Whether the database confirmed the return.
    pub(super) fn give_back_unlocked(&self, lease: Lease, used: Amounts) -> bool {
        let r = self.leases.release(lease.id, used);
        if matches!(r, Err(LeaseError::Unavailable { .. })) {
            self.lock().unreturned.push((lease, used));
            return false;
        }
        let confirmed = r.is_ok();
        self.returned(lease, used, r);
        confirmed
    }

    /// Return a slice saying `used`; kept to retry if the database did not answer.
    pub(super) fn give_back(&self, local: &mut Local, lease: Lease, used: Amounts) {
        let r = self.leases.release(lease.id, used);
        if matches!(r, Err(LeaseError::Unavailable { .. })) {
            local.unreturned.push((lease, used));
            return;
        }
        self.returned_in(local, lease, used, r);
    }

    /// A return answered: remembered where it settled `used` ([`Local::covered`]), and
    /// said (returned, or lost).
    pub(super) fn returned(
        &self,
        lease: Lease,
        used: Amounts,
        r: Result<super::Released, LeaseError>,
    ) {
        cover(&mut self.lock(), lease.id, used, &r);
        self.said(lease, used, r);
    }

    /// [`Slices::returned`], under the holder's lock.
    pub(super) fn returned_in(
        &self,
        local: &mut Local,
        lease: Lease,
        used: Amounts,
        r: Result<super::Released, LeaseError>,
    ) {
        cover(local, lease.id, used, &r);
        self.said(lease, used, r);
    }

    /// A return answered, said: returned, or lost (left to be reclaimed).
    fn said(&self, lease: Lease, used: Amounts, r: Result<Released, LeaseError>) {
        let event = match r {
            Ok(released) => LeaseEvent::Returned {
                lease,
                used,
                released,
            },
            Err(e) => {
                self.lost
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(lease.id);
                LeaseEvent::Lost {
                    lease,
                    why: e.to_string(),
                }
            }
        };
        self.event(event);
    }

    /// Give back every slice held (the daemon stops).
    pub fn close(&self) {
        let mut local = self.lock();
        let held = std::mem::take(&mut local.held);
        for (_, h) in held {
            self.give_back(&mut local, h.lease, h.used);
        }
    }

    /// `work` done at the end of every tick from now on (in place of any before).
    pub(crate) fn after_tick(&self, work: AfterTick) {
        *self.after.lock().unwrap_or_else(|e| e.into_inner()) = Some(work);
    }

    /// The work done at the end of a tick, if any.
    pub(super) fn ticked(&self, ticked: &mut Ticked) {
        if let Some(work) = self
            .after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            work(ticked);
        }
    }

    /// What is held of `scope` now: what the slice covers and what of it was used.
    pub fn held(&self, scope: &Scope) -> Option<(Amounts, Amounts)> {
        let local = self.lock();
        local.held.get(scope).map(|h| (h.lease.granted, h.used))
    }

    /// Whether this holder holds slice `lease` of `scope` now.
    pub fn holds(&self, scope: &Scope, lease: i64) -> bool {
        self.lock()
            .held
            .get(scope)
            .is_some_and(|h| h.lease.id == lease)
    }

    /// Slices whose return the database has not confirmed yet.
    pub fn unreturned(&self) -> usize {
        self.lock().unreturned.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The covered returns kept are the latest answered, whatever their slices' ids: a
    /// long-held slice (a low id) returned last is kept, the oldest return dropped.
    #[test]
    fn the_latest_returns_are_kept_not_the_highest_ids() {
        let mut local = Local::default();
        let used = Amounts::default();
        for id in 1_000..1_000 + COVERED as i64 {
            cover(&mut local, id, used, &Ok(Released::Returned));
        }
        cover(&mut local, 7, used, &Ok(Released::Refunded));
        assert_eq!(local.covered.len(), COVERED);
        assert!(
            local.covered.contains_key(&7),
            "the latest return was dropped"
        );
        assert!(
            !local.covered.contains_key(&1_000),
            "the oldest return was kept"
        );
        assert!(local.covered.contains_key(&1_001));
        // A return not covering its use is not remembered.
        cover(&mut local, 3, used, &Ok(Released::Late));
        assert!(!local.covered.contains_key(&3));
    }
}
