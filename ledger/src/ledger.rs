//! The append API: the only way decisions enter a ledger.
//!
//! There is no update, delete or rewind. Appends from many threads share commit groups:
//! each group is encrypted and chained, sealed by one checkpoint, appended to the log's
//! active segment in one write (entries, the gate's derived state, the checkpoint),
//! made durable with one `fdatasync`, and only then acknowledged.
//!
//! Commit is a two-stage pipeline. The *commit* stage takes everything queued as one
//! group, encrypts, chains, signs and writes it to the log (and applies its derived
//! state to the sled index, not synced); the *sync* stage makes everything written so
//! far durable (`fdatasync`) and then acknowledges it. While
//! one group is being fsynced the next one is encrypted and written. A group is never
//! acknowledged before an fsync that began after it was written.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, MAX_DECISION_BYTES};
use crate::error::{DecisionError, Error, Result};
use crate::format::{entry_hash, key_id, Checkpoint, Entry, Frame, Hash, Header, LedgerId};
use crate::keys::{self, DataKey, EpochSecrets, LedgerPublic};
use crate::segment::{
    self, list_segments, push_frame, sync_dir, Item, LogReader, LogWriter, Resume, StateValue,
    DEFAULT_SEGMENT_BYTES, LOG_DIR, MAX_STATE_LEN, OLD_STORE_DIR, TAG_CHECKPOINT, TAG_ENTRY,
    TAG_STATE_DELTA,
};
use crate::store::{Point, Store, POINT_EVERY};
use crate::tlog::merkle::{leaf_hash, TreeHash};
use crate::tlog::tiles::TreeWriter;
use crate::tlog::LogKey;
use crate::tree::RunLinks;

/// File names inside a ledger directory.
pub mod files {
    /// The auditors' verification key.
    pub const PUBLIC: &str = "ledger.pub";
    /// The writer's current epoch secrets (0600).
    pub const WRITER_KEY: &str = "writer.key";
    /// The next epoch's secrets while a rotation commits (0600).
    pub const WRITER_KEY_NEXT: &str = "writer.key.next";
    /// Rotation settings.
    pub const CONFIG: &str = "config.json";
}

/// What the ledger acknowledges for each durable decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The entry's position in the chain.
    pub seq: u64,
    /// The entry's chain hash, lowercase hex.
    #[serde(with = "hash_hex")]
    pub hash: Hash,
}

mod hash_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::format::{parse_hex, Hash};

    pub fn serialize<S: Serializer>(h: &Hash, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&h.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let s = String::deserialize(d)?;
        parse_hex::<32>(&s, "hash")
            .map(Hash)
            .map_err(serde::de::Error::custom)
    }
}

/// What [`Ledger::reindex`] rebuilt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reindexed {
    /// Segments read.
    pub segments: u64,
    /// Entries read (the log's sealed entries).
    pub entries: u64,
    /// State frames replayed into the new index.
    pub state_frames: u64,
    /// Index points written.
    pub points: u64,
    /// Values written outside commit groups (an operator's pause) carried over from the
    /// old index.
    pub carried: u64,
    /// Whether the old index could not be read, so those values are lost.
    pub old_index_unreadable: bool,
    /// Torn writes seen (kept in place).
    pub torn: u64,
}

/// When the writer moves to a new key epoch. Rotation happens at commit-group
/// boundaries, so an epoch may exceed `records` by up to one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rotation {
    /// Rotate after this many entries in an epoch.
    pub records: u64,
    /// Rotate after this many ms of wall time in an epoch.
    pub ms: u64,
}

impl Default for Rotation {
    fn default() -> Rotation {
        Rotation {
            records: 100_000,
            ms: 600_000,
        }
    }
}

/// Most decisions a commit group gathers from the queue, so one group's latency and memory
/// stay bounded. A single larger append is still one group (it is atomic).
const MAX_GROUP: usize = 16_384;

/// Where a group member's result goes: called exactly once, with its receipts once they
/// are durable, or with the error that refused them. Dropped unanswered (a pipeline
/// thread died), it answers with an error itself.
struct Reply(Option<Done>);

type Done = Box<dyn FnOnce(Result<Vec<Receipt>>) + Send>;

impl Reply {
    fn new(done: impl FnOnce(Result<Vec<Receipt>>) + Send + 'static) -> Reply {
        Reply(Some(Box::new(done)))
    }

    fn send(mut self, result: Result<Vec<Receipt>>) {
        if let Some(done) = self.0.take() {
            done(result);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(Error::Poisoned(
                "the commit pipeline stopped before answering".into(),
            )));
        }
    }
}

struct Pending {
    plaintexts: Vec<Vec<u8>>,
    /// Derived state written in the same atomic batch as these decisions.
    state: Vec<(Vec<u8>, Vec<u8>)>,
    /// Start a new key epoch before this group (an explicit [`Ledger::rotate`]).
    rotate: bool,
    reply: Reply,
}

/// A group written to the log, waiting for an fsync before it is acknowledged.
struct Applied {
    replies: Vec<(Reply, Vec<Receipt>)>,
    checkpoint: Checkpoint,
    /// The Merkle tree's root at the checkpoint's size.
    root: TreeHash,
}

struct Writer {
    dir: PathBuf,
    ledger_id: LedgerId,
    recipient: [u8; 32],
    rotation: Rotation,
    next_seq: u64,
    head: Hash,
    last_wall: u64,
    secrets: EpochSecrets,
    cipher: DataKey,
    epoch_from_seq: u64,
    epoch_since_ms: u64,
    nonce_prefix: [u8; 16],
    /// The last index point written: (segment, offset).
    last_point: Option<(u64, u64)>,
    /// The last value this process wrote under each state key, the base of that key's
    /// next delta (bounded: [`MAX_BASES_BYTES`]).
    bases: StateBases,
    /// The Merkle tree over the entries: its frontier, and the tile files it extends.
    tree: TreeWriter,
    /// Each run's last seq, for the next decision's `prev_seq`.
    links: RunLinks,
    /// A plaintext with its run link, reused from decision to decision.
    linked: Vec<u8>,
}

/// A state frame's `check`, before its pairs.
const STATE_CHECK_LEN: usize = 4;

/// The most bytes `state`'s pairs take in a state frame (tag 4): per pair the key and the
/// value (a delta is only taken when shorter) and at most 13 bytes of varints and kind.
fn state_bound(state: &[(Vec<u8>, Vec<u8>)]) -> usize {
    state.iter().map(|(k, v)| k.len() + v.len() + 16).sum()
}

/// Most bytes of state values [`StateBases`] keeps; past it, it starts again empty (the
/// next value of each key is written whole).
const MAX_BASES_BYTES: usize = 16 << 20;

/// The previous value of each state key this process wrote. Only a value this writer put
/// in the log is ever a base: one the index holds from log bytes lost before a crash
/// never is, so every delta decodes against the log alone (`tally reindex`).
#[derive(Default)]
struct StateBases {
    values: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
}

impl StateBases {
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        let add = key.len() + value.len();
        if self.bytes + add > MAX_BASES_BYTES {
            self.values.clear();
            self.bytes = 0;
        }
        match self.values.get_mut(key) {
            Some(old) => {
                self.bytes = self.bytes - old.len() + value.len();
                old.clear();
                old.extend_from_slice(value);
            }
            None => {
                self.bytes += add;
                self.values.insert(key.to_vec(), value.to_vec());
            }
        }
    }
}

/// Apply one state frame read from the log to the index: each delta decodes against the
/// key's value in the index, which holds every earlier frame (the one rule the writer's
/// replay on open and `tally reindex` share).
fn apply_state_frame(
    dir: &Path,
    store: &Store,
    frame: segment::StateFrame,
    at: (u64, u64),
) -> Result<()> {
    let mut bases = std::collections::HashMap::new();
    for (k, v) in &frame.pairs {
        if let StateValue::Delta { .. } = v {
            if let Some(b) = store.derived_get(k)? {
                bases.insert(k.clone(), b);
            }
        }
    }
    let full = frame
        .resolve(|k| bases.get(k).map(Vec::as_slice))
        .map_err(|e| Error::Segment {
            path: dir.join(LOG_DIR).join(segment::segment_name(at.0)),
            why: format!("state frame ending at byte {}: {e}", at.1),
        })?;
    store.apply_group(
        full.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
        None,
        at,
    )
}

/// Put an index back in place after a crash between a reindex's two renames (`index` to
/// `index.old`, then `index.new` to `index`), which leaves none: the one built (with what
/// `put_state_durable` wrote carried into it), never a new empty index.
fn recover_index(dir: &Path) -> Result<()> {
    use crate::store::{remove_index, INDEX_DIR};
    let index = dir.join(INDEX_DIR);
    let old = dir.join("index.old");
    if index.exists() || !old.exists() {
        return Ok(());
    }
    // `index.old` is made only once `index.new` is built whole and synced.
    let new = dir.join("index.new");
    let from = if new.exists() { &new } else { &old };
    fs::rename(from, &index).map_err(|e| Error::io(from, e))?;
    sync_dir(dir)?;
    remove_index(&old)
}

/// Bring `store` up to the log `reader` reads: index points for its entries (one per
/// [`POINT_EVERY`] bytes of a segment), its state frames applied in order, and the mark
/// at its last checkpoint. What the writer's open (from the index's mark) and `tally
/// reindex` (from the start, into a new index) both do; counts go to `done`.
fn replay_into(
    dir: &Path,
    store: &Store,
    mut reader: LogReader,
    done: &mut Reindexed,
) -> Result<()> {
    let mut last_point: Option<(u64, u64)> = None;
    let mut mark = None;
    while let Some(item) = reader.next() {
        let pos = reader.position();
        match item? {
            Item::Frame(Frame::Entry(bytes)) => {
                done.entries += 1;
                let Some((segment, end)) = pos else { continue };
                let offset = end - (segment::FRAME_PREFIX_LEN + bytes.len()) as u64;
                let due = match last_point {
                    Some((s, o)) => s != segment || offset - o >= POINT_EVERY,
                    None => true,
                };
                if due {
                    let seq = Header::decode(&bytes)?.seq;
                    store.apply_group(
                        std::iter::empty(),
                        Some(Point {
                            seq,
                            segment,
                            offset,
                        }),
                        (segment, offset),
                    )?;
                    last_point = Some((segment, offset));
                    done.points += 1;
                }
            }
            Item::Frame(Frame::Checkpoint(_)) => mark = pos,
            Item::State {
                frame,
                segment,
                end,
            } => {
                apply_state_frame(dir, store, frame, (segment, end))?;
                done.state_frames += 1;
                #[cfg(feature = "faults")]
                crate::faults::replayed_state_frame(done.state_frames, || {
                    let _ = store.flush();
                });
            }
            Item::Torn(_) => done.torn += 1,
            Item::Tree { .. } | Item::Frame(Frame::Cosigned(_)) => {}
        }
    }
    if let Some(m) = mark {
        store.apply_group(std::iter::empty(), None, m)?;
    }
    Ok(())
}

/// The commit pipeline's shared state.
struct Queue {
    /// Decisions waiting for the next group.
    pending: Vec<Pending>,
    /// Groups written, waiting for the next fsync.
    applied: Vec<Applied>,
    /// Someone holds the commit role (encrypting and writing a group).
    committing: bool,
    /// Someone holds the sync role (flushing and fsyncing).
    syncing: bool,
    /// The syncer is taking what it will sync; the next group starts once it has.
    flushing: bool,
    /// The committer thread is asleep, waiting for work (so it is woken only when it has
    /// some: a condvar notify is a system call).
    commit_idle: bool,
    /// The syncer thread is asleep, waiting for work.
    sync_idle: bool,
    /// The latest checkpoint whose group is durable and acknowledged.
    durable: Checkpoint,
    /// The Merkle tree's root at the durable checkpoint's size.
    durable_root: TreeHash,
    /// Set once a write or fsync failed: whether earlier groups are durable is then
    /// unknown, so everything after is refused.
    poisoned: Option<String>,
    /// The ledger is being dropped: the threads finish what is queued and exit.
    closing: bool,
}

/// What the appenders and the two pipeline threads share.
struct Shared {
    /// The log: the record of truth.
    log: LogWriter,
    /// The sled index: derived state and index points, never synced per group.
    store: Store,
    queue: Mutex<Queue>,
    /// Signalled when decisions are queued, or a written group was taken by the syncer.
    to_commit: Condvar,
    /// Signalled when a group is written.
    to_sync: Condvar,
    writer: Mutex<Writer>,
    /// Told how long each flush and fsync took ([`Ledger::on_sync`]).
    on_sync: std::sync::OnceLock<SyncObserver>,
}

/// Told how long each flush and fsync of the log took.
pub type SyncObserver = Box<dyn Fn(std::time::Duration) + Send + Sync>;

/// An open ledger: the append side. Holds the log's exclusive lock (and sled's on the
/// index).
///
/// Group commit: an appender queues its decisions and waits for its receipts. A group is
/// written while the previous one is made durable; the next group starts only once the
/// syncer has taken the one before, so the queue keeps filling (and groups stay large)
/// while an fsync runs. Each role is taken by an appender when the pipeline is idle
/// (no hand-off latency for a lone appender) and by the ledger's own committer and
/// syncer threads under load.
pub struct Ledger {
    dir: PathBuf,
    ledger_id: LedgerId,
    /// Signs the ledger's C2SP checkpoints.
    log_key: LogKey,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The torn writes open found after the sealed end (kept; the log resumed after them).
    torn: Vec<segment::Torn>,
}

/// The verifying key of the writer's key for `epoch` (`writer.key`, or `writer.key.next`
/// while a rotation to `epoch` is being finished), read without changing a file.
fn writer_verifying_key(dir: &Path, ledger_id: LedgerId, epoch: u32) -> Result<[u8; 32]> {
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a commit stage poisons the ledger (see `RoleGuard`), so a guard recovered
    // from a panicking thread is never used to write again.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Prepare decisions for the store: validate, replace raw args by their digest, encode.
/// The first refused decision is named by its index; nothing is written.
pub fn prepare(decisions: Vec<Decision>) -> Result<Vec<Vec<u8>>> {
    let single = decisions.len() == 1;
    decisions
        .into_iter()
        .enumerate()
        .map(|(index, mut d)| {
            let wrap = |source: DecisionError| {
                if single {
                    Error::Decision(source)
                } else {
                    Error::InBatch { index, source }
                }
            };
            d.validate().map_err(wrap)?;
            d.seal_args();
            let bytes = d.to_canonical_json();
            if bytes.len() > MAX_DECISION_BYTES {
                return Err(wrap(DecisionError::TooLong {
                    field: "decision",
                    len: bytes.len(),
                    max: MAX_DECISION_BYTES,
                }));
            }
            Ok(bytes)
        })
        .collect()
}

impl Ledger {
    /// Create a new ledger in `dir` (created 0700) whose records only the holder of the
    /// auditor key for `recipient` can decrypt. Writes `ledger.pub` for auditors.
    pub fn init(dir: &Path, recipient: &[u8; 32], rotation: Rotation) -> Result<LedgerPublic> {
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
        let result = Ledger::write_new(dir, ledger_id, secrets, &ephemeral, recipient, rotation);
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
    ) -> Result<LedgerPublic> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io(dir, e))?;
        }
        let wall = now_ms();
        secrets.from_seq = 0;
        secrets.since_ms = wall;
        let vk = secrets.verifying_key();
        let bytes = secrets.genesis_entry(ledger_id, wall, recipient, ephemeral);
        let head = entry_hash(&bytes);
        let checkpoint = secrets.sign_checkpoint(ledger_id, 1, head, wall);
        let log_key = LogKey::generate(ledger_id);

        let config = serde_json::to_vec_pretty(&rotation).unwrap_or_default();
        fs::write(dir.join(files::CONFIG), config)
            .map_err(|e| Error::io(dir.join(files::CONFIG), e))?;
        secrets.write(&dir.join(files::WRITER_KEY), ledger_id)?;
        log_key.write(dir)?;
        let mut tree = TreeWriter::empty(dir)?;
        tree.push(leaf_hash(&bytes));
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
    /// log; resumes in a new segment after a torn write. Refuses layout 1
    /// ([`Error::OldLayout`]).
    pub fn open(dir: &Path) -> Result<Ledger> {
        Ledger::open_with_segment_bytes(dir, DEFAULT_SEGMENT_BYTES)
    }

    /// [`Ledger::open`], closing a segment once a group would take it past
    /// `segment_bytes` (tests use small segments to cross many boundaries).
    pub fn open_with_segment_bytes(dir: &Path, segment_bytes: u64) -> Result<Ledger> {
        segment::refuse_old_layout(dir)?;
        let pub_path = dir.join(files::PUBLIC);
        if !pub_path.exists() {
            return Err(Error::NotALedger(dir.to_path_buf()));
        }
        let public = LedgerPublic::read(&pub_path)?;
        let ledger_id = public.ledger_id;
        let config_path = dir.join(files::CONFIG);
        let config = fs::read(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let rotation: Rotation = serde_json::from_slice(&config).map_err(|e| Error::Corrupt {
            seq: 0,
            why: format!("{}: {e}", config_path.display()),
        })?;
        let lock = LogWriter::lock(dir)?;
        recover_index(dir)?;
        let segments = list_segments(dir)?;
        let corrupt = |seq: u64, why: String| Error::TailDamaged {
            dir: dir.to_path_buf(),
            at: format!("seq {seq}"),
            why,
        };
        let genesis_bytes = match LogReader::new(segments[..1].to_vec(), false, None)
            .frames()
            .next()
        {
            Some(Ok(Frame::Entry(b))) => b,
            Some(Err(Error::Segment { why, .. })) => return Err(corrupt(0, why)),
            Some(Err(e)) => return Err(e),
            _ => return Err(corrupt(0, "no genesis entry".into())),
        };
        let genesis = Entry::decode(&genesis_bytes).map_err(|e| corrupt(0, e.to_string()))?;
        let g = genesis
            .genesis()
            .ok_or_else(|| corrupt(0, "entry 0 is not a genesis".into()))?;
        if genesis.header.ledger_id != ledger_id || g.verifying_key != public.verifying_key {
            return Err(corrupt(0, "genesis does not match ledger.pub".into()));
        }
        // The last segment with a complete checkpoint holds the log's sealed end; any
        // byte after it (a torn write, or segments holding only one) is never
        // overwritten: the next write starts a new segment.
        let mut sealed_at = None;
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
                sealed_at = Some((i, scan));
                break;
            }
        }
        let Some((sealed_index, sealed_scan)) = sealed_at else {
            return Err(corrupt(0, "no segment holds a checkpoint".into()));
        };
        let last_number = segments[segments.len() - 1].0;
        let mut resync = sealed_index + 1 < segments.len() || sealed_scan.unsealed() > 0;
        // The scan found where the last entry and checkpoint are: read those two alone.
        let sealed_path = &segments[sealed_index].1;
        let (Some(entry_at), Some(cp_at)) = (sealed_scan.last_entry, sealed_scan.last_checkpoint)
        else {
            return Err(corrupt(0, "the last sealed segment holds no entry".into()));
        };
        let last_bytes = segment::read_payload(sealed_path, entry_at)?;
        let cp_text = segment::read_payload(sealed_path, cp_at)?;
        let last = Entry::decode(&last_bytes).map_err(|e| corrupt(0, e.to_string()))?;
        let last_seq = last.header.seq;
        if last.header.ledger_id != ledger_id {
            return Err(corrupt(
                last_seq,
                "the log's last entry is not of this ledger".into(),
            ));
        }
        let checkpoint =
            Checkpoint::from_text(&cp_text).map_err(|e| corrupt(last_seq, e.to_string()))?;
        if checkpoint.size != last_seq + 1 || checkpoint.head != last.hash() {
            return Err(corrupt(
                last_seq,
                "the log's last checkpoint does not seal its last entry".into(),
            ));
        }
        // Never write after bytes that do not verify: the last group and everything
        // after it are checked before anything is written, the index included.
        let torn = crate::tail::check(
            &crate::tail::Sealed {
                dir,
                ledger_id,
                segments: &segments,
                index: sealed_index,
                scan: &sealed_scan,
                checkpoint: &checkpoint,
                key: writer_verifying_key(dir, ledger_id, last.header.epoch)?,
            },
            &genesis,
        )?;
        // Bring the index up to the log: replay the state frames after its mark.
        let store = Store::open(dir)?;
        let mut mark = store.mark()?;
        let sealed_number = segments[sealed_index].0;
        let new_number = last_number + 1;
        if let Some((seg, off)) = mark {
            if seg > sealed_number || (seg == sealed_number && off > sealed_scan.sealed_end) {
                // The index holds state from log bytes that are gone (lost with a power
                // failure, never acknowledged): state ahead of the log is safe (a budget
                // is over-counted, never re-spendable). Its mark and seq points may name
                // a segment the log no longer has, whose number the next segment takes
                // (the numbers have no gap): set them back to the sealed end, durably,
                // before anything is written where they point.
                resync = true;
                let sealed = (sealed_number, sealed_scan.sealed_end);
                store.remark(sealed, last_seq + 1)?;
                mark = Some(sealed);
            }
        }
        replay_into(
            dir,
            &store,
            LogReader::new(segments.clone(), false, mark),
            &mut Reindexed::default(),
        )?;
        let tree_frame = match sealed_scan.last_tree {
            Some(at) => segment::decode_tree(&segment::read_payload(sealed_path, at)?),
            None => None,
        };
        let tree = crate::tree::open_tree(dir, &segments, &store, last_seq + 1, tree_frame)?;
        let durable_root = tree.frontier().root();
        let log_key = open_log_key(dir, &pub_path, &public)?;
        let resume = if resync {
            Resume::NewSegment { number: new_number }
        } else {
            Resume::Continue {
                number: sealed_number,
                len: sealed_scan.len,
            }
        };
        let log = LogWriter::new(dir, lock, ledger_id, segment_bytes, resume)?;
        let epoch = last.header.epoch;

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
        let cp_size = checkpoint.size;
        if checkpoint.epoch == epoch && checkpoint.key_id != key_id(&secrets.verifying_key()) {
            return Err(corrupt(
                cp_size,
                "writer key does not match the key that sealed the ledger".into(),
            ));
        }
        let cipher = keys::data_key(&secrets.data);
        let writer = Writer {
            dir: dir.to_path_buf(),
            ledger_id,
            recipient: g.recipient,
            rotation,
            next_seq: last_seq + 1,
            head: last.hash(),
            last_wall: last.header.wall_ms.max(checkpoint.wall_ms),
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
        let shared = Arc::new(Shared {
            log,
            store,
            queue: Mutex::new(Queue {
                pending: Vec::new(),
                applied: Vec::new(),
                committing: false,
                syncing: false,
                flushing: false,
                commit_idle: false,
                sync_idle: false,
                durable: checkpoint,
                durable_root,
                poisoned: None,
                closing: false,
            }),
            to_commit: Condvar::new(),
            to_sync: Condvar::new(),
            writer: Mutex::new(writer),
            on_sync: std::sync::OnceLock::new(),
        });
        let mut ledger = Ledger {
            dir: dir.to_path_buf(),
            ledger_id,
            log_key,
            shared,
            threads: Vec::with_capacity(2),
            torn,
        };
        type Stage = fn(&Shared);
        let stages: [(&str, Stage); 2] = [
            ("tally-commit", Shared::commit_loop),
            ("tally-sync", Shared::sync_loop),
        ];
        for (name, stage) in stages {
            let shared = Arc::clone(&ledger.shared);
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || stage(&shared))
                .map_err(|e| Error::io(dir, e))?;
            ledger.threads.push(thread);
        }
        Ok(ledger)
    }

    /// The latest checkpoint in the log of the ledger in `dir`, read without opening it
    /// for writing: no lock taken, no byte of the directory changed, and a writer (`tally
    /// serve`) may keep appending meanwhile.
    pub fn read_checkpoint(dir: &Path) -> Result<Checkpoint> {
        let segments = list_segments(dir)?;
        for (number, path) in segments.iter().rev() {
            if !segment::scan(path)?.sealed {
                continue;
            }
            let mut last = None;
            for f in LogReader::new(vec![(*number, path.clone())], false, None).frames() {
                if let Frame::Checkpoint(t) = f? {
                    last = Some(t);
                }
            }
            if let Some(text) = last {
                return Checkpoint::from_text(&text).map_err(Error::from);
            }
        }
        Err(Error::Corrupt {
            seq: 0,
            why: "no segment holds a checkpoint".into(),
        })
    }

    /// A snapshot of the ledger in `dir` up to its latest checkpoint, read without
    /// opening it for writing (see [`Ledger::read_checkpoint`]).
    pub fn read_snapshot(dir: &Path) -> Result<Snapshot> {
        let size = Ledger::read_checkpoint(dir)?.size;
        Ok(Snapshot {
            size,
            frames: Some(list_segments(dir).map(|s| LogReader::new(s, false, None))),
        })
    }

    /// Rebuild the sled index of the ledger in `dir` from its log: derived state from the
    /// state frames, index points from the entries; values written outside commit groups
    /// ([`Ledger::put_state_durable`]) are carried over from the old index when it still
    /// opens. Takes the writer's lock ([`Error::Busy`] while a writer holds the ledger).
    /// The new index is built beside the old one and then put in its place.
    pub fn reindex(dir: &Path) -> Result<Reindexed> {
        use crate::store::{remove_index, INDEX_DIR};
        segment::refuse_old_layout(dir)?;
        if !dir.join(files::PUBLIC).exists() {
            return Err(Error::NotALedger(dir.to_path_buf()));
        }
        let _lock = LogWriter::lock(dir)?;
        recover_index(dir)?;
        let segments = list_segments(dir)?;
        let mut done = Reindexed {
            segments: segments.len() as u64,
            ..Reindexed::default()
        };
        let old_path = dir.join(INDEX_DIR);
        let carried = if old_path.exists() {
            match Store::open(dir).and_then(|s| s.put_pairs()) {
                Ok(pairs) => pairs,
                Err(e @ Error::Busy(_)) => return Err(e),
                Err(_) => {
                    done.old_index_unreadable = true;
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        let new_path = dir.join("index.new");
        remove_index(&new_path)?;
        let store = Store::open_at(dir, &new_path)?;
        replay_into(dir, &store, LogReader::new(segments, true, None), &mut done)?;
        store.fold()?;
        done.carried = carried.len() as u64;
        store.put_durable(&carried)?;
        drop(store);
        let old = dir.join("index.old");
        remove_index(&old)?;
        if old_path.exists() {
            fs::rename(&old_path, &old).map_err(|e| Error::io(&old_path, e))?;
        }
        fs::rename(&new_path, &old_path).map_err(|e| Error::io(&new_path, e))?;
        sync_dir(dir)?;
        remove_index(&old)?;
        Ok(done)
    }

    /// The sealed entry at `seq`, found through the index (a sparse map from seqs to
    /// log positions) and read from the log; `None` beyond the durable checkpoint. The
    /// index only says where to start reading: the entry returned is the one whose header
    /// carries `seq`.
    pub fn entry(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        if seq >= self.checkpoint().size {
            return Ok(None);
        }
        let start = self.shared.store.point(seq)?.map(|p| (p.segment, p.offset));
        let segments = list_segments(&self.dir)?;
        for found in [start, None] {
            for f in LogReader::new(segments.clone(), false, found).frames() {
                if let Frame::Entry(b) = f? {
                    let at = Header::decode(&b)?.seq;
                    if at == seq {
                        return Ok(Some(b));
                    }
                    if at > seq {
                        break;
                    }
                }
            }
            if found.is_none() {
                break;
            }
        }
        Ok(None)
    }

    /// The torn writes found after the log's sealed end when it was opened: a crash's
    /// groups cut short, never acknowledged. They stay where they are (`tally verify`
    /// reports them) and the log resumed after them in a new segment; the writer says so.
    pub fn torn_at_open(&self) -> &[segment::Torn] {
        &self.torn
    }

    /// What to tell the operator about each of [`Ledger::torn_at_open`], one line each.
    pub fn torn_notes(&self) -> Vec<String> {
        self.torn
            .iter()
            .map(|t| {
                format!(
                    "the log ends in a torn write: {} bytes from byte {} of {} (a group a crash cut short, never acknowledged); they stay where they are, `tally verify` reports them, and the log resumes in a new segment",
                    t.len,
                    t.offset,
                    t.path.display()
                )
            })
            .collect()
    }

    /// The ledger's id.
    pub fn id(&self) -> LedgerId {
        self.ledger_id
    }

    /// The ledger directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Append one decision. Returns once it is durable and sealed.
    pub fn append(&self, decision: Decision) -> Result<Receipt> {
        let mut receipts = self.append_batch(vec![decision])?;
        receipts
            .pop()
            .ok_or_else(|| Error::Poisoned("commit returned no receipt".into()))
    }

    /// Append decisions atomically: all are validated first, and either all become
    /// durable with consecutive seqs or none is written.
    pub fn append_batch(&self, decisions: Vec<Decision>) -> Result<Vec<Receipt>> {
        let plaintexts = prepare(decisions)?;
        self.append_prepared(plaintexts)
    }

    /// Append already prepared (validated, canonical) decisions; see [`prepare`].
    pub fn append_prepared(&self, plaintexts: Vec<Vec<u8>>) -> Result<Vec<Receipt>> {
        if plaintexts.is_empty() {
            return Ok(Vec::new());
        }
        self.submit(plaintexts, false)
    }

    /// Queue prepared decisions and return at once. `done` is called exactly once: with
    /// the receipts once the decisions are durable and sealed, or with the error that
    /// refused them. Receipts are delivered in submission order. `done` runs on one of
    /// the ledger's threads (or on this one, if the ledger already refuses appends); it
    /// must be quick and must not append to this ledger (its thread would wait for itself).
    pub fn submit_prepared(
        &self,
        plaintexts: Vec<Vec<u8>>,
        done: impl FnOnce(Result<Vec<Receipt>>) + Send + 'static,
    ) {
        self.submit_with_state(plaintexts, Vec::new(), done)
    }

    /// [`Ledger::submit_prepared`], with derived state (the gate's counters) written in
    /// the group's state frame, in the same log write and under the same `fdatasync` as
    /// the decisions: after a crash the log holds both or neither, and opening replays
    /// what the index missed, so state is never behind the ledger. Keys live in their own namespace
    /// ([`Ledger::state`] reads them back); a later write of a key replaces it.
    pub fn submit_with_state(
        &self,
        plaintexts: Vec<Vec<u8>>,
        state: Vec<(Vec<u8>, Vec<u8>)>,
        done: impl FnOnce(Result<Vec<Receipt>>) + Send + 'static,
    ) {
        if plaintexts.is_empty() {
            return done(Ok(Vec::new()));
        }
        // A longer state frame would be written and acknowledged, then read as a torn
        // write (and the segment after it refused).
        let len = STATE_CHECK_LEN + state_bound(&state);
        if len > MAX_STATE_LEN {
            return done(Err(Error::StateTooLong {
                len,
                max: MAX_STATE_LEN,
            }));
        }
        let shared = &*self.shared;
        let mut queue = lock(&shared.queue);
        if let Some(why) = &queue.poisoned {
            let e = Error::Poisoned(why.clone());
            drop(queue);
            return done(Err(e));
        }
        queue.pending.push(Pending {
            plaintexts,
            state,
            rotate: false,
            reply: Reply::new(done),
        });
        shared.wake_committer(&queue);
    }

    /// Queue a group member and wait for its receipts. If the pipeline is idle, this
    /// thread commits and syncs the group itself (no hand-off to wait for); otherwise
    /// the pipeline threads take it up.
    fn submit(&self, plaintexts: Vec<Vec<u8>>, rotate: bool) -> Result<Vec<Receipt>> {
        let (tx, rx) = mpsc::channel();
        let shared = &*self.shared;
        let mut queue = lock(&shared.queue);
        if let Some(why) = &queue.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        queue.pending.push(Pending {
            plaintexts,
            state: Vec::new(),
            rotate,
            reply: Reply::new(move |result| {
                let _ = tx.send(result);
            }),
        });
        if queue.committing || queue.flushing || !queue.applied.is_empty() {
            shared.wake_committer(&queue);
            drop(queue);
        } else {
            queue = shared.commit_once(queue);
            if !queue.syncing && !queue.applied.is_empty() {
                queue = shared.sync_once(queue);
            }
            drop(queue);
        }
        rx.recv().unwrap_or_else(|_| {
            Err(Error::Poisoned(
                "the commit pipeline stopped before answering".into(),
            ))
        })
    }

    /// Move to a new key epoch now: the new keys are certified by the current signing
    /// key inside the chain, and the current secrets are destroyed. Returns once the
    /// certificate is durable and sealed.
    pub fn rotate(&self) -> Result<Checkpoint> {
        self.submit(Vec::new(), true)?;
        Ok(self.checkpoint())
    }

    /// Tell `observer` how long each flush and fsync of the log takes (a group commit's
    /// durability), from now on. Only the first observer set is kept; it runs on the
    /// thread that syncs, so it must be quick (a histogram's observe).
    pub fn on_sync(&self, observer: SyncObserver) {
        let _ = self.shared.on_sync.set(observer);
    }

    /// The latest signed checkpoint whose entries are durable.
    pub fn checkpoint(&self) -> Checkpoint {
        lock(&self.shared.queue).durable.clone()
    }

    /// The latest durable checkpoint and the Merkle tree's root at its size.
    pub fn tree_head(&self) -> (Checkpoint, TreeHash) {
        let q = lock(&self.shared.queue);
        (q.durable.clone(), q.durable_root)
    }

    /// The C2SP checkpoint of the latest durable size, signed by the log key.
    pub fn signed_tree_head(&self) -> crate::tlog::note::Note {
        let (cp, root) = self.tree_head();
        self.log_key.sign(cp.size, root)
    }

    /// The ledger's log key (signs its C2SP checkpoints).
    pub fn log_key(&self) -> &LogKey {
        &self.log_key
    }

    /// Every durable state value whose key starts with `prefix`, in key order (see
    /// [`Ledger::submit_with_state`]).
    pub fn state(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.shared.store.state(prefix)
    }

    /// The durable state value stored under exactly `key`.
    pub fn state_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.shared.store.state_get(key)
    }

    /// Write state values outside any commit group and make them durable before
    /// returning (for state no decision carries; the gate's pauses were, before they
    /// became records). Keys
    /// written here must not also be written through [`Ledger::submit_with_state`]:
    /// the two paths are not ordered with each other.
    pub fn put_state_durable(&self, state: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        if let Some(why) = &lock(&self.shared.queue).poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        self.shared.store.put_durable(state)
    }

    /// The current key epoch.
    pub fn epoch(&self) -> u32 {
        lock(&self.shared.writer).secrets.epoch
    }

    /// A consistent snapshot of the ledger up to its latest checkpoint, in frame order.
    /// Appends continue while it is read.
    pub fn snapshot(&self) -> Snapshot {
        // Entries written after the durable checkpoint are skipped by the size bound.
        let size = self.checkpoint().size;
        let frames = list_segments(&self.dir).map(|segments| LogReader::new(segments, false, None));
        Snapshot {
            size,
            frames: Some(frames),
        }
    }

    /// Export a consistent snapshot to `out` (see [`crate::export`]).
    pub fn export(&self, out: &Path) -> Result<(u64, u64)> {
        let (snapshot, root) = self.sealed_snapshot();
        let cosigned = crate::tlog::read_cosigned_at(&self.dir, snapshot.size)?;
        crate::export::export_frames_to(
            snapshot,
            out,
            crate::export::Target::Replace,
            Some(crate::export::Seal {
                ledger: self.ledger_id,
                key: &self.log_key,
                root,
                cosigned,
            }),
        )
    }

    /// A snapshot up to the latest durable checkpoint, and the Merkle root of its entries.
    pub fn sealed_snapshot(&self) -> (Snapshot, TreeHash) {
        let (cp, root) = self.tree_head();
        let frames = list_segments(&self.dir).map(|segments| LogReader::new(segments, false, None));
        (
            Snapshot {
                size: cp.size,
                frames: Some(frames),
            },
            root,
        )
    }

    /// A snapshot of the ledger in `dir` up to its latest checkpoint and the Merkle root of
    /// its entries (read in place, as [`Ledger::read_checkpoint`]).
    pub fn read_sealed_snapshot(dir: &Path) -> Result<(Snapshot, TreeHash)> {
        let (cp, root) = crate::prove::read_tree_head(dir)?;
        Ok((
            Snapshot {
                size: cp.size,
                frames: Some(list_segments(dir).map(|s| LogReader::new(s, false, None))),
            },
            root,
        ))
    }
}

/// The log key of the ledger in `dir`: read, or made for a ledger written before log keys
/// (then `ledger.pub` is rewritten as version 2, naming it; its epoch 0 key is unchanged).
fn open_log_key(dir: &Path, pub_path: &Path, public: &LedgerPublic) -> Result<LogKey> {
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

/// Frames of a ledger up to a checkpoint, read while the ledger keeps appending.
pub struct Snapshot {
    size: u64,
    /// The log reader, or why the log could not be listed (yielded once).
    frames: Option<Result<LogReader>>,
}

impl Snapshot {
    /// Entries in the snapshot.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Iterator for Snapshot {
    type Item = Result<Frame>;

    fn next(&mut self) -> Option<Result<Frame>> {
        loop {
            let reader = match self.frames.as_mut()? {
                Ok(r) => r,
                Err(_) => {
                    return match self.frames.take() {
                        Some(Err(e)) => Some(Err(e)),
                        _ => None,
                    }
                }
            };
            let frame = match reader.next()? {
                Ok(Item::Frame(f)) => f,
                Ok(_) => continue,
                Err(e) => return Some(Err(e)),
            };
            match &frame {
                // Entries come in seq order: the first beyond the snapshot ends it.
                Frame::Entry(b) => match Header::decode(b) {
                    Ok(h) if h.seq >= self.size => return None,
                    _ => return Some(Ok(frame)),
                },
                Frame::Checkpoint(t) => match Checkpoint::from_text(t) {
                    Ok(c) if c.size > self.size => continue,
                    _ => return Some(Ok(frame)),
                },
                Frame::Cosigned(_) => return Some(Ok(frame)),
            }
        }
    }
}

/// Answer every reply with a refusal: the first with the error itself, the rest with
/// the ledger's poisoned state. Call without holding the queue's lock.
fn refuse(replies: impl Iterator<Item = Reply>, first: Error, why: &str) {
    let mut first = Some(first);
    for reply in replies {
        let e = first
            .take()
            .unwrap_or_else(|| Error::Poisoned(why.to_string()));
        reply.send(Err(e));
    }
}

impl Drop for Ledger {
    /// Let the pipeline threads answer what is queued (appends submitted with
    /// [`Ledger::submit_prepared`] may still be) and exit, so the log's lock is released
    /// when this returns.
    fn drop(&mut self) {
        lock(&self.shared.queue).closing = true;
        self.shared.to_commit.notify_all();
        self.shared.to_sync.notify_all();
        // A reply callback may drop the last handle, on one of the pipeline threads. Then
        // join neither (each may wait for the other to finish the queue): they answer
        // what is queued and exit on their own, and the log's lock goes with them.
        let me = std::thread::current().id();
        if self.threads.iter().any(|t| t.thread().id() == me) {
            return;
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The two roles of the commit pipeline.
#[derive(Clone, Copy)]
enum Role {
    Commit,
    Sync,
}

impl Shared {
    /// Wake the committer thread if it sleeps and may start a group. Call holding the
    /// queue's lock, after changing what it waits for.
    fn wake_committer(&self, queue: &Queue) {
        if queue.commit_idle
            && !queue.committing
            && !queue.flushing
            && !queue.pending.is_empty()
            && queue.applied.is_empty()
        {
            self.to_commit.notify_one();
        }
    }

    /// Wake the syncer thread if it sleeps and has written groups to sync.
    fn wake_syncer(&self, queue: &Queue) {
        if queue.sync_idle && !queue.syncing && !queue.applied.is_empty() {
            self.to_sync.notify_one();
        }
    }

    /// The committer thread: commits queued decisions whenever no one else does.
    fn commit_loop(&self) {
        let mut queue = lock(&self.queue);
        loop {
            // Start a group only once the syncer has taken the one before and sled's flush
            // is over, so the next group gathers everything that arrives meanwhile.
            if queue.committing
                || queue.flushing
                || queue.pending.is_empty()
                || !queue.applied.is_empty()
            {
                if queue.closing && queue.pending.is_empty() {
                    return;
                }
                queue.commit_idle = true;
                queue = self
                    .to_commit
                    .wait(queue)
                    .unwrap_or_else(|e| e.into_inner());
                queue.commit_idle = false;
                continue;
            }
            queue = self.commit_once(queue);
            self.wake_syncer(&queue);
        }
    }

    /// The syncer thread: syncs written groups whenever no one else does.
    fn sync_loop(&self) {
        let mut queue = lock(&self.queue);
        loop {
            if queue.syncing || queue.applied.is_empty() {
                if queue.closing
                    && queue.applied.is_empty()
                    && queue.pending.is_empty()
                    && !queue.committing
                {
                    return;
                }
                queue.sync_idle = true;
                queue = self.to_sync.wait(queue).unwrap_or_else(|e| e.into_inner());
                queue.sync_idle = false;
                continue;
            }
            queue = self.sync_once(queue);
        }
    }

    /// Stage one, on the calling thread: encrypt, chain, sign and write everything
    /// queued as one group, and leave it for the syncer.
    fn commit_once<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.committing = true;
        // Whole appends, oldest first, until the group holds MAX_GROUP decisions.
        // And until its state frame could reach MAX_STATE_LEN (each append's own state
        // is within it: `submit_with_state`).
        let (mut count, mut bytes, mut taken) = (0, STATE_CHECK_LEN, 0);
        let take = queue
            .pending
            .iter()
            .take_while(|p| {
                let more = state_bound(&p.state);
                let room = taken == 0 || (count < MAX_GROUP && bytes + more <= MAX_STATE_LEN);
                count += p.plaintexts.len();
                bytes += more;
                taken += 1;
                room
            })
            .count();
        let group: Vec<Pending> = queue.pending.drain(..take).collect();
        let poisoned = queue.poisoned.clone();
        drop(queue);
        let guard = RoleGuard(self, Role::Commit);
        let outcome = match poisoned {
            Some(why) => Err((Error::Poisoned(why), group)),
            None => lock(&self.writer).apply(&self.log, &self.store, group),
        };
        std::mem::forget(guard);
        let mut queue = lock(&self.queue);
        queue.committing = false;
        // Poisoned while this group was written (the syncer failed or died): no one may
        // sync it now, so it is refused, never left waiting.
        let outcome = match (outcome, queue.poisoned.clone()) {
            (Ok(applied), Some(why)) => {
                let replies: Vec<Reply> = applied
                    .replies
                    .into_iter()
                    .map(|(reply, _)| reply)
                    .collect();
                Err((Error::Poisoned(why), replies))
            }
            (Ok(applied), None) => Ok(applied),
            (Err((e, group)), _) => Err((e, group.into_iter().map(|p| p.reply).collect())),
        };
        match outcome {
            Ok(applied) => queue.applied.push(applied),
            Err((e, replies)) => {
                let why = queue.poisoned.get_or_insert_with(|| e.to_string()).clone();
                drop(queue);
                refuse(replies.into_iter(), e, &why);
                queue = lock(&self.queue);
                self.wake_committer(&queue);
            }
        }
        queue
    }

    /// Stage two, on the calling thread: flush and fsync everything written so far,
    /// then acknowledge it.
    fn sync_once<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.syncing = true;
        queue.flushing = true;
        let groups = std::mem::take(&mut queue.applied);
        let poisoned = queue.poisoned.clone();
        drop(queue);
        let guard = RoleGuard(self, Role::Sync);
        let flushed = match poisoned {
            Some(why) => Err(Error::Poisoned(why)),
            None => Ok(()),
        };
        {
            // The committer may start the next group now, while the fsync runs.
            let mut queue = lock(&self.queue);
            queue.flushing = false;
            self.wake_committer(&queue);
        }
        let began = std::time::Instant::now();
        let synced = flushed.and_then(|()| self.log.sync());
        if let Some(tell) = self.on_sync.get() {
            tell(began.elapsed());
        }
        // The replies go out without the queue's lock (they may read the ledger), but
        // still holding the sync role, so the next sync's replies cannot overtake them.
        let mut queue = lock(&self.queue);
        match synced {
            Ok(()) => {
                if let Some(last) = groups.last() {
                    if last.checkpoint.size > queue.durable.size {
                        queue.durable = last.checkpoint.clone();
                        queue.durable_root = last.root;
                    }
                }
                drop(queue);
                for group in groups {
                    for (reply, receipts) in group.replies {
                        reply.send(Ok(receipts));
                    }
                }
            }
            Err(e) => {
                let why = queue.poisoned.get_or_insert_with(|| e.to_string()).clone();
                drop(queue);
                let replies = groups
                    .into_iter()
                    .flat_map(|g| g.replies.into_iter().map(|(reply, _)| reply));
                refuse(replies, e, &why);
            }
        }
        std::mem::forget(guard);
        let mut queue = lock(&self.queue);
        queue.syncing = false;
        self.wake_syncer(&queue);
        queue
    }
}

/// Held while a pipeline role runs without the queue's lock; forgotten when the role
/// ends normally. If its thread panics instead, the ledger is poisoned, the role freed
/// and every queued or written group dropped, so their appenders get an error rather
/// than waiting forever, and later appends are refused.
struct RoleGuard<'a>(&'a Shared, Role);

impl Drop for RoleGuard<'_> {
    fn drop(&mut self) {
        let mut queue = lock(&self.0.queue);
        queue
            .poisoned
            .get_or_insert_with(|| "a commit thread panicked".into());
        match self.1 {
            Role::Commit => queue.committing = false,
            Role::Sync => {
                queue.syncing = false;
                queue.flushing = false;
            }
        }
        let pending = std::mem::take(&mut queue.pending);
        let applied = std::mem::take(&mut queue.applied);
        drop(queue);
        // Their replies answer with an error as they drop, outside the lock.
        drop((pending, applied));
        self.0.to_commit.notify_all();
        self.0.to_sync.notify_all();
    }
}

impl Writer {
    /// Write one group to the log (not yet durable). On failure the group comes back
    /// with the error, to be refused.
    fn apply(
        &mut self,
        log: &LogWriter,
        store: &Store,
        group: Vec<Pending>,
    ) -> std::result::Result<Applied, (Error, Vec<Pending>)> {
        match self.write_group(log, store, &group) {
            Ok((mut receipts, checkpoint, root)) => {
                let mut replies = Vec::with_capacity(group.len());
                for p in group.into_iter().rev() {
                    let mine = receipts.split_off(receipts.len() - p.plaintexts.len());
                    replies.push((p.reply, mine));
                }
                // In submission order, so receipts are delivered in seq order.
                replies.reverse();
                Ok(Applied {
                    replies,
                    checkpoint,
                    root,
                })
            }
            Err(e) => Err((e, group)),
        }
    }

    fn write_group(
        &mut self,
        log: &LogWriter,
        store: &Store,
        group: &[Pending],
    ) -> Result<(Vec<Receipt>, Checkpoint, TreeHash)> {
        let wall = now_ms().max(self.last_wall);
        let count: usize = group.iter().map(|p| p.plaintexts.len()).sum();
        let (first_seq, prev_hash) = (self.next_seq, self.head);
        let mut frames: Vec<u8> = Vec::with_capacity(count * 400 + 512);
        let due = self.next_seq - self.epoch_from_seq >= self.rotation.records
            || wall.saturating_sub(self.epoch_since_ms) >= self.rotation.ms;
        let rotated = group.iter().any(|p| p.rotate) || due;
        if rotated {
            let (_, bytes) = self.rotate(wall)?;
            self.tree.push(leaf_hash(&bytes));
            push_frame(&mut frames, TAG_ENTRY, &bytes);
        }
        let mut receipts = Vec::with_capacity(count);
        // The last seq of each run this group links, recorded with the group's state.
        let mut group_links: std::collections::HashMap<Vec<u8>, u64> = Default::default();
        let mut linked = std::mem::take(&mut self.linked);
        for plaintext in group.iter().flat_map(|p| &p.plaintexts) {
            let seq = self.next_seq;
            let mut nonce = [0u8; 24];
            nonce[..16].copy_from_slice(&self.nonce_prefix);
            nonce[16..].copy_from_slice(&seq.to_be_bytes());
            linked.clear();
            linked.extend_from_slice(plaintext);
            self.links.link(store, &mut linked, seq, &mut group_links)?;
            let bytes = self.cipher.decision_entry(
                self.ledger_id,
                seq,
                self.secrets.epoch,
                wall,
                self.head,
                nonce,
                &linked,
            );
            self.tree.push(leaf_hash(&bytes));
            self.head = entry_hash(&bytes);
            self.next_seq += 1;
            receipts.push(Receipt {
                seq,
                hash: self.head,
            });
            push_frame(&mut frames, TAG_ENTRY, &bytes);
        }
        let checkpoint =
            self.secrets
                .sign_checkpoint(self.ledger_id, self.next_seq, self.head, wall);
        self.linked = linked;
        let links = RunLinks::pairs(&group_links);
        // The group's last value of each key, in one state frame before the checkpoint.
        let mut changed: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
        for (k, v) in group.iter().flat_map(|p| &p.state) {
            changed.insert(k.as_slice(), v.as_slice());
        }
        for (k, v) in &links {
            changed.insert(k.as_slice(), v.as_slice());
        }
        if !changed.is_empty() {
            let pairs: Vec<(&[u8], &[u8])> = changed.iter().map(|(k, v)| (*k, *v)).collect();
            let payload = segment::StateFrame::encode(&pairs, |k| self.bases.get(k));
            push_frame(&mut frames, TAG_STATE_DELTA, &payload);
        }
        let root = self.tree.frontier().root();
        push_frame(
            &mut frames,
            segment::TAG_TREE,
            &segment::encode_tree(self.next_seq, &root),
        );
        push_frame(&mut frames, TAG_CHECKPOINT, checkpoint.to_text().as_bytes());
        let placed = log.append(&frames, first_seq, prev_hash)?;
        // The tree files are derived (checked against the tree frame on open), never synced.
        self.tree.flush()?;
        // Only once the frame is in the log is its value the next delta's base (a failed
        // write poisons the ledger: nothing follows it from this process).
        for (k, v) in &changed {
            self.bases.put(k, v);
        }
        let point = match self.last_point {
            Some((seg, off)) if seg == placed.segment && placed.offset - off < POINT_EVERY => None,
            _ => Some(Point {
                seq: first_seq,
                segment: placed.segment,
                offset: placed.offset,
            }),
        };
        if let Some(p) = point {
            self.last_point = Some((p.segment, p.offset));
        }
        store.apply_group(changed, point, (placed.segment, placed.end))?;
        self.last_wall = wall;
        if rotated {
            // The old key file may be replaced only once the certificate is durable.
            log.sync()?;
            let key_path = self.dir.join(files::WRITER_KEY);
            fs::rename(self.dir.join(files::WRITER_KEY_NEXT), &key_path)
                .map_err(|e| Error::io(&key_path, e))?;
            keys::sync_parent(&key_path)?;
        }
        Ok((receipts, checkpoint, root))
    }

    /// Start the next epoch: certify its keys with the current key, persist them as
    /// `writer.key.next`, and switch. The old secrets are dropped (zeroized) here; the old
    /// key file is replaced once the certificate is durable.
    fn rotate(&mut self, wall: u64) -> Result<(u64, Vec<u8>)> {
        let epoch = self.secrets.epoch + 1;
        let seq = self.next_seq;
        let (mut next, ephemeral) = EpochSecrets::generate(epoch, &self.recipient, self.ledger_id)?;
        next.from_seq = seq;
        next.since_ms = wall;
        let bytes =
            self.secrets
                .certify_epoch(&next, &ephemeral, self.ledger_id, seq, wall, self.head);
        let next_path = self.dir.join(files::WRITER_KEY_NEXT);
        let _ = fs::remove_file(&next_path);
        next.write(&next_path, self.ledger_id)?;
        self.cipher = keys::data_key(&next.data);
        self.epoch_from_seq = seq;
        self.epoch_since_ms = wall;
        self.secrets = next;
        self.head = entry_hash(&bytes);
        self.next_seq += 1;
        Ok((seq, bytes))
    }
}
