//! A per-peer token bucket: so one client cannot starve the rest.
//!
//! Peers are told apart by what the kernel says about the connection (the Unix socket
//! peer's uid, or "loopback TCP" as one peer), never by anything the client sends. The
//! bucket holds up to one second of decisions. A request is let in while the bucket is not
//! empty and then pays for all its decisions, so a batch larger than the bucket still
//! passes once and the peer's next requests wait until the debt is repaid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tally_ledger::clock::Clock;

/// Who is on the other end of a connection, as the kernel reports it (one type for
/// every listener: `tally_proxy::accept` hands it out).
pub(crate) use tally_proxy::Peer;

struct Bucket {
    tokens: f64,
    /// When it was last refilled, ms on the daemon's clock.
    at: u64,
}

/// Decisions per second per peer, on the daemon's clock (tests move it).
pub(crate) struct RateLimit {
    rate: f64,
    buckets: Mutex<HashMap<Peer, Bucket>>,
    clock: Arc<dyn Clock>,
}

impl RateLimit {
    pub fn new(rate_per_sec: u32, clock: Arc<dyn Clock>) -> RateLimit {
        RateLimit {
            rate: f64::from(rate_per_sec.max(1)),
            buckets: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// Let a request of `decisions` in, or say how many seconds to wait.
    pub fn take(&self, peer: Peer, decisions: usize) -> Result<(), u64> {
        let now = self.clock.now_ms();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(peer).or_insert(Bucket {
            tokens: self.rate,
            at: now,
        });
        // A clock set back refills nothing (and is not a debt either).
        let refill = now.saturating_sub(bucket.at) as f64 / 1000.0 * self.rate;
        bucket.tokens = (bucket.tokens + refill).min(self.rate);
        bucket.at = bucket.at.max(now);
        if bucket.tokens < 1.0 {
            let wait = (1.0 - bucket.tokens) / self.rate;
            return Err(wait.ceil().max(1.0) as u64);
        }
        bucket.tokens -= decisions as f64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tally_ledger::clock::ManualClock;

    use super::*;

    #[test]
    fn the_bucket_refills_with_the_clock_and_a_clock_set_back_refills_nothing() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let limit = RateLimit::new(2, Arc::clone(&clock) as Arc<dyn Clock>);
        let peer = Peer::Uid(7);
        assert_eq!(limit.take(peer, 1), Ok(()));
        assert_eq!(limit.take(peer, 1), Ok(()));
        assert_eq!(limit.take(peer, 1), Err(1), "empty: come back in a second");
        clock.advance(499);
        assert!(limit.take(peer, 1).is_err(), "not a token yet");
        clock.advance(1);
        assert_eq!(limit.take(peer, 1), Ok(()), "one token after 500 ms at 2/s");
        clock.set(0);
        assert!(limit.take(peer, 1).is_err(), "going back refills nothing");
        clock.set(1_000_500 + 500);
        assert_eq!(
            limit.take(peer, 1),
            Ok(()),
            "and time lost going back is not repaid"
        );
    }
}
