//! The export file: one self-describing file holding a ledger's entries and checkpoints,
//! for offline audit.
//!
//! Layout: the 16-byte magic `tally export v2\n`, then frames `tag (u8) | len (u32 BE) |
//! payload`, in [`Frame`] order, then one end frame (tag `0xff`, 16 bytes: entry count and
//! checkpoint count, u64 BE each), then nothing. A file cut inside a frame is *torn*; a
//! file cut between frames (no end frame) is *cut clean*: the reader tells them apart.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{
    ChainRule, Checkpoint, Frame, LedgerId, DOMAIN_EXPORT_END, EXPORT_MAGIC, EXPORT_MAGIC_V1,
    FRAME_CHECKPOINT, FRAME_COSIGNED, FRAME_END, FRAME_ENTRY, FRAME_SIGNED_END, MAX_FRAME_LEN,
};
use crate::tlog::merkle::TreeHash;
use crate::tlog::note::Note;
use crate::tlog::LogKey;

/// The signed end of an export: how many entries and checkpoints it holds, the Merkle
/// root of those entries, and the log key's signature over them. A copy cut at any
/// checkpoint and given a new end marker cannot carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedEnd {
    /// Entries in the export.
    pub entries: u64,
    /// Checkpoints in the export.
    pub checkpoints: u64,
    /// The Merkle root of the `entries` entries.
    pub root: TreeHash,
    /// Ed25519 signature of the log key over [`SignedEnd::message`].
    pub signature: [u8; 64],
}

impl SignedEnd {
    /// What the log key signs: `"tally v1 export end\0" ‖ ledger id ‖ entries (u64 BE) ‖
    /// checkpoints (u64 BE) ‖ root`.
    pub fn message(ledger: LedgerId, entries: u64, checkpoints: u64, root: &TreeHash) -> Vec<u8> {
        [
            DOMAIN_EXPORT_END,
            &ledger.0,
            &entries.to_be_bytes(),
            &checkpoints.to_be_bytes(),
            root,
        ]
        .concat()
    }

    fn encode(&self) -> Vec<u8> {
        [
            &self.entries.to_be_bytes()[..],
            &self.checkpoints.to_be_bytes(),
            &self.root,
            &self.signature,
        ]
        .concat()
    }
}

/// How an export is sealed at its end: the ledger, the log key, the root of the entries
/// it holds, and the latest cosigned checkpoint to carry after its checkpoint.
pub struct Seal<'a> {
    /// The ledger.
    pub ledger: LedgerId,
    /// Its log key.
    pub key: &'a LogKey,
    /// The Merkle root of the snapshot's entries.
    pub root: TreeHash,
    /// The cosigned checkpoint, if the witnesses cosigned one.
    pub cosigned: Option<(u64, Note)>,
}

/// A malformed export file, with the byte offset where reading stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// Not an export file (or an unknown export version).
    #[error("not a tally export file (its first 16 bytes are neither `tally export v2` nor `tally export v1`)")]
    BadMagic,
    /// The file ends inside a frame: a torn write or a cut mid-record.
    #[error("torn frame at byte {offset}: file ends {missing} bytes early")]
    Torn {
        /// Offset of the frame's first byte.
        offset: u64,
        /// How many bytes the frame still needed.
        missing: u64,
    },
    /// The file ends between frames with no end marker: cut at a frame boundary.
    #[error("export ends at byte {offset} without its end marker (cut at a frame boundary)")]
    CutClean {
        /// Offset where the file ends.
        offset: u64,
    },
    /// A frame tag this version does not know.
    #[error("unknown frame tag {tag:#04x} at byte {offset}")]
    BadTag {
        /// Offset of the frame.
        offset: u64,
        /// The tag.
        tag: u8,
    },
    /// A frame longer than any valid entry.
    #[error("frame at byte {offset} claims {len} bytes (at most {MAX_FRAME_LEN})")]
    FrameTooLarge {
        /// Offset of the frame.
        offset: u64,
        /// Its claimed length.
        len: u64,
    },
    /// The end marker's counts differ from the frames read.
    #[error("end marker at byte {offset} counts {claimed_entries} entries and {claimed_checkpoints} checkpoints; the file holds {entries} and {checkpoints}")]
    CountMismatch {
        /// Offset of the end frame.
        offset: u64,
        /// Entries claimed.
        claimed_entries: u64,
        /// Checkpoints claimed.
        claimed_checkpoints: u64,
        /// Entries read.
        entries: u64,
        /// Checkpoints read.
        checkpoints: u64,
    },
    /// Bytes after the end marker.
    #[error("bytes after the end marker at byte {offset}")]
    TrailingBytes {
        /// Offset of the first extra byte.
        offset: u64,
    },
    /// Reading failed.
    #[error("read error at byte {offset}: {message}")]
    Io {
        /// Offset where it failed.
        offset: u64,
        /// The OS error.
        message: String,
    },
}

/// Writes an export file frame by frame.
pub struct ExportWriter<W: Write> {
    out: W,
    entries: u64,
    checkpoints: u64,
}

impl<W: Write> ExportWriter<W> {
    /// Start an export: writes the magic.
    pub fn new(mut out: W) -> io::Result<ExportWriter<W>> {
        out.write_all(EXPORT_MAGIC)?;
        Ok(ExportWriter {
            out,
            entries: 0,
            checkpoints: 0,
        })
    }

    /// Append one frame.
    pub fn frame(&mut self, frame: &Frame) -> io::Result<()> {
        let (tag, payload) = match frame {
            Frame::Entry(b) => {
                self.entries += 1;
                (FRAME_ENTRY, b)
            }
            Frame::Checkpoint(b) => {
                self.checkpoints += 1;
                (FRAME_CHECKPOINT, b)
            }
            Frame::Cosigned(b) => (FRAME_COSIGNED, b),
        };
        self.out.write_all(&[tag])?;
        self.out.write_all(&(payload.len() as u32).to_be_bytes())?;
        self.out.write_all(payload)
    }

    /// Write the signed end marker for `ledger` (the root of the entries written, signed
    /// by `key`) and return the output.
    pub fn finish_signed(
        mut self,
        ledger: LedgerId,
        key: &LogKey,
        root: TreeHash,
    ) -> io::Result<W> {
        let signature = key.sign_raw(&SignedEnd::message(
            ledger,
            self.entries,
            self.checkpoints,
            &root,
        ));
        let end = SignedEnd {
            entries: self.entries,
            checkpoints: self.checkpoints,
            root,
            signature,
        }
        .encode();
        self.out.write_all(&[FRAME_SIGNED_END])?;
        self.out.write_all(&(end.len() as u32).to_be_bytes())?;
        self.out.write_all(&end)?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Write the end marker and return the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[FRAME_END])?;
        self.out.write_all(&16u32.to_be_bytes())?;
        self.out.write_all(&self.entries.to_be_bytes())?;
        self.out.write_all(&self.checkpoints.to_be_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// What [`export_frames_to`] does when its target already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Refuse an existing file, directory or symlink at the target.
    New,
    /// Replace what is there; a symlink at the target is replaced, never followed.
    Replace,
}

/// Write `frames` to an export file at `out`, replacing any file there; see
/// [`export_frames_to`].
pub fn export_frames(
    frames: impl Iterator<Item = Result<Frame>>,
    out: &Path,
) -> Result<(u64, u64)> {
    export_frames_to(frames, out, Target::Replace, None)
}

/// Write `frames` to an export file at `out`, durably: into a new file beside `out`,
/// created exclusively under a random name (so no one sharing the directory can plant a
/// file or symlink for it), fsynced, then moved into place. Nothing is left behind on
/// failure, and errors name `out`. Returns (entries, checkpoints) written.
pub fn export_frames_to(
    frames: impl Iterator<Item = Result<Frame>>,
    out: &Path,
    target: Target,
    seal: Option<Seal<'_>>,
) -> Result<(u64, u64)> {
    let exists = || Error::io(out, std::io::Error::from(std::io::ErrorKind::AlreadyExists));
    if target == Target::New && out.symlink_metadata().is_ok() {
        return Err(exists());
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned());
    let prefix = format!(".{}.", name.as_deref().unwrap_or("export"));
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let mut tmp = builder.tempfile_in(parent).map_err(|e| Error::io(out, e))?;
    // On any error below, dropping `tmp` removes the half-written file.
    let counts = write_export(frames, tmp.as_file_mut(), out, seal)?;
    let persisted = match target {
        Target::New => tmp.persist_noclobber(out),
        Target::Replace => tmp.persist(out),
    };
    persisted.map_err(|e| Error::io(out, e.error))?;
    crate::keys::sync_parent(out)?;
    Ok(counts)
}

/// Write `frames` as an export to `out`: with a seal, the cosigned checkpoint after the
/// checkpoint of its size, and the signed end.
pub fn write_export_to<W: Write>(
    frames: impl Iterator<Item = Result<Frame>>,
    out: W,
    seal: Option<Seal<'_>>,
) -> Result<(W, (u64, u64))> {
    let here = Path::new("export");
    let mut w = ExportWriter::new(out).map_err(|e| Error::io(here, e))?;
    for frame in frames {
        let frame = frame?;
        w.frame(&frame).map_err(|e| Error::io(here, e))?;
        if let (
            Frame::Checkpoint(t),
            Some(Seal {
                cosigned: Some((size, note)),
                ..
            }),
        ) = (&frame, &seal)
        {
            if Checkpoint::from_text(t).map(|c| c.size) == Ok(*size) {
                w.frame(&Frame::Cosigned(note.to_text().into_bytes()))
                    .map_err(|e| Error::io(here, e))?;
            }
        }
    }
    let counts = (w.entries, w.checkpoints);
    let out = match seal {
        Some(s) => w.finish_signed(s.ledger, s.key, s.root),
        None => w.finish(),
    }
    .map_err(|e| Error::io(here, e))?;
    Ok((out, counts))
}

fn write_export(
    frames: impl Iterator<Item = Result<Frame>>,
    file: &mut std::fs::File,
    here: &Path,
    seal: Option<Seal<'_>>,
) -> Result<(u64, u64)> {
    let (buf, counts) =
        write_export_to(frames, BufWriter::new(&mut *file), seal).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(here, source),
            e => e,
        })?;
    buf.into_inner()
        .map_err(|e| Error::io(here, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(here, e))?;
    Ok(counts)
}

/// Length of a signed end frame's payload: counts, root, signature.
const SIGNED_END_LEN: u64 = 16 + 32 + 64;

/// Reads an export file frame by frame, strictly.
pub struct ExportReader<R: Read> {
    input: BufReader<R>,
    offset: u64,
    entries: u64,
    checkpoints: u64,
    done: bool,
    end: Option<SignedEnd>,
    chain: ChainRule,
}

impl<R: Read> ExportReader<R> {
    /// Start reading: checks the magic.
    pub fn new(input: R) -> Result<ExportReader<R>, ExportError> {
        let mut input = BufReader::with_capacity(1 << 20, input);
        let mut magic = [0u8; 16];
        let n = read_full(&mut input, &mut magic).map_err(|e| ExportError::Io {
            offset: 0,
            message: e.to_string(),
        })?;
        let chain = match &magic {
            _ if n != 16 => return Err(ExportError::BadMagic),
            m if m == EXPORT_MAGIC => ChainRule::LeafHash,
            m if m == EXPORT_MAGIC_V1 => ChainRule::EntryBytes,
            _ => return Err(ExportError::BadMagic),
        };
        Ok(ExportReader {
            input,
            offset: 16,
            entries: 0,
            checkpoints: 0,
            done: false,
            end: None,
            chain,
        })
    }

    /// How the export's entries are chained, by its magic: [`ChainRule::LeafHash`] for
    /// `tally export v2`, [`ChainRule::EntryBytes`] for `v1` (written before layout 3).
    pub fn chain_rule(&self) -> ChainRule {
        self.chain
    }

    /// The signed end marker, once the export was read to it (`None` after a plain one).
    pub fn signed_end(&self) -> Option<&SignedEnd> {
        self.end.as_ref()
    }

    /// Byte offset of the next frame.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn read_frame(&mut self) -> Result<Option<Frame>, ExportError> {
        let start = self.offset;
        let io = |e: io::Error| ExportError::Io {
            offset: start,
            message: e.to_string(),
        };
        let mut head = [0u8; 5];
        let n = read_full(&mut self.input, &mut head).map_err(io)?;
        if n == 0 {
            return Err(ExportError::CutClean { offset: start });
        }
        if n < 5 {
            return Err(ExportError::Torn {
                offset: start,
                missing: (5 - n) as u64,
            });
        }
        let tag = head[0];
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as u64;
        check_frame_head(start, tag, len)?;
        let mut payload = vec![0u8; len as usize];
        let n = read_full(&mut self.input, &mut payload).map_err(io)?;
        if (n as u64) < len {
            return Err(ExportError::Torn {
                offset: start,
                missing: len - n as u64,
            });
        }
        self.offset += 5 + len;
        match tag {
            FRAME_ENTRY => {
                self.entries += 1;
                Ok(Some(Frame::Entry(payload)))
            }
            FRAME_CHECKPOINT => {
                self.checkpoints += 1;
                Ok(Some(Frame::Checkpoint(payload)))
            }
            FRAME_COSIGNED => Ok(Some(Frame::Cosigned(payload))),
            _ => self.read_end(start, tag, &payload).map(|()| None),
        }
    }

    /// The end frame (plain or signed) read at `start`: its counts must be the frames
    /// read, and nothing may follow it.
    fn read_end(&mut self, start: u64, tag: u8, payload: &[u8]) -> Result<(), ExportError> {
        let claimed_entries = u64::from_be_bytes(payload[..8].try_into().unwrap_or_default());
        let claimed_checkpoints = u64::from_be_bytes(payload[8..16].try_into().unwrap_or_default());
        if claimed_entries != self.entries || claimed_checkpoints != self.checkpoints {
            return Err(ExportError::CountMismatch {
                offset: start,
                claimed_entries,
                claimed_checkpoints,
                entries: self.entries,
                checkpoints: self.checkpoints,
            });
        }
        let mut extra = [0u8; 1];
        let more = read_full(&mut self.input, &mut extra).map_err(|e| ExportError::Io {
            offset: start,
            message: e.to_string(),
        })?;
        if more != 0 {
            return Err(ExportError::TrailingBytes {
                offset: self.offset,
            });
        }
        if tag == FRAME_SIGNED_END {
            let mut root = [0u8; 32];
            root.copy_from_slice(&payload[16..48]);
            let mut signature = [0u8; 64];
            signature.copy_from_slice(&payload[48..112]);
            self.end = Some(SignedEnd {
                entries: claimed_entries,
                checkpoints: claimed_checkpoints,
                root,
                signature,
            });
        }
        Ok(())
    }
}

/// A frame's tag is known and its length within the tag's bound (an end frame's exact).
fn check_frame_head(start: u64, tag: u8, len: u64) -> Result<(), ExportError> {
    let max = match tag {
        FRAME_END => 16,
        FRAME_SIGNED_END => SIGNED_END_LEN,
        _ => MAX_FRAME_LEN as u64,
    };
    if !matches!(
        tag,
        FRAME_ENTRY | FRAME_CHECKPOINT | FRAME_COSIGNED | FRAME_END | FRAME_SIGNED_END
    ) {
        return Err(ExportError::BadTag { offset: start, tag });
    }
    if len > max
        || (tag == FRAME_END && len != 16)
        || (tag == FRAME_SIGNED_END && len != SIGNED_END_LEN)
    {
        return Err(ExportError::FrameTooLarge { offset: start, len });
    }
    Ok(())
}

impl<R: Read> Iterator for ExportReader<R> {
    type Item = Result<Frame, ExportError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_frame() {
            Ok(Some(f)) => Some(Ok(f)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Read until `buf` is full or the reader ends; the count read.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
