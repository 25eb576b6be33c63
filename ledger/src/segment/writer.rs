//! Writing the log: commit groups appended to the active segment, one write and one
//! `fdatasync` each, and a new segment once one is full.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::format::{Hash, LedgerId};

use super::{segment_name, sync_dir, SegmentHeader, LOG_DIR, SEGMENT_HEADER_LEN};

/// The writing end of the log: appends commit groups to the active segment, one write
/// each, and makes them durable with `fdatasync`. Holds an exclusive lock on `DIR/log`
/// (an advisory `flock` on the directory: no file is written for it).
pub struct LogWriter {
    log_dir: PathBuf,
    ledger_id: LedgerId,
    segment_bytes: u64,
    active: Mutex<Active>,
    /// Serializes syncs and remembers the first that failed: Linux reports a writeback
    /// error to one fsync only, so once any has failed every later one fails too.
    sync_failed: Mutex<Option<String>>,
    _lock: File,
}

pub(super) struct Active {
    /// The segment being appended to; `None` until the next write creates one.
    file: Option<Arc<File>>,
    number: u64,
    len: u64,
    /// Closed segments not yet fdatasynced.
    unsynced: Vec<Arc<File>>,
    /// A segment was created since the last sync: the directory needs an fsync.
    dir_dirty: bool,
    /// A write failed: what was written of it is unknown, so nothing more is.
    failed: Option<String>,
}

/// Where a group landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The segment.
    pub segment: u64,
    /// Offset of the group's first frame.
    pub offset: u64,
    /// Offset just past its last frame.
    pub end: u64,
}

/// Where the writer resumes.
pub(crate) enum Resume {
    /// Keep appending to this segment, whose length is `len`.
    Continue { number: u64, len: u64 },
    /// Start a new segment with this number at the next write.
    NewSegment { number: u64 },
}

impl LogWriter {
    /// Lock the log of the ledger in `dir` for writing ([`Error::Busy`] if held).
    ///
    /// A reader asking [`writer_active`] holds a shared lock for an instant; the writer
    /// retries for up to 200 ms before calling the ledger busy, so a `tally verify DIR`
    /// never makes `tally serve` fail to start.
    pub(crate) fn lock(dir: &Path) -> Result<File> {
        let log = dir.join(LOG_DIR);
        let f = File::open(&log).map_err(|e| Error::io(&log, e))?;
        for _ in 0..20 {
            match f.try_lock() {
                Ok(()) => return Ok(f),
                Err(fs::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(fs::TryLockError::Error(e)) => return Err(Error::io(&log, e)),
            }
        }
        Err(Error::Busy(dir.to_path_buf()))
    }

    pub(crate) fn new(
        dir: &Path,
        lock: File,
        ledger_id: LedgerId,
        segment_bytes: u64,
        resume: Resume,
    ) -> Result<LogWriter> {
        let log_dir = dir.join(LOG_DIR);
        let active = match resume {
            Resume::Continue { number, len } => {
                let path = log_dir.join(segment_name(number));
                let file = OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, e))?;
                Active {
                    file: Some(Arc::new(file)),
                    number,
                    len,
                    unsynced: Vec::new(),
                    dir_dirty: false,
                    failed: None,
                }
            }
            Resume::NewSegment { number } => Active {
                file: None,
                number,
                len: 0,
                unsynced: Vec::new(),
                dir_dirty: false,
                failed: None,
            },
        };
        Ok(LogWriter {
            log_dir,
            ledger_id,
            segment_bytes: segment_bytes.max(SEGMENT_HEADER_LEN as u64 + 1),
            active: Mutex::new(active),
            sync_failed: Mutex::new(None),
            _lock: lock,
        })
    }

    /// Append one commit group's frames in one write: to the active segment, or to a new
    /// one (header first, in the same write) when none is open or this group would take
    /// the active one past its size. `first_seq` and `prev_hash` are the group's start
    /// in the chain (a new segment's header records them). Not durable until
    /// [`LogWriter::sync`].
    pub fn append(&self, frames: &[u8], first_seq: u64, prev_hash: Hash) -> Result<Placed> {
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &a.failed {
            return Err(Error::Poisoned(why.clone()));
        }
        if a.file.is_some() && a.len + frames.len() as u64 > self.segment_bytes {
            if let Some(f) = a.file.take() {
                a.unsynced.push(f);
            }
            a.number += 1;
        }
        let mut buf;
        let data: &[u8] = if a.file.is_none() {
            let path = self.log_dir.join(segment_name(a.number));
            let file = OpenOptions::new()
                .append(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            a.file = Some(Arc::new(file));
            a.len = 0;
            a.dir_dirty = true;
            let header = SegmentHeader {
                ledger_id: self.ledger_id,
                number: a.number,
                first_seq,
                prev_hash,
            };
            buf = Vec::with_capacity(SEGMENT_HEADER_LEN + frames.len());
            buf.extend_from_slice(&header.encode());
            buf.extend_from_slice(frames);
            &buf
        } else {
            frames
        };
        let offset = a.len + (data.len() - frames.len()) as u64;
        let file = a.file.clone();
        let written = match &file {
            Some(f) => (&**f).write_all(data),
            None => Ok(()),
        };
        if let Err(e) = written {
            let path = self.log_dir.join(segment_name(a.number));
            let why = format!("{}: {e}", path.display());
            a.failed = Some(why);
            return Err(Error::io(path, e));
        }
        a.len += data.len() as u64;
        Ok(Placed {
            segment: a.number,
            offset,
            end: a.len,
        })
    }

    /// Make everything appended before this call durable: `fdatasync` of the segments
    /// written, and the log directory's fsync when a segment was created. Safe to call
    /// while another thread appends.
    pub fn sync(&self) -> Result<()> {
        let mut failed = self.sync_failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &*failed {
            return Err(Error::Poisoned(format!(
                "an earlier fsync failed, so durability is unknown: {why}"
            )));
        }
        let (closed, active, dir_dirty, number) = {
            let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
            (
                std::mem::take(&mut a.unsynced),
                a.file.clone(),
                std::mem::take(&mut a.dir_dirty),
                a.number,
            )
        };
        let path = self.log_dir.join(segment_name(number));
        let synced = closed
            .iter()
            .chain(active.iter())
            .try_for_each(|f| f.sync_data())
            .map_err(|e| Error::io(&path, e))
            .and_then(|()| {
                if dir_dirty {
                    sync_dir(&self.log_dir)
                } else {
                    Ok(())
                }
            });
        if let Err(e) = &synced {
            *failed = Some(e.to_string());
        }
        synced
    }
}
