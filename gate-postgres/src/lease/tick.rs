//! A holder's periodic work, at a time passed in: retry the returns the database did not
//! confirm, renew the slices in use, give back idle ones and ones near their deadline
//! (and any granted to it whose answer was lost), and reclaim every holder's slices past
//! expiry and the margin (on the database's clock). Called every refresh interval by the daemon's lease thread; a revoked scope
//! (its run paused or killed) loses its slices here, so a pause reaches every holder
//! within one interval.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use super::breakers::BreakersTicked;
use super::events::LeaseEvent;
use super::holder::Slices;
use super::types::{Amounts, Lease, LeaseError, Released};
use super::Scope;

/// What one tick did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ticked {
    /// Slices renewed and still held (a renewal of a slice a use gave back meanwhile
    /// is not counted).
    pub renewed: usize,
    /// Slices given back (idle, near their deadline, revoked, pending a return, or
    /// granted unseen) whose return the database confirmed.
    pub returned: usize,
    /// Slices of any holder reclaimed.
    pub reclaimed: usize,
    /// The database did not answer some call, or some of the breakers' work failed
    /// (the rest of the tick went on).
    pub unavailable: bool,
    /// What the tools' breakers' views did at the end of the tick (flushed, refreshed:
    /// [`BreakersTicked`]), counted in the holder's lease metrics too.
    pub breakers: BreakersTicked,
    /// The time the tick was run at (its `now`).
    pub at: Option<Instant>,
}

/// What a tick does, decided under the holder's lock: the returns to send again, the
/// slices to give back (taken out of use at once) and those to renew.
struct Plan {
    pending: Vec<(Lease, Amounts)>,
    ending: Vec<(Lease, Amounts)>,
    renew: Vec<(Scope, Lease)>,
}

impl Slices {
    /// One round of the periodic work at `now`, one tick at a time. The holder's lock
    /// is held only to read and change what is held, never while the database answers:
    /// uses that fit in a slice go on while a tick waits on the database (at most the
    /// bound per call).
    pub fn tick(&self, now: Instant) -> Ticked {
        let _one = self.ticking.lock().unwrap_or_else(|e| e.into_inner());
        let mut ticked = Ticked {
            at: Some(now),
            ..Ticked::default()
        };
        let plan = self.plan(now);
        for (lease, used) in plan.pending.into_iter().chain(plan.ending) {
            ticked.returned += usize::from(self.give_back_unlocked(lease, used));
        }
        for (scope, lease) in plan.renew {
            match self.leases.renew(&lease) {
                Ok(renewed) => {
                    // Recorded only where it is used: a use's refill may have given the
                    // slice back meanwhile (then nothing decided on the renewal).
                    let mut local = self.lock();
                    if let Some(held) = local
                        .held
                        .get_mut(&scope)
                        .filter(|h| h.lease.id == lease.id)
                    {
                        held.deadline = now + renewed.valid_for;
                        held.lease = renewed.clone();
                        self.event(LeaseEvent::Renewed(renewed));
                        ticked.renewed += 1;
                    }
                }
                Err(LeaseError::Unavailable { .. }) => ticked.unavailable = true,
                // Revoked, expired or fenced off: given back (unless a use replaced it).
                Err(_) => {
                    let mut local = self.lock();
                    let same = local
                        .held
                        .get(&scope)
                        .is_some_and(|h| h.lease.id == lease.id);
                    let held = if same {
                        local.held.remove(&scope)
                    } else {
                        None
                    };
                    drop(local);
                    if let Some(h) = held {
                        ticked.returned += usize::from(self.give_back_unlocked(h.lease, h.used));
                    }
                }
            }
        }
        ticked.returned += self.return_unseen(&mut ticked);
        ticked.unavailable |= self.unreturned() > 0;
        match self.leases.reclaim_expired() {
            Ok(reclaimed) => {
                ticked.reclaimed = reclaimed.len();
                for r in reclaimed {
                    self.event(LeaseEvent::Reclaimed(r));
                }
            }
            Err(_) => ticked.unavailable = true,
        }
        self.ticked(&mut ticked);
        ticked.unavailable |= ticked.breakers.failed();
        ticked
    }

    /// Under the lock: the returns to retry, the idle slices and those near their
    /// deadline (out of use from now on), and the rest to renew.
    fn plan(&self, now: Instant) -> Plan {
        let mut local = self.lock();
        let pending = std::mem::take(&mut local.unreturned);
        let (mut ending, mut renew) = (Vec::new(), Vec::new());
        let scopes: Vec<Scope> = local.held.keys().cloned().collect();
        for scope in scopes {
            let Some(h) = local.held.get(&scope) else {
                continue;
            };
            let idle = now.saturating_duration_since(h.last_used) >= self.options.idle;
            let near = now + self.options.margin >= h.deadline;
            if idle || near {
                if let Some(h) = local.held.remove(&scope) {
                    ending.push((h.lease, h.used));
                }
            } else {
                renew.push((scope, h.lease.clone()));
            }
        }
        Plan {
            pending,
            ending,
            renew,
        }
    }

    /// The slices the database holds for this holder at its epoch that it neither
    /// holds, nor is returning, nor lost (its return refused: left to be reclaimed) were
    /// granted to it unseen (a grant whose answer was lost: no use was made of them).
    /// Each is given back, used nothing, and recorded granted and returned once the
    /// database confirmed it (not answering: found unseen again at the next tick). How
    /// many were given back.
    fn return_unseen(&self, ticked: &mut Ticked) -> usize {
        let out = match self.leases.held() {
            Ok(out) => out,
            Err(_) => {
                ticked.unavailable = true;
                return 0;
            }
        };
        let local = self.lock();
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        // A lost slice no longer out (reclaimed) need not be remembered.
        lost.retain(|id| out.iter().any(|l| l.id == *id));
        let known = |id: i64| {
            local.held.values().any(|h| h.lease.id == id)
                || local.unreturned.iter().any(|(l, _)| l.id == id)
                || lost.contains(&id)
        };
        let unseen: Vec<Lease> = out.into_iter().filter(|l| !known(l.id)).collect();
        drop(lost);
        drop(local);
        let mut n = 0;
        for lease in unseen {
            match self.leases.release(lease.id, Amounts::default()) {
                // Given back meanwhile by a use's refill (it was seen after all).
                Ok(Released::Already) => {}
                Ok(released) => {
                    self.event(LeaseEvent::Granted(lease.clone()));
                    self.returned(lease, Amounts::default(), Ok(released));
                    n += 1;
                }
                Err(LeaseError::Unavailable { .. }) => ticked.unavailable = true,
                Err(e) => self.returned(lease, Amounts::default(), Err(e)),
            }
        }
        n
    }
}

/// The holder's lease thread: one [`Slices::tick`] at every time received on `times`
/// (the daemon's timer sends one every refresh interval; a test sends the times it
/// chooses), each tick's report sent back on `done`. It ends when `times` closes, or
/// `done` does.
pub fn spawn_ticks(
    slices: Arc<Slices>,
    times: Receiver<Instant>,
    done: Sender<Ticked>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tally-leases".into())
        .spawn(move || {
            for now in times {
                if done.send(slices.tick(now)).is_err() {
                    return;
                }
            }
        })
}
