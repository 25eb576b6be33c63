//! What happens to a holder's slices, as typed events, and the counters kept of them.
//! [`on_lease_event`] is the one place every event passes: where a daemon records lease
//! events in its ledger, it hooks in there (the sink).

use std::sync::atomic::{AtomicU64, Ordering};

use super::breakers::BreakersTicked;
use super::types::{Amounts, Lease, Reclaimed, Released};
use super::Scope;

/// Something that happened to a slice of this holder (or, for [`LeaseEvent::Reclaimed`],
/// of any holder, reclaimed by this one).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// A slice was granted.
    Granted(Lease),
    /// A slice was renewed.
    Renewed(Lease),
    /// A slice an earlier process of this holder left out was adopted (and is returned).
    Adopted(Lease),
    /// A slice was given back saying what was used.
    Returned {
        /// The slice.
        lease: Lease,
        /// What of it was used.
        used: Amounts,
        /// What the database did.
        released: Released,
    },
    /// A slice could not be kept nor returned (revoked and refused, or fenced off by a
    /// newer epoch): it expires and is reclaimed (its committed use settled, or the
    /// whole slice where that is not known).
    Lost {
        /// The slice.
        lease: Lease,
        /// Why.
        why: String,
    },
    /// A slice past its expiry and the margin was reclaimed (its committed use settled,
    /// or the whole slice where that is not known: [`Reclaimed::settled`]).
    Reclaimed(Reclaimed),
    /// A use was refused for want of a slice (no room, or no database).
    Refused {
        /// The scopes it asked of.
        scope: Vec<Scope>,
    },
}

/// Where lease events go besides the counters.
pub type Sink = Box<dyn Fn(&LeaseEvent) + Send + Sync>;

/// Counters of a holder's lease events.
#[derive(Debug, Default)]
pub struct LeaseMetrics {
    granted: AtomicU64,
    renewed: AtomicU64,
    returned: AtomicU64,
    reclaimed: AtomicU64,
    lost: AtomicU64,
    refused: AtomicU64,
    adopted: AtomicU64,
    /// The tools' breakers' views ([`BreakersTicked`]), summed over ticks and stops.
    breaker_flushed: AtomicU64,
    breaker_flush_failed: AtomicU64,
    breaker_flush_unsure: AtomicU64,
    breaker_refresh_failed: AtomicU64,
    breaker_unreadable: AtomicU64,
}

impl LeaseMetrics {
    /// Slices granted.
    pub fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }
    /// Renewals.
    pub fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }
    /// Slices returned (or refunded after a reclaim).
    pub fn returned(&self) -> u64 {
        self.returned.load(Ordering::Relaxed)
    }
    /// Expired slices this holder reclaimed (of any holder).
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }
    /// Slices lost (neither kept nor returned).
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
    /// Uses refused for want of a slice.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
    /// Slices an earlier process of this holder left out, adopted at start.
    pub fn adopted(&self) -> u64 {
        self.adopted.load(Ordering::Relaxed)
    }
    /// What the views of the tools' breakers did in a tick or a stop, counted.
    pub fn breakers(&self, b: &BreakersTicked) {
        let n = |x: usize| u64::try_from(x).unwrap_or(u64::MAX);
        self.breaker_flushed
            .fetch_add(n(b.flushed), Ordering::Relaxed);
        self.breaker_flush_failed
            .fetch_add(n(b.flush_failed), Ordering::Relaxed);
        self.breaker_flush_unsure
            .fetch_add(n(b.flush_unsure), Ordering::Relaxed);
        self.breaker_refresh_failed
            .fetch_add(u64::from(b.refresh_failed), Ordering::Relaxed);
        self.breaker_unreadable
            .fetch_add(n(b.unreadable), Ordering::Relaxed);
    }
    /// Every counter, by the event it counts: the slices', then the views' of the
    /// tools' breakers (`breaker_flushed`: a tool's outcomes folded into its row;
    /// `breaker_flush_failed`: kept for the next tick; `breaker_flush_unsure`: let go,
    /// its COMMIT unanswered; `breaker_refresh_failed`: the rows not read again;
    /// `breaker_unreadable`: a row the decoder refused at a refresh).
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("granted", self.granted()),
            ("renewed", self.renewed()),
            ("returned", self.returned()),
            ("reclaimed", self.reclaimed()),
            ("lost", self.lost()),
            ("refused", self.refused()),
            ("adopted", self.adopted()),
            ("breaker_flushed", load(&self.breaker_flushed)),
            ("breaker_flush_failed", load(&self.breaker_flush_failed)),
            ("breaker_flush_unsure", load(&self.breaker_flush_unsure)),
            ("breaker_refresh_failed", load(&self.breaker_refresh_failed)),
            ("breaker_unreadable", load(&self.breaker_unreadable)),
        ]
    }
}

/// Every lease event of a holder passes here: counted, then given to the sink (the
/// daemon's recording of lease events, once the ledger has records for them).
pub fn on_lease_event(metrics: &LeaseMetrics, sink: Option<&Sink>, event: &LeaseEvent) {
    let counter = match event {
        LeaseEvent::Granted(_) => &metrics.granted,
        LeaseEvent::Renewed(_) => &metrics.renewed,
        LeaseEvent::Returned { .. } => &metrics.returned,
        LeaseEvent::Reclaimed(_) => &metrics.reclaimed,
        LeaseEvent::Lost { .. } => &metrics.lost,
        LeaseEvent::Refused { .. } => &metrics.refused,
        LeaseEvent::Adopted(_) => &metrics.adopted,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if let Some(sink) = sink {
        sink(event);
    }
}
