//! The two-stage commit pipeline under attack (from an adversarial review): shutdown with
//! a group in flight, a dying sync thread, a callback that drops the last ledger handle,
//! and a mixed stress run (append, append_batch, submit_prepared, rotate) guarding order,
//! exactly-once answers and durability.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_ledger::keys::EpochSecrets;
use tally_ledger::ledger::{files, prepare};
use tally_ledger::{Ledger, Rotation};

use crate::store::{decision, new_ledger, read_back};

fn prepared(run: &str, n: u64) -> Vec<Vec<u8>> {
    prepare((0..n).map(|i| decision(run, i)).collect()).unwrap()
}

/// A group this big takes about a second to encrypt and write in a debug build, so a
/// few hundred ms of sleep reliably lands inside its commit.
const BIG: u64 = 8000;
const SETTLE: Duration = Duration::from_millis(300);
const ANSWER: Duration = Duration::from_secs(10);

/// Drop the ledger while the committer thread writes a group: the sync thread sees
/// `closing`, an empty `applied` and an empty `pending` and exits, although `committing`
/// is set. The group is then pushed to `applied` with no syncer left, and its reply is
/// dropped unanswered at teardown: the submitter is told "stopped before answering"
/// for decisions that are in fact written (and present after reopening).
#[test]
fn drop_with_a_group_in_flight_answers_it_ok() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, auditor) = new_ledger(&path, Rotation::default());
    let big = prepared("big", BIG);
    let (tx, rx) = channel();
    l.submit_prepared(big, move |r| {
        let _ = tx.send(r.map(|v| v.len()).map_err(|e| e.to_string()));
    });
    std::thread::sleep(SETTLE); // the committer thread is now inside write_group
    drop(l);
    let answer = rx.recv_timeout(ANSWER).expect("callback never called");
    let l = Ledger::open(&path).unwrap();
    let stored = read_back(&l, &auditor).len();
    assert_eq!(
        answer,
        Ok(BIG as usize),
        "answer at close (after reopening, {stored} decisions are stored)"
    );
}

/// Submit one decision whose reply callback holds the sync thread (sync role, reply
/// phase) until the returned sender sends or is dropped, then runs `then` there. Returns
/// once the callback is running.
fn hold_sync_thread(l: &Ledger, then: impl FnOnce() + Send + 'static) -> Sender<()> {
    let (started_tx, started_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    l.submit_prepared(prepared("one", 1), move |r| {
        r.unwrap();
        started_tx.send(()).unwrap();
        let _ = release_rx.recv();
        then();
    });
    started_rx.recv_timeout(ANSWER).unwrap();
    release_tx
}

/// The sync thread dies (here: a reply callback panics, which the RoleGuard is meant to
/// handle) while the committer thread writes the next group. RoleGuard sweeps `pending`
/// and `applied`, but the group in flight is pushed to `applied` afterwards; the dead
/// sync thread never takes it and `wake_syncer` only wakes an idle syncer. A blocking
/// appender inside that group waits forever.
#[test]
fn a_dying_sync_thread_strands_no_appender() {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = new_ledger(&dir.path().join("l"), Rotation::default());
    let l = Arc::new(l);
    // Group 1: its callback holds the sync thread (sync role, reply phase).
    let release_tx = hold_sync_thread(&l, || {});
    // Group 2 (X): written by the committer thread, waits in `applied`.
    l.submit_prepared(prepared("x", 1), move |_| {
        std::thread::sleep(SETTLE); // let group 3 get well into its commit
        panic!("review: a reply callback panics on the sync thread");
    });
    std::thread::sleep(SETTLE);
    // Group 3: a blocking appender and a big submission, queued behind `applied`.
    let (b_tx, b_rx) = channel();
    let l2 = Arc::clone(&l);
    std::thread::spawn(move || {
        let _ = b_tx.send(l2.append(decision("b", 0)).map_err(|e| e.to_string()));
    });
    std::thread::sleep(SETTLE);
    let (y_tx, y_rx) = channel();
    l.submit_prepared(prepared("y", BIG), move |r| {
        let _ = y_tx.send(r.is_ok());
    });
    release_tx.send(()).unwrap();
    // Either answer is acceptable (the ledger is poisoned); never answering is not.
    let b = b_rx.recv_timeout(ANSWER);
    let y = y_rx.recv_timeout(Duration::from_millis(100));
    assert!(
        b.is_ok() && y.is_ok(),
        "blocking appender answered: {b:?}; big submission answered: {y:?}"
    );
}

/// A reply callback holds the last handle (allowed: `Drop for Ledger` skips joining its
/// own thread). Dropping it on the sync thread joins the committer, which waits for the
/// syncer to take `applied` before committing `pending`: both threads wait forever.
#[test]
fn a_callback_dropping_the_last_handle_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = new_ledger(&dir.path().join("l"), Rotation::default());
    let l = Arc::new(l);
    let last = Arc::clone(&l);
    // The last handle: Ledger::drop runs on the sync thread.
    let release_tx = hold_sync_thread(&l, move || drop(last));
    let (x_tx, x_rx) = channel();
    l.submit_prepared(prepared("x", 1), move |r| {
        let _ = x_tx.send(r.is_ok());
    });
    std::thread::sleep(SETTLE); // X is written and waits in `applied`
    let (y_tx, y_rx) = channel();
    l.submit_prepared(prepared("y", 1), move |r| {
        let _ = y_tx.send(r.is_ok());
    });
    drop(l);
    release_tx.send(()).unwrap();
    let x = x_rx.recv_timeout(ANSWER);
    let y = y_rx.recv_timeout(Duration::from_millis(100));
    assert!(
        matches!(x, Ok(true)) && matches!(y, Ok(true)),
        "X answered: {x:?}; Y answered: {y:?}"
    );
}

/// Guard: many threads mixing append, append_batch, submit_prepared and rotate, with
/// count-based rotation every few groups. Every submission is answered once, Ok, in
/// submission order, only once the durable checkpoint covers it; seqs are unique; the
/// chain reads back; the key file matches the epoch; reopening works.
#[test]
fn mixed_stress_answers_everything_in_order_and_durably() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let rotation = Rotation {
        records: 40,
        ms: u64::MAX,
    };
    let (l, auditor) = new_ledger(&path, rotation);
    let l = Arc::new(l);
    let mut expected = 0usize;
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let l = Arc::clone(&l);
        threads.push(std::thread::spawn(move || {
            let mut seqs = Vec::new();
            for i in 0..40u64 {
                let receipts = if t % 2 == 0 {
                    vec![l.append(decision(&format!("a{t}"), i)).unwrap()]
                } else {
                    let batch = (0..1 + i % 5)
                        .map(|k| decision(&format!("b{t}"), 10 * i + k))
                        .collect();
                    l.append_batch(batch).unwrap()
                };
                assert!(l.checkpoint().size > receipts.last().unwrap().seq);
                seqs.extend(receipts.iter().map(|r| r.seq));
            }
            seqs
        }));
        expected += if t % 2 == 0 {
            40
        } else {
            (0..40).map(|i| 1 + i % 5).sum::<usize>()
        };
    }
    {
        let l = Arc::clone(&l);
        threads.push(std::thread::spawn(move || {
            let mut epochs = Vec::new();
            for _ in 0..6 {
                epochs.push(l.rotate().unwrap().epoch);
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
            Vec::new()
        }));
    }
    let answers = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done_rx) = channel();
    let submissions = 300u64;
    for i in 0..submissions {
        let n = 1 + i % 4;
        expected += n as usize;
        let (answers, done_tx, l2) = (Arc::clone(&answers), done_tx.clone(), Arc::clone(&l));
        l.submit_prepared(prepared(&format!("s{i}"), n), move |r| {
            let receipts = r.unwrap();
            assert_eq!(receipts.len() as u64, n);
            assert!(l2.checkpoint().size > receipts.last().unwrap().seq);
            answers.lock().unwrap().push((i, receipts));
            done_tx.send(()).unwrap();
        });
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for _ in 0..submissions {
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    }
    let mut seqs: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let answers = answers.lock().unwrap();
    assert_eq!(
        answers.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..submissions).collect::<Vec<_>>(),
        "submit_prepared answers in submission order"
    );
    let async_seqs: Vec<u64> = answers
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.seq))
        .collect();
    assert!(async_seqs.windows(2).all(|w| w[0] < w[1]));
    seqs.extend(async_seqs);
    seqs.sort_unstable();
    let before = seqs.len();
    seqs.dedup();
    assert_eq!(seqs.len(), before, "every seq once");
    assert_eq!(seqs.len(), expected);
    assert_eq!(read_back(&l, &auditor).len(), expected);
    let epoch = l.epoch();
    assert!(epoch >= 6);
    assert!(!path.join(files::WRITER_KEY_NEXT).exists());
    let key = EpochSecrets::read(&path.join(files::WRITER_KEY), l.id()).unwrap();
    assert_eq!(key.epoch, epoch);
    drop(answers);
    let l = Arc::try_unwrap(l).ok().expect("no other handle");
    drop(l);
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.epoch(), epoch);
    assert_eq!(read_back(&l, &auditor).len(), expected);
}

/// The Merkle tree of big groups (and of small ones between them, and of groups that
/// rotate the epoch), each leaf also the input of the entry's chain hash, is the RFC 6962
/// tree of the log's entries, as an independent implementation computes it, at every size the
/// ledger reports, and again after reopening (the tree frame and tiles agree with it).
#[test]
fn the_tree_of_every_group_is_the_tree_of_the_log() {
    use tally_ledger::tlog::merkle::{range_root, TreeHash};
    struct Leaves(Vec<TreeHash>);
    impl tlog_tiles::HashReader for Leaves {
        fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<tlog_tiles::Hash>, tlog_tiles::Error> {
            Ok(indexes
                .iter()
                .map(|&i| {
                    let (level, n) = tlog_tiles::split_stored_hash_index(i);
                    let lo = (n << level) as usize;
                    tlog_tiles::Hash(range_root(&self.0[lo..lo + (1usize << level)]))
                })
                .collect())
        }
    }
    // Leaves hashed by tlog_tiles from the log's entry bytes.
    let root_of_log = |dir: &std::path::Path| -> (u64, TreeHash) {
        let leaves: Vec<TreeHash> = tally_ledger::segment::LogReader::open(dir)
            .unwrap()
            .frames()
            .filter_map(|f| match f.unwrap() {
                tally_ledger::Frame::Entry(b) => Some(tlog_tiles::record_hash(&b).0),
                _ => None,
            })
            .collect();
        let n = leaves.len() as u64;
        (n, tlog_tiles::tree_hash(n, &Leaves(leaves)).unwrap().0)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, _auditor) = new_ledger(&path, Rotation::default());
    for (i, n) in [1u64, 127, 128, 129, 700, 2, 1000, 131]
        .into_iter()
        .enumerate()
    {
        if i == 6 {
            l.rotate().unwrap();
        }
        let (tx, rx) = channel();
        l.submit_prepared(prepared(&format!("r{i}"), n), move |r| {
            let _ = tx.send(r.map(|v| v.len()).map_err(|e| e.to_string()));
        });
        assert_eq!(rx.recv_timeout(ANSWER).unwrap(), Ok(n as usize));
        let (cp, root) = l.tree_head();
        assert_eq!(
            (cp.size, root),
            root_of_log(&path),
            "after group {i} of {n}"
        );
    }
    let (cp, root) = l.tree_head();
    drop(l);
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.tree_head().1, root);
    assert_eq!(l.tree_head().0.size, cp.size);
}
