//! Backups of a live ledger (docs/FORMAT.md, "Log segments"): closed segments never
//! change and the active one only grows, so copying the segments in order, while the
//! writer keeps appending, gives a ledger that verifies intact up to the last checkpoint
//! the copy holds; a group being written at copy time is reported as a torn write. And a
//! directory held by a writer verifies in place.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use tally_ledger::segment::{segment_name, LOG_DIR};
use tally_ledger::Ledger;
use tally_tests::*;
use tally_verify::{Report, SourceError, Verdict};

fn verify_dir(dir: &Path, opts: &tally_verify::Options) -> Report {
    let frames: Vec<Result<tally_ledger::Frame, SourceError>> =
        tally_verify::walk::ledger_frames(dir)
            .expect("log")
            .collect();
    tally_verify::verify(frames.into_iter(), opts, |_| {}, |_| {})
}

/// The recipe: `ledger.pub`, then every segment in number order (the last one is the
/// active one, copied as far as it is written when the copy reaches it).
fn backup(from: &Path, to: &Path) {
    fs::create_dir_all(to.join(LOG_DIR)).expect("backup dir");
    fs::copy(from.join("ledger.pub"), to.join("ledger.pub")).expect("ledger.pub");
    let mut names: Vec<_> = fs::read_dir(from.join(LOG_DIR))
        .expect("log")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    for n in names {
        fs::copy(from.join(LOG_DIR).join(&n), to.join(LOG_DIR).join(&n)).expect("copy");
    }
}

#[test]
fn a_backup_taken_while_the_writer_appends_verifies_intact() {
    let tmp = tempfile::tempdir().expect("tmp");
    let auditor = tally_ledger::AuditorKey::generate();
    let dir = tmp.path().join("l");
    let public = Ledger::init(&dir, &auditor.public(), MANUAL_ROTATION).expect("init");
    let ledger = Arc::new(Ledger::open_with_segment_bytes(&dir, 8 * 1024).expect("open"));
    let writer = {
        let ledger = Arc::clone(&ledger);
        std::thread::spawn(move || {
            for i in 0..600 {
                let batch = (0..(1 + i % 7)).map(|k| decision(i * 10 + k)).collect();
                ledger.append_batch(batch).expect("append");
            }
        })
    };
    let opts = tally_verify::Options::new(public);
    let mut copies = 0;
    while !writer.is_finished() {
        let to = tmp.path().join(format!("backup{copies}"));
        backup(&dir, &to);
        let report = verify_dir(&to, &opts);
        assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
        // The directory itself, held by the writer, verifies in place too.
        let live = verify_dir(&dir, &opts);
        assert_eq!(live.verdict(), Verdict::Intact, "{}", live.to_text());
        assert!(
            live.torn_writes.is_empty(),
            "a live writer's tail is not torn"
        );
        copies += 1;
    }
    writer.join().expect("writer");
    assert!(copies > 0);
    // A copy that caught a group mid-write: the active segment ends inside a frame.
    let size = ledger.checkpoint().size;
    drop(ledger);
    let to = tmp.path().join("torn");
    backup(&dir, &to);
    let segments = fs::read_dir(to.join(LOG_DIR)).expect("log").count() as u64;
    assert!(segments > 3, "{segments} segments");
    let last = to.join(LOG_DIR).join(segment_name(segments - 1));
    let mut bytes = fs::read(&last).expect("last");
    let cut = bytes.len();
    bytes.extend_from_slice(&[1, 0, 0, 1, 0x20, 1, 1, 0xaa]);
    fs::write(&last, &bytes).expect("write");
    let report = verify_dir(&to, &opts);
    assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
    assert_eq!(report.sealed, size);
    assert_eq!(report.torn_writes.len(), 1);
    let t = report.torn_writes[0];
    assert_eq!(
        (t.segment, t.offset, t.bytes),
        (segments - 1, cut as u64, 8)
    );
    assert_eq!(t.before_seq, size);
    let text = report.to_text();
    assert!(
        text.contains(&format!(
            "torn write  segment {} at byte {cut}: 8 bytes",
            segments - 1
        )),
        "{text}"
    );
}
