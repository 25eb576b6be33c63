//! Shared fixtures for tally's workspace-level tests.
//!
//! Ledgers are built through the real append API ([`Ledger`]) in a temporary directory;
//! their exports are handled as bytes and as [`Frame`]s. The attacker's tools live here
//! too: re-chaining entries after a change, and signing checkpoints with a writer key
//! stolen from `writer.key` (a host compromise at a later epoch).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;
use tally_ledger::export::{ExportError, ExportWriter};
use tally_ledger::format::{entry_hash, Hash, Header, LedgerId};
use tally_ledger::keys::{verify_signature, AuditorKey, EpochSecrets, LedgerPublic};
use tally_ledger::ledger::files;
use tally_ledger::{Checkpoint, Decision, Error, Frame, Ledger, Rotation};
use tally_verify::{Event, FindingKind, Options, Report, SourceError, Verdict};
use tempfile::TempDir;

/// One step of building a ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Append this many decisions in one `append_batch` (one commit group, one
    /// checkpoint); 1 uses `append`.
    Append(usize),
    /// Move to a new key epoch (`Ledger::rotate`): an epoch certificate and its checkpoint.
    Rotate,
}

/// The standard small ledger: 10 entries in 3 epochs, a checkpoint after every commit.
///
/// ```text
/// seq 0 genesis (e0) | 1 d | 2 d | 3 cert (e1) | 4 d, 5 d (one batch) | 6 d | 7 cert (e2) | 8 d | 9 d
/// checkpoints of size 1 2 3 4 6 7 8 9 10 (none of size 5)
/// ```
pub const STANDARD: &[Step] = &[
    Step::Append(1),
    Step::Append(1),
    Step::Rotate,
    Step::Append(2),
    Step::Append(1),
    Step::Rotate,
    Step::Append(1),
    Step::Append(1),
];

/// Rotation only when a test asks for it.
pub const MANUAL_ROTATION: Rotation = Rotation {
    records: u64::MAX,
    ms: u64::MAX,
};

/// A deterministic, valid decision; `i` picks the kind and the contents.
pub fn decision(i: u64) -> Decision {
    let run = format!("run-{}", i / 5);
    let value = match i % 5 {
        0 => {
            json!({"run": run, "kind": "start", "goal": format!("goal {i}"), "budget": {"attempts": 3}})
        }
        1 => json!({"run": run, "kind": "allow", "tool": "http", "operation": format!("op:{i}"),
                    "args": {"n": i}, "effect": "read", "attempt": 1, "at_ms": i}),
        2 => {
            json!({"run": run, "kind": "outcome", "status": "ok", "attempt": 1, "remote_ref": format!("r{i}")})
        }
        3 => {
            json!({"run": run, "kind": "deny", "reason": "budget_exceeded", "tool": "http", "attempt": 2})
        }
        _ => json!({"run": run, "kind": "stop", "reason": "completed"}),
    };
    Decision::from_json(&value.to_string()).expect("fixture decision is valid")
}

/// What the ledger stores for a decision (raw args replaced by their digest).
pub fn sealed(mut d: Decision) -> Decision {
    d.seal_args();
    d
}

/// A ledger built through the real append API, in its own temporary directory
/// (`tmp/ledger`), with its auditor key in `tmp/auditor.key`.
pub struct Fixture {
    /// Holds the ledger directory, the auditor key and scratch files.
    pub tmp: TempDir,
    /// The ledger directory.
    pub dir: PathBuf,
    /// The open ledger (holds the store's lock).
    pub ledger: Ledger,
    /// Its `ledger.pub`.
    pub public: LedgerPublic,
    /// Every decision appended, as stored, in seq order.
    pub appended: Vec<Decision>,
    /// Each run's last seq: the `prev_seq` the ledger gives its next decision.
    pub last_of_run: std::collections::HashMap<String, u64>,
}

impl Fixture {
    /// A new ledger with a new auditor key, built by `steps`.
    pub fn new(steps: &[Step]) -> Fixture {
        Fixture::with_auditor(&AuditorKey::generate(), steps)
    }

    /// The standard small ledger ([`STANDARD`]).
    pub fn standard() -> Fixture {
        Fixture::new(STANDARD)
    }

    /// A new ledger for the given auditor, built by `steps`.
    pub fn with_auditor(auditor: &AuditorKey, steps: &[Step]) -> Fixture {
        Fixture::build(auditor, MANUAL_ROTATION, steps)
    }

    /// A new ledger for the given auditor and rotation settings, built by `steps`.
    pub fn build(auditor: &AuditorKey, rotation: Rotation, steps: &[Step]) -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        auditor
            .write(&tmp.path().join("auditor.key"))
            .expect("write auditor key");
        let dir = tmp.path().join("ledger");
        let public = Ledger::init(&dir, &auditor.public(), rotation).expect("init");
        let ledger = open_ledger(&dir);
        let mut fx = Fixture {
            tmp,
            dir,
            ledger,
            public,
            appended: Vec::new(),
            last_of_run: Default::default(),
        };
        fx.apply(steps);
        fx
    }

    /// Another ledger with the same auditor key (same recipient), built by `steps`.
    pub fn sibling(&self, steps: &[Step]) -> Fixture {
        Fixture::with_auditor(&self.auditor(), steps)
    }

    /// Run more steps on this ledger.
    pub fn apply(&mut self, steps: &[Step]) {
        for step in steps {
            match *step {
                Step::Append(n) => {
                    let base = self.appended.len() as u64;
                    self.append_batch((base..base + n as u64).map(decision).collect());
                }
                Step::Rotate => {
                    self.ledger.rotate().expect("rotate");
                }
            }
        }
    }

    /// Append given decisions: one with `append`, more with `append_batch`.
    pub fn append_batch(&mut self, batch: Vec<Decision>) {
        let receipts = if let [one] = &batch[..] {
            vec![self.ledger.append(one.clone()).expect("append")]
        } else {
            self.ledger
                .append_batch(batch.clone())
                .expect("append batch")
        };
        for (d, r) in batch.into_iter().zip(receipts) {
            let mut d = sealed(d);
            d.prev_seq = self.last_of_run.insert(d.run.clone(), r.seq);
            self.appended.push(d);
        }
    }

    /// Close the ledger, copy its whole directory (keys included, as an attacker with the
    /// host can), and reopen both: the original and the copy append independently.
    pub fn fork(self) -> (Fixture, Fixture) {
        let Fixture {
            tmp,
            dir,
            ledger,
            public,
            appended,
            last_of_run,
        } = self;
        drop(ledger);
        let copy_tmp = tempfile::tempdir().expect("tempdir");
        copy_dir(tmp.path(), copy_tmp.path());
        let copy_dir = copy_tmp.path().join("ledger");
        let copy = Fixture {
            ledger: open_ledger(&copy_dir),
            tmp: copy_tmp,
            dir: copy_dir,
            public: public.clone(),
            appended: appended.clone(),
            last_of_run: last_of_run.clone(),
        };
        let original = Fixture {
            ledger: open_ledger(&dir),
            tmp,
            dir,
            public,
            appended,
            last_of_run,
        };
        (original, copy)
    }

    /// The ledger id.
    pub fn id(&self) -> LedgerId {
        self.public.ledger_id
    }

    /// The auditor's key (read from its file).
    pub fn auditor(&self) -> AuditorKey {
        AuditorKey::read(&self.tmp.path().join("auditor.key")).expect("auditor key")
    }

    /// The writer's current epoch secrets, as an attacker who took the host reads them.
    pub fn writer_key(&self) -> EpochSecrets {
        EpochSecrets::read(&self.dir.join(files::WRITER_KEY), self.id()).expect("writer key")
    }

    /// Integrity-only options (the public key only), without the log key: the chain's
    /// tests rewrite exports with plain end markers, which a verifier holding the log key
    /// calls incomplete (`options_with_log_key` for those tests that need it).
    pub fn options(&self) -> Options {
        Options::new(LedgerPublic {
            log_key: None,
            ..self.public.clone()
        })
    }

    /// Integrity-only options with the whole `ledger.pub`, log key included.
    pub fn options_with_log_key(&self) -> Options {
        Options::new(self.public.clone())
    }

    /// Options with the auditor key.
    pub fn auditor_options(&self) -> Options {
        let mut o = self.options();
        o.auditor = Some(self.auditor());
        o
    }

    /// The ledger's frames up to its latest checkpoint (`Ledger::snapshot`).
    pub fn frames(&self) -> Vec<Frame> {
        self.ledger
            .snapshot()
            .map(|f| f.expect("snapshot frame"))
            .collect()
    }

    /// The export file's bytes (`Ledger::export`).
    pub fn export(&self) -> Vec<u8> {
        let out = self.tmp.path().join("export.tally");
        self.ledger.export(&out).expect("export");
        std::fs::read(&out).expect("read export")
    }
}

/// `Ledger::open`, waiting while the lock of a just-closed handle lingers. sled 0.34
/// reports a held lock as `ErrorKind::Other`, which `Store::open`'s own retry does not
/// match (see `store::second_open_is_busy`).
pub fn open_ledger(dir: &Path) -> Ledger {
    retry_lock(|| Ledger::open(dir))
}

/// The frames of the ledger directory `dir` read from its log in place, as `tally
/// verify DIR` reads them (entries and checkpoints; torn writes left out).
pub fn log_frames(dir: &Path) -> Vec<Frame> {
    tally_ledger::segment::LogReader::open(dir)
        .expect("log")
        .frames()
        .map(|f| f.expect("log frame"))
        .collect()
}

fn retry_lock<T>(mut open: impl FnMut() -> tally_ledger::Result<T>) -> T {
    for _ in 0..500 {
        match open() {
            Ok(t) => return t,
            Err(Error::Busy(_)) => {}
            Err(Error::Store(m)) if m.contains("could not acquire lock") => {}
            Err(e) => panic!("open: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the store stayed locked for 5 s");
}

/// Frames of an export, or the error that stops reading. `Err` only for a bad magic.
pub fn read_export(bytes: &[u8]) -> Result<Vec<Result<Frame, SourceError>>, ExportError> {
    // How the export ended (signed or not), or how its entries are chained, is not a
    // frame.
    Ok(tally_verify::walk::export_frames(bytes)?
        .filter(|f| {
            !matches!(
                f,
                Err(SourceError::SignedEnd(_) | SourceError::PlainEnd | SourceError::Chain(_))
            )
        })
        .collect())
}

/// The frames of a well-formed export.
pub fn parse_frames(bytes: &[u8]) -> Vec<Frame> {
    read_export(bytes)
        .expect("export magic")
        .into_iter()
        .map(|f| f.expect("well-formed export"))
        .collect()
}

/// A complete export (with its end marker) holding `frames`.
pub fn write_export(frames: &[Frame]) -> Vec<u8> {
    let mut w = ExportWriter::new(Vec::new()).expect("export to memory");
    for f in frames {
        w.frame(f).expect("frame to memory");
    }
    w.finish().expect("end marker")
}

/// Length of the signed end frame `Ledger::export` writes: tag, length, two counts, the
/// Merkle root, the log key's signature.
pub const END_FRAME_LEN: usize = 5 + 16 + 32 + 64;

/// Verify export bytes. `Err` when the file is not an export at all (bad magic).
pub fn verify_export(bytes: &[u8], opts: &Options) -> Result<Report, ExportError> {
    verify_export_events(bytes, opts).map(|(r, _)| r)
}

/// Verify export bytes and collect what the sink receives.
pub fn verify_export_events(
    bytes: &[u8],
    opts: &Options,
) -> Result<(Report, Vec<Event>), ExportError> {
    // As `tally verify` reads an export: a cut copy is incomplete, a frame whose length
    // runs past the end marker is tampering.
    let frames = tally_verify::walk::export_frames(bytes)?;
    let mut events = Vec::new();
    let report = tally_verify::verify(frames, opts, |e| events.push(e), |_| {});
    Ok((report, events))
}

/// Verify frames (as if read from a store).
pub fn verify_frames(frames: &[Frame], opts: &Options) -> Report {
    verify_events(frames, opts).0
}

/// Verify frames and collect what the sink receives.
pub fn verify_events(frames: &[Frame], opts: &Options) -> (Report, Vec<Event>) {
    let mut events = Vec::new();
    let report = tally_verify::verify(
        frames.iter().cloned().map(Ok),
        opts,
        |e| events.push(e),
        |_| {},
    );
    (report, events)
}

/// A report's findings as (kind, seq), in report order.
pub fn findings(report: &Report) -> Vec<(FindingKind, u64)> {
    report.findings.iter().map(|f| (f.kind, f.seq)).collect()
}

/// Assert the verdict and the first finding (kind and seq); returns all findings.
#[track_caller]
pub fn assert_first(
    report: &Report,
    verdict: Verdict,
    kind: FindingKind,
    seq: u64,
) -> Vec<(FindingKind, u64)> {
    let all = findings(report);
    assert_eq!(
        report.verdict(),
        verdict,
        "verdict; findings {all:?}\n{}",
        report.to_text()
    );
    assert_eq!(
        all.first(),
        Some(&(kind, seq)),
        "first finding\n{}",
        report.to_text()
    );
    all
}

/// Assert an intact, fully sealed report.
#[track_caller]
pub fn assert_intact(report: &Report) {
    assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
    assert!(report.findings.is_empty());
    assert_eq!(report.sealed, report.entries);
    assert!(report.to_text().starts_with("INTACT"));
}

/// The decoded header of an entry.
pub fn header(entry: &[u8]) -> Header {
    Header::decode(entry).expect("entry header")
}

/// The checkpoint in a checkpoint frame's text.
pub fn checkpoint(text: &[u8]) -> Checkpoint {
    Checkpoint::from_text(text).expect("checkpoint")
}

/// Index of the entry frame with header seq `seq`.
pub fn entry_at(frames: &[Frame], seq: u64) -> usize {
    frames
        .iter()
        .position(|f| matches!(f, Frame::Entry(b) if header(b).seq == seq))
        .unwrap_or_else(|| panic!("no entry {seq}"))
}

/// Index of the checkpoint frame of size `size`.
pub fn checkpoint_at(frames: &[Frame], size: u64) -> usize {
    frames
        .iter()
        .position(|f| matches!(f, Frame::Checkpoint(t) if checkpoint(t).size == size))
        .unwrap_or_else(|| panic!("no checkpoint of size {size}"))
}

/// The bytes of entry `seq`.
pub fn entry_bytes(frames: &[Frame], seq: u64) -> &[u8] {
    match &frames[entry_at(frames, seq)] {
        Frame::Entry(b) => b,
        Frame::Checkpoint(_) | Frame::Cosigned(_) => unreachable!(),
    }
}

/// Mutable bytes of entry `seq`.
pub fn entry_mut(frames: &mut [Frame], seq: u64) -> &mut Vec<u8> {
    let i = entry_at(frames, seq);
    match &mut frames[i] {
        Frame::Entry(b) => b,
        Frame::Checkpoint(_) | Frame::Cosigned(_) => unreachable!(),
    }
}

/// Number of entry frames.
pub fn entry_count(frames: &[Frame]) -> u64 {
    frames
        .iter()
        .filter(|f| matches!(f, Frame::Entry(_)))
        .count() as u64
}

/// The checkpoints among `frames`.
pub fn checkpoints(frames: &[Frame]) -> Vec<Checkpoint> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Checkpoint(t) => Some(checkpoint(t)),
            Frame::Entry(_) | Frame::Cosigned(_) => None,
        })
        .collect()
}

/// Overwrite an entry's previous-hash field.
pub fn set_prev_hash(entry: &mut [u8], prev: Hash) {
    entry[38..70].copy_from_slice(&prev.0);
}

/// The attacker's re-chaining after changing entry `from`: every later entry's
/// previous-hash is recomputed from the (changed) entry before it. Nothing is re-signed.
pub fn rechain(frames: &mut [Frame], from: u64) {
    let mut prev: Option<Hash> = None;
    for f in frames.iter_mut() {
        if let Frame::Entry(b) = f {
            if let Some(p) = prev.filter(|_| header(b).seq > from) {
                set_prev_hash(b, p);
            }
            prev = Some(entry_hash(b));
        }
    }
}

/// Sign a checkpoint with an epoch's secrets (what the writer does, and what an attacker
/// holding `writer.key` can do).
pub fn sign_checkpoint(
    secrets: &EpochSecrets,
    ledger_id: LedgerId,
    size: u64,
    head: Hash,
    wall_ms: u64,
) -> Checkpoint {
    secrets.sign_checkpoint(ledger_id, size, head, wall_ms)
}

/// A checkpoint as a frame.
pub fn checkpoint_frame(cp: &Checkpoint) -> Frame {
    Frame::Checkpoint(cp.to_text().into_bytes())
}

/// Flip bit `bit` (0 = most significant bit of byte 0) of `bytes`.
pub fn flip(bytes: &mut [u8], bit: usize) {
    bytes[bit / 8] ^= 0x80 >> (bit % 8);
}

/// Copy a directory tree (for copying a closed ledger).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy dir");
    for item in std::fs::read_dir(from).expect("read dir") {
        let item = item.expect("dir entry");
        let dst = to.join(item.file_name());
        if item.file_type().expect("file type").is_dir() {
            copy_dir(&item.path(), &dst);
        } else {
            std::fs::copy(item.path(), &dst).expect("copy file");
        }
    }
}

/// Whether exhaustive modes are affordable: `TALLY_EXHAUSTIVE=1`/`0` decides; otherwise
/// they are when Ed25519 runs optimized (a release build, or `opt-level` set for the
/// crypto crates), measured once. Unoptimized, one signature check costs ~20 ms here.
pub fn exhaustive() -> bool {
    static MODE: OnceLock<bool> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TALLY_EXHAUSTIVE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => {
            let (secrets, _) =
                EpochSecrets::generate(0, &AuditorKey::generate().public(), LedgerId([0; 16]))
                    .expect("epoch secrets");
            let (vk, sig) = (secrets.verifying_key(), secrets.sign(b"probe"));
            let start = Instant::now();
            for _ in 0..4 {
                verify_signature(&vk, b"probe", &sig, "probe").expect("probe signature");
            }
            start.elapsed() < Duration::from_millis(8)
        }
    })
}

/// The bits to flip in `len` bytes: every bit when [`exhaustive`], else `sample` bits
/// spread evenly over the bytes, with the bit position rotating.
pub fn bits_to_flip(len: usize, sample: usize) -> Vec<usize> {
    if exhaustive() {
        return (0..len * 8).collect();
    }
    sample_bits(len, sample)
}

/// `sample` bits spread evenly over `len` bytes, the bit position rotating (all bits if
/// `sample` covers them).
pub fn sample_bits(len: usize, sample: usize) -> Vec<usize> {
    if sample >= len * 8 {
        return (0..len * 8).collect();
    }
    (0..sample)
        .map(|i| {
            let byte = i * len / sample;
            byte * 8 + (byte * 5 + i) % 8
        })
        .collect()
}

/// Run `check` over `items` on two threads; returns every non-`None` result (failures).
pub fn par_failures<T: Sync, R: Send>(
    items: &[T],
    check: impl Fn(&T) -> Option<R> + Sync,
) -> Vec<R> {
    let half = items.len().div_ceil(2).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(half)
            .map(|part| s.spawn(|| part.iter().filter_map(&check).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("checker thread"))
            .collect()
    })
}

/// Whether any entry in an export claims an epoch of at least 2^20. Such an epoch
/// certificate makes the verifier allocate 32 bytes per claimed epoch (up to 128 GiB);
/// the flip tests leave those flips to `crafted::huge_epoch_claim_is_bounded`.
pub fn claims_huge_epoch(export: &[u8]) -> bool {
    read_export(export).is_ok_and(|frames| {
        frames.iter().any(|f| match f {
            Ok(Frame::Entry(b)) => Header::decode(b).is_ok_and(|h| h.epoch >= 1 << 20),
            _ => false,
        })
    })
}
