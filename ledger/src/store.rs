//! The embedded store: one sled tree holding entries and checkpoints.
//!
//! Keys: `e` + seq (u64 big-endian) -> entry bytes; `c` + size (u64 big-endian) ->
//! checkpoint text. A commit group is one `apply_batch` (atomic in sled), so entries and
//! the checkpoint that seals them land together or not at all.
//!
//! Durability: sled 0.34's `flush()` ends in `sync_file_range`, which neither flushes the
//! drive's cache nor the file's metadata (sled issue #1452). After every flush we
//! `fsync` the log file (`db`) ourselves; only then is a commit acknowledged.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::Frame;

const ENTRY_PREFIX: u8 = b'e';
const CHECKPOINT_PREFIX: u8 = b'c';

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
}

impl Store {
    /// Open (or create) the store under `dir/store`.
    pub fn open(dir: &Path) -> Result<Store> {
        let path = dir.join("store");
        let db = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(store_err)?;
        let log_path = path.join("db");
        let log = File::open(&log_path).map_err(|e| Error::io(&log_path, e))?;
        Ok(Store { db, path, log })
    }

    /// Commit entries (with their seqs) and a checkpoint atomically and durably.
    pub fn commit(&self, entries: &[(u64, Vec<u8>)], checkpoint: Option<(u64, &[u8])>) -> Result<()> {
        let mut batch = sled::Batch::default();
        for (seq, bytes) in entries {
            batch.insert(&key(ENTRY_PREFIX, *seq), bytes.as_slice());
        }
        if let Some((size, text)) = checkpoint {
            batch.insert(&key(CHECKPOINT_PREFIX, size), text);
        }
        self.db.apply_batch(batch).map_err(store_err)?;
        self.sync()
    }

    /// Flush sled and fsync its log file: after this returns, everything applied is
    /// durable as far as the OS's fsync promises.
    pub fn sync(&self) -> Result<()> {
        self.db.flush().map_err(store_err)?;
        self.log
            .sync_all()
            .map_err(|e| Error::io(self.path.join("db"), e))?;
        let blobs = self.path.join("blobs");
        if blobs.is_dir() {
            for f in fs::read_dir(&blobs).map_err(|e| Error::io(&blobs, e))? {
                let p = f.map_err(|e| Error::io(&blobs, e))?.path();
                File::open(&p)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| Error::io(&p, e))?;
            }
        }
        Ok(())
    }

    /// The entry at `seq`.
    pub fn entry(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        Ok(self
            .db
            .get(key(ENTRY_PREFIX, seq))
            .map_err(store_err)?
            .map(|v| v.to_vec()))
    }

    /// The last entry: (seq, bytes).
    pub fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>> {
        self.last(ENTRY_PREFIX)
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
            next_entry: None,
            next_checkpoint: None,
            failed: false,
        }
    }
}

fn decode_key(k: &[u8]) -> Result<u64> {
    if k.len() != 9 {
        return Err(Error::Store(format!("malformed store key of {} bytes", k.len())));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&k[1..]);
    Ok(u64::from_be_bytes(n))
}

/// Iterator over a store's content in frame order.
pub struct Frames {
    entries: sled::Iter,
    checkpoints: sled::Iter,
    next_entry: Option<(u64, Vec<u8>)>,
    next_checkpoint: Option<(u64, Vec<u8>)>,
    failed: bool,
}

impl Frames {
    fn pull(it: &mut sled::Iter, slot: &mut Option<(u64, Vec<u8>)>) -> Result<()> {
        if slot.is_none() {
            if let Some(kv) = it.next() {
                let (k, v) = kv.map_err(store_err)?;
                *slot = Some((decode_key(&k)?, v.to_vec()));
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
        let pulled = Frames::pull(&mut self.entries, &mut self.next_entry)
            .and_then(|_| Frames::pull(&mut self.checkpoints, &mut self.next_checkpoint));
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
    if !src.join("db").is_file() {
        return Err(Error::NotALedger(dir.to_path_buf()));
    }
    copy_dir(&src, &scratch.join("store"))?;
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
