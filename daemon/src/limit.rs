//! A per-peer token bucket: so one client cannot starve the rest.
//!
//! Peers are told apart by what the kernel says about the connection (the Unix socket
//! peer's uid, or "loopback TCP" as one peer), never by anything the client sends. The
//! bucket holds up to one second of decisions. A request is let in while the bucket is not
//! empty and then pays for all its decisions, so a batch larger than the bucket still
//! passes once and the peer's next requests wait until the debt is repaid.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Who is on the other end of a connection, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    /// A Unix socket peer's user id (SO_PEERCRED).
    Uid(u32),
    /// A loopback TCP peer (all are one: their addresses are free to choose).
    Tcp,
    /// A peer whose credentials could not be read.
    Unknown,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Decisions per second per peer.
pub(crate) struct RateLimit {
    rate: f64,
    buckets: Mutex<HashMap<Peer, Bucket>>,
}

impl RateLimit {
    pub fn new(rate_per_sec: u32) -> RateLimit {
        RateLimit {
            rate: f64::from(rate_per_sec.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Let a request of `decisions` in, or say how many seconds to wait.
    pub fn take(&self, peer: Peer, decisions: usize) -> Result<(), u64> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(peer).or_insert(Bucket {
            tokens: self.rate,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * self.rate;
        bucket.tokens = (bucket.tokens + refill).min(self.rate);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            let wait = (1.0 - bucket.tokens) / self.rate;
            return Err(wait.ceil().max(1.0) as u64);
        }
        bucket.tokens -= decisions as f64;
        Ok(())
    }
}
