//! Deferred appends (`Ledger::submit_deferred`): queued in order like any append, they
//! start no fsync of their own. One rides the next group another append starts; alone,
//! it is committed once it has waited `LINGER_MS` on the ledger's clock (a `ManualClock`
//! here: the tests move it, never sleep for it); a ledger dropped commits it at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use tally_ledger::clock::{Clock, ManualClock};
use tally_ledger::keys::AuditorKey;
use tally_ledger::ledger::prepare;
use tally_ledger::{Ledger, Receipt, Rotation, LINGER_MS};

use crate::store::decision;

const T0: u64 = 1_700_000_000_000;
const ANSWER: Duration = Duration::from_secs(10);
/// Real time in which a deferred append, its linger not up on the held clock, must not
/// be committed: many times `LINGER_MS`, so a committer that timed the linger by the
/// system's clock, or started a group for it at once, is seen doing so.
const QUIET: Duration = Duration::from_millis(200);

type Answer = Receiver<tally_ledger::Result<Vec<Receipt>>>;

/// A fresh ledger in `dir` on a held clock, counting its fsyncs.
fn held(dir: &std::path::Path) -> (Ledger, Arc<ManualClock>, Arc<AtomicU64>) {
    let clock = Arc::new(ManualClock::new(T0));
    let auditor = AuditorKey::generate();
    Ledger::init_with_clock(dir, &auditor.public(), Rotation::default(), clock.as_ref()).unwrap();
    let ledger = Ledger::open_with_clock(dir, Arc::clone(&clock) as Arc<dyn Clock>).unwrap();
    let syncs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&syncs);
    ledger.on_sync(Box::new(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
    }));
    (ledger, clock, syncs)
}

fn deferred(ledger: &Ledger, run: &str, i: u64) -> Answer {
    let (tx, rx) = channel();
    let plaintexts = prepare(vec![decision(run, i)]).unwrap();
    ledger.submit_deferred(plaintexts, Vec::new(), move |r| {
        let _ = tx.send(r);
    });
    rx
}

#[test]
fn a_deferred_append_rides_the_next_appends_fsync_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (ledger, _clock, syncs) = held(&tmp.path().join("l"));
    let before = ledger.checkpoint().size;
    let outcome = deferred(&ledger, "r", 1);
    // Nothing else queued and its linger not up: no group, no fsync.
    assert!(outcome.recv_timeout(QUIET).is_err(), "not committed alone");
    assert_eq!(
        (ledger.checkpoint().size, syncs.load(Ordering::SeqCst)),
        (before, 0)
    );
    // The next append starts a group: both in it, one fsync, the deferred one first.
    let later = ledger.append(decision("r", 2)).unwrap();
    let early = outcome.recv_timeout(ANSWER).unwrap().unwrap();
    assert_eq!(early[0].seq + 1, later.seq);
    assert_eq!(early[0].seq, before);
    assert_eq!(syncs.load(Ordering::SeqCst), 1, "one fsync for both");
}

#[test]
fn a_deferred_append_alone_is_committed_once_its_linger_is_up_on_the_ledgers_clock() {
    let tmp = tempfile::tempdir().unwrap();
    let (ledger, clock, syncs) = held(&tmp.path().join("l"));
    let outcome = deferred(&ledger, "r", 1);
    clock.advance(LINGER_MS - 1);
    assert!(
        outcome.recv_timeout(QUIET).is_err(),
        "1 ms short of its linger"
    );
    assert_eq!(syncs.load(Ordering::SeqCst), 0);
    // A second deferred append waits with it, and does not restart the wait.
    let second = deferred(&ledger, "r", 2);
    clock.advance(1);
    let first = outcome.recv_timeout(ANSWER).unwrap().unwrap();
    let second = second.recv_timeout(ANSWER).unwrap().unwrap();
    assert_eq!(first[0].seq + 1, second[0].seq);
    assert_eq!(syncs.load(Ordering::SeqCst), 1, "one group for both");
    assert_eq!(ledger.checkpoint().size, second[0].seq + 1);
}

#[test]
fn a_clock_set_back_does_not_hold_a_deferred_append() {
    let tmp = tempfile::tempdir().unwrap();
    let (ledger, clock, _) = held(&tmp.path().join("l"));
    let outcome = deferred(&ledger, "r", 1);
    clock.set(T0 - 3_600_000);
    outcome.recv_timeout(ANSWER).unwrap().unwrap();
}

#[test]
fn a_ledger_dropped_commits_its_deferred_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _clock, _) = held(&dir);
    let before = ledger.checkpoint().size;
    let outcome = deferred(&ledger, "r", 1);
    drop(ledger);
    let receipts = outcome.recv_timeout(ANSWER).unwrap().unwrap();
    assert_eq!(receipts[0].seq, before);
    let reopened = Ledger::open(&dir).unwrap();
    assert_eq!(
        reopened.checkpoint().size,
        before + 1,
        "durable after the drop"
    );
}

#[test]
fn a_flush_commits_deferred_appends_before_their_linger_is_up() {
    let tmp = tempfile::tempdir().unwrap();
    let (ledger, _clock, syncs) = held(&tmp.path().join("l"));
    let before = ledger.checkpoint().size;
    // Nothing queued: the checkpoint as it is, no fsync.
    assert_eq!(ledger.flush().unwrap().size, before);
    assert_eq!(syncs.load(Ordering::SeqCst), 0);
    let first = deferred(&ledger, "r", 1);
    let second = deferred(&ledger, "r", 2);
    // The held clock never moves: only the flush commits them, and it returns once
    // they are durable.
    let flushed = ledger.flush().unwrap();
    assert_eq!(flushed.size, before + 2);
    assert_eq!(ledger.checkpoint().size, before + 2);
    assert_eq!(syncs.load(Ordering::SeqCst), 1, "one group for both");
    assert_eq!(first.recv_timeout(ANSWER).unwrap().unwrap()[0].seq, before);
    assert_eq!(
        second.recv_timeout(ANSWER).unwrap().unwrap()[0].seq,
        before + 1
    );
}
