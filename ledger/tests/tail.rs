//! Opening for writing checks the tail it extends (docs/FORMAT.md, "Opening for
//! writing"): a changed byte in the last group, or bytes after the sealed end that no
//! crash leaves, are refused with nothing written; a crash's torn write still reopens,
//! and is reported.

use std::fs;
use std::path::{Path, PathBuf};

use tally_ledger::segment::{segment_name, Torn, LOG_DIR};
use tally_ledger::{Error, Ledger, Rotation};

use crate::segments::hash_tree;
use crate::store::{decision, new_ledger};

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(LOG_DIR).join(segment_name(n))
}

/// Append one group of `n` decisions with a state value, as the gate does.
fn group(ledger: &Ledger, first: u64, n: u64, state: &[u8]) {
    let p = tally_ledger::ledger::prepare((first..first + n).map(|i| decision("r", i)).collect())
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    ledger.submit_with_state(p, vec![(b"r/r".to_vec(), state.to_vec())], move |r| {
        tx.send(r).unwrap()
    });
    rx.recv().unwrap().unwrap();
}

/// A ledger of four groups (each with a state frame), closed; the byte offsets where
/// its last two groups start (just after the checkpoint that ends the group before).
fn four_groups(dir: &Path) -> (u64, u64) {
    let (ledger, _) = new_ledger(dir, Rotation::default());
    let mut ends = Vec::new();
    for g in 0..4u64 {
        group(&ledger, 1 + g * 3, 3, format!("state {g}").as_bytes());
        ends.push(fs::metadata(segment_path(dir, 0)).unwrap().len());
    }
    drop(ledger);
    (ends[1], ends[2])
}

fn refused(dir: &Path) -> Option<String> {
    match Ledger::open(dir) {
        Err(e @ Error::TailDamaged { .. }) => Some(e.to_string()),
        Err(other) => panic!("refused with another error: {other}"),
        Ok(_) => None,
    }
}

/// Every byte of the last group and of the checkpoint before it, changed one at a time:
/// the ledger is refused for writing, with the verify command to run, and no file changes
/// (only the group's state frame, which is not hashed, may still open: its check is read
/// when the index replays it).
#[test]
fn every_byte_of_the_tail_changed_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (before_prev, last) = four_groups(&dir);
    let path = segment_path(&dir, 0);
    let pristine = fs::read(&path).unwrap();
    // The state frame of the last group: after its three entry frames.
    let state_frame = {
        let mut at = last as usize;
        for _ in 0..3 {
            let len = u32::from_be_bytes(pristine[at + 1..at + 5].try_into().unwrap()) as usize;
            at += 5 + len;
        }
        assert_eq!(pristine[at], 4, "a state frame follows the entries");
        let len = u32::from_be_bytes(pristine[at + 1..at + 5].try_into().unwrap()) as usize;
        at + 5..at + 5 + len
    };
    // The checkpoint frame ending the group before the last one starts after that
    // group's entries and state: find it as the last tag 2 frame before `last`.
    let prev_checkpoint = {
        let mut at = before_prev as usize;
        let mut cp = None;
        while at < last as usize {
            let len = u32::from_be_bytes(pristine[at + 1..at + 5].try_into().unwrap()) as usize;
            if pristine[at] == 2 {
                cp = Some(at);
            }
            at += 5 + len;
        }
        cp.unwrap()
    };
    let mut opened = 0;
    for i in prev_checkpoint..pristine.len() {
        let mut bad = pristine.clone();
        bad[i] ^= 1 << (i % 8);
        fs::write(&path, &bad).unwrap();
        let files = hash_tree(&dir);
        match refused(&dir) {
            Some(why) => {
                assert!(
                    why.contains("refusing to write")
                        && why.contains(&format!("tally verify {}", dir.display())),
                    "byte {i}: {why}"
                );
                assert_eq!(
                    hash_tree(&dir),
                    files,
                    "byte {i}: a refused open changed a file"
                );
            }
            None => {
                assert!(
                    state_frame.contains(&i),
                    "byte {i} of the tail changed, and the ledger opened for writing"
                );
                opened += 1;
            }
        }
    }
    fs::write(&path, &pristine).unwrap();
    assert!(
        opened < state_frame.len(),
        "the state frame's check caught some"
    );
    // Unchanged, it opens and appends.
    Ledger::open(&dir)
        .unwrap()
        .append(decision("r", 99))
        .unwrap();
}

/// A crash leaves a prefix of one group's write after the sealed end: every such prefix
/// (and zeros a file system extended the file with) reopens, is reported, and stays.
#[test]
fn a_crash_torn_tail_reopens_and_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    four_groups(&dir);
    let path = segment_path(&dir, 0);
    let sealed = fs::read(&path).unwrap();
    // The next group's write, as the writer makes it: appended in a copy.
    let write = {
        let copy = tmp.path().join("copy");
        fs::create_dir(&copy).unwrap();
        for f in ["ledger.pub", "config.json", "writer.key", "log.key"] {
            fs::copy(dir.join(f), copy.join(f)).unwrap();
        }
        fs::create_dir(copy.join(LOG_DIR)).unwrap();
        fs::write(segment_path(&copy, 0), &sealed).unwrap();
        let l = Ledger::open(&copy).unwrap();
        group(&l, 13, 3, b"state 4, a little longer than before");
        drop(l);
        fs::read(segment_path(&copy, 0)).unwrap()[sealed.len()..].to_vec()
    };
    let cuts = (1..write.len()).chain([0]);
    for cut in cuts {
        let mut torn = sealed.clone();
        if cut == 0 {
            torn.extend_from_slice(&[0u8; 300]);
        } else {
            torn.extend_from_slice(&write[..cut]);
        }
        fs::write(&path, &torn).unwrap();
        let ledger = Ledger::open(&dir).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(
            ledger.torn_at_open(),
            [Torn {
                segment: 0,
                path: path.clone(),
                offset: sealed.len() as u64,
                len: (torn.len() - sealed.len()) as u64,
            }],
            "cut at {cut}"
        );
        drop(ledger);
        assert_eq!(fs::read(&path).unwrap(), torn, "the torn bytes stay");
    }
    // And the log resumes after it.
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.append(decision("r", 50)).unwrap().seq, 13);
    drop(ledger);
    assert!(segment_path(&dir, 1).exists());
    assert!(Ledger::open(&dir).unwrap().torn_at_open().is_empty());
}

/// A changed frame prefix in an earlier group makes everything after it look like a torn
/// write; the writer must not take it for one (it would resume after the earlier
/// checkpoint, dropping the sealed groups after it): refused, and no segment is added.
#[test]
fn sealed_groups_are_never_taken_for_a_torn_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (second_to_last, last) = four_groups(&dir);
    let path = segment_path(&dir, 0);
    let pristine = fs::read(&path).unwrap();
    let patch = |at: usize, bytes: &[u8]| {
        let mut bad = pristine.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        bad
    };
    let past_the_end = 65_000u32.to_be_bytes(); // within an entry's bound
    for (start, whose) in [
        (second_to_last, "an earlier group"),
        (last, "the last group"),
    ] {
        let at = start as usize;
        for (what, bad, says) in [
            ("an unknown tag", patch(at, &[9]), "unknown tag"),
            (
                "a length over the bound",
                patch(at + 1, &[1]),
                "more than its tag allows",
            ),
            (
                "a length that runs past the end of the file",
                patch(at + 1, &past_the_end),
                "a checkpoint signed by this ledger's writer lies after the sealed end",
            ),
            (
                "a length that ends inside the file",
                patch(at + 4, &[pristine[at + 4] ^ 0x40]),
                "does not decode",
            ),
        ] {
            fs::write(&path, &bad).unwrap();
            let why = refused(&dir).unwrap_or_else(|| panic!("{what} in {whose}: opened"));
            assert!(why.contains(says), "{what} in {whose}: {why}");
            assert!(
                !segment_path(&dir, 1).exists(),
                "{what} in {whose}: a segment was added"
            );
        }
    }
    // Garbage after the sealed end that is not zeros, and an entry that does not link.
    let mut garbage = pristine.clone();
    garbage.extend_from_slice(b"\x01\x00\x00\x00\x10not an entry....");
    fs::write(&path, &garbage).unwrap();
    let why = refused(&dir).expect("a whole frame that is not an entry");
    assert!(why.contains("does not decode"), "{why}");
    let mut relinked = pristine.clone();
    let first_entry = &pristine[last as usize..];
    let len = u32::from_be_bytes(first_entry[1..5].try_into().unwrap()) as usize;
    relinked.extend_from_slice(&first_entry[..5 + len]);
    fs::write(&path, &relinked).unwrap();
    let why = refused(&dir).expect("an old entry copied after the sealed end");
    assert!(why.contains("stands where seq"), "{why}");
    // A segment after the sealed end whose header starts somewhere else.
    fs::write(&path, &pristine).unwrap();
    let mut header = fs::read(&path).unwrap()[..80].to_vec();
    header[39] = 1; // number 1
    fs::write(segment_path(&dir, 1), &header).unwrap();
    let why = refused(&dir).expect("a stray segment");
    assert!(
        why.contains("does not start where the log is sealed"),
        "{why}"
    );
    fs::remove_file(segment_path(&dir, 1)).unwrap();
    Ledger::open(&dir).unwrap();
}
