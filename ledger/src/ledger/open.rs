//! Creating a ledger and opening one for appending (finishing an interrupted rotation,
//! bringing the index up to the log, resuming after a torn write).

use std::fs;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::format::{chain_hash, key_id, Checkpoint, Entry, Frame, Hash, LedgerId};
use crate::keys::{self, EpochSecrets, LedgerPublic};
use crate::segment::{
    self, list_segments, push_frame, sync_dir, LogReader, LogWriter, Resume, Scan,
    DEFAULT_SEGMENT_BYTES, LOG_DIR, OLD_STORE_DIR, TAG_CHECKPOINT, TAG_ENTRY,
};
use crate::store::Store;
use crate::tlog::merkle::leaf_hash;
use crate::tlog::tiles::TreeWriter;
use crate::tlog::LogKey;
use crate::tree::RunLinks;

use super::index::{recover_index, replay_into};
use super::pipeline::{Queue, Shared};
use super::writer::{StateBases, Writer};
use super::{files, Ledger, Reindexed, Rotation};

impl Ledger {
    /// Create a new ledger in `dir` (created 0700) whose records only the holder of the
    /// auditor key for `recipient` can decrypt. Writes `ledger.pub` for auditors.
    pub fn init(dir: &Path, recipient: &[u8; 32], rotation: Rotation) -> Result<LedgerPublic> {
        Ledger::init_with_clock(dir, recipient, rotation, &SystemClock)
    }

    /// [`Ledger::init`], its genesis entry and first checkpoint timed by `clock`.
    pub fn init_with_clock(
        dir: &Path,
        recipient: &[u8; 32],
        rotation: Rotation,
        clock: &dyn Clock,
    ) -> Result<LedgerPublic> {
        if dir.join(files::PUBLIC).exists()
            || dir.join(OLD_STORE_DIR).exists()
            || dir.join(LOG_DIR).exists()
        {
            return Err(Error::AlreadyExists(dir.to_path_buf()));
        }
        let ledger_id = LedgerId(keys::random16());
        // Refuse a bad recipient before anything touches the disk.
        let (secrets, ephemeral) = EpochSecrets::generate(0, recipient, ledger_id)?;
        let created = !dir.exists();
        let wall = clock.now_ms();
        let result = Ledger::write_new(
            dir, ledger_id, secrets, &ephemeral, recipient, rotation, wall,
        );
        if result.is_err() {
            // Leave nothing half-made: the whole directory if we made it, else our files.
            if created {
                let _ = fs::remove_dir_all(dir);
            } else {
                for f in [
                    files::CONFIG,
                    files::WRITER_KEY,
                    files::PUBLIC,
                    crate::tlog::LOG_KEY,
                ] {
                    let _ = fs::remove_file(dir.join(f));
                }
                let _ = fs::remove_dir_all(dir.join(crate::tlog::tiles::TREE_DIR));
                let _ = fs::remove_dir_all(dir.join(LOG_DIR));
                let _ = fs::remove_dir_all(dir.join(crate::store::INDEX_DIR));
            }
        }
        result
    }

    fn write_new(
        dir: &Path,
        ledger_id: LedgerId,
        mut secrets: EpochSecrets,
        ephemeral: &[u8; 32],
        recipient: &[u8; 32],
        rotation: Rotation,
        wall: u64,
    ) -> Result<LedgerPublic> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io(dir, e))?;
        }
        secrets.from_seq = 0;
        secrets.since_ms = wall;
        let vk = secrets.verifying_key();
        let bytes = secrets.genesis_entry(ledger_id, wall, recipient, ephemeral);
        let leaf = leaf_hash(&bytes);
        let head = chain_hash(&leaf);
        let checkpoint = secrets.sign_checkpoint(ledger_id, 1, head, wall);
        let log_key = LogKey::generate(ledger_id);

        let config = serde_json::to_vec_pretty(&rotation).unwrap_or_default();
        fs::write(dir.join(files::CONFIG), config)
            .map_err(|e| Error::io(dir.join(files::CONFIG), e))?;
        secrets.write(&dir.join(files::WRITER_KEY), ledger_id)?;
        log_key.write(dir)?;
        let mut tree = TreeWriter::empty(dir)?;
        tree.push(leaf);
        tree.flush()?;
        let root = tree.frontier().root();
        let log_dir = dir.join(LOG_DIR);
        fs::create_dir(&log_dir).map_err(|e| Error::io(&log_dir, e))?;
        sync_dir(dir)?;
        let lock = LogWriter::lock(dir)?;
        let log = LogWriter::new(
            dir,
            lock,
            ledger_id,
            DEFAULT_SEGMENT_BYTES,
            Resume::NewSegment { number: 0 },
        )?;
        let mut frames = Vec::new();
        push_frame(&mut frames, TAG_ENTRY, &bytes);
        push_frame(
            &mut frames,
            segment::TAG_TREE,
            &segment::encode_tree(1, &root),
        );
        push_frame(&mut frames, TAG_CHECKPOINT, checkpoint.to_text().as_bytes());
        log.append(&frames, 0, Hash::default())?;
        log.sync()?;
        drop(log);
        let public = LedgerPublic {
            ledger_id,
            verifying_key: vk,
            log_key: Some(log_key.vkey()),
        };
        let pub_path = dir.join(files::PUBLIC);
        fs::write(&pub_path, public.to_text()).map_err(|e| Error::io(&pub_path, e))?;
        keys::sync_parent(&pub_path)?;
        Ok(public)
    }

    /// Open an existing ledger for appending. Takes the log's exclusive lock; finishes
    /// or discards a key rotation that a crash interrupted; brings the index up to the
    /// log; resumes in a new segment after a torn write. Refuses layout 2
    /// ([`Error::Layout2`]) and layout 1 ([`Error::OldLayout`]).
    pub fn open(dir: &Path) -> Result<Ledger> {
        Ledger::open_with(dir, DEFAULT_SEGMENT_BYTES, Arc::new(SystemClock))
    }

    /// [`Ledger::open`], reading the time for its entries, checkpoints and rotation by
    /// age from `clock` (the system's in the daemon; tests move one of their own). The
    /// ledger never writes a time before one it already wrote, whatever the clock says.
    pub fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> Result<Ledger> {
        Ledger::open_with(dir, DEFAULT_SEGMENT_BYTES, clock)
    }

    /// [`Ledger::open`], closing a segment once a group would take it past
    /// `segment_bytes` (tests use small segments to cross many boundaries).
    pub fn open_with_segment_bytes(dir: &Path, segment_bytes: u64) -> Result<Ledger> {
        Ledger::open_with(dir, segment_bytes, Arc::new(SystemClock))
    }

    fn open_with(dir: &Path, segment_bytes: u64, clock: Arc<dyn Clock>) -> Result<Ledger> {
        segment::refuse_old_layout(dir)?;
        let pub_path = dir.join(files::PUBLIC);
        if !pub_path.exists() {
            return Err(Error::NotALedger(dir.to_path_buf()));
        }
        let public = LedgerPublic::read(&pub_path)?;
        let ledger_id = public.ledger_id;
        let rotation = read_rotation(dir)?;
        let lock = LogWriter::lock(dir)?;
        recover_index(dir)?;
        let segments = list_segments(dir)?;
        let end = check_log(dir, &public, &segments)?;
        let (sealed_index, sealed_scan) = (end.index, &end.scan);
        let sealed_path = &segments[sealed_index].1;
        let last_number = segments[segments.len() - 1].0;
        let mut resync = sealed_index + 1 < segments.len() || sealed_scan.unsealed() > 0;
        let (checkpoint, last_seq) = (end.checkpoint, end.last_seq);
        // Bring the index up to the log: replay the state frames after its mark.
        let store = Store::open(dir)?;
        let sealed_number = segments[sealed_index].0;
        let sealed_end = (sealed_number, sealed_scan.sealed_end);
        resync |= catch_up_index(dir, &store, &segments, sealed_end, last_seq)?;
        let tree_frame = sealed_scan
            .last_tree
            .map(|at| segment::read_payload(sealed_path, at));
        let tree_frame = tree_frame
            .transpose()?
            .and_then(|f| segment::decode_tree(&f));
        let tree = crate::tree::open_tree(dir, &segments, &store, last_seq + 1, tree_frame)?;
        let durable_root = tree.frontier().root();
        let log_key = open_log_key(dir, &pub_path, &public)?;
        let resume = if resync {
            Resume::NewSegment {
                number: last_number + 1,
            }
        } else {
            Resume::Continue {
                number: sealed_number,
                len: sealed_scan.len,
            }
        };
        let log = LogWriter::new(dir, lock, ledger_id, segment_bytes, resume)?;
        let secrets = writer_secrets(dir, ledger_id, end.epoch, &checkpoint)?;
        let cipher = keys::data_key(&secrets.data);
        let writer = Writer {
            dir: dir.to_path_buf(),
            clock: Arc::clone(&clock),
            ledger_id,
            recipient: end.recipient,
            rotation,
            next_seq: last_seq + 1,
            head: end.head,
            last_wall: end.last_wall.max(checkpoint.wall_ms),
            epoch_from_seq: secrets.from_seq,
            epoch_since_ms: secrets.since_ms,
            secrets,
            cipher,
            nonce_prefix: keys::random16(),
            last_point: None,
            bases: StateBases::default(),
            tree,
            links: RunLinks::default(),
            linked: Vec::new(),
        };
        let shared = shared(log, store, (checkpoint, durable_root), writer, clock);
        let mut ledger = Ledger {
            dir: dir.to_path_buf(),
            ledger_id,
            log_key,
            shared,
            threads: Vec::with_capacity(2),
            torn: end.torn,
        };
        ledger.start_threads()?;
        Ok(ledger)
    }

    /// The commit and sync threads, started once the ledger is open.
    fn start_threads(&mut self) -> Result<()> {
        type Stage = fn(&Shared);
        let stages: [(&str, Stage); 2] = [
            ("tally-commit", Shared::commit_loop),
            ("tally-sync", Shared::sync_loop),
        ];
        for (name, stage) in stages {
            let shared = Arc::clone(&self.shared);
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || stage(&shared))
                .map_err(|e| Error::io(&self.dir, e))?;
            self.threads.push(thread);
        }
        Ok(())
    }
}

/// What opening reads from the log's sealed end, every byte of it verified.
struct LogEnd {
    /// The auditor's key the genesis names.
    recipient: [u8; 32],
    /// The last sealed segment's place in the list, and its scan.
    index: usize,
    scan: Scan,
    /// The last checkpoint, which seals the last entry.
    checkpoint: Checkpoint,
    /// The last entry's seq, hash, time and epoch.
    last_seq: u64,
    head: Hash,
    last_wall: u64,
    epoch: u32,
    /// Torn writes found after the sealed end.
    torn: Vec<segment::Torn>,
}

/// The log checked before anything is written: its genesis matches `ledger.pub`, its
/// last checkpoint seals its last entry, and the last group and everything after it
/// verify (the index included).
fn check_log(
    dir: &Path,
    public: &LedgerPublic,
    segments: &[(u64, std::path::PathBuf)],
) -> Result<LogEnd> {
    let ledger_id = public.ledger_id;
    let genesis_bytes = genesis_bytes(dir, segments)?;
    let genesis = Entry::decode(&genesis_bytes).map_err(|e| corrupt(dir, 0, e.to_string()))?;
    let g = genesis
        .genesis()
        .ok_or_else(|| corrupt(dir, 0, "entry 0 is not a genesis".into()))?;
    if genesis.header.ledger_id != ledger_id || g.verifying_key != public.verifying_key {
        return Err(corrupt(dir, 0, "genesis does not match ledger.pub".into()));
    }
    let (index, scan) = last_sealed(dir, segments)?;
    let (last_bytes, cp_text) = sealed_end_bytes(dir, &segments[index].1, &scan)?;
    let last = Entry::decode(&last_bytes).map_err(|e| corrupt(dir, 0, e.to_string()))?;
    let checkpoint = check_sealed_end(dir, &last, &cp_text, ledger_id)?;
    let torn = crate::tail::check(
        &crate::tail::Sealed {
            dir,
            ledger_id,
            segments,
            index,
            scan: &scan,
            checkpoint: &checkpoint,
            key: writer_verifying_key(dir, ledger_id, last.header.epoch)?,
        },
        &genesis,
    )?;
    Ok(LogEnd {
        recipient: g.recipient,
        index,
        scan,
        checkpoint,
        last_seq: last.header.seq,
        head: last.hash(),
        last_wall: last.header.wall_ms,
        epoch: last.header.epoch,
        torn,
    })
}

/// A damaged log's error, at `seq`.
fn corrupt(dir: &Path, seq: u64, why: String) -> Error {
    Error::TailDamaged {
        dir: dir.to_path_buf(),
        at: format!("seq {seq}"),
        why,
    }
}

/// The ledger's rotation settings (`config.json`).
fn read_rotation(dir: &Path) -> Result<Rotation> {
    let config_path = dir.join(files::CONFIG);
    let config = fs::read(&config_path).map_err(|e| Error::io(&config_path, e))?;
    serde_json::from_slice(&config).map_err(|e| Error::Corrupt {
        seq: 0,
        why: format!("{}: {e}", config_path.display()),
    })
}

/// The bytes of entry 0, the first frame of the first segment.
fn genesis_bytes(dir: &Path, segments: &[(u64, std::path::PathBuf)]) -> Result<Vec<u8>> {
    match LogReader::new(segments[..1].to_vec(), false, None)
        .frames()
        .next()
    {
        Some(Ok(Frame::Entry(b))) => Ok(b),
        Some(Err(Error::Segment { why, .. })) => Err(corrupt(dir, 0, why)),
        Some(Err(e)) => Err(e),
        _ => Err(corrupt(dir, 0, "no genesis entry".into())),
    }
}

/// The last segment with a complete checkpoint, which holds the log's sealed end; any
/// byte after it (a torn write, or segments holding only one) is never overwritten: the
/// next write starts a new segment.
fn last_sealed(dir: &Path, segments: &[(u64, std::path::PathBuf)]) -> Result<(usize, Scan)> {
    for (i, (_, path)) in segments.iter().enumerate().rev() {
        let scan = segment::scan(path).map_err(|e| match e {
            Error::Segment { path, why } => Error::TailDamaged {
                dir: dir.to_path_buf(),
                at: format!("{}", path.display()),
                why,
            },
            e => e,
        })?;
        if scan.sealed {
            return Ok((i, scan));
        }
    }
    Err(corrupt(dir, 0, "no segment holds a checkpoint".into()))
}

/// The last entry's and the last checkpoint's bytes: the scan found where they are, so
/// those two alone are read.
fn sealed_end_bytes(dir: &Path, path: &Path, scan: &Scan) -> Result<(Vec<u8>, Vec<u8>)> {
    let (Some(entry_at), Some(cp_at)) = (scan.last_entry, scan.last_checkpoint) else {
        return Err(corrupt(
            dir,
            0,
            "the last sealed segment holds no entry".into(),
        ));
    };
    Ok((
        segment::read_payload(path, entry_at)?,
        segment::read_payload(path, cp_at)?,
    ))
}

/// The log's last checkpoint, which must seal its last entry, of this ledger.
fn check_sealed_end(
    dir: &Path,
    last: &Entry<'_>,
    cp_text: &[u8],
    ledger_id: LedgerId,
) -> Result<Checkpoint> {
    let last_seq = last.header.seq;
    if last.header.ledger_id != ledger_id {
        return Err(corrupt(
            dir,
            last_seq,
            "the log's last entry is not of this ledger".into(),
        ));
    }
    let checkpoint =
        Checkpoint::from_text(cp_text).map_err(|e| corrupt(dir, last_seq, e.to_string()))?;
    if checkpoint.size != last_seq + 1 || checkpoint.head != last.hash() {
        return Err(corrupt(
            dir,
            last_seq,
            "the log's last checkpoint does not seal its last entry".into(),
        ));
    }
    Ok(checkpoint)
}

/// The index brought up to the log: the state frames after its mark replayed into it.
/// Whether it was ahead of the log (see [`index_mark`]).
fn catch_up_index(
    dir: &Path,
    store: &Store,
    segments: &[(u64, std::path::PathBuf)],
    sealed_end: (u64, u64),
    last_seq: u64,
) -> Result<bool> {
    let (mark, ahead) = index_mark(store, sealed_end, last_seq)?;
    replay_into(
        dir,
        store,
        LogReader::new(segments.to_vec(), false, mark),
        &mut Reindexed::default(),
    )?;
    Ok(ahead)
}

/// Where the index's replay starts, and whether the index was ahead of the log.
///
/// The index may hold state from log bytes that are gone (lost with a power failure,
/// never acknowledged): state ahead of the log is safe (a budget is over-counted, never
/// re-spendable). Its mark and seq points may name a segment the log no longer has, whose
/// number the next segment takes (the numbers have no gap): they are set back to the
/// sealed end, durably, before anything is written where they point.
fn index_mark(
    store: &Store,
    sealed: (u64, u64),
    last_seq: u64,
) -> Result<(Option<(u64, u64)>, bool)> {
    let mark = store.mark()?;
    match mark {
        Some((seg, off)) if seg > sealed.0 || (seg == sealed.0 && off > sealed.1) => {
            store.remark(sealed, last_seq + 1)?;
            Ok((Some(sealed), true))
        }
        _ => Ok((mark, false)),
    }
}

/// The writer's key for `epoch`, after finishing a rotation a crash interrupted: the
/// key that sealed the log's last checkpoint if that is of this epoch.
fn writer_secrets(
    dir: &Path,
    ledger_id: LedgerId,
    epoch: u32,
    checkpoint: &Checkpoint,
) -> Result<EpochSecrets> {
    let key_path = dir.join(files::WRITER_KEY);
    let next_path = dir.join(files::WRITER_KEY_NEXT);
    if next_path.exists() {
        let next = EpochSecrets::read(&next_path, ledger_id)?;
        if next.epoch == epoch {
            // The certificate committed; the rename did not.
            fs::rename(&next_path, &key_path).map_err(|e| Error::io(&key_path, e))?;
        } else {
            // The certificate never became durable: this key was never used.
            fs::remove_file(&next_path).map_err(|e| Error::io(&next_path, e))?;
        }
        keys::sync_parent(&key_path)?;
    }
    let secrets = EpochSecrets::read(&key_path, ledger_id)?;
    if secrets.epoch != epoch {
        return Err(Error::KeyEpochMismatch {
            key_epoch: secrets.epoch,
            ledger_epoch: epoch,
        });
    }
    if checkpoint.epoch == epoch && checkpoint.key_id != key_id(&secrets.verifying_key()) {
        return Err(corrupt(
            dir,
            checkpoint.size,
            "writer key does not match the key that sealed the ledger".into(),
        ));
    }
    Ok(secrets)
}

/// The state the commit and sync threads share, its durable end the log's.
fn shared(
    log: LogWriter,
    store: Store,
    (durable, durable_root): (Checkpoint, crate::tlog::merkle::TreeHash),
    writer: Writer,
    clock: Arc<dyn Clock>,
) -> Arc<Shared> {
    Arc::new(Shared {
        log,
        store,
        queue: Mutex::new(Queue {
            pending: Vec::new(),
            eager: 0,
            applied: Vec::new(),
            committing: false,
            syncing: false,
            flushing: false,
            commit_idle: false,
            commit_lingering: false,
            sync_idle: false,
            durable,
            durable_root,
            poisoned: None,
            unknown: None,
            closing: false,
        }),
        to_commit: Condvar::new(),
        to_sync: Condvar::new(),
        synced: Condvar::new(),
        writer: Mutex::new(writer),
        on_sync: std::sync::OnceLock::new(),
        clock,
    })
}

/// The verifying key of the writer's key for `epoch` (`writer.key`, or `writer.key.next`
/// while a rotation to `epoch` is being finished), read without changing a file.
pub(super) fn writer_verifying_key(
    dir: &Path,
    ledger_id: LedgerId,
    epoch: u32,
) -> Result<[u8; 32]> {
    let next_path = dir.join(files::WRITER_KEY_NEXT);
    if next_path.exists() {
        let next = EpochSecrets::read(&next_path, ledger_id)?;
        if next.epoch == epoch {
            return Ok(next.verifying_key());
        }
    }
    let current = EpochSecrets::read(&dir.join(files::WRITER_KEY), ledger_id)?;
    if current.epoch != epoch {
        return Err(Error::KeyEpochMismatch {
            key_epoch: current.epoch,
            ledger_epoch: epoch,
        });
    }
    Ok(current.verifying_key())
}

/// The log key of the ledger in `dir`: read, or made for a ledger written before log keys
/// (then `ledger.pub` is rewritten as version 2, naming it; its epoch 0 key is unchanged).
pub(super) fn open_log_key(dir: &Path, pub_path: &Path, public: &LedgerPublic) -> Result<LogKey> {
    let (key, _) = LogKey::read_or_create(dir, public.ledger_id)?;
    match &public.log_key {
        Some(v) if *v == key.vkey() => Ok(key),
        Some(_) => Err(Error::Corrupt {
            seq: 0,
            why: format!(
                "{} names another log key than {}",
                pub_path.display(),
                dir.join(crate::tlog::LOG_KEY).display()
            ),
        }),
        None => {
            let upgraded = LedgerPublic {
                log_key: Some(key.vkey()),
                ..public.clone()
            };
            let tmp = pub_path.with_extension("pub.tmp");
            fs::write(&tmp, upgraded.to_text()).map_err(|e| Error::io(&tmp, e))?;
            fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(&tmp, e))?;
            fs::rename(&tmp, pub_path).map_err(|e| Error::io(pub_path, e))?;
            keys::sync_parent(pub_path)?;
            Ok(key)
        }
    }
}
