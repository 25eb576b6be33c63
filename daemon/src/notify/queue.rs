//! One receiver's queue of bodies waiting to be sent: bounded, the oldest dropped when a
//! new one comes to a full queue (a slow or dead receiver never holds the gate), with
//! the counters `/metrics` shows.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// What `/metrics` shows of the deliveries, over every receiver.
#[derive(Clone, Default)]
pub(crate) struct Counters {
    /// Events a receiver answered 2xx to.
    pub delivered: Counter,
    /// Attempts that failed (no connection, timeout, a status other than 2xx).
    pub failed: Counter,
    /// Events never delivered, by why: `queue_full` (dropped as the oldest of a full
    /// queue) or `gave_up` (every attempt failed).
    pub dropped: Family<Vec<(&'static str, String)>, Counter>,
    /// Events waiting in the queues.
    pub depth: Gauge,
}

impl Counters {
    /// One event dropped for `why`.
    pub fn drop_one(&self, why: &'static str) {
        self.dropped
            .get_or_create(&vec![("why", why.to_owned())])
            .inc();
    }
}

/// A bounded queue of bodies.
pub(crate) struct Queue {
    items: Mutex<VecDeque<Bytes>>,
    cap: usize,
    ready: tokio::sync::Notify,
}

impl Queue {
    /// A queue of at most `cap` bodies (at least one).
    pub fn new(cap: usize) -> Queue {
        Queue {
            items: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            ready: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Bytes>> {
        self.items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Add `body`; a full queue drops its oldest first (counted). Never waits.
    pub fn push(&self, body: Bytes, counters: &Counters) {
        {
            let mut items = self.lock();
            if items.len() >= self.cap {
                items.pop_front();
                counters.drop_one("queue_full");
            } else {
                counters.depth.inc();
            }
            items.push_back(body);
        }
        self.ready.notify_one();
    }

    /// The oldest body, once there is one.
    pub async fn pop(&self, counters: &Counters) -> Bytes {
        loop {
            if let Some(b) = self.lock().pop_front() {
                counters.depth.dec();
                return b;
            }
            self.ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_drops_its_oldest_and_counts_it() {
        let c = Counters::default();
        let q = Queue::new(2);
        for b in ["a", "b", "c"] {
            q.push(Bytes::from(b), &c);
        }
        assert_eq!(c.depth.get(), 2);
        assert_eq!(
            c.dropped
                .get_or_create(&vec![("why", "queue_full".to_owned())])
                .get(),
            1
        );
        assert_eq!(q.pop(&c).await, Bytes::from("b"));
        assert_eq!(q.pop(&c).await, Bytes::from("c"));
        assert_eq!(c.depth.get(), 0);
    }
}
