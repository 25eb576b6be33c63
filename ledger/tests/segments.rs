//! The log: segment bytes as FORMAT.md says, torn writes kept and resumed after, the old
//! layout refused, derived state rebuilt from the log, readers that change no byte, and
//! the append-only inode attribute.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tally_ledger::format::{entry_hash, Entry, Hash};
use tally_ledger::segment::{
    segment_name, Item, LogReader, SegmentHeader, Torn, LOG_DIR, SEGMENT_HEADER_LEN, SEGMENT_MAGIC,
};
use tally_ledger::{Error, Frame, Ledger, Rotation};

use crate::store::{decision, new_ledger};

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(LOG_DIR).join(segment_name(n))
}

/// Every file under `dir` (recursively) and the BLAKE3 of its bytes.
pub(crate) fn hash_tree(dir: &Path) -> BTreeMap<PathBuf, blake3::Hash> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.insert(e.path(), blake3::hash(&fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}

/// Entries of the log in order, checking that seqs have no gap and hashes link.
fn chain(dir: &Path) -> Vec<Vec<u8>> {
    let mut entries: Vec<Vec<u8>> = Vec::new();
    for f in LogReader::open(dir).unwrap().frames() {
        if let Frame::Entry(b) = f.unwrap() {
            let e = Entry::decode(&b).unwrap();
            assert_eq!(e.header.seq, entries.len() as u64, "gap-free");
            if let Some(prev) = entries.last() {
                assert_eq!(e.header.prev_hash, entry_hash(prev), "linked");
            }
            entries.push(b);
        }
    }
    entries
}

#[test]
fn a_segment_is_its_header_then_frames_as_format_md_says() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    ledger.append(decision("r", 1)).unwrap();
    let seg = fs::read(segment_path(&dir, 0)).unwrap();
    assert_eq!(&seg[..16], SEGMENT_MAGIC);
    let header = SegmentHeader::decode(&seg[..SEGMENT_HEADER_LEN]).unwrap();
    assert_eq!(header.ledger_id, ledger.id());
    assert_eq!((header.number, header.first_seq), (0, 0));
    assert_eq!(header.prev_hash, Hash::default());
    assert_eq!(header.encode().as_slice(), &seg[..SEGMENT_HEADER_LEN]);
    // genesis (tag 1, 258 bytes), its tree frame (tag 5) and checkpoint (tag 2); the
    // decision, the state frame recording its run's last seq (tag 4), its tree frame and
    // its checkpoint.
    let mut pos = SEGMENT_HEADER_LEN;
    let mut tags = Vec::new();
    while pos < seg.len() {
        let len = u32::from_be_bytes(seg[pos + 1..pos + 5].try_into().unwrap()) as usize;
        tags.push((seg[pos], len));
        pos += 5 + len;
    }
    assert_eq!(pos, seg.len(), "frames end exactly at the end of the file");
    assert_eq!(tags[0], (1, 258));
    assert_eq!(
        tags.iter().map(|t| t.0).collect::<Vec<_>>(),
        [1, 5, 2, 1, 4, 5, 2]
    );
    assert_eq!(tags[1], (5, 40));
    // Strict header decoding: another magic, or a segment 0 that does not start the chain.
    let mut bad = header.encode();
    bad[15] = b'\r';
    assert!(SegmentHeader::decode(&bad).is_err());
    let mut bad = header.encode();
    bad[47] = 1;
    assert!(SegmentHeader::decode(&bad).is_err());
    assert!(SegmentHeader::decode(&header.encode()[..79]).is_err());
}

#[test]
fn a_torn_write_stays_and_the_log_resumes_in_a_new_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    for i in 0..3 {
        ledger.append(decision("r", i)).unwrap();
    }
    drop(ledger);
    // A crash mid-write: half of an entry frame after the last checkpoint.
    let path = segment_path(&dir, 0);
    let sealed = fs::metadata(&path).unwrap().len();
    let frame = {
        let entries = chain(&dir);
        let mut f = vec![1u8];
        f.extend_from_slice(&(entries[1].len() as u32).to_be_bytes());
        f.extend_from_slice(&entries[1]);
        f
    };
    let torn = &frame[..frame.len() / 2];
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(torn)
        .unwrap();
    let before = fs::read(&path).unwrap();
    let reported: Vec<Torn> = LogReader::open(&dir)
        .unwrap()
        .filter_map(|i| match i.unwrap() {
            Item::Torn(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(
        reported,
        [Torn {
            segment: 0,
            path: path.clone(),
            offset: sealed,
            len: torn.len() as u64
        }]
    );
    let ledger = Ledger::open(&dir).unwrap();
    let r = ledger.append(decision("r", 9)).unwrap();
    assert_eq!(
        r.seq, 4,
        "the torn entry was never sealed: its seq is used again"
    );
    drop(ledger);
    assert_eq!(
        fs::read(&path).unwrap(),
        before,
        "segment 0 kept every byte"
    );
    let next = fs::read(segment_path(&dir, 1)).unwrap();
    let h = SegmentHeader::decode(&next[..SEGMENT_HEADER_LEN]).unwrap();
    assert_eq!((h.number, h.first_seq), (1, 4));
    let entries = chain(&dir);
    assert_eq!(entries.len(), 5);
    assert_eq!(h.prev_hash, entry_hash(&entries[3]));
    // Still reported, now in a closed segment.
    let torn_now = LogReader::open(&dir)
        .unwrap()
        .filter(|i| matches!(i, Ok(Item::Torn(_))))
        .count();
    assert_eq!(torn_now, 1);
}

#[test]
fn small_segments_rotate_and_read_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    new_ledger(&dir, Rotation::default());
    let ledger = Ledger::open_with_segment_bytes(&dir, 2048).unwrap();
    for i in 0..60 {
        ledger.append(decision("r", i)).unwrap();
    }
    ledger.rotate().unwrap();
    ledger.append(decision("r", 60)).unwrap();
    let size = ledger.checkpoint().size;
    drop(ledger);
    let segments = fs::read_dir(dir.join(LOG_DIR)).unwrap().count();
    assert!(segments > 5, "{segments} segments");
    assert_eq!(chain(&dir).len() as u64, size);
    // Each segment starts where the one before it is sealed (the header says so).
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.append(decision("r", 61)).unwrap().seq, size);
}

#[test]
fn a_segment_whose_header_breaks_continuity_is_refused_by_readers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    new_ledger(&dir, Rotation::default());
    let ledger = Ledger::open_with_segment_bytes(&dir, 1024).unwrap();
    for i in 0..6 {
        ledger.append(decision("r", i)).unwrap();
    }
    drop(ledger);
    let path = segment_path(&dir, 2);
    let mut bytes = fs::read(&path).unwrap();
    bytes[47] ^= 1; // first_seq
    fs::write(&path, &bytes).unwrap();
    let err = LogReader::open(&dir)
        .unwrap()
        .find_map(|i| i.err())
        .expect("an error");
    assert!(
        matches!(err, Error::Segment { .. }) && err.to_string().contains("starts the segment"),
        "{err}"
    );
}

#[test]
fn the_old_layout_is_refused_naming_its_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("old");
    let (ledger, _) = new_ledger(&tmp.path().join("new"), Rotation::default());
    drop(ledger);
    fs::create_dir_all(dir.join("store")).unwrap();
    fs::write(dir.join("store").join("db"), b"sled").unwrap();
    for f in ["ledger.pub", "config.json", "writer.key"] {
        fs::copy(tmp.path().join("new").join(f), dir.join(f)).unwrap();
    }
    let e = Ledger::open(&dir).err().expect("refused");
    assert!(matches!(e, Error::OldLayout(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("layout 1") && text.contains("layout 3"),
        "{text}"
    );
    assert!(text.contains("tally export"), "{text}");
    assert!(matches!(LogReader::open(&dir), Err(Error::OldLayout(_))));
    assert!(matches!(
        Ledger::read_checkpoint(&dir),
        Err(Error::OldLayout(_))
    ));
}

#[test]
fn derived_state_is_rebuilt_from_the_log_when_the_index_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    for i in 0..20u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = tally_ledger::ledger::prepare(vec![decision("r", i)]).unwrap();
        let state = vec![
            (b"c/r".to_vec(), i.to_be_bytes().to_vec()),
            (format!("k/{}", i % 3).into_bytes(), vec![i as u8]),
        ];
        ledger.submit_with_state(p, state, move |r| tx.send(r).unwrap());
        rx.recv().unwrap().unwrap();
    }
    ledger
        .put_state_durable(&[(b"z/pause".to_vec(), b"1".to_vec())])
        .unwrap();
    let want = ledger.state(b"").unwrap();
    assert_eq!(
        ledger.state_get(b"c/r").unwrap(),
        Some(19u64.to_be_bytes().to_vec())
    );
    drop(ledger);
    // Reopen: as it was.
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.state(b"").unwrap(), want);
    drop(ledger);
    // Index gone: the derived state comes back from the log's state frames (an operator's
    // pause is not derived from the log, and is lost with the index; `tally reindex`
    // carries it over when the old index still opens).
    fs::remove_dir_all(dir.join("index")).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    let derived: Vec<_> = want
        .iter()
        .filter(|(k, _)| k != b"z/pause")
        .cloned()
        .collect();
    assert_eq!(ledger.state(b"").unwrap(), derived);
}

#[test]
fn reindex_rebuilds_the_index_and_keeps_an_operators_state() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    for i in 0..50u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = tally_ledger::ledger::prepare(vec![decision("r", i)]).unwrap();
        ledger.submit_with_state(p, vec![(b"n".to_vec(), vec![i as u8])], move |r| {
            tx.send(r).unwrap()
        });
        rx.recv().unwrap().unwrap();
    }
    ledger
        .put_state_durable(&[(b"pause".to_vec(), b"yes".to_vec())])
        .unwrap();
    let want = ledger.state(b"").unwrap();
    let entry = chain(&dir)[33].clone();
    assert_eq!(ledger.entry(33).unwrap(), Some(entry.clone()));
    // Held by a writer: refused.
    assert!(matches!(Ledger::reindex(&dir), Err(Error::Busy(_))));
    drop(ledger);
    let report = Ledger::reindex(&dir).unwrap();
    assert_eq!(report.entries, 51);
    assert_eq!(report.state_frames, 50);
    assert_eq!(report.carried, 1);
    assert!(report.points >= 1);
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.state(b"").unwrap(), want);
    assert_eq!(ledger.entry(33).unwrap(), Some(entry));
    assert_eq!(ledger.entry(51).unwrap(), None);
}

#[test]
fn readers_change_no_byte_of_the_ledger_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    for i in 0..10 {
        ledger.append(decision("r", i)).unwrap();
    }
    drop(ledger);
    let before = hash_tree(&dir);
    let cp = Ledger::read_checkpoint(&dir).unwrap();
    assert_eq!(cp.size, 11);
    let out = tmp.path().join("export.tally");
    let (entries, _) =
        tally_ledger::export::export_frames(Ledger::read_snapshot(&dir).unwrap(), &out).unwrap();
    assert_eq!(entries, 11);
    assert_eq!(chain(&dir).len(), 11);
    assert_eq!(
        hash_tree(&dir),
        before,
        "readers changed the ledger directory"
    );

    // With a writer appending meanwhile: snapshots are consistent (they end with the
    // checkpoint of their size), and the log's bytes up to them never change.
    let ledger = std::sync::Arc::new(Ledger::open(&dir).unwrap());
    let writer = {
        let ledger = std::sync::Arc::clone(&ledger);
        std::thread::spawn(move || {
            for i in 0..300 {
                ledger.append(decision("w", i)).unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads < 3 {
        let snap = Ledger::read_snapshot(&dir).unwrap();
        let size = snap.size();
        let frames: Vec<Frame> = snap.map(Result::unwrap).collect();
        let entries = frames
            .iter()
            .filter(|f| matches!(f, Frame::Entry(_)))
            .count();
        assert_eq!(entries as u64, size);
        match frames.last() {
            Some(Frame::Checkpoint(t)) => {
                assert_eq!(tally_ledger::Checkpoint::from_text(t).unwrap().size, size)
            }
            other => panic!("a snapshot ends with {other:?}"),
        }
        reads += 1;
    }
    writer.join().unwrap();
    assert!(reads >= 3);
}

/// `chattr +a` on the segments and the log directory: the writer keeps appending (it
/// only ever opens segments with O_APPEND and creates new ones), while no one, root
/// included, can rewrite or truncate what is there. Skipped, loudly, where the file
/// system or the process's capabilities refuse the attribute.
#[test]
fn the_log_works_with_the_append_only_attribute() {
    // Under the target directory: on the disk's file system, where /tmp may be a tmpfs
    // (which refuses the attribute).
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("l");
    let (ledger, _) = new_ledger(&dir, Rotation::default());
    ledger.append(decision("r", 0)).unwrap();
    drop(ledger);
    let log = dir.join(LOG_DIR);
    let seg0 = segment_path(&dir, 0);
    let set = Command::new("chattr")
        .arg("+a")
        .arg(&seg0)
        .arg(&log)
        .output();
    match set {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            tally_testkit::skip(
                &format!(
                    "chattr +a refused here ({}): the file system or missing CAP_LINUX_IMMUTABLE",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                "run the suite as root on ext4, xfs or btrfs, as CI does",
            );
            return;
        }
        Err(e) => {
            tally_testkit::skip(&format!("no chattr ({e})"), "apt-get install e2fsprogs");
            return;
        }
    }
    struct Clear(Vec<PathBuf>);
    impl Drop for Clear {
        fn drop(&mut self) {
            let _ = Command::new("chattr")
                .arg("-R")
                .arg("-a")
                .args(&self.0)
                .status();
        }
    }
    let _clear = Clear(vec![log.clone()]);
    let before = fs::read(&seg0).unwrap();
    // History cannot be rewritten through the file system.
    assert!(
        OpenOptions::new().write(true).open(&seg0).is_err(),
        "opened for overwrite"
    );
    assert!(OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&seg0)
        .is_err());
    assert!(fs::remove_file(&seg0).is_err(), "removed");
    assert!(fs::rename(&seg0, log.join("x")).is_err(), "renamed");
    // The ledger appends, rotates segments, and reads back whole.
    let ledger = Ledger::open_with_segment_bytes(&dir, 4096).unwrap();
    for i in 1..40 {
        ledger.append(decision("r", i)).unwrap();
    }
    drop(ledger);
    let now = fs::read(&seg0).unwrap();
    assert_eq!(&now[..before.len()], &before[..]);
    assert!(
        segment_path(&dir, 1).exists(),
        "a new segment in the +a directory"
    );
    assert_eq!(chain(&dir).len(), 41);
    let ledger = Ledger::open(&dir).unwrap();
    assert_eq!(ledger.append(decision("r", 99)).unwrap().seq, 41);
}
