//! The append API and store: atomic batches, unchanged store on bad input, rotation and
//! its crash recovery, key file permissions, export framing.

use std::path::Path;
use std::sync::Arc;

use tally_ledger::export::{ExportError, ExportReader, ExportWriter};
use tally_ledger::format::{Entry, EntryType};
use tally_ledger::keys::{AuditorKey, EpochSecrets};
use tally_ledger::ledger::files;
use tally_ledger::{Decision, DecisionError, Error, Frame, Ledger, Rotation};

use crate::decisions::every_kind;

pub(crate) fn new_ledger(dir: &Path, rotation: Rotation) -> (Ledger, AuditorKey) {
    let auditor = AuditorKey::generate();
    Ledger::init(dir, &auditor.public(), rotation).unwrap();
    (Ledger::open(dir).unwrap(), auditor)
}

pub(crate) fn decision(run: &str, i: u64) -> Decision {
    Decision::from_json(&format!(
        r#"{{"run":"{run}","kind":"allow","tool":"search","args":{{"q":{i}}},"attempt":{i}}}"#
    ))
    .unwrap()
}

fn frames(l: &Ledger) -> Vec<Frame> {
    l.snapshot().map(Result::unwrap).collect()
}

/// Decrypt every decision of a ledger's snapshot with the auditor key, checking links.
pub(crate) fn read_back(l: &Ledger, auditor: &AuditorKey) -> Vec<Decision> {
    let mut out = Vec::new();
    let mut keys = std::collections::HashMap::new();
    let mut prev = None;
    for f in frames(l) {
        let Frame::Entry(bytes) = f else { continue };
        let e = Entry::decode(&bytes).unwrap();
        if let Some(p) = prev {
            assert_eq!(e.header.prev_hash, p);
        }
        prev = Some(e.hash());
        match e.header.entry_type {
            EntryType::Genesis => {
                let g = e.genesis().unwrap();
                keys.insert(
                    0,
                    auditor
                        .epoch_key(&g.ephemeral, e.header.ledger_id, 0)
                        .unwrap(),
                );
            }
            EntryType::Epoch => {
                let c = e.epoch_cert().unwrap();
                let k = auditor
                    .epoch_key(&c.ephemeral, e.header.ledger_id, e.header.epoch)
                    .unwrap();
                keys.insert(e.header.epoch, k);
            }
            _ => {
                let plain = keys[&e.header.epoch]
                    .open(&e.header.nonce, e.header_bytes(), e.body())
                    .unwrap();
                out.push(Decision::from_stored(&plain).unwrap());
            }
        }
    }
    out
}

#[test]
fn every_kind_round_trips_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (l, auditor) = new_ledger(&dir.path().join("l"), Rotation::default());
    let receipts = l.append_batch(every_kind()).unwrap();
    assert_eq!(
        receipts.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (1..=7).collect::<Vec<_>>()
    );
    let mut want = every_kind();
    want.iter_mut().for_each(Decision::seal_args);
    // The ledger links each decision of run r1 to the one before it (seqs 1..=7).
    for (i, d) in want.iter_mut().enumerate().skip(1) {
        d.prev_seq = Some(i as u64);
    }
    assert_eq!(read_back(&l, &auditor), want);
    assert_eq!(l.checkpoint().size, 8);
    assert_eq!(l.checkpoint().head, receipts[6].hash);
}

#[test]
fn bad_input_changes_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = new_ledger(&dir.path().join("l"), Rotation::default());
    l.append_batch((0..5).map(|i| decision("r", i)).collect())
        .unwrap();
    let before = frames(&l);
    let cp = l.checkpoint();
    let mut batch: Vec<Decision> = (0..4).map(|i| decision("r", i)).collect();
    batch[2].reason = None;
    batch[2].kind = Some(tally_ledger::Kind::Deny);
    match l.append_batch(batch) {
        Err(Error::InBatch {
            index: 2,
            source: DecisionError::Missing { field: "reason" },
        }) => {}
        other => panic!("{other:?}"),
    }
    let mut big = decision("r", 1);
    big.args_preview = Some("p".repeat(300));
    assert!(matches!(
        l.append(big),
        Err(Error::Decision(DecisionError::TooLong { .. }))
    ));
    assert_eq!(frames(&l), before);
    assert_eq!(l.checkpoint(), cp);
    // And the next good append takes the next seq: no gap.
    assert_eq!(l.append(decision("r", 9)).unwrap().seq, 6);
}

#[test]
fn concurrent_appenders_get_unique_gap_free_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let (l, auditor) = new_ledger(&dir.path().join("l"), Rotation::default());
    let l = Arc::new(l);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut seqs = Vec::new();
                for i in 0..30 {
                    // Batches of 1 to 4 decisions: each batch gets consecutive seqs.
                    let batch: Vec<_> = (0..1 + i % 4)
                        .map(|k| decision(&format!("run{t}"), 10 * i + k))
                        .collect();
                    let receipts = l.append_batch(batch).unwrap();
                    let first = receipts[0].seq;
                    for (k, r) in receipts.iter().enumerate() {
                        assert_eq!(r.seq, first + k as u64);
                    }
                    // Acknowledged means sealed: the durable checkpoint covers it.
                    assert!(l.checkpoint().size > receipts.last().unwrap().seq);
                    seqs.extend(receipts.iter().map(|r| r.seq));
                }
                seqs
            })
        })
        .collect();
    // Rotations on demand while the appenders run.
    let rotations: Vec<_> = (0..3).map(|_| l.rotate().unwrap().epoch).collect();
    assert_eq!(rotations, vec![1, 2, 3]);
    let mut seqs: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    seqs.sort_unstable();
    let expected = 8 * (0..30).map(|i| 1 + i % 4).sum::<usize>();
    assert_eq!(seqs.len(), expected);
    seqs.dedup();
    assert_eq!(seqs.len(), expected, "every seq once");
    // Seq 0 is the genesis; the three epoch certificates take three more.
    assert!(*seqs.last().unwrap() <= expected as u64 + 3);
    assert_eq!(read_back(&l, &auditor).len(), expected);
}

#[test]
fn submitted_appends_are_answered_once_each_in_seq_order() {
    let dir = tempfile::tempdir().unwrap();
    let (l, auditor) = new_ledger(&dir.path().join("l"), Rotation::default());
    let l = Arc::new(l);
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Waiting appenders in other threads share the groups.
    let others: Vec<_> = (0..3)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                for i in 0..40 {
                    l.append(decision(&format!("other{t}"), i)).unwrap();
                }
            })
        })
        .collect();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for i in 0..200u64 {
        let batch = (0..1 + i % 3)
            .map(|k| decision("async", 10 * i + k))
            .collect();
        let plaintexts = tally_ledger::ledger::prepare(batch).unwrap();
        let (answers, done_tx, l2) = (Arc::clone(&answers), done_tx.clone(), Arc::clone(&l));
        l.submit_prepared(plaintexts, move |result| {
            let receipts = result.unwrap();
            // Answered only once durable and sealed.
            assert!(l2.checkpoint().size > receipts.last().unwrap().seq);
            answers.lock().unwrap().push((i, receipts));
            done_tx.send(()).unwrap();
        });
    }
    for _ in 0..200 {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap();
    }
    for t in others {
        t.join().unwrap();
    }
    let answers = answers.lock().unwrap();
    // Each submission answered once, in submission order, with increasing seqs.
    assert_eq!(
        answers.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>()
    );
    let seqs: Vec<u64> = answers
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.seq))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(seqs.len(), (0..200).map(|i| 1 + i % 3).sum::<usize>());
    assert_eq!(read_back(&l, &auditor).len(), seqs.len() + 120);
}

#[test]
fn reopen_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, auditor) = new_ledger(&path, Rotation::default());
    let first = l.append(decision("r", 1)).unwrap();
    drop(l);
    let l = Ledger::open(&path).unwrap();
    let second = l.append(decision("r", 2)).unwrap();
    assert_eq!(second.seq, first.seq + 1);
    assert_eq!(read_back(&l, &auditor).len(), 2);
}

#[test]
fn epochs_rotate_by_count_and_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, auditor) = new_ledger(
        &path,
        Rotation {
            records: 5,
            ms: u64::MAX,
        },
    );
    for i in 0..12 {
        l.append(decision("r", i)).unwrap();
    }
    let by_count = l.epoch();
    assert!(by_count >= 2, "epoch {by_count}");
    l.rotate().unwrap();
    assert_eq!(l.epoch(), by_count + 1);
    assert_eq!(l.checkpoint().epoch, by_count + 1);
    assert!(!path.join(files::WRITER_KEY_NEXT).exists());
    let key = EpochSecrets::read(&path.join(files::WRITER_KEY), l.id()).unwrap();
    assert_eq!(key.epoch, by_count + 1);
    assert_eq!(read_back(&l, &auditor).len(), 12);
}

#[test]
fn interrupted_rotation_is_finished_or_discarded_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, _) = new_ledger(&path, Rotation::default());
    let id = l.id();
    // Crash before the certificate was durable: the stray next key is discarded.
    drop(l);
    EpochSecrets::from_bytes(1, [7; 32], [8; 32])
        .write(&path.join(files::WRITER_KEY_NEXT), id)
        .unwrap();
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.epoch(), 0);
    assert!(!path.join(files::WRITER_KEY_NEXT).exists());
    // Crash after the certificate was durable but before the rename: the next key is adopted.
    let old = std::fs::read(path.join(files::WRITER_KEY)).unwrap();
    l.rotate().unwrap();
    drop(l);
    std::fs::rename(
        path.join(files::WRITER_KEY),
        path.join(files::WRITER_KEY_NEXT),
    )
    .unwrap();
    std::fs::write(path.join(files::WRITER_KEY), old).unwrap();
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.epoch(), 1);
    l.append(decision("r", 1)).unwrap();
}

#[cfg(unix)]
#[test]
fn key_files_are_private_and_refused_when_not() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, _) = new_ledger(&path, Rotation::default());
    drop(l);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o700);
    assert_eq!(mode(&path.join(files::WRITER_KEY)), 0o600);
    let key = dir.path().join("auditor.key");
    AuditorKey::generate().write(&key).unwrap();
    assert_eq!(mode(&key), 0o600);
    std::fs::set_permissions(
        path.join(files::WRITER_KEY),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    assert!(matches!(
        Ledger::open(&path),
        Err(Error::KeyPermissions { mode: 0o644, .. })
    ));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(matches!(
        AuditorKey::read(&key),
        Err(Error::KeyPermissions { .. })
    ));
}

#[test]
fn init_refuses_an_existing_ledger_and_open_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, auditor) = new_ledger(&path, Rotation::default());
    drop(l);
    assert!(matches!(
        Ledger::init(&path, &auditor.public(), Rotation::default()),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        Ledger::open(&dir.path().join("nope")),
        Err(Error::NotALedger(_))
    ));
}

#[test]
fn a_failed_init_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let auditor = AuditorKey::generate();
    // `store` already there counts as a ledger: refused before any write.
    std::fs::create_dir_all(path.join("store")).unwrap();
    assert!(matches!(
        Ledger::init(&path, &auditor.public(), Rotation::default()),
        Err(Error::AlreadyExists(_))
    ));
    std::fs::remove_dir(path.join("store")).unwrap();
    // A directory where the key file's temporary copy goes: init fails after writing
    // config.json, and takes back everything it wrote.
    std::fs::create_dir(path.join("writer.tmp")).unwrap();
    let r = Ledger::init(&path, &auditor.public(), Rotation::default());
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
    let left: Vec<_> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["writer.tmp"]);
}

#[test]
fn a_low_order_recipient_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = Ledger::init(&dir.path().join("l"), &[0u8; 32], Rotation::default());
    assert!(matches!(r, Err(Error::Crypto(_))), "{r:?}");
    assert!(!dir.path().join("l").exists(), "nothing was created");
}

#[test]
fn a_failed_export_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.tally");
    let frames = vec![
        Ok(Frame::Entry(vec![1, 2, 3])),
        Err(Error::Store("the store failed mid-export".into())),
    ];
    assert!(matches!(
        tally_ledger::export::export_frames(frames.into_iter(), &out),
        Err(Error::Store(_))
    ));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn export_bytes(l: &Ledger) -> Vec<u8> {
    let mut w = ExportWriter::new(Vec::new()).unwrap();
    for f in frames(l) {
        w.frame(&f).unwrap();
    }
    w.finish().unwrap()
}

fn read_all(bytes: &[u8]) -> Result<Vec<Frame>, ExportError> {
    ExportReader::new(bytes)?.collect()
}

#[test]
fn export_framing_tells_torn_from_cut_from_complete() {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = new_ledger(&dir.path().join("l"), Rotation::default());
    l.append_batch((0..3).map(|i| decision("r", i)).collect())
        .unwrap();
    let bytes = export_bytes(&l);
    assert_eq!(read_all(&bytes).unwrap(), frames(&l));
    // The file written by Ledger::export holds the same frames, then the signed end
    // (tag 0xfe, 112 bytes) in place of the plain one.
    let out = dir.path().join("x.tally");
    l.export(&out).unwrap();
    let signed = std::fs::read(&out).unwrap();
    assert_eq!(read_all(&signed).unwrap(), frames(&l));
    assert_eq!(&signed[..bytes.len() - 21], &bytes[..bytes.len() - 21]);
    assert_eq!(signed.len(), bytes.len() - 21 + 5 + 112);
    assert_eq!(signed[bytes.len() - 21], 0xfe);

    let end = bytes.len() - 21; // the end frame is 5 + 16 bytes
    assert_eq!(
        read_all(&bytes[..end]),
        Err(ExportError::CutClean { offset: end as u64 })
    );
    assert!(matches!(
        read_all(&bytes[..end - 3]),
        Err(ExportError::Torn { .. })
    ));
    assert!(matches!(
        read_all(&bytes[..bytes.len() - 1]),
        Err(ExportError::Torn { .. })
    ));
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(matches!(
        read_all(&extra),
        Err(ExportError::TrailingBytes { .. })
    ));
    let mut counts = bytes.clone();
    let n = counts.len();
    counts[n - 9] ^= 1;
    assert!(matches!(
        read_all(&counts),
        Err(ExportError::CountMismatch { .. })
    ));
    let mut tag = bytes.clone();
    tag[16] = 9;
    assert!(matches!(
        read_all(&tag),
        Err(ExportError::BadTag { offset: 16, tag: 9 })
    ));
    assert!(matches!(
        ExportReader::new(&b"not an export at all"[..]),
        Err(ExportError::BadMagic)
    ));
}

/// The gate's state rides in the decisions' own batches as delta chunks, folded into
/// one value per key every so often: readers see the latest value of every key before
/// and after a fold, and after a reopen, whatever the chunks held.
#[test]
fn derived_state_reads_its_latest_value_across_folds_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (ledger, _) = new_ledger(&path, Rotation::default());
    let d = |i: u64| Decision::from_json(&format!(r#"{{"run":"r{i}","kind":"start"}}"#)).unwrap();
    let mut expect = std::collections::BTreeMap::new();
    // More chunks than a fold waits for, and keys written again and again.
    for i in 0..700u64 {
        let key = format!("r/k{}", i % 50).into_bytes();
        let value = format!("v{i}").into_bytes();
        expect.insert(key.clone(), value.clone());
        let plaintexts = tally_ledger::ledger::prepare(vec![d(i)]).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        ledger.submit_with_state(plaintexts, vec![(key, value)], move |r| {
            let _ = tx.send(r);
        });
        rx.recv().unwrap().unwrap();
        if i % 97 == 0 {
            let all = ledger.state(b"r/").unwrap();
            for (k, v) in &all {
                assert_eq!(Some(v), expect.get(k), "{}", String::from_utf8_lossy(k));
            }
        }
    }
    let check = |l: &Ledger| {
        let all: std::collections::BTreeMap<_, _> = l.state(b"r/").unwrap().into_iter().collect();
        assert_eq!(all, expect);
        assert_eq!(
            l.state_get(b"r/k7").unwrap(),
            expect.get(b"r/k7".as_slice()).cloned()
        );
        assert_eq!(l.state_get(b"r/none").unwrap(), None);
        assert_eq!(l.state(b"x/").unwrap(), vec![]);
    };
    check(&ledger);
    drop(ledger);
    let reopened = Ledger::open(&path).unwrap();
    check(&reopened);
}
