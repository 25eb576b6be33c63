//! When deferred appends ([`super::Ledger::submit_deferred`]) may start a commit group:
//! never while they are young, unless something else does. A deferred append rides the
//! next group another append starts (one fsync for both); only once it has waited
//! [`LINGER_MS`] with nothing else queued does it start one of its own.

use std::time::Duration;

/// How long a deferred append waits for another append to ride with before it starts a
/// commit group of its own: 5 ms, by the ledger's clock. Longer than the time an agent on
/// loopback takes from the end of one proxied answer to its next check reaching the gate
/// (a few hundred µs, a few ms on a loaded machine), so that check's fsync carries the
/// outcome too (measured: docs/PERFORMANCE.md, "The outcome rides the next decision's
/// fsync"; swept over 1, 2, 5 and 10 ms in "The standing read in place": only 5 kept 0.8
/// of the gate's rate at 64 clients in both rounds); short enough that a run that makes no further call has its last
/// outcome durable a few ms later. It bounds what a crash of an otherwise idle gate can
/// lose: a deferred record no later acknowledged append followed (docs/GATE.md,
/// "Durability and ordering").
pub const LINGER_MS: u64 = 5;

/// What may start a group now, of what is queued: `eager` appends that are not deferred,
/// and the oldest deferred one queued at `oldest` (ms), the clock reading `now`. `None`:
/// a group may start. `Some(wait)`: only deferred appends are queued and they are young;
/// look again after `wait` (or when woken). A clock that went back counts as a linger
/// that is up: a deferred append is never held on a clock's say-so for longer than that.
pub(super) fn lingering(
    eager: usize,
    closing: bool,
    oldest: Option<u64>,
    now: u64,
) -> Option<Duration> {
    if eager > 0 || closing {
        return None;
    }
    let since = oldest?;
    let waited = now.checked_sub(since)?;
    (waited < LINGER_MS).then(|| Duration::from_millis(LINGER_MS - waited))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_young_deferred_appends_wait() {
        // Something not deferred, or a closing ledger: now.
        assert_eq!(lingering(1, false, Some(100), 100), None);
        assert_eq!(lingering(0, true, Some(100), 100), None);
        // Young: wait out the rest of the linger.
        assert_eq!(
            lingering(0, false, Some(100), 102),
            Some(Duration::from_millis(LINGER_MS - 2))
        );
        // Its linger up: now.
        assert_eq!(lingering(0, false, Some(100), 100 + LINGER_MS), None);
        // The clock went back: now, not once the clock catches up.
        assert_eq!(lingering(0, false, Some(100), 40), None);
    }
}
