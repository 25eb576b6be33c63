//! A full disk, for real: the ledger on a small tmpfs filled up (ENOSPC). Every operation
//! answers with an error within a bound (none waits forever), nothing acknowledged is
//! lost, and the ledger opens and appends again once there is space.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tally_ledger::{Entry, Error, Ledger, Receipt, Rotation};
use tally_testkit::tmpfs::Tmpfs;

use crate::store::{decision, new_ledger, read_back};

/// What "promptly" is here: far more than any of these operations takes, far less than
/// a hang.
const BOUND: Duration = Duration::from_secs(20);

/// The file system: 4 MiB, small enough to fill at once.
const TMPFS_BYTES: u64 = 4 << 20;

/// Run `op` on a thread of its own and wait at most [`BOUND`] for it.
fn bounded<T: Send + 'static>(what: &str, op: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(op());
    });
    rx.recv_timeout(BOUND)
        .unwrap_or_else(|_| panic!("{what} did not return within {BOUND:?} on a full disk"))
}

/// Whether `e` is a full disk's error: the OS's ENOSPC on a named file, the index's
/// failed write, or the refusal of a ledger closed by one.
fn is_full_disk(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
        Error::Index { why, .. } | Error::Poisoned(why) => why.contains("No space left"),
        _ => false,
    }
}

/// Append until one fails; every receipt acknowledged before that, and the error.
fn append_until_full(ledger: &std::sync::Arc<Ledger>) -> (Vec<Receipt>, Error) {
    let ledger = std::sync::Arc::clone(ledger);
    bounded("appending", move || {
        let mut acked = Vec::new();
        for i in 0..100_000u64 {
            match ledger.append(decision("full", i)) {
                Ok(r) => acked.push(r),
                Err(e) => return (acked, e),
            }
        }
        panic!("100000 appends fitted in {TMPFS_BYTES} bytes");
    })
}

/// Each acknowledged receipt is in the reopened ledger, byte for byte (its hash), the
/// whole chain reads back, and it holds no other decision: a group refused was never
/// whole in the log (its retry is no second copy).
fn assert_kept(dir: &Path, acked: &[Receipt], auditor: &tally_ledger::AuditorKey) -> Ledger {
    let ledger = Ledger::open(dir).expect("reopen after space came back");
    for r in acked {
        let bytes = ledger
            .entry(r.seq)
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged seq {} lost", r.seq));
        assert_eq!(
            Entry::decode(&bytes).unwrap().hash(),
            r.hash,
            "seq {}",
            r.seq
        );
    }
    let decisions = read_back(&ledger, auditor);
    assert_eq!(
        decisions.len(),
        acked.len(),
        "the reopened ledger holds exactly the acknowledged decisions"
    );
    ledger
}

/// The log fills up: the append that does not fit fails at once with the OS's error
/// naming the file, the next is refused (the ledger is closed: fail closed), closing
/// returns, and once space is back the ledger reopens with every acknowledged append,
/// any torn tail reported, and appends again.
#[test]
fn appends_on_a_full_disk_fail_promptly_and_a_reopen_keeps_every_acknowledged_one() {
    let Some(fs) = Tmpfs::mount(TMPFS_BYTES) else {
        return;
    };
    let dir = fs.path().join("l");
    let (ledger, auditor) = new_ledger(&dir, Rotation::default());
    fs.fill(48 * 1024);
    let ledger = std::sync::Arc::new(ledger);
    let (acked, e) = append_until_full(&ledger);
    assert!(!acked.is_empty(), "nothing fitted in the space left");
    assert!(is_full_disk(&e), "not a full disk's error: {e:?}");
    let again = {
        let ledger = std::sync::Arc::clone(&ledger);
        bounded("the append after", move || {
            ledger.append(decision("full", 0))
        })
    };
    assert!(
        matches!(again, Err(Error::Poisoned(_))),
        "a ledger whose write failed must refuse: {again:?}"
    );
    bounded("closing the ledger", move || drop(ledger));
    // What the failed write left of itself in the log: reported as torn at the reopen.
    let lengths: Vec<(std::path::PathBuf, u64)> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path(), e.metadata().unwrap().len())
        })
        .collect();
    fs.free();
    let ledger = assert_kept(&dir, &acked, &auditor);
    for t in ledger.torn_at_open() {
        let len = lengths.iter().find(|(p, _)| *p == t.path).map(|(_, l)| *l);
        assert_eq!(
            Some(t.offset + t.len),
            len,
            "the torn tail is all after the sealed end: {t:?}"
        );
    }
    let next = ledger.append(decision("after", 0)).expect("appends again");
    assert!(next.seq > acked.last().unwrap().seq);
}

/// The index (sled) fails a write too large for its log buffer (a `blobs/` file): sled
/// 0.34 is wedged after it (`tally_ledger::store`'s module doc). The write fails at once
/// with the typed index error naming the index, the next is refused without reaching
/// sled, appends are refused, and closing returns instead of waiting forever in sled's
/// drop. The ledger refuses appends from then on. The log holds every acknowledged append
/// and nothing more.
#[test]
fn a_failed_index_write_on_a_full_disk_is_refused_promptly_and_closing_returns() {
    let Some(fs) = Tmpfs::mount(TMPFS_BYTES) else {
        return;
    };
    let dir = fs.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    let acked: Vec<Receipt> = (0..20)
        .map(|i| ledger.append(decision("before", i)).unwrap())
        .collect();
    fs.fill(64 * 1024);
    let ledger = std::sync::Arc::new(ledger);
    let big = vec![(b"p/big".to_vec(), vec![7u8; 512 * 1024])];
    let first = {
        let (ledger, big) = (std::sync::Arc::clone(&ledger), big.clone());
        bounded("a durable index write", move || {
            ledger.put_state_durable(&big)
        })
    };
    match &first {
        Err(e @ Error::Index { path, .. }) => {
            assert_eq!(path, &dir.join("index"), "{e}");
            assert!(is_full_disk(e), "{e}");
        }
        other => panic!("expected the index's typed error, got {other:?}"),
    }
    let second = {
        let ledger = std::sync::Arc::clone(&ledger);
        bounded("the index write after", move || {
            ledger.put_state_durable(&big)
        })
    };
    assert!(
        matches!(&second, Err(Error::Poisoned(why)) if is_full_disk(&Error::Poisoned(why.clone()))),
        "the ledger is closed by the failed index write: {second:?}"
    );
    let append = {
        let ledger = std::sync::Arc::clone(&ledger);
        bounded("an append after", move || {
            ledger.append(decision("after", 0))
        })
    };
    assert!(matches!(append, Err(Error::Poisoned(_))), "{append:?}");
    bounded("closing the ledger", move || drop(ledger));
    fs.free();
    // This process keeps the failed index's handle (and sled's lock on it): the log, the
    // record of truth, is read without it.
    let stored: Vec<u64> = tally_ledger::segment::LogReader::open(&dir)
        .unwrap()
        .frames()
        .filter_map(|f| match f.unwrap() {
            tally_ledger::Frame::Entry(bytes) => Some(Entry::decode(&bytes).unwrap().header.seq),
            _ => None,
        })
        .collect();
    let acked: Vec<u64> = acked.iter().map(|r| r.seq).collect();
    // What the ledger's creation wrote comes before.
    let stored: Vec<u64> = stored.into_iter().filter(|s| *s >= acked[0]).collect();
    assert_eq!(
        stored, acked,
        "the log holds exactly the acknowledged appends"
    );
}

/// A group whose write fails while the ledger closes: the group is refused and closing
/// returns (the syncer, which waits for the committer to finish before it exits, is woken
/// though the failed group left it nothing to sync). Timing-dependent: the drop usually
/// marks the ledger closing before the committer's write fails, which is the case this
/// covers; if the write fails first, the test passes without it (as it would on code
/// without the wake-up). No fault point can order the two: the close flag is set inside
/// `Drop`, where no test code runs, and holding the committer at a point (as the test
/// above does) cannot tell when the drop has set it without a sleep.
#[test]
fn a_group_failing_while_the_ledger_closes_is_refused_and_closing_returns() {
    let Some(fs) = Tmpfs::mount(TMPFS_BYTES) else {
        return;
    };
    let dir = fs.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    fs.fill(0);
    let group = (0..4000).map(|i| decision("closing", i)).collect();
    let (tx, rx) = mpsc::channel();
    ledger.submit_prepared(tally_ledger::ledger::prepare(group).unwrap(), move |r| {
        let _ = tx.send(r.map(|v| v.len()));
    });
    bounded("closing the ledger", move || drop(ledger));
    let answer = rx.recv_timeout(BOUND).expect("the group is answered");
    assert!(
        matches!(&answer, Err(e) if is_full_disk(e)),
        "a group that does not fit is refused with the disk's error: {answer:?}"
    );
}

/// Submit prepared decisions (with state) and wait at most [`BOUND`] for the answer.
fn submit_and_wait(
    ledger: &Ledger,
    decisions: Vec<tally_ledger::Decision>,
    state: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Vec<Receipt>, Error> {
    let (tx, rx) = mpsc::channel();
    let plaintexts = tally_ledger::ledger::prepare(decisions).unwrap();
    ledger.submit_with_state(plaintexts, state, move |r| {
        let _ = tx.send(r);
    });
    rx.recv_timeout(BOUND).expect("answered within the bound")
}

/// The index fails to take a group already whole in the log: the group's state goes to
/// sled with the fold it completes ([`tally_ledger::store::FOLD_GROUPS`] groups), and the
/// fold holds a value sled writes to a `blobs/` file of its own, which the full disk
/// refuses. That group is acknowledged (the log holds it, and a restart finds it: refusing
/// it would make its retry a second copy); every group after it is refused before its log
/// write; and the reopened ledger holds exactly the acknowledged decisions.
#[test]
fn a_group_whole_in_the_log_is_acknowledged_when_its_fold_fails_and_later_groups_are_refused() {
    let Some(fs) = Tmpfs::mount(TMPFS_BYTES) else {
        return;
    };
    let dir = fs.path().join("l");
    let (ledger, auditor) = new_ledger(&dir, Rotation::default());
    let big = vec![(b"big".to_vec(), vec![7u8; 512 * 1024])];
    let mut acked = submit_and_wait(&ledger, vec![decision("big", 0)], big).expect("fits");
    let appended = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&appended);
    tally_ledger::faults::on_group_appended(&dir, move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    // Room for the log's next groups, not for the blob the fold needs.
    fs.fill(384 * 1024);
    let ledger = Arc::new(ledger);
    let (after, e) = append_until_full(&ledger);
    match &e {
        Error::Poisoned(why) if why.contains("writing folded state") => {
            assert!(is_full_disk(&e), "{e}")
        }
        other => panic!("expected the refusal after a failed fold, got {other:?}"),
    }
    assert!(
        !after.is_empty() && after.len() <= tally_ledger::store::FOLD_GROUPS,
        "{} acknowledged",
        after.len()
    );
    assert_eq!(
        appended.load(Ordering::SeqCst),
        after.len(),
        "every group whole in the log (the one whose fold failed too) is acknowledged, and \
         none after it reaches the log"
    );
    let again = {
        let ledger = Arc::clone(&ledger);
        bounded("the append after", move || {
            ledger.append(decision("full", 0))
        })
    };
    assert!(matches!(again, Err(Error::Poisoned(_))), "{again:?}");
    bounded("closing the ledger", move || drop(ledger));
    fs.free();
    acked.extend(after);
    // This process keeps the failed index's handle (and sled's lock on it): a copy of the
    // ledger without its index is opened, as after a restart, its index rebuilt from the log.
    let copy = tempfile::tempdir().unwrap();
    copy_without_index(&dir, copy.path());
    assert_kept(copy.path(), &acked, &auditor);
}

/// Copy a ledger directory, all but its index.
fn copy_without_index(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for item in std::fs::read_dir(from).unwrap() {
        let item = item.unwrap();
        let target = to.join(item.file_name());
        if item.file_type().unwrap().is_dir() {
            if item.file_name() != "index" {
                copy_without_index(&item.path(), &target);
            }
        } else {
            std::fs::copy(item.path(), &target).unwrap();
        }
    }
}

/// A reply callback that panics while the commit thread refuses a group: the ledger is
/// poisoned, the group's other member is still answered (its reply, dropped while the
/// thread unwinds, answers without a second panic aborting the process), and closing the
/// ledger returns (the syncer is woken, not left waiting for a committer that is gone).
#[test]
fn a_reply_panicking_in_a_refused_group_poisons_the_ledger_and_the_rest_are_answered() {
    let Some(fs) = Tmpfs::mount(TMPFS_BYTES) else {
        return;
    };
    let dir = fs.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    // The commit thread is held just after the first group's log write, so the next two
    // submissions wait together and are taken as one group once the disk is full.
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let hold = Mutex::new(Some((entered_tx, release_rx)));
    tally_ledger::faults::on_group_appended(&dir, move || {
        let first = hold.lock().unwrap().take();
        if let Some((entered, release)) = first {
            entered.send(()).unwrap();
            let _ = release.recv_timeout(BOUND);
        }
    });
    let (first_tx, first) = mpsc::channel();
    let prepared = |run| tally_ledger::ledger::prepare(vec![decision(run, 0)]).unwrap();
    ledger.submit_prepared(prepared("held"), move |r| {
        let _ = first_tx.send(r.map(|v| v.len()));
    });
    entered
        .recv_timeout(BOUND)
        .expect("the first group is written");
    fs.fill(0);
    ledger.submit_prepared(prepared("panics"), |_| {
        panic!("a reply callback panics");
    });
    let (second_tx, second) = mpsc::channel();
    ledger.submit_prepared(prepared("answered"), move |r| {
        let _ = second_tx.send(r.map(|v| v.len()));
    });
    release.send(()).unwrap();
    let held = first
        .recv_timeout(BOUND)
        .expect("the first group is answered");
    assert_eq!(
        held.ok(),
        Some(1),
        "the group written before is acknowledged"
    );
    let answer = second.recv_timeout(BOUND).expect("the second is answered");
    assert!(answer.is_err(), "a member of a refused group: {answer:?}");
    let after = ledger.append(decision("after", 0));
    assert!(matches!(after, Err(Error::Poisoned(_))), "{after:?}");
    bounded("closing the ledger", move || drop(ledger));
}
