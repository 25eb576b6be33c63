//! The embedded store: one sled tree holding entries and checkpoints.
//!
//! Keys: `e` + seq of its first entry (u64 big-endian) -> a chunk of up to
//! [`CHUNK_ENTRIES`] consecutive entries (closed early at [`CHUNK_BYTES`]), each as `len (u32 BE) | entry bytes`;
//! `c` + size (u64 big-endian) -> checkpoint text; `s` + key -> derived state (the gate's
//! counters), and `d` + n -> a chunk of derived state written in the batch of the
//! decisions it follows from, until folded into `s` keys (see `Deltas`); never verified. Chunking keeps sled's per-key cost
//! per chunk, not per decision. A commit group is one `apply_batch` (atomic in sled),
//! so entries and the checkpoint that seals them land together or not at all.
//!
//! Durability: sled 0.34's `flush()` ends in `sync_file_range`, which neither flushes the
//! drive's cache nor the file's metadata (sled issue #1452). After every flush we
//! `fsync` the log file (`db`) ourselves; only then is a commit acknowledged.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::format::Frame;

/// Most entries stored under one sled key.
pub const CHUNK_ENTRIES: usize = 16;
/// A chunk closes once it reaches this many bytes. sled splits a leaf above 16 items and
/// writes any node over 128 KiB to a separate blob file; 16 chunks of at most ~6 KiB keep
/// ordinary leaves inline in its log.
pub const CHUNK_BYTES: usize = 6 * 1024;

const ENTRY_PREFIX: u8 = b'e';
const CHECKPOINT_PREFIX: u8 = b'c';
/// Derived state (the gate's counters), never part of the chain: nothing verifies it.
const STATE_PREFIX: u8 = b's';
/// Derived state written since the last fold, one chunk per batch (see [`Deltas`]).
const DELTA_PREFIX: u8 = b'd';

fn key(prefix: u8, n: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&n.to_be_bytes());
    k
}

fn store_err(e: sled::Error) -> Error {
    Error::Store(e.to_string())
}

/// An open sled store. Holds sled's exclusive lock while open.
pub struct Store {
    db: sled::Db,
    path: PathBuf,
    log: File,
    /// Blob files already fsynced: sled writes large nodes to `blobs/` without syncing
    /// them, so each new one is synced once, at the commit that follows it.
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
    /// Serializes fsyncs, and remembers the first that failed. Linux reports a writeback
    /// error to one fsync only: had two threads fsync the same file, the one that did not
    /// see the error could take data it never wrote for durable. So once any fsync has
    /// failed, every later one fails too.
    fsync_failed: Mutex<Option<String>>,
    /// Derived state changed since the last fold (see [`Deltas`]).
    deltas: Mutex<Deltas>,
}

/// Derived state is written as one delta chunk per batch (`d` + chunk number), in the
/// batch of the decisions it follows from: one sled insert per commit group however many
/// keys changed. Every so often the chunks are folded into one value per key (`s` +
/// key) and removed, in one atomic batch. A reader looks in the unfolded latest values
/// first. After a crash, sled recovers a prefix of the batches; opening reads whatever
/// chunks remain.
#[derive(Default)]
struct Deltas {
    /// The latest value of each key written since the last fold.
    latest: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The chunks that hold them.
    chunks: Vec<u64>,
    /// The next chunk's number.
    next: u64,
}

/// Fold after this many chunks...
const FOLD_CHUNKS: usize = 256;
/// ...or this many distinct keys.
const FOLD_KEYS: usize = 4096;

fn encode_delta<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn decode_delta(n: u64, mut chunk: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let bad = || Error::Store(format!("malformed state delta chunk {n}"));
    let take = |chunk: &mut &[u8]| -> Result<Vec<u8>> {
        let len: [u8; 4] = chunk
            .get(..4)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?;
        let len = u32::from_be_bytes(len) as usize;
        let bytes = chunk.get(4..4 + len).ok_or_else(bad)?.to_vec();
        *chunk = &chunk[4 + len..];
        Ok(bytes)
    };
    let mut out = Vec::new();
    while !chunk.is_empty() {
        let k = take(&mut chunk)?;
        let v = take(&mut chunk)?;
        out.push((k, v));
    }
    Ok(out)
}

impl Store {
    /// Open (or create) the store under `dir/store`.
    pub fn open(dir: &Path) -> Result<Store> {
        let path = dir.join("store");
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput);
        // sled's lock outlives a dropped handle for a moment (its threads let go late), so
        // a reopen in the same process retries briefly before calling the store busy.
        let mut tries = 0;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled 0.34 reports a held lock as `Other("could not acquire lock ...")`.
                Err(sled::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.to_string().contains("could not acquire lock") =>
                {
                    tries += 1;
                    if tries > 100 {
                        return Err(Error::Busy(dir.to_path_buf()));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(store_err(e)),
            }
        };
        let log_path = path.join("db");
        let log = File::open(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let mut deltas = Deltas::default();
        for kv in db.scan_prefix([DELTA_PREFIX]) {
            let (k, v) = kv.map_err(store_err)?;
            let n = decode_key(&k)?;
            for (key, value) in decode_delta(n, &v)? {
                deltas.latest.insert(key, value);
            }
            deltas.chunks.push(n);
            deltas.next = n + 1;
        }
        Ok(Store {
            db,
            path,
            log,
            synced_blobs: Mutex::new(HashSet::new()),
            fsync_failed: Mutex::new(None),
            deltas: Mutex::new(deltas),
        })
    }

    /// Commit consecutive entries (with their seqs) and a checkpoint atomically and durably.
    pub fn commit(
        &self,
        entries: &[(u64, Vec<u8>)],
        checkpoint: Option<(u64, &[u8])>,
    ) -> Result<()> {
        self.apply(entries, checkpoint)?;
        self.sync()
    }

    /// Write consecutive entries (with their seqs) and a checkpoint in one atomic batch,
    /// without waiting for durability: a later [`Store::sync`] makes it durable together
    /// with everything applied before that call. After a crash, sled recovers a prefix of
    /// the batches applied, each whole or not at all.
    pub fn apply(
        &self,
        entries: &[(u64, Vec<u8>)],
        checkpoint: Option<(u64, &[u8])>,
    ) -> Result<()> {
        self.apply_with_state(entries, checkpoint, std::iter::empty())
    }

    /// [`Store::apply`], with derived state values (key, value) in the same atomic
    /// batch, as one delta chunk; later values of one key replace earlier ones.
    pub fn apply_with_state<'a>(
        &self,
        entries: &[(u64, Vec<u8>)],
        checkpoint: Option<(u64, &[u8])>,
        state: impl IntoIterator<Item = &'a (Vec<u8>, Vec<u8>)>,
    ) -> Result<()> {
        let mut batch = sled::Batch::default();
        // The group's last value of each key.
        let mut changed: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
        for (k, v) in state {
            changed.insert(k.as_slice(), v.as_slice());
        }
        // Held across the batch, so chunks are numbered in the order they are applied.
        let mut deltas = self.deltas.lock().unwrap_or_else(|e| e.into_inner());
        let chunk = deltas.next;
        if !changed.is_empty() {
            let value = encode_delta(changed.iter().map(|(k, v)| (*k, *v)));
            batch.insert(&key(DELTA_PREFIX, chunk), value);
        }
        let mut value: Vec<u8> = Vec::new();
        let (mut first, mut count) = (0, 0);
        for (seq, bytes) in entries {
            if count == 0 {
                first = *seq;
            }
            value.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            value.extend_from_slice(bytes);
            count += 1;
            if count == CHUNK_ENTRIES || value.len() >= CHUNK_BYTES {
                batch.insert(&key(ENTRY_PREFIX, first), std::mem::take(&mut value));
                count = 0;
            }
        }
        if count > 0 {
            batch.insert(&key(ENTRY_PREFIX, first), value);
        }
        if let Some((size, text)) = checkpoint {
            batch.insert(&key(CHECKPOINT_PREFIX, size), text);
        }
        self.db.apply_batch(batch).map_err(store_err)?;
        if !changed.is_empty() {
            deltas.chunks.push(chunk);
            deltas.next = chunk + 1;
            for (k, v) in changed {
                deltas.latest.insert(k.to_vec(), v.to_vec());
            }
            if deltas.chunks.len() >= FOLD_CHUNKS || deltas.latest.len() >= FOLD_KEYS {
                self.fold(&mut deltas)?;
            }
        }
        Ok(())
    }

    /// Write each key's latest value in its own place and remove the chunks, atomically.
    fn fold(&self, deltas: &mut Deltas) -> Result<()> {
        let mut batch = sled::Batch::default();
        for (k, v) in &deltas.latest {
            let mut key = Vec::with_capacity(k.len() + 1);
            key.push(STATE_PREFIX);
            key.extend_from_slice(k);
            batch.insert(key, v.as_slice());
        }
        for n in &deltas.chunks {
            batch.remove(&key(DELTA_PREFIX, *n));
        }
        self.db.apply_batch(batch).map_err(store_err)?;
        deltas.latest.clear();
        deltas.chunks.clear();
        Ok(())
    }

    /// Flush sled and fsync its log file: after this returns, everything applied before
    /// the call is durable as far as the OS's fsync promises. Safe to call while another
    /// thread applies the next batch.
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.fsync()
    }

    /// The first half of [`Store::sync`]: sled writes out everything applied so far. Not
    /// durable yet. sled holds its own lock meanwhile, so an `apply` waits for it.
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map(|_| ()).map_err(store_err)
    }

    /// The second half of [`Store::sync`]: fsync the log and any new blob files, making
    /// what the last [`Store::flush`] wrote durable. An `apply` may run meanwhile. Once
    /// an fsync has failed, this fails for good (see `fsync_failed`).
    pub fn fsync(&self) -> Result<()> {
        let mut failed = self.fsync_failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &*failed {
            return Err(Error::Store(format!(
                "an earlier fsync failed, so durability is unknown: {why}"
            )));
        }
        let synced = self
            .log
            .sync_all()
            .map_err(|e| Error::io(self.path.join("db"), e))
            .and_then(|()| self.sync_new_blobs());
        if let Err(e) = &synced {
            *failed = Some(e.to_string());
        }
        synced
    }

    /// fsync blob files written since the last sync, then the blobs directory. A blob
    /// that disappeared meanwhile was superseded by sled and is not needed.
    fn sync_new_blobs(&self) -> Result<()> {
        let blobs = self.path.join("blobs");
        let dir = match fs::read_dir(&blobs) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(&blobs, e)),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = false;
        for item in dir {
            let name = item.map_err(|e| Error::io(&blobs, e))?.file_name();
            if synced.contains(&name) {
                continue;
            }
            let p = blobs.join(&name);
            match File::open(&p).and_then(|f| f.sync_all()) {
                Ok(()) => {
                    synced.insert(name);
                    new = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&p, e)),
            }
        }
        if new {
            File::open(&blobs)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::io(&blobs, e))?;
            // Forget names sled has since deleted, so the set stays as small as the dir.
            synced.retain(|n| blobs.join(n).exists());
        }
        Ok(())
    }

    /// Every state value whose key (without the store's prefix) starts with `prefix`,
    /// in key order.
    pub fn state(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut p = vec![STATE_PREFIX];
        p.extend_from_slice(prefix);
        let mut all = BTreeMap::new();
        for kv in self.db.scan_prefix(p) {
            let (k, v) = kv.map_err(store_err)?;
            all.insert(k[1..].to_vec(), v.to_vec());
        }
        let deltas = self.deltas.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in deltas.latest.range(prefix.to_vec()..) {
            if !k.starts_with(prefix) {
                break;
            }
            all.insert(k.clone(), v.clone());
        }
        Ok(all.into_iter().collect())
    }

    /// The state value under exactly `key` (without the store's prefix).
    pub fn state_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self
            .deltas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .latest
            .get(key)
        {
            return Ok(Some(v.clone()));
        }
        let mut k = vec![STATE_PREFIX];
        k.extend_from_slice(key);
        Ok(self.db.get(k).map_err(store_err)?.map(|v| v.to_vec()))
    }

    /// The entry at `seq`.
    pub fn entry(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        let Some(kv) = self
            .db
            .range(key(ENTRY_PREFIX, 0)..=key(ENTRY_PREFIX, seq))
            .next_back()
        else {
            return Ok(None);
        };
        let (k, v) = kv.map_err(store_err)?;
        let first = decode_key(&k)?;
        let mut entries = split_chunk(first, &v)?;
        let index = (seq - first) as usize;
        Ok((index < entries.len()).then(|| entries.swap_remove(index)))
    }

    /// The last entry: (seq, bytes).
    pub fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>> {
        match self.last(ENTRY_PREFIX)? {
            None => Ok(None),
            Some((first, chunk)) => {
                let mut entries = split_chunk(first, &chunk)?;
                let n = entries.len() as u64;
                Ok(entries.pop().map(|e| (first + n - 1, e)))
            }
        }
    }

    /// The last checkpoint: (size, text).
    pub fn last_checkpoint(&self) -> Result<Option<(u64, Vec<u8>)>> {
        self.last(CHECKPOINT_PREFIX)
    }

    fn last(&self, prefix: u8) -> Result<Option<(u64, Vec<u8>)>> {
        match self.db.scan_prefix([prefix]).next_back() {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv.map_err(store_err)?;
                Ok(Some((decode_key(&k)?, v.to_vec())))
            }
        }
    }

    /// Every entry and checkpoint in order (see [`Frame`]). A checkpoint comes right after
    /// the entry it seals; one whose size is beyond the last entry comes at the end.
    pub fn frames(&self) -> Frames {
        Frames {
            entries: self.db.scan_prefix([ENTRY_PREFIX]),
            checkpoints: self.db.scan_prefix([CHECKPOINT_PREFIX]),
            chunk: VecDeque::new(),
            next_entry: None,
            next_checkpoint: None,
            failed: false,
        }
    }
}

/// Split a stored chunk into its entries; a malformed chunk is a store error naming its seq.
fn split_chunk(first: u64, mut chunk: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !chunk.is_empty() {
        let bad = || Error::Store(format!("malformed chunk of entries from seq {first}"));
        let len_bytes: [u8; 4] = chunk
            .get(..4)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?;
        let len = u32::from_be_bytes(len_bytes) as usize;
        let entry = chunk.get(4..4 + len).ok_or_else(bad)?;
        out.push(entry.to_vec());
        chunk = &chunk[4 + len..];
    }
    if out.is_empty() || out.len() > CHUNK_ENTRIES {
        return Err(Error::Store(format!(
            "chunk from seq {first} holds {} entries",
            out.len()
        )));
    }
    Ok(out)
}

fn decode_key(k: &[u8]) -> Result<u64> {
    if k.len() != 9 {
        return Err(Error::Store(format!(
            "malformed store key of {} bytes",
            k.len()
        )));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&k[1..]);
    Ok(u64::from_be_bytes(n))
}

/// Iterator over a store's content in frame order.
pub struct Frames {
    entries: sled::Iter,
    checkpoints: sled::Iter,
    chunk: VecDeque<(u64, Vec<u8>)>,
    next_entry: Option<(u64, Vec<u8>)>,
    next_checkpoint: Option<(u64, Vec<u8>)>,
    failed: bool,
}

impl Frames {
    fn pull_entry(&mut self) -> Result<()> {
        if self.next_entry.is_none() {
            if self.chunk.is_empty() {
                if let Some(kv) = self.entries.next() {
                    let (k, v) = kv.map_err(store_err)?;
                    let first = decode_key(&k)?;
                    self.chunk = (first..).zip(split_chunk(first, &v)?).collect();
                }
            }
            self.next_entry = self.chunk.pop_front();
        }
        Ok(())
    }

    fn pull_checkpoint(&mut self) -> Result<()> {
        if self.next_checkpoint.is_none() {
            if let Some(kv) = self.checkpoints.next() {
                let (k, v) = kv.map_err(store_err)?;
                self.next_checkpoint = Some((decode_key(&k)?, v.to_vec()));
            }
        }
        Ok(())
    }
}

impl Iterator for Frames {
    type Item = Result<Frame>;

    fn next(&mut self) -> Option<Result<Frame>> {
        if self.failed {
            return None;
        }
        let pulled = self.pull_entry().and_then(|_| self.pull_checkpoint());
        if let Err(e) = pulled {
            self.failed = true;
            return Some(Err(e));
        }
        // A checkpoint of size s goes after entry s-1, i.e. before any entry with seq >= s.
        let take_checkpoint = match (&self.next_entry, &self.next_checkpoint) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some((seq, _)), Some((size, _))) => size <= seq,
        };
        if take_checkpoint {
            self.next_checkpoint
                .take()
                .map(|(_, v)| Ok(Frame::Checkpoint(v)))
        } else {
            self.next_entry.take().map(|(_, v)| Ok(Frame::Entry(v)))
        }
    }
}

/// Open a copy of the store in `dir` for reading. sled has no read-only mode and writes on
/// open, so the auditor's copy is never opened itself: its `store/` is copied into
/// `scratch` (which must be empty) and that copy is opened.
pub fn open_copy(dir: &Path, scratch: &Path) -> Result<Store> {
    let src = dir.join("store");
    let db = src.join("db");
    if !db.is_file() {
        return Err(Error::NotALedger(dir.to_path_buf()));
    }
    // sled holds an exclusive flock on `db` while a writer has the store open. A shared
    // lock here refuses a live store (its copy could be torn) and keeps a writer from
    // opening it while we copy.
    let guard = File::open(&db).map_err(|e| Error::io(&db, e))?;
    match guard.try_lock_shared() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Busy(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&db, e)),
    }
    copy_dir(&src, &scratch.join("store"))?;
    drop(guard);
    Store::open(scratch)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| Error::io(to, e))?;
    for item in fs::read_dir(from).map_err(|e| Error::io(from, e))? {
        let item = item.map_err(|e| Error::io(from, e))?;
        let (src, dst) = (item.path(), to.join(item.file_name()));
        let ty = item.file_type().map_err(|e| Error::io(&src, e))?;
        if ty.is_dir() {
            copy_dir(&src, &dst)?;
        } else if ty.is_file() {
            fs::copy(&src, &dst).map_err(|e| Error::io(&src, e))?;
        }
    }
    Ok(())
}
