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
//!
//! Here: the public types and the read side. `open` creates and opens ledgers, `pipeline`
//! runs the two stages, `linger` says when deferred appends may start a group, `writer`
//! writes one group (and rotates epochs), `group` is what a group is made of, `index`
//! rebuilds the sled index from the log, `own` reads the current epoch's decisions back
//! with the writer's key. Among them dependencies point one way: open -> pipeline ->
//! writer -> group, pipeline -> linger, open -> index, own -> pipeline.

mod group;
mod index;
mod linger;
mod open;
mod own;
mod pipeline;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, MAX_DECISION_BYTES};
use crate::error::{DecisionError, Error, Result};
use crate::format::{Checkpoint, Frame, Header, LedgerId};
use crate::segment::{self, list_segments, Item, LogReader, MAX_STATE_LEN};
use crate::tlog::merkle::TreeHash;
use crate::tlog::LogKey;

use self::group::{Pending, Reply};
pub use self::linger::LINGER_MS;
pub use self::own::EpochRead;
pub use self::pipeline::SyncObserver;
use self::pipeline::{lock, Shared};
use self::writer::{state_bound, STATE_CHECK_LEN};

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

pub use tally_record::Receipt;

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
    /// Leaves of the Merkle tree files rebuilt from the entries (the sealed size).
    pub tree_leaves: u64,
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
        self.queue(plaintexts, state, false, done)
    }

    /// [`Ledger::submit_with_state`], *deferred*: queued in the same order as every other
    /// append (whatever is submitted after it is durable only after it), but it starts
    /// no commit group, and so no fsync, of its own: it rides the next group another
    /// append starts, or, if none is submitted within [`LINGER_MS`] (by the ledger's
    /// clock), a group of its own after that. A ledger dropped commits it at once.
    /// `done` is called once it is durable, as for any append; until then a crash
    /// (`kill -9`, power) may lose it, and it is lost only if no append submitted after
    /// it was acknowledged.
    pub fn submit_deferred(
        &self,
        plaintexts: Vec<Vec<u8>>,
        state: Vec<(Vec<u8>, Vec<u8>)>,
        done: impl FnOnce(Result<Vec<Receipt>>) + Send + 'static,
    ) {
        self.queue(plaintexts, state, true, done)
    }

    /// Queue an append for the pipeline threads, `deferred` or not.
    fn queue(
        &self,
        plaintexts: Vec<Vec<u8>>,
        state: Vec<(Vec<u8>, Vec<u8>)>,
        deferred: bool,
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
        let deferred_since = deferred.then(|| shared.clock.now_ms());
        queue.eager += usize::from(!deferred);
        queue.pending.push(Pending {
            plaintexts,
            state,
            rotate: false,
            deferred_since,
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
        queue.eager += 1;
        queue.pending.push(Pending {
            plaintexts,
            state: Vec::new(),
            rotate,
            deferred_since: None,
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

    /// Commits what is queued now, deferred appends too (their linger cut short), and
    /// returns once nothing is queued or in flight: the durable checkpoint then. For a
    /// server that stops: appends that keep arriving keep it waiting.
    pub fn flush(&self) -> Result<Checkpoint> {
        self.shared.flush()
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
    /// the two paths are not ordered with each other. If it fails, the ledger refuses
    /// every append after it (a group already written to the log is still acknowledged
    /// once durable).
    pub fn put_state_durable(&self, state: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        if let Some(why) = &lock(&self.shared.queue).poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        let put = self.shared.store.put_durable(state);
        if let Err(e) = &put {
            // The index is failed for good (or its durability unknown): no group is
            // written after this (the store's module doc), the queued ones are refused.
            let mut queue = lock(&self.shared.queue);
            queue.poisoned.get_or_insert_with(|| e.to_string());
            self.shared.wake_committer(&queue);
            self.shared.synced.notify_all();
        }
        put
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
