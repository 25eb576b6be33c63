//! Reindexing and the fold, attacked: a crash between a reindex's renames keeps the
//! operator's pause, reads racing a fold's write never go back, and a reindex gives the
//! live state across rotations and cleared delta bases.

use crate::store::{decision, new_ledger};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tally_ledger::store::INDEX_DIR;
use tally_ledger::{Ledger, Rotation};

use crate::review::{append_with_state, copy_dir, counter, key, value, write_groups};

/// A ledger in `dir` with 10 groups and an operator's pause (`p/run` = 1), left as a
/// reindex that crashed between its renames leaves it: `index.new` built (the pause
/// carried), the old index renamed away to `index.old`, no `index`.
fn crashed_between_reindex_renames(dir: &Path) {
    let (ledger, _) = new_ledger(dir, Rotation::default());
    write_groups(&ledger, 0, 10);
    ledger
        .put_state_durable(&[(b"p/run".to_vec(), vec![1])])
        .unwrap();
    drop(ledger);
    let index = dir.join(INDEX_DIR);
    copy_dir(&index, &dir.join("index.new"));
    std::fs::rename(&index, dir.join("index.old")).unwrap();
}

/// A crash between a reindex's two renames (`index` to `index.old`, `index.new` to
/// `index`) leaves no `index`: the next open must not start an empty one and lose what
/// `put_state_durable` wrote (an operator's pause), nor may the next reindex delete it.
#[test]
fn a_crash_between_the_reindex_renames_keeps_the_operator_pause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    crashed_between_reindex_renames(&dir);
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(
        ledger.state_get(b"p/run").unwrap(),
        Some(vec![1]),
        "the pause survives a crash inside a reindex"
    );
    assert_eq!(counter(0, &ledger.state_get(&key(0)).unwrap().unwrap()), 9);
    drop(ledger);
    Ledger::reindex(&dir).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.state_get(b"p/run").unwrap(), Some(vec![1]));
}

/// ... and the same when the next thing run is `tally reindex` itself.
#[test]
fn a_reindex_after_a_crash_between_its_renames_carries_the_pause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    crashed_between_reindex_renames(&dir);
    let done = Ledger::reindex(&dir).unwrap();
    assert_eq!(done.carried, 1, "{done:?}");
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.state_get(b"p/run").unwrap(), Some(vec![1]));
}

/// `Ledger::state` (the gate loads its tables with it) racing the writer: a value it
/// returns is never older than one acknowledged before the read began, also when a fold
/// is written to sled in the middle of the read.
#[test]
fn state_reads_racing_a_fold_never_go_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    // Many keys after the raced one, so a read's scan of sled takes a while.
    let filler: Vec<(Vec<u8>, Vec<u8>)> = (0..3000)
        .map(|i| (format!("r/z{i:05}").into_bytes(), vec![1u8; 64]))
        .collect();
    append_with_state(&ledger, 0, filler);
    let ledger = Arc::new(ledger);
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ledger, acked, stop) = (ledger.clone(), acked.clone(), stop.clone());
        std::thread::spawn(move || {
            for i in 1u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                append_with_state(&ledger, i, vec![(key(0), value(0, i))]);
                acked.store(i, Ordering::SeqCst);
            }
        })
    };
    let start = Instant::now();
    let mut stale = None;
    let mut reads = 0;
    while start.elapsed() < Duration::from_secs(4) && stale.is_none() {
        let before = acked.load(Ordering::SeqCst);
        let got = ledger.state(b"r/").unwrap();
        reads += 1;
        let v = got
            .iter()
            .find(|(k, _)| *k == key(0))
            .map(|(_, v)| counter(0, v));
        if v.unwrap_or(0) < before {
            stale = Some((v, before));
        }
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert_eq!(
        stale, None,
        "a read returned a value older than acknowledged ({reads} reads)"
    );
}

/// `tally reindex` gives the live writer's state for everything acknowledged, across
/// segment rotations, key epoch rotations, groups pipelined behind an fsync, and the
/// writer's bases cleared over their bound (values over 64 KiB among small ones).
#[test]
fn reindex_gives_the_live_state_across_rotations_and_cleared_bases() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    drop(new_ledger(
        &dir,
        Rotation {
            records: 40,
            ms: u64::MAX,
        },
    ));
    let ledger = Arc::new(Ledger::open_with_segment_bytes(&dir, 512 * 1024).unwrap());
    for round in 0..3u64 {
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let ledger = ledger.clone();
                std::thread::spawn(move || {
                    let (tx, rx) = mpsc::channel();
                    for i in round * 120..(round + 1) * 120 {
                        let p = tally_ledger::ledger::prepare(vec![decision("t", i)]).unwrap();
                        let mut state = vec![
                            (key(t), value(t, i)),
                            (key(10 + i % 5), value(10 + i % 5, i)),
                        ];
                        if t == 0 && i % 6 == 0 {
                            // 1 MiB values: past the bases' 16 MiB every ~16 of them.
                            state.push((format!("r/big-{i}").into_bytes(), vec![i as u8; 1 << 20]));
                        }
                        let tx = tx.clone();
                        ledger.submit_with_state(p, state, move |r| tx.send(r).unwrap());
                        if t == 1 {
                            // One appender waits for each: many small groups between the big.
                            rx.recv().unwrap().unwrap();
                        }
                    }
                    drop(tx);
                    rx.iter().for_each(|r| {
                        r.unwrap();
                    });
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        ledger.rotate().unwrap();
    }
    let live = ledger.state(b"").unwrap();
    let live_keys: BTreeSet<Vec<u8>> = live.iter().map(|(k, _)| k.clone()).collect();
    assert!(live_keys.len() > 20);
    for (k, v) in &live {
        if let Some(n) = k.strip_prefix(b"r/key-") {
            let n: u64 = std::str::from_utf8(n).unwrap().parse().unwrap();
            counter(n, v);
        }
    }
    assert!(ledger.epoch() >= 3);
    drop(ledger);
    Ledger::reindex(&dir).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    let again: BTreeMap<Vec<u8>, Vec<u8>> = ledger.state(b"").unwrap().into_iter().collect();
    assert_eq!(again, live.into_iter().collect::<BTreeMap<_, _>>());
}

/// `tally reindex` rebuilds the tree files from the entries, but only puts them in place
/// when their root is the one the log's last tree frame records: a log whose recorded
/// root is not its entries' (a changed tree frame) is refused, and the tree files are
/// left byte for byte as they were, with nothing beside them.
#[test]
fn a_reindex_whose_tree_is_not_the_logs_recorded_root_changes_nothing() {
    use tally_ledger::segment::{list_segments, scan};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    write_groups(&ledger, 0, 5);
    drop(ledger);
    // Damaged tree files are rebuilt whole.
    let level0 = dir.join("tree/0");
    let good = std::fs::read(&level0).unwrap();
    std::fs::write(&level0, &good[..32]).unwrap();
    let done = Ledger::reindex(&dir).unwrap();
    assert_eq!(std::fs::read(&level0).unwrap(), good);
    assert_eq!(done.tree_leaves, good.len() as u64 / 32);
    // Now change the root the last tree frame records.
    let (_, seg) = list_segments(&dir).unwrap().pop().unwrap();
    let (at, _) = scan(&seg).unwrap().last_tree.expect("a tree frame");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[at as usize + 8 + 5] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    std::fs::write(&level0, &good[..64]).unwrap();
    let err = Ledger::reindex(&dir).unwrap_err().to_string();
    assert!(err.contains("tree frame"), "{err}");
    assert_eq!(std::fs::read(&level0).unwrap(), &good[..64]);
    assert!(!dir.join("tree.rebuild").exists() && !dir.join("tree.old").exists());
}
