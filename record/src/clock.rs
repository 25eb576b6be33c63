//! Where tally reads the time: a [`Clock`] passed in, as rustls passes a `TimeProvider`.
//!
//! The gate (deadlines, breakers, back-off, rate windows, approvals' expiry) and the
//! ledger (entry and checkpoint times, rotation by age) read the time only through a
//! `Clock`; the daemon and the CLI hand them [`SystemClock`], and tests a
//! [`ManualClock`] they move, so time-driven behaviour is tested without sleeping.
//!
//! It lives here, in the lowest crate, so that every crate that needs a clock (ledger,
//! gate and the backends above them) shares one trait and dependencies keep pointing
//! down. [`SystemClock::now_ms`] is the one place in the gate and the ledger that reads
//! the system's time.

use std::sync::atomic::{AtomicU64, Ordering};

/// The time, in ms since the Unix epoch. (`Debug`, so that options holding one print.)
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            // A system clock set before 1970 reads as the epoch; the ledger and the gate
            // never let their own clocks go back, so this only holds time still.
            .unwrap_or(0)
    }
}

/// A clock that moves only when told (for tests): set it, advance it; it never moves on
/// its own. Shared between threads behind an `Arc`.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `ms` (since the Unix epoch).
    pub fn new(ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(ms))
    }

    /// Move the clock forward by `ms` (saturating); returns the new time.
    pub fn advance(&self, ms: u64) -> u64 {
        let before = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            })
            .unwrap_or_else(|t| t);
        before.saturating_add(ms)
    }

    /// Set the clock to `ms` (it may go back: tests of a clock going backwards).
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        assert_eq!(c.advance(250), 1_250);
        assert_eq!(c.now_ms(), 1_250);
        c.set(10);
        assert_eq!(c.now_ms(), 10);
        c.set(u64::MAX - 1);
        assert_eq!(c.advance(5), u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn the_system_clock_is_past_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
