//! Attacks on the state frames (tag 4), the fold and the index mark: an index ahead of
//! the log after a power failure, an index behind it, a fold lost to `kill -9`, a crash
//! between a reindex's renames, oversized and bomb-like state frames, and reads racing
//! a fold's write to sled.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tally_ledger::segment::{
    list_segments, LogReader, StateFrame, StateValue, MAX_STATE_LEN, TAG_STATE_DELTA,
};
use tally_ledger::store::{Point, Store, INDEX_DIR};
use tally_ledger::{Header, Ledger, Rotation};

use crate::store::{decision, new_ledger};

const CHILD_DIR: &str = "TALLY_REVIEW_DIR";
const CHILD_GROUPS: &str = "TALLY_REVIEW_GROUPS";
const CHILD_FROM: &str = "TALLY_REVIEW_FROM";
const SEGMENT_BYTES: u64 = 64 * 1024;

/// Value `i` of key `k`: mostly what value `i - 1` held, so most are written as deltas.
pub(crate) fn value(k: u64, i: u64) -> Vec<u8> {
    let mut v = i.to_be_bytes().to_vec();
    for j in 0..30u64 {
        v.extend_from_slice(&(i.wrapping_sub(j) ^ (k << 40)).to_be_bytes());
    }
    v.extend_from_slice(format!("key {k}, a tail that never changes").as_bytes());
    v
}

pub(crate) fn key(k: u64) -> Vec<u8> {
    format!("r/key-{k}").into_bytes()
}

/// The counter a value holds, checking the whole value is one the writer wrote.
pub(crate) fn counter(k: u64, v: &[u8]) -> u64 {
    let i = u64::from_be_bytes(v[..8].try_into().unwrap());
    assert_eq!(v, value(k, i), "key {k}: not a value the writer wrote");
    i
}

/// Append one decision whose group writes `state`, and wait for it.
pub(crate) fn append_with_state(ledger: &Ledger, i: u64, state: Vec<(Vec<u8>, Vec<u8>)>) -> u64 {
    let p = tally_ledger::ledger::prepare(vec![decision("review", i)]).unwrap();
    let (tx, rx) = mpsc::channel();
    ledger.submit_with_state(p, state, move |r| tx.send(r).unwrap());
    rx.recv().unwrap().unwrap()[0].seq
}

/// Groups `from..from + n`, group `i` writing value `i` of keys 0..4.
pub(crate) fn write_groups(ledger: &Ledger, from: u64, n: u64) {
    for i in from..from + n {
        append_with_state(ledger, i, (0..4).map(|k| (key(k), value(k, i))).collect());
    }
}

/// The child of the tests below: opens the ledger, writes `CHILD_GROUPS` groups from
/// `CHILD_FROM`, prints `DONE` and waits to be killed (so its fold never reaches sled).
#[test]
#[ignore = "run by the review tests as their child process"]
fn review_child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let n: u64 = std::env::var(CHILD_GROUPS).unwrap().parse().unwrap();
    let from: u64 = std::env::var(CHILD_FROM).unwrap().parse().unwrap();
    let ledger = Ledger::open_with_segment_bytes(Path::new(&dir), SEGMENT_BYTES).unwrap();
    write_groups(&ledger, from, n);
    // Not `println!`: the test harness captures that.
    let mut out = std::io::stdout().lock();
    writeln!(out, "DONE").unwrap();
    out.flush().unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs(600));
}

/// Run the child on `dir` for groups `from..from + n`, then SIGKILL it.
fn run_child_and_kill(dir: &Path, from: u64, n: u64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "review::review_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env(CHILD_GROUPS, n.to_string())
        .env(CHILD_FROM, from.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let done = lines.map_while(Result::ok).any(|l| l.ends_with("DONE"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(done, "the child wrote its groups");
}

/// Run this binary's ignored test `test` as a child process with `env` until it ends:
/// whether it died of `abort` (a fault point, as `kill -9`), and how it ended.
pub(crate) fn child_to_abort(
    test: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (bool, std::process::ExitStatus) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            test,
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    let abort = rustix::process::Signal::ABORT.as_raw();
    (status.signal() == Some(abort), status)
}

/// Every entry from seq 1 to the checkpoint is found through the index's points.
fn every_entry_found(ledger: &Ledger) {
    for seq in 1..ledger.checkpoint().size {
        let bytes = ledger
            .entry(seq)
            .unwrap_or_else(|e| panic!("entry {seq}: {e}"))
            .unwrap_or_else(|| panic!("entry {seq} not found"));
        assert_eq!(Header::decode(&bytes).unwrap().seq, seq);
    }
}

/// Every frame of the log reads, with no torn write: what was acknowledged is sealed.
fn log_reads_whole(dir: &Path) {
    for item in LogReader::open(dir).unwrap() {
        match item {
            Ok(tally_ledger::segment::Item::Torn(t)) => {
                panic!("a torn write after clean closes: {t:?}")
            }
            Ok(_) => {}
            Err(e) => panic!("the log does not read: {e}"),
        }
    }
}

fn last_segment(dir: &Path) -> u64 {
    list_segments(dir).unwrap().last().unwrap().0
}

/// A power failure after sled made a fold durable (its background flush, or a
/// `put_state_durable` beside the appends) but before the log's fsync made the segment
/// that fold's groups went to exist: the index's mark and points name segment N, which
/// the log no longer has. The writer must resume without leaving a gap in the segment
/// numbers (every later open and `verify` refuses a gap), and the stale mark and points
/// must never make it read the new segment N from a byte of the lost one.
#[test]
fn an_index_ahead_into_a_lost_segment_leaves_no_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    drop(new_ledger(&dir, Rotation::default()));
    let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES).unwrap();
    write_groups(&ledger, 0, 40);
    let size = ledger.checkpoint().size;
    drop(ledger);
    let lost = last_segment(&dir) + 1;
    // What sled held from the lost segment: state, a seq point, the mark.
    let store = Store::open(&dir).unwrap();
    store
        .apply_group(
            [(&key(0)[..], &value(0, 1000)[..])],
            Some(Point {
                seq: size + 3,
                segment: lost,
                offset: 1234,
            }),
            (lost, 5000),
        )
        .unwrap();
    store.fold().unwrap();
    store.sync().unwrap();
    drop(store);
    // A writer resumes, writes groups (key 0..4, mostly deltas) and is killed before its
    // fold reaches sled.
    run_child_and_kill(&dir, 40, 60);
    let segments = list_segments(&dir).unwrap_or_else(|e| panic!("the log after resuming: {e}"));
    assert!(segments.len() as u64 > lost, "{segments:?}");
    let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES)
        .unwrap_or_else(|e| panic!("reopening after the index was ahead: {e}"));
    for k in 0..4 {
        let v = ledger.state_get(&key(k)).unwrap().unwrap();
        assert_eq!(counter(k, &v), 99, "key {k}");
    }
    every_entry_found(&ledger);
    drop(ledger);
    // Reopened once more (the fold now in sled): the entries are still found.
    let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES).unwrap();
    every_entry_found(&ledger);
    drop(ledger);
    assert!(LogReader::open(&dir).unwrap().all(|i| i.is_ok()));
    Ledger::reindex(&dir).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    for k in 0..4 {
        assert_eq!(counter(k, &ledger.state_get(&key(k)).unwrap().unwrap()), 99);
    }
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &p);
        } else {
            std::fs::copy(e.path(), &p).unwrap();
        }
    }
}

fn replace_index(dir: &Path, with: &Path) {
    tally_ledger::store::remove_index(&dir.join(INDEX_DIR)).unwrap();
    copy_dir(with, &dir.join(INDEX_DIR));
}

/// The index behind the log (an older copy of it: sled lost its last batches) and ahead
/// of it (a newer copy beside a log cut back to an earlier prefix, as a power failure
/// leaves it, in the same segment): every delta still decodes against the writer's base,
/// and a writer that then writes and is killed leaves state that reopens and reindexes.
#[test]
fn an_index_behind_or_ahead_of_the_log_decodes_every_delta() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    drop(new_ledger(&dir, Rotation::default()));
    let ledger = Ledger::open(&dir).unwrap();
    write_groups(&ledger, 0, 300);
    drop(ledger);
    let t1 = tmp.path().join("t1");
    copy_dir(&dir, &t1);
    let ledger = Ledger::open(&dir).unwrap();
    write_groups(&ledger, 300, 300);
    drop(ledger);
    let t2_index = tmp.path().join("t2-index");
    copy_dir(&dir.join(INDEX_DIR), &t2_index);

    // Behind: the index of t1 beside the log of t2.
    replace_index(&dir, &t1.join(INDEX_DIR));
    let ledger = Ledger::open(&dir).unwrap();
    for k in 0..4 {
        assert_eq!(
            counter(k, &ledger.state_get(&key(k)).unwrap().unwrap()),
            599
        );
    }
    drop(ledger);

    // Ahead: the log of t1 (a prefix of t2's, in the same segment) beside t2's index.
    let ahead = tmp.path().join("ahead");
    copy_dir(&t1, &ahead);
    replace_index(&ahead, &t2_index);
    run_child_and_kill(&ahead, 1000, 30);
    let ledger = Ledger::open(&ahead).unwrap();
    for k in 0..4 {
        assert_eq!(
            counter(k, &ledger.state_get(&key(k)).unwrap().unwrap()),
            1029
        );
    }
    every_entry_found(&ledger);
    drop(ledger);
    Ledger::reindex(&ahead).unwrap();
    let ledger = Ledger::open(&ahead).unwrap();
    for k in 0..4 {
        assert_eq!(
            counter(k, &ledger.state_get(&key(k)).unwrap().unwrap()),
            1029
        );
    }
}

/// A group's state frame longer than a state frame may be (64 MiB) would be written,
/// fsynced and acknowledged, and then never read back: the scan takes its length for
/// a torn write, so the acknowledged decision disappears on the next open. Such state
/// must be refused before it is written (or read back whole).
#[test]
fn a_state_frame_too_long_for_the_log_is_never_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    let big = vec![7u8; MAX_STATE_LEN + 1];
    let p = tally_ledger::ledger::prepare(vec![decision("big", 0)]).unwrap();
    let (tx, rx) = mpsc::channel();
    ledger.submit_with_state(p, vec![(b"r/big".to_vec(), big)], move |r| {
        tx.send(r).unwrap()
    });
    let acknowledged = rx.recv().unwrap();
    // Whatever happened to it, the ledger keeps taking appends.
    let after = append_with_state(&ledger, 1, vec![(key(0), value(0, 1))]);
    drop(ledger);
    log_reads_whole(&dir);
    let ledger = Ledger::open(&dir).unwrap();
    assert!(
        ledger.checkpoint().size > after,
        "an acknowledged append was lost"
    );
    every_entry_found(&ledger);
    if let Ok(receipts) = acknowledged {
        assert!(
            ledger.checkpoint().size > receipts[0].seq,
            "acknowledged seq {} lost on reopen (size {})",
            receipts[0].seq,
            ledger.checkpoint().size
        );
        assert_eq!(
            ledger.state_get(b"r/big").unwrap().map(|v| v.len()),
            Some(MAX_STATE_LEN + 1)
        );
    }
}

/// Many groups whose state frames are each within the bound, gathered into one commit
/// group, must not make a frame past it either.
#[test]
fn groups_gathered_together_never_make_a_state_frame_too_long() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    let ledger = Arc::new(ledger);
    // Submitted without waiting: the pipeline gathers them into few groups.
    let (tx, rx) = mpsc::channel();
    for i in 0..6u64 {
        let p = tally_ledger::ledger::prepare(vec![decision("big", i)]).unwrap();
        // Incompressible and under distinct keys: nothing shrinks them.
        let v: Vec<u8> = (0..(MAX_STATE_LEN / 4) as u64)
            .map(|j| (j.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ i as u8)
            .collect();
        let tx = tx.clone();
        ledger.submit_with_state(p, vec![(format!("r/big-{i}").into_bytes(), v)], move |r| {
            tx.send(r).unwrap()
        });
    }
    drop(tx);
    let acked: Vec<u64> = rx.iter().filter_map(|r| r.ok().map(|r| r[0].seq)).collect();
    assert_eq!(acked.len(), 6, "each is within the bound on its own");
    drop(ledger);
    log_reads_whole(&dir);
    let ledger = Ledger::open(&dir).unwrap();
    every_entry_found(&ledger);
    let size = ledger.checkpoint().size;
    for seq in acked {
        assert!(
            size > seq,
            "acknowledged seq {seq} lost on reopen (size {size})"
        );
    }
}

/// A delta frame of a few hundred KiB decodes to far more than the 64 MiB a state frame
/// (and its check's tag 3 form) may hold: 2 pairs of 40 MiB each here; a 64 MiB frame
/// would reach 16 GiB. Decoding must stop at the bound instead of allocating it.
#[test]
fn a_delta_frame_never_decodes_to_more_than_a_state_frame_holds() {
    let base = vec![0u8; 64];
    let v = vec![0u8; 40 << 20];
    let payload = StateFrame::encode(&[(b"r/a", &v[..]), (b"r/b", &v[..])], |_| Some(&base[..]));
    assert!(payload.len() < 1 << 20, "{} bytes", payload.len());
    let frame = StateFrame::decode(TAG_STATE_DELTA, &payload).unwrap();
    assert!(
        frame.resolve(|_| Some(&base[..])).is_err(),
        "a frame decoding to 80 MiB of values was accepted"
    );
    // One delta claiming 64 MiB on a 3-byte block is refused before it is decoded.
    let mut tiny = vec![0, 0, 0, 0, 0, 3, b'r', b'/', b'a', 1];
    tiny.extend_from_slice(&[0x80, 0x80, 0x80, 0x20, 3, 0x10, b'x', 0]);
    if let Ok(f) = StateFrame::decode(TAG_STATE_DELTA, &tiny) {
        assert!(f.resolve(|_| Some(&base[..])).is_err());
    }
    assert!(matches!(
        StateValue::encode(&v, Some(&base)),
        StateValue::Delta { .. }
    ));
}

/// A writer that dies (`abort`, as `kill -9`: nothing flushed, no destructor) while its
/// open replays the log into the index (the index was removed, so the replay is long and
/// writes folds to sled as it goes), again and again, each time at a point of the replay
/// chosen in advance (the `faults` fault point, not a race with the clock): every later
/// open decodes every delta (no frame applied twice, none skipped) and the state is the
/// last the log holds.
#[test]
fn kill_9_during_the_replay_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    drop(new_ledger(&dir, Rotation::default()));
    let ledger = Ledger::open(&dir).unwrap();
    // Besides keys 0..4, each group writes new keys of 4 KiB, so the replay writes enough
    // to sled for its buffers to reach the file before the abort.
    const GROUPS: u64 = 1500;
    for i in 0..GROUPS {
        let mut state: Vec<_> = (0..4).map(|k| (key(k), value(k, i))).collect();
        state.extend((0..8u64).map(|j| {
            (
                format!("r/fill-{i:05}-{j}").into_bytes(),
                vec![j as u8; 4096],
            )
        }));
        append_with_state(&ledger, i, state);
    }
    drop(ledger);
    let end = Store::open(&dir).unwrap().mark().unwrap();
    assert!(end.is_some());
    tally_ledger::store::remove_index(&dir.join(INDEX_DIR)).unwrap();
    // Each child replays from the mark the one before left: it dies after this many state
    // frames of its own replay (all of them fewer than what is left to replay), some just
    // after sled wrote out what it held (so the index on disk holds part of a replay).
    let mut marks = Vec::new();
    for at in [
        "1",
        "300/flushed",
        "90",
        "300/flushed",
        "40",
        "300/flushed",
        "7",
    ] {
        let (aborted, status) = child_to_abort(
            "review::review_child_writer",
            &[
                (CHILD_DIR, dir.as_os_str()),
                (CHILD_GROUPS, "0".as_ref()),
                (CHILD_FROM, "0".as_ref()),
                (tally_ledger::faults::REPLAY_ABORT_AFTER, at.as_ref()),
            ],
        );
        assert!(
            aborted,
            "the child did not die inside its replay (after {at} state frames): {status}"
        );
        marks.push(Store::open(&dir).unwrap().mark().unwrap());
    }
    assert!(
        marks.iter().all(|m| *m != end),
        "a child finished the replay it was to die in: {marks:?}"
    );
    // The flushed aborts left part of a replay in the index, and later ones went on
    // from it.
    let partial: BTreeSet<_> = marks.iter().flatten().collect();
    assert!(partial.len() >= 3, "{marks:?}");
    let ledger = Ledger::open(&dir).unwrap_or_else(|e| panic!("open after kills in replay: {e}"));
    for k in 0..4 {
        assert_eq!(
            counter(k, &ledger.state_get(&key(k)).unwrap().unwrap()),
            GROUPS - 1
        );
    }
    every_entry_found(&ledger);
    eprintln!("marks after each abort: {marks:?}");
}

/// A delta no shorter than its value is a form no writer makes (it writes a delta only
/// when `block_len + 4 < len`): two encodings of one value, so strict decoding refuses it.
#[test]
fn a_delta_no_shorter_than_its_value_is_refused() {
    let base = b"abc".to_vec();
    // A block of the 3 literals "abc": token 0x30, then the bytes.
    let block = [0x30, b'a', b'b', b'c'];
    let pairs = [(b"r/a".to_vec(), b"abc".to_vec())];
    let check = blake3::hash(&tally_ledger::segment::encode_state(
        pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
    ));
    let mut payload = check.as_bytes()[..4].to_vec();
    payload.extend_from_slice(&[0, 3, b'r', b'/', b'a', 1, 3, 4]);
    payload.extend_from_slice(&block);
    // The block itself decodes: only its form is wrong.
    let value = StateValue::Delta {
        len: 3,
        block: block.to_vec(),
    };
    assert_eq!(value.resolve(Some(&base)).unwrap(), b"abc");
    assert!(
        StateFrame::decode(TAG_STATE_DELTA, &payload).is_err(),
        "a 4-byte delta of a 3-byte value was accepted"
    );
}
