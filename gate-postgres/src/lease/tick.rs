//! A holder's periodic work, at a time passed in: retry the returns the database did not
//! confirm, renew the slices in use, give back idle ones and ones near their deadline,
//! and reclaim every holder's slices past expiry and the margin (on the database's
//! clock). Called every refresh interval by the daemon's lease thread; a revoked scope
//! (its run paused or killed) loses its slices here, so a pause reaches every holder
//! within one interval.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use super::events::LeaseEvent;
use super::holder::Slices;
use super::types::LeaseError;

/// What one tick did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ticked {
    /// Slices renewed.
    pub renewed: usize,
    /// Slices given back (idle, near their deadline, revoked, or pending a return).
    pub returned: usize,
    /// Slices of any holder reclaimed.
    pub reclaimed: usize,
    /// The database did not answer some call (the rest of the tick went on).
    pub unavailable: bool,
}

impl Slices {
    /// One round of the periodic work at `now`.
    pub fn tick(&self, now: Instant) -> Ticked {
        let mut ticked = Ticked::default();
        let mut local = self.lock();
        for (lease, used) in std::mem::take(&mut local.unreturned) {
            self.give_back(&mut local, lease, used);
        }
        let scopes: Vec<_> = local.held.keys().cloned().collect();
        for scope in scopes {
            let Some(h) = local.held.get(&scope).cloned() else {
                continue;
            };
            let idle = now.saturating_duration_since(h.last_used) >= self.options.idle;
            let ending = now + self.options.margin >= h.deadline;
            if !idle && !ending {
                match self.leases.renew(&h.lease) {
                    Ok(lease) => {
                        self.event(LeaseEvent::Renewed(lease.clone()));
                        if let Some(held) = local.held.get_mut(&scope) {
                            held.deadline = now + lease.valid_for;
                            held.lease = lease;
                        }
                        ticked.renewed += 1;
                        continue;
                    }
                    Err(LeaseError::Unavailable { .. }) => {
                        ticked.unavailable = true;
                        continue;
                    }
                    // Revoked, expired or fenced off: given back below.
                    Err(_) => {}
                }
            }
            local.held.remove(&scope);
            self.give_back(&mut local, h.lease, h.used);
            ticked.returned += 1;
        }
        ticked.unavailable |= !local.unreturned.is_empty();
        drop(local);
        match self.leases.reclaim_expired() {
            Ok(reclaimed) => {
                ticked.reclaimed = reclaimed.len();
                for r in reclaimed {
                    self.event(LeaseEvent::Reclaimed(r));
                }
            }
            Err(_) => ticked.unavailable = true,
        }
        ticked
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
