//! A full disk, for real: the ledger on a small tmpfs filled up (ENOSPC). Every operation
//! answers with an error within a bound (none waits forever), nothing acknowledged is
//! lost, and the ledger opens and appends again once there is space.

use std::path::Path;
use std::sync::mpsc;
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

/// Each acknowledged receipt is in the reopened ledger, byte for byte (its hash), and the
/// whole chain reads back.
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
    assert!(decisions.len() >= acked.len());
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
/// drop. The log still holds every acknowledged append.
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
        matches!(&second, Err(Error::Index { why, .. }) if why.contains("an earlier write failed")),
        "{second:?}"
    );
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
    for r in &acked {
        assert!(stored.contains(&r.seq), "acknowledged seq {} lost", r.seq);
    }
}

/// A group whose write fails while the ledger closes: the group is refused and closing
/// returns (the syncer, which waits for the committer to finish before it exits, is woken
/// though the failed group left it nothing to sync).
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
