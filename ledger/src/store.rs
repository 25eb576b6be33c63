//! The index: a sled tree beside the log, holding only what can be derived again.
//!
//! The record of truth is the log (`crate::segment`); sled keeps what a key-value store
//! is good at, and nothing that verifies reads it:
//!
//! * `s` + key: the gate's derived state, as written by the state frames of the log
//!   (replayed from the log on open, rebuilt by `tally reindex`);
//! * `p` + key: state written outside any commit group ([`Store::put_durable`], an
//!   operator's pause), the one thing here not derived from the log: made durable by
//!   sled itself, and carried over by a reindex;
//! * `o` + seq (u64 BE): a sparse index of the log, `segment (u64 BE) ‖ offset (u64 BE)`
//!   of the frame of entry seq, every [`POINT_EVERY`] bytes of a segment;
//! * `m`: `segment (u64 BE) ‖ offset (u64 BE)`, the log position through which the state
//!   and index points above are applied, written in the same atomic sled batch as them.
//!
//! Commit groups are *folded* before they reach sled: their state values (each key's
//! latest), index points and mark are kept in memory and written to sled in one batch
//! every [`FOLD_GROUPS`] groups (or [`FOLD_BYTES`] of values), so sled rewrites a value
//! once per fold, not once per group, and its log grows with the state rather than with
//! the decisions. Reads see the folded values first. A crash loses at most the fold,
//! which the log replays like any group after the mark.
//!
//! sled is never synced per commit group: its background flush writes it every second,
//! and after a crash the writer replays the log's state frames after `m` (sled recovers a
//! prefix of its batches, each whole or not at all, so `m` never runs ahead of what it
//! holds).
//!
//! Durability of [`Store::put_durable`]: sled 0.34's `flush()` ends in
//! `sync_file_range`, which neither flushes the drive's cache nor the file's metadata
//! (sled's own GitHub issue #1452, upstream), so after its flush we `fsync` sled's log file (`db`) ourselves.
//!
//! A failed write (a full disk): after the first sled write or flush through the store
//! that fails, the store sends sled no other write or flush of its own and answers each
//! with [`Error::Index`] (the check and the write are one step, so none racing the
//! failing one gets through). The commit group whose fold failed is whole in the log, so
//! it is still acknowledged once fsynced; the pipeline refuses every group after it. sled
//! 0.34 can wedge on such a failure: a value too large for its log buffer goes to a
//! `blobs/` file, written while the buffer's writer count is held
//! (`Log::reserve_inner` -> `IoBufs::encapsulate` -> `write_blob`); when that write
//! fails, the count is never given back, so the buffer is never written, and from then
//! on every `flush` waits for it forever (`make_stable_inner`), every write that meets
//! the sealed buffer spins forever (`reserve_inner`), and so does dropping the database
//! (`TreeInner::drop` flushes). Worse, sled's flush waits holding a lock shared by every
//! sled database in the process (`concurrency_control`), and every write takes it
//! exclusively: one wedged flush stops every index in the process. So a failed store is
//! never flushed again, nor dropped: its sled handle is kept until the process exits
//! (with sled's lock on `DIR/index`), and the ledger opens again after a restart.
//!
//! What this does not stop: sled's own threads. Its flusher (`flush_every_ms` below)
//! still flushes the failed database every second for the life of the process, and so
//! may wedge itself and, through that shared lock, every other index in the process;
//! and a write failing inside sled's own work (its segment cleaning rewriting a blob)
//! never reaches the store, so `failed` stays unset and a clean close folds and drops the
//! database as usual, and may hang there. Turning the flusher off would stop the first,
//! but sled's background flush is what bounds the log a restart replays into the index
//! (module doc above), so it stays; a process whose index failed is to be restarted.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The index's directory inside a ledger directory.
pub const INDEX_DIR: &str = "index";
/// An index point is written once a segment has grown this many bytes past the last.
pub const POINT_EVERY: u64 = 64 * 1024;
/// Groups folded in memory before they are written to sled in one batch.
pub const FOLD_GROUPS: usize = 256;
/// Bytes of folded state values that make a fold be written before [`FOLD_GROUPS`].
pub const FOLD_BYTES: usize = 8 << 20;

const STATE_PREFIX: u8 = b's';
const PUT_PREFIX: u8 = b'p';
const POINT_PREFIX: u8 = b'o';
const MARK_KEY: &[u8] = b"m";

fn key(prefix: u8, n: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&n.to_be_bytes());
    k
}

fn two_u64(a: u64, b: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&a.to_be_bytes());
    v[8..].copy_from_slice(&b.to_be_bytes());
    v
}

fn decode_two(v: &[u8], what: &str) -> Result<(u64, u64)> {
    if v.len() != 16 {
        return Err(Error::Store(format!(
            "malformed {what} of {} bytes",
            v.len()
        )));
    }
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&v[..8]);
    b.copy_from_slice(&v[8..]);
    Ok((u64::from_be_bytes(a), u64::from_be_bytes(b)))
}

fn prefixed(prefix: u8, k: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(k.len() + 1);
    key.push(prefix);
    key.extend_from_slice(k);
    key
}

fn store_err(e: sled::Error) -> Error {
    Error::Store(e.to_string())
}

/// Write what is folded, so a clean close leaves nothing for the next open to replay, and
/// let sled go; an index that failed a write is neither written nor flushed nor dropped
/// (module doc: sled may be wedged, and its drop would flush).
fn close(store: &mut Store) {
    if store.failed().is_none() {
        // An error here only leaves more of the log to replay.
        let _ = store.fold();
    }
    if store.failed().is_some() {
        if let Some(db) = store.db.0.take() {
            std::mem::forget(db);
        }
    }
}

/// The sled handle, taken out only when a failed store is closed (`close`).
struct Db(Option<sled::Db>);

impl std::ops::Deref for Db {
    type Target = sled::Db;

    fn deref(&self) -> &sled::Db {
        self.0
            .as_ref()
            .expect("the sled handle is only taken by the store's drop")
    }
}

/// An index point: where the frame of entry `seq` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// The entry's seq.
    pub seq: u64,
    /// Its segment.
    pub segment: u64,
    /// The offset of its frame.
    pub offset: u64,
}

/// Groups applied but not yet written to sled.
#[derive(Default)]
struct Fold {
    state: BTreeMap<Vec<u8>, Vec<u8>>,
    points: Vec<Point>,
    mark: Option<(u64, u64)>,
    groups: usize,
    bytes: usize,
}

/// The open index. Holds sled's exclusive lock while open.
pub struct Store {
    db: Db,
    fold: Mutex<Fold>,
    path: PathBuf,
    log: File,
    /// Blob files already fsynced: sled writes large nodes to `blobs/` without syncing
    /// them, so each new one is synced once, at the durable write that follows it.
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
    /// Serializes fsyncs, and remembers the first that failed (see `LogWriter::sync`).
    fsync_failed: Mutex<Option<String>>,
    /// The first sled write or flush that failed: none is sent to sled after it (module
    /// doc).
    failed: Mutex<Option<String>>,
    /// Held across each sled write or flush with the check of `failed` before it (sled
    /// serialises its writes and flushes anyway); `failed` itself is only held briefly,
    /// so reading it never waits for sled.
    gate: Mutex<()>,
}

impl Store {
    /// Open (or create) the index under `DIR/index`.
    pub fn open(dir: &Path) -> Result<Store> {
        Store::open_at(dir, &dir.join(INDEX_DIR))
    }

    /// Open (or create) an index at `path` (for a reindex building a fresh one).
    pub fn open_at(dir: &Path, path: &Path) -> Result<Store> {
        let path = path.to_path_buf();
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(Some(1000))
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
        Ok(Store {
            db: Db(Some(db)),
            fold: Mutex::new(Fold::default()),
            path,
            log,
            synced_blobs: Mutex::new(HashSet::new()),
            fsync_failed: Mutex::new(None),
            failed: Mutex::new(None),
            gate: Mutex::new(()),
        })
    }

    /// What failed, if a sled write or flush has: the store is then failed for good, and
    /// the commit pipeline refuses every group after the one that saw it. Never waits for
    /// sled.
    pub fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Run one sled write or flush, unless one failed before; the first failure is kept,
    /// and every write after it refused without reaching sled. The check and the write
    /// are one step (`gate` held across both), so no write that starts while another is
    /// failing reaches sled after it.
    fn write<T>(&self, what: &str, op: impl FnOnce(&sled::Db) -> sled::Result<T>) -> Result<T> {
        let _gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = self.failed() {
            return Err(Error::Index {
                path: self.path.clone(),
                why: format!("{what} refused: an earlier write failed ({why}); reopen the ledger once that is fixed"),
            });
        }
        op(&self.db).map_err(|e| {
            let why = format!("{what}: {e}");
            let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            failed.get_or_insert_with(|| why.clone());
            Error::Index {
                path: self.path.clone(),
                why,
            }
        })
    }

    /// Apply one commit group's derived state and index point, and move the mark to
    /// `mark` (segment, offset just past the group). Folded in memory (reads see it at
    /// once) and written to sled with the groups around it, in one atomic sled batch
    /// with the mark. Not durable by itself: the log is, and the group is replayed from
    /// it after a crash.
    pub fn apply_group<'a>(
        &self,
        state: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        point: Option<Point>,
        mark: (u64, u64),
    ) -> Result<()> {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in state {
            fold.bytes += k.len() + v.len();
            fold.state.insert(k.to_vec(), v.to_vec());
        }
        fold.points.extend(point);
        fold.mark = Some(mark);
        fold.groups += 1;
        if fold.groups >= FOLD_GROUPS || fold.bytes >= FOLD_BYTES {
            self.write_fold(&mut fold)?;
        }
        Ok(())
    }

    /// Write what is folded to sled now (a reindex finishing, a ledger closing).
    pub fn fold(&self) -> Result<()> {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        self.write_fold(&mut fold)
    }

    fn write_fold(&self, fold: &mut Fold) -> Result<()> {
        let Some(mark) = fold.mark else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        for (k, v) in &fold.state {
            batch.insert(prefixed(STATE_PREFIX, k), v.as_slice());
        }
        for p in &fold.points {
            batch.insert(&key(POINT_PREFIX, p.seq), &two_u64(p.segment, p.offset));
        }
        batch.insert(MARK_KEY, &two_u64(mark.0, mark.1));
        self.write("writing folded state", |db| db.apply_batch(batch))?;
        *fold = Fold::default();
        Ok(())
    }

    /// Set the mark back to `mark`, the log's sealed end, and forget every index point
    /// at or after `next_seq`, durably: for an index ahead of the log (its mark and points
    /// name log bytes a power failure took), before the writer writes where they point.
    /// The state values stay (ahead of the log is safe).
    pub fn remark(&self, mark: (u64, u64), next_seq: u64) -> Result<()> {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        self.write_fold(&mut fold)?;
        let mut batch = sled::Batch::default();
        for kv in self
            .db
            .range(key(POINT_PREFIX, next_seq)..=key(POINT_PREFIX, u64::MAX))
        {
            let (k, _) = kv.map_err(store_err)?;
            batch.remove(k);
        }
        batch.insert(MARK_KEY, &two_u64(mark.0, mark.1));
        self.write("moving the index mark back", |db| db.apply_batch(batch))?;
        drop(fold);
        self.sync()
    }

    /// The log position through which state and index points are applied.
    pub fn mark(&self) -> Result<Option<(u64, u64)>> {
        if let Some(m) = self.fold.lock().unwrap_or_else(|e| e.into_inner()).mark {
            return Ok(Some(m));
        }
        match self.db.get(MARK_KEY).map_err(store_err)? {
            None => Ok(None),
            Some(v) => decode_two(&v, "index mark").map(Some),
        }
    }

    /// Write state values that no decision carries (an operator's pause) and make them
    /// durable before returning: sled's flush, then an fsync of its log.
    pub fn put_durable(&self, state: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for (k, v) in state {
            batch.insert(prefixed(PUT_PREFIX, k), v.as_slice());
        }
        self.write("writing durable state", |db| db.apply_batch(batch))?;
        self.sync()
    }

    /// Every pair written with [`Store::put_durable`], as written (a reindex carries them
    /// into the new index).
    pub fn put_pairs(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.db
            .scan_prefix([PUT_PREFIX])
            .map(|kv| {
                let (k, v) = kv.map_err(store_err)?;
                Ok((k[1..].to_vec(), v.to_vec()))
            })
            .collect()
    }

    /// The last index point at or before `seq`.
    pub fn point(&self, seq: u64) -> Result<Option<Point>> {
        let folded = self
            .fold
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .points
            .iter()
            .rev()
            .find(|p| p.seq <= seq)
            .copied();
        if folded.is_some() {
            return Ok(folded);
        }
        let Some(kv) = self
            .db
            .range(key(POINT_PREFIX, 0)..=key(POINT_PREFIX, seq))
            .next_back()
        else {
            return Ok(None);
        };
        let (k, v) = kv.map_err(store_err)?;
        let mut n = [0u8; 8];
        n.copy_from_slice(
            k.get(1..9)
                .ok_or_else(|| Error::Store("malformed index key".into()))?,
        );
        let (segment, offset) = decode_two(&v, "index point")?;
        Ok(Some(Point {
            seq: u64::from_be_bytes(n),
            segment,
            offset,
        }))
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
        self.write("flushing", |db| db.flush()).map(|_| ())
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
    /// in key order: derived state and state written with [`Store::put_durable`] (the
    /// two never share a key).
    pub fn state(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut all = BTreeMap::new();
        // Held across the scan of sled: a fold written between that scan and the read of
        // the fold would otherwise leave its values in neither (an older value returned).
        let fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        for p in [PUT_PREFIX, STATE_PREFIX] {
            for kv in self.db.scan_prefix(prefixed(p, prefix)) {
                let (k, v) = kv.map_err(store_err)?;
                all.insert(k[1..].to_vec(), v.to_vec());
            }
        }
        for (k, v) in fold.state.range(prefix.to_vec()..) {
            if !k.starts_with(prefix) {
                break;
            }
            all.insert(k.clone(), v.clone());
        }
        Ok(all.into_iter().collect())
    }

    /// The derived state value under exactly `key` (without the store's prefix), as the
    /// log's state frames applied so far left it: the base of the key's next delta.
    pub fn derived_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self
            .fold
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state
            .get(key)
        {
            return Ok(Some(v.clone()));
        }
        Ok(self
            .db
            .get(prefixed(STATE_PREFIX, key))
            .map_err(store_err)?
            .map(|v| v.to_vec()))
    }

    /// The state value under exactly `key` (without the store's prefix).
    pub fn state_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.derived_get(key)? {
            return Ok(Some(v));
        }
        Ok(self
            .db
            .get(prefixed(PUT_PREFIX, key))
            .map_err(store_err)?
            .map(|v| v.to_vec()))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        close(self);
    }
}

/// Remove an index directory (a reindex replacing it).
pub fn remove_index(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}
