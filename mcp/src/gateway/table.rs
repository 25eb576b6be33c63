//! The gateway's open sessions: the holder of the credential that opened each, its run,
//! the messages refused in it and when it was last used; the bound on how many are open
//! (an `initialize` in progress holds a place too), and which have been idle too long,
//! read on the clock the gateway was given.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Authorized;

/// One open session.
struct Bound {
    holder: String,
    run: Authorized,
    /// The protocol version its `initialize` negotiated.
    version: Option<String>,
    refused: u64,
    last_ms: u64,
}

#[derive(Default)]
struct Inner {
    open: HashMap<String, Bound>,
    /// `initialize`s admitted and not answered yet, by holder.
    opening: HashMap<String, usize>,
    /// The gateway stops: no place is given, no session taken in.
    closed: bool,
}

/// The open sessions.
pub(super) struct Table {
    inner: Mutex<Inner>,
    max: usize,
    per_holder: usize,
    idle_ms: u64,
    clock: Arc<dyn tally_record::Clock>,
    /// How many `initialize`s are being answered (the places held).
    answering: tokio::sync::watch::Sender<usize>,
}

/// What a session id names, for a holder.
pub(super) enum Found {
    /// No open session (never opened, closed, or expired).
    Unknown,
    /// A session another credential opened.
    Another,
    /// The holder's session: its run, and the protocol version it negotiated.
    Yours(Authorized, Option<String>),
}

/// Why there is no place for one more session.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoPlace {
    /// As many as the gateway's bound are open or opening.
    Gateway,
    /// As many as the bound per credential are its holder's.
    Holder,
    /// The gateway stops.
    Closing,
}

/// A place among the open sessions, held while an `initialize` is answered: given back
/// when dropped, the session it opened (if any) then counted as open.
pub(super) struct Place(Arc<Table>, String);

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        if let Some(n) = inner.opening.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.opening.remove(&self.1);
            }
        }
        drop(inner);
        self.0.answering.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Table {
    pub(super) fn new(
        (max, per_holder): (usize, usize),
        idle: std::time::Duration,
        clock: Arc<dyn tally_record::Clock>,
    ) -> Table {
        Table {
            inner: Mutex::default(),
            max,
            per_holder,
            idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
            clock,
            answering: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session `id` for `holder`; the holder's own is marked used now.
    pub(super) fn find(&self, id: &str, holder: &str) -> Found {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        match inner.open.get_mut(id) {
            None => Found::Unknown,
            Some(b) if b.holder != holder => Found::Another,
            Some(b) => {
                b.last_ms = now;
                Found::Yours(b.run.clone(), b.version.clone())
            }
        }
    }

    /// A place for one more session of `holder`, unless as many as the bound are open
    /// or opening, or as many as the bound per credential are the holder's, or the
    /// gateway stops.
    pub(super) fn reserve(self: &Arc<Self>, holder: &str) -> Result<Place, NoPlace> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(NoPlace::Closing);
        }
        let opening: usize = inner.opening.values().sum();
        if inner.open.len().saturating_add(opening) >= self.max {
            return Err(NoPlace::Gateway);
        }
        let theirs = inner.open.values().filter(|b| b.holder == holder).count()
            + inner.opening.get(holder).copied().unwrap_or(0);
        if theirs >= self.per_holder {
            return Err(NoPlace::Holder);
        }
        *inner.opening.entry(holder.to_owned()).or_default() += 1;
        self.answering.send_modify(|n| *n += 1);
        Ok(Place(Arc::clone(self), holder.to_owned()))
    }

    /// The session `id`, opened by `holder` in `run` having negotiated `version` (its
    /// place given back after); false if the gateway stops (the caller closes it).
    pub(super) fn insert(
        &self,
        id: String,
        (holder, run, version): (String, Authorized, Option<String>),
        place: Place,
    ) -> bool {
        let last_ms = self.clock.now_ms();
        let bound = Bound {
            holder,
            run,
            version,
            refused: 0,
            last_ms,
        };
        let taken = {
            let mut inner = self.lock();
            if !inner.closed {
                inner.open.insert(id, bound);
            }
            !inner.closed
        };
        drop(place);
        taken
    }

    /// The session `id` is closed.
    pub(super) fn remove(&self, id: &str) {
        self.lock().open.remove(id);
    }

    /// One more message refused in session `id`: how many so far (1 outside a session).
    pub(super) fn refused(&self, id: Option<&str>) -> u64 {
        let mut inner = self.lock();
        id.and_then(|id| inner.open.get_mut(id)).map_or(1, |b| {
            b.refused += 1;
            b.refused
        })
    }

    /// The sessions idle longer than the bound, taken out of the table.
    pub(super) fn expired(&self) -> Vec<String> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let idle: Vec<String> = inner
            .open
            .iter()
            .filter(|(_, b)| now.saturating_sub(b.last_ms) > self.idle_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            inner.open.remove(id);
        }
        idle
    }

    /// The gateway stops: no place given from now on, no session taken in; every open
    /// session taken out of the table.
    pub(super) fn close(&self) -> Vec<String> {
        let mut inner = self.lock();
        inner.closed = true;
        inner.open.drain().map(|(id, _)| id).collect()
    }

    /// Wait until no `initialize` is being answered, at most `bound`: how many still
    /// were then.
    pub(super) async fn answered(&self, bound: std::time::Duration) -> usize {
        let mut answering = self.answering.subscribe();
        let _ = tokio::time::timeout(bound, answering.wait_for(|n| *n == 0)).await;
        let left = *answering.borrow();
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_record::ManualClock;

    fn run() -> Authorized {
        Authorized {
            run: "r".to_owned(),
            started: false,
            gate: Arc::new(|| tally_api::GateClient::new("/nonexistent")),
        }
    }

    #[test]
    fn the_bound_counts_open_and_opening_sessions_and_idle_ones_expire_on_the_clock() {
        let clock = Arc::new(ManualClock::new(1_000));
        let table = Arc::new(Table::new(
            (2, 2),
            std::time::Duration::from_secs(60),
            Arc::clone(&clock) as Arc<dyn tally_record::Clock>,
        ));
        let a = table.reserve("h1").expect("a place");
        let b = table.reserve("h1").expect("a second place");
        assert_eq!(
            table.reserve("h2").err(),
            Some(NoPlace::Gateway),
            "two opening fill a bound of 2"
        );
        drop(b);
        assert!(table.insert("s1".into(), ("h1".into(), run(), None), a));
        let c = table.reserve("h2").expect("one open, none opening");
        assert!(table.insert("s2".into(), ("h2".into(), run(), None), c));
        assert_eq!(
            table.reserve("h3").err(),
            Some(NoPlace::Gateway),
            "two open fill it"
        );
        assert!(matches!(table.find("s1", "h2"), Found::Another));
        assert!(matches!(table.find("nope", "h1"), Found::Unknown));
        clock.advance(30_000);
        assert!(matches!(table.find("s1", "h1"), Found::Yours(..)));
        clock.advance(30_001);
        assert_eq!(
            table.expired(),
            vec!["s2".to_owned()],
            "s1 was used 30 s ago"
        );
        assert!(matches!(table.find("s2", "h2"), Found::Unknown));
        assert!(
            table.reserve("h2").is_ok(),
            "the expired one's place is free"
        );
    }

    #[test]
    fn one_holder_holds_at_most_its_bound_open_and_opening() {
        let clock = Arc::new(ManualClock::new(1_000));
        let table = Arc::new(Table::new(
            (10, 2),
            std::time::Duration::from_secs(60),
            clock as Arc<dyn tally_record::Clock>,
        ));
        let a = table.reserve("h1").expect("a place");
        assert!(table.insert("s1".into(), ("h1".into(), run(), None), a));
        let b = table.reserve("h1").expect("its second");
        assert_eq!(
            table.reserve("h1").err(),
            Some(NoPlace::Holder),
            "one open, one opening"
        );
        let other = table.reserve("h2").expect("another holder's");
        drop(b);
        let c = table
            .reserve("h1")
            .expect("the opening one gave its place back");
        assert!(table.insert("s2".into(), ("h1".into(), run(), None), c));
        assert_eq!(table.reserve("h1").err(), Some(NoPlace::Holder), "two open");
        table.remove("s1");
        assert!(
            table.reserve("h1").is_ok(),
            "a closed one frees its holder's place"
        );
        drop(other);
    }

    #[tokio::test]
    async fn a_closed_table_gives_no_place_takes_no_session_and_waits_for_the_answering() {
        let clock = Arc::new(ManualClock::new(1_000));
        let table = Arc::new(Table::new(
            (10, 10),
            std::time::Duration::from_secs(60),
            clock as Arc<dyn tally_record::Clock>,
        ));
        let a = table.reserve("h1").expect("a place");
        assert!(table.insert("s1".into(), ("h1".into(), run(), None), a));
        let answering = table.reserve("h1").expect("an initialize being answered");
        assert_eq!(table.close(), vec!["s1".to_owned()]);
        assert_eq!(table.reserve("h2").err(), Some(NoPlace::Closing));
        let short = std::time::Duration::from_millis(1);
        assert_eq!(table.answered(short).await, 1, "one still answering");
        assert!(
            !table.insert("s2".into(), ("h1".into(), run(), None), answering),
            "a session answered after the close is not taken in"
        );
        assert_eq!(table.answered(short).await, 0);
        assert!(matches!(table.find("s2", "h1"), Found::Unknown));
    }
}
