//! Reading the log: segment after segment, each up to its last complete checkpoint.

use std::fs::{self, File};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{Frame, LedgerId};

use super::{
    decode_tree, list_segments, scan, Scan, StateFrame, Torn, FRAME_PREFIX_LEN, LOG_DIR,
    SEGMENT_HEADER_LEN, TAG_CHECKPOINT, TAG_ENTRY, TAG_TREE,
};

/// What a [`LogReader`] yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// An entry or checkpoint, in log order.
    Frame(Frame),
    /// A state frame, with the segment and the offset just past the frame.
    State {
        /// The frame (resolve its deltas in log order).
        frame: StateFrame,
        /// The segment holding the frame.
        segment: u64,
        /// The offset just after the frame.
        end: u64,
    },
    /// A segment's unsealed remainder (after its sealed frames).
    Torn(Torn),
    /// A tree frame: the Merkle tree's size and root the writer recorded (never trusted).
    Tree {
        /// The tree's size.
        size: u64,
        /// Its root.
        root: [u8; 32],
    },
}

/// Streams a ledger's log, segment after segment, each up to its last complete
/// checkpoint (as it was when the reader reached that segment). Opens files read-only
/// and writes nothing. Memory is one read buffer and one frame.
pub struct LogReader {
    segments: Vec<(u64, PathBuf)>,
    next: usize,
    current: Option<Current>,
    ledger_id: Option<LedgerId>,
    /// Report the last segment's unsealed bytes (no live writer is appending to it).
    report_last_tail: bool,
    /// Start at this segment and offset (a writer catching up its index).
    start: Option<(u64, u64)>,
    /// The text of the last checkpoint read: the next segment's header must start where
    /// it ends.
    last_checkpoint: Option<Vec<u8>>,
    failed: bool,
}

pub(super) struct Current {
    number: u64,
    path: PathBuf,
    reader: BufReader<File>,
    pos: u64,
    scan: Scan,
    last: bool,
}

/// Whether a writer holds the ledger in `dir` right now (its lock on `DIR/log`). Takes
/// and drops a shared lock, which changes no byte.
pub fn writer_active(dir: &Path) -> Result<bool> {
    let log = dir.join(LOG_DIR);
    let f = File::open(&log).map_err(|e| Error::io(&log, e))?;
    match f.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(e)) => Err(Error::io(&log, e)),
    }
}

impl LogReader {
    /// Read the log of the ledger in `dir`. Refuses layouts 1 and 2 ([`Error::OldLayout`], [`Error::Layout2`]).
    /// The last segment's unsealed remainder is reported as torn only when no writer
    /// holds the ledger (a live writer's may be a write in progress).
    pub fn open(dir: &Path) -> Result<LogReader> {
        let segments = list_segments(dir)?;
        let live = writer_active(dir)?;
        Ok(LogReader::new(segments, !live, None))
    }

    pub(crate) fn new(
        segments: Vec<(u64, PathBuf)>,
        report_last_tail: bool,
        start: Option<(u64, u64)>,
    ) -> LogReader {
        let next = start
            .map(|(s, _)| {
                segments
                    .iter()
                    .position(|(n, _)| *n >= s)
                    .unwrap_or(segments.len())
            })
            .unwrap_or(0);
        LogReader {
            segments,
            next,
            current: None,
            ledger_id: None,
            report_last_tail,
            start,
            last_checkpoint: None,
            failed: false,
        }
    }

    /// Only the entries and checkpoints, as `Result<Frame>` (what exports and the
    /// verifier's store path read); state frames are skipped, torn writes dropped.
    pub fn frames(self) -> impl Iterator<Item = Result<Frame>> {
        self.filter_map(|item| match item {
            Ok(Item::Frame(f)) => Some(Ok(f)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
    }

    /// The segment being read and the offset just past the last frame read from it.
    pub fn position(&self) -> Option<(u64, u64)> {
        self.current.as_ref().map(|c| (c.number, c.pos))
    }

    fn open_next(&mut self) -> Result<bool> {
        let Some((number, path)) = self.segments.get(self.next).cloned() else {
            return Ok(false);
        };
        let last = self.next + 1 == self.segments.len();
        self.next += 1;
        let scan = scan(&path)?;
        let bad = |why: String| Error::Segment {
            path: path.clone(),
            why,
        };
        let Some(header) = scan.header else {
            // Shorter than a header: a torn creation, reported whole.
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            self.current = Some(Current {
                number,
                path,
                reader: BufReader::new(file),
                pos: 0,
                scan,
                last,
            });
            return Ok(true);
        };
        if header.number != number {
            return Err(bad(format!("its header says segment {}", header.number)));
        }
        match self.ledger_id {
            None => self.ledger_id = Some(header.ledger_id),
            Some(id) if id != header.ledger_id => {
                return Err(bad(format!(
                    "belongs to ledger {}, not {id}",
                    header.ledger_id
                )))
            }
            Some(_) => {}
        }
        if let Some(text) = &self.last_checkpoint {
            let cp = crate::format::Checkpoint::from_text(text).map_err(|e| {
                bad(format!(
                    "the checkpoint before this segment does not parse: {e}"
                ))
            })?;
            if (cp.size, cp.head) != (header.first_seq, header.prev_hash) {
                return Err(bad(format!(
                    "its header starts the segment at seq {} after head {}, but the log before it is sealed at size {} head {}",
                    header.first_seq, header.prev_hash, cp.size, cp.head
                )));
            }
        }
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let mut pos = SEGMENT_HEADER_LEN as u64;
        if let Some((s, off)) = self.start.take() {
            if s == number && off > pos {
                pos = off.min(scan.sealed_end);
            }
        }
        reader
            .seek(SeekFrom::Start(pos))
            .map_err(|e| Error::io(&path, e))?;
        self.current = Some(Current {
            number,
            path,
            reader,
            pos,
            scan,
            last,
        });
        Ok(true)
    }

    fn step(&mut self) -> Result<Option<Item>> {
        loop {
            if self.current.is_none() && !self.open_next()? {
                return Ok(None);
            }
            let Some(cur) = self.current.as_mut() else {
                return Ok(None);
            };
            if cur.pos >= cur.scan.sealed_end {
                let torn = Torn {
                    segment: cur.number,
                    path: cur.path.clone(),
                    offset: cur.scan.sealed_end,
                    len: cur.scan.unsealed(),
                };
                let report = torn.len > 0 && (!cur.last || self.report_last_tail);
                self.current = None;
                if report {
                    return Ok(Some(Item::Torn(torn)));
                }
                continue;
            }
            let mut prefix = [0u8; FRAME_PREFIX_LEN];
            let io = |e| Error::io(&cur.path, e);
            cur.reader.read_exact(&mut prefix).map_err(io)?;
            let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
            let mut payload = vec![0u8; len];
            cur.reader
                .read_exact(&mut payload)
                .map_err(|e| Error::io(&cur.path, e))?;
            cur.pos += (FRAME_PREFIX_LEN + len) as u64;
            return match prefix[0] {
                TAG_ENTRY => {
                    // The header's ledger id is the one every entry in it carries.
                    let id = cur.scan.header.map(|h| h.ledger_id.0);
                    if payload.get(2..18) != id.as_ref().map(|i| &i[..]) {
                        return Err(Error::Segment {
                            path: cur.path.clone(),
                            why: format!(
                                "the entry frame ending at byte {} is not of the ledger the segment header names",
                                cur.pos
                            ),
                        });
                    }
                    Ok(Some(Item::Frame(Frame::Entry(payload))))
                }
                TAG_CHECKPOINT => {
                    self.last_checkpoint = Some(payload.clone());
                    Ok(Some(Item::Frame(Frame::Checkpoint(payload))))
                }
                TAG_TREE => match decode_tree(&payload) {
                    Some((size, root)) => Ok(Some(Item::Tree { size, root })),
                    None => Err(Error::Segment {
                        path: cur.path.clone(),
                        why: format!("tree frame ending at byte {} is not 40 bytes", cur.pos),
                    }),
                },
                tag => {
                    let frame = StateFrame::decode(tag, &payload).map_err(|e| Error::Segment {
                        path: cur.path.clone(),
                        why: format!("state frame ending at byte {}: {e}", cur.pos),
                    })?;
                    Ok(Some(Item::State {
                        frame,
                        segment: cur.number,
                        end: cur.pos,
                    }))
                }
            };
        }
    }
}

impl Iterator for LogReader {
    type Item = Result<Item>;

    fn next(&mut self) -> Option<Result<Item>> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(item) => item.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
