//! Where a walk's frames come from: an export file (its end marker, signed or not, read
//! as it streams past) or a ledger directory's log.

use std::io::Read;
use std::sync::{Arc, Mutex};

use tally_ledger::export::{ExportError, ExportReader};
use tally_ledger::{Checkpoint, Frame};

use tally_ledger::export::SignedEnd;
use tally_ledger::format::ChainRule;

/// Where frames come from failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The export file is malformed or cut.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The store could not be read.
    #[error("store: {0}")]
    Store(String),
    /// A log segment's bytes after its last complete checkpoint: a write that a crash
    /// tore (never sealed, so never acknowledged). Not an error of the chain: the log
    /// resumes in the next segment, and the walk goes on.
    #[error("torn write in segment {segment} at byte {offset} ({len} bytes)")]
    TornWrite {
        /// The segment's number.
        segment: u64,
        /// Where the unsealed bytes start.
        offset: u64,
        /// How many there are.
        len: u64,
    },
    /// A frame claims more bytes than the export holds, yet the export ends with its end
    /// marker: the frame's length was altered (a cut copy never keeps its end marker).
    #[error("frame at byte {offset} claims {missing} bytes past the export's end marker")]
    FrameOverrunsEnd {
        /// Offset of the frame's first byte.
        offset: u64,
        /// Bytes it claims beyond the end of the file.
        missing: u64,
    },
    /// Not an error: the export's entries are chained by this rule, not by
    /// [`ChainRule::LeafHash`] (a `tally export v1` file). Comes first, before any frame.
    #[error("the export's entries are chained by {0:?}")]
    Chain(ChainRule),
    /// Not an error: the export ended with its signed end marker (read to it whole).
    #[error("the export's signed end")]
    SignedEnd(SignedEnd),
    /// Not an error: the export ended with an end marker the log key did not sign.
    #[error("the export's end marker is not signed")]
    PlainEnd,
    /// Not an error: a log's tree frame, the Merkle tree's size and root its writer
    /// recorded after a group (checked against the entries read).
    #[error("tree frame of size {size}")]
    TreeFrame {
        /// The tree's size.
        size: u64,
        /// Its root.
        root: [u8; 32],
    },
}

/// The frames of an export file, read strictly by [`ExportReader`]. A file that ends
/// inside a frame is a cut copy ([`ExportError::Torn`], incomplete evidence) unless it
/// still ends with a valid end marker: then a frame's length contradicts the file, and
/// the frame is reported as [`SourceError::FrameOverrunsEnd`] (tampering).
pub fn export_frames<R: Read>(
    input: R,
) -> Result<impl Iterator<Item = Result<Frame, SourceError>>, ExportError> {
    let tail = Arc::new(Mutex::new(Vec::with_capacity(2 * SIGNED_END_FRAME_LEN)));
    let reader = ExportReader::new(TailTap {
        input,
        tail: Arc::clone(&tail),
    })?;
    let legacy = (reader.chain_rule() != ChainRule::LeafHash).then(|| reader.chain_rule());
    Ok(ExportFrames {
        reader,
        tail,
        legacy,
        failed: false,
        ended: false,
    })
}

/// The frames of an export, then how it ended (signed or not).
struct ExportFrames<R: Read> {
    reader: ExportReader<TailTap<R>>,
    tail: Arc<Mutex<Vec<u8>>>,
    /// The chain rule to announce before the first frame, when it is not the current one.
    legacy: Option<ChainRule>,
    failed: bool,
    ended: bool,
}

impl<R: Read> Iterator for ExportFrames<R> {
    type Item = Result<Frame, SourceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        if let Some(rule) = self.legacy.take() {
            return Some(Err(SourceError::Chain(rule)));
        }
        match self.reader.next() {
            Some(Err(ExportError::Torn { offset, missing }))
                if ends_with_end_marker(&self.tail) =>
            {
                self.failed = true;
                Some(Err(SourceError::FrameOverrunsEnd { offset, missing }))
            }
            Some(Err(e)) => {
                self.failed = true;
                Some(Err(SourceError::from(e)))
            }
            Some(Ok(f)) => Some(Ok(f)),
            None => {
                self.ended = true;
                if self.failed {
                    return None;
                }
                Some(Err(match self.reader.signed_end() {
                    Some(e) => SourceError::SignedEnd(e.clone()),
                    None => SourceError::PlainEnd,
                }))
            }
        }
    }
}

/// The frames of the ledger directory `dir`, read from its log segments in place: no
/// lock taken, no byte written, while a writer may keep appending (each segment is read
/// up to its last complete checkpoint). Torn writes come as [`SourceError::TornWrite`];
/// a segment that does not read as one comes as [`SourceError::Store`]. Fails up front
/// when `dir` holds no log (or one in an old layout: [`tally_ledger::Error::OldLayout`],
/// [`tally_ledger::Error::Layout2`]).
pub fn ledger_frames(
    dir: &std::path::Path,
) -> Result<impl Iterator<Item = Result<Frame, SourceError>>, tally_ledger::Error> {
    use tally_ledger::segment::{Item, LogReader};
    let reader = LogReader::open(dir)?;
    // The latest cosigned checkpoint kept beside the log, read where its size is sealed.
    let cosigned = tally_ledger::tlog::read_cosigned(dir)?.and_then(|n| {
        let size = tally_ledger::tlog::note::TreeHead::parse(&n.text)
            .ok()?
            .size;
        Some((size, n.to_text().into_bytes()))
    });
    let mut pending: Option<Result<Frame, SourceError>> = None;
    let mut items = reader.filter_map(|item| match item {
        Ok(Item::Frame(f)) => Some(Ok(f)),
        Ok(Item::State { .. }) => None,
        Ok(Item::Tree { size, root }) => Some(Err(SourceError::TreeFrame { size, root })),
        Ok(Item::Torn(t)) => Some(Err(SourceError::TornWrite {
            segment: t.segment,
            offset: t.offset,
            len: t.len,
        })),
        Err(e) => Some(Err(SourceError::Store(e.to_string()))),
    });
    let mut cosigned = cosigned;
    Ok(std::iter::from_fn(move || {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        let item = items.next()?;
        if let (Ok(Frame::Checkpoint(t)), Some((size, _))) = (&item, &cosigned) {
            if Checkpoint::from_text(t).map(|c| c.size) == Ok(*size) {
                pending = cosigned.take().map(|(_, b)| Ok(Frame::Cosigned(b)));
            }
        }
        Some(item)
    }))
}

/// An export's end frame: tag, length (16), entry and checkpoint counts.
const END_FRAME_LEN: usize = 1 + 4 + 16;
/// An export's signed end frame: tag, length (112), counts, root, signature.
const SIGNED_END_FRAME_LEN: usize = 1 + 4 + 16 + 32 + 64;

/// A reader that remembers the last [`SIGNED_END_FRAME_LEN`] bytes it read.
struct TailTap<R> {
    input: R,
    tail: Arc<Mutex<Vec<u8>>>,
}

impl<R: Read> Read for TailTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        if n > 0 {
            if let Ok(mut tail) = self.tail.lock() {
                tail.extend_from_slice(&buf[n.saturating_sub(SIGNED_END_FRAME_LEN)..n]);
                let extra = tail.len().saturating_sub(SIGNED_END_FRAME_LEN);
                tail.drain(..extra);
            }
        }
        Ok(n)
    }
}

/// Whether the bytes read last are a well-formed end frame (plain or signed), judged by
/// the export reader itself (a lone end frame after the magic: it reads as the end, or
/// as counts that do not match an empty export).
fn ends_with_end_marker(tail: &Mutex<Vec<u8>>) -> bool {
    let Ok(tail) = tail.lock() else { return false };
    [END_FRAME_LEN, SIGNED_END_FRAME_LEN].iter().any(|&len| {
        if tail.len() < len {
            return false;
        }
        let mut lone = tally_ledger::format::EXPORT_MAGIC.to_vec();
        lone.extend_from_slice(&tail[tail.len() - len..]);
        let Ok(mut reader) = ExportReader::new(&lone[..]) else {
            return false;
        };
        matches!(
            reader.next(),
            None | Some(Err(ExportError::CountMismatch { .. }))
        )
    })
}
