//! The log: append-only segment files holding the exact entry and checkpoint bytes.
//!
//! A ledger's record of truth is `DIR/log/`, a numbered series of segment files
//! (`docs/FORMAT.md`, "Log segments"). A segment starts with an 80-byte header and then
//! holds frames `tag (u8) ‖ len (u32 BE) ‖ payload`: entries (tag 1), checkpoints (tag 2,
//! sealing the entries before them) and the gate's derived state (tag 3, never hashed,
//! never verified). One commit group is one `write` of its frames (entries, state,
//! checkpoint last) and one `fdatasync`.
//!
//! No byte of a segment is ever rewritten or truncated. After a crash, the bytes after a
//! segment's last complete checkpoint frame are a *torn write*: they stay where they are,
//! readers report them ([`Item::Torn`]), and the writer resumes in a new segment (the
//! resynchronisation point), so every earlier byte is kept.
//!
//! Readers ([`LogReader`]) open segments read-only and take no lock that writes: they
//! read each segment up to its last complete checkpoint while a writer keeps appending.

use std::fs::{self, File};
use std::io::{self, BufReader, Read as _};
use std::path::{Path, PathBuf};

use crate::error::{Error, FormatError, Result};
use crate::export::read_full;
use crate::format::{ChainRule, Checkpoint, Hash, LedgerId, HEADER_LEN, MAX_BODY_LEN};

mod reader;
mod state;
mod writer;

pub use reader::{writer_active, Item, LogReader};
pub use state::{encode_state, Pairs, StateFrame, StatePairs, StateValue};
pub(crate) use writer::Resume;
pub use writer::{LogWriter, Placed};

/// The log's directory inside a ledger directory.
pub const LOG_DIR: &str = "log";
/// The sled directory of layout 1, which held the entries themselves.
pub const OLD_STORE_DIR: &str = "store";
/// Segment file magic (16 bytes); the `3` is the ledger layout version.
pub const SEGMENT_MAGIC: &[u8; 16] = b"tally segment 3\n";
/// Length of a segment header.
pub const SEGMENT_HEADER_LEN: usize = 80;
/// Length of a frame's tag and length prefix.
pub const FRAME_PREFIX_LEN: usize = 5;
/// Frame tag of an entry (the same tag as in an export).
pub const TAG_ENTRY: u8 = 1;
/// Frame tag of a checkpoint's text.
pub const TAG_CHECKPOINT: u8 = 2;
/// Frame tag of derived state (the gate's counters), every value whole, as builds before
/// [`TAG_STATE_DELTA`] wrote it: never hashed, never verified. Still read, never written.
pub const TAG_STATE: u8 = 3;
/// Frame tag of derived state whose values may be deltas against the key's previous value
/// ([`StateValue`]): never hashed, never verified. What the writer writes.
pub const TAG_STATE_DELTA: u8 = 4;
/// Frame tag of a tree frame: the Merkle tree's size and root after the group's entries
/// (`size u64 BE ‖ root`, 40 bytes), written before the group's checkpoint. Derived from
/// the entries, never trusted by a verifier: the writer checks its tree files against it
/// on open.
pub const TAG_TREE: u8 = 5;
/// Length of a tree frame's payload.
pub const TREE_FRAME_LEN: usize = 40;
/// Largest previous value a delta may refer to (LZ4's window).
pub const MAX_DELTA_BASE: usize = 64 * 1024;
/// Largest checkpoint frame payload.
pub const MAX_CHECKPOINT_LEN: usize = 1024;
/// Largest state frame payload.
pub const MAX_STATE_LEN: usize = 64 << 20;
/// A segment is closed once a group would take it past this many bytes (a group larger
/// than this still goes whole into a fresh segment).
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// The file name of segment `number`: 20 decimal digits and `.seg`.
pub fn segment_name(number: u64) -> String {
    format!("{number:020}.seg")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment's header: which ledger, which segment, and where in the chain it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The ledger's id.
    pub ledger_id: LedgerId,
    /// The segment's number: 0 for the first, then +1 per segment, no gaps.
    pub number: u64,
    /// The seq of the first entry the segment holds (the log's size when it was created).
    pub first_seq: u64,
    /// The chain hash of entry `first_seq - 1` (all zero for segment 0).
    pub prev_hash: Hash,
}

impl SegmentHeader {
    /// The header's 80 bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[..16].copy_from_slice(SEGMENT_MAGIC);
        b[16..32].copy_from_slice(&self.ledger_id.0);
        b[32..40].copy_from_slice(&self.number.to_be_bytes());
        b[40..48].copy_from_slice(&self.first_seq.to_be_bytes());
        b[48..80].copy_from_slice(&self.prev_hash.0);
        b
    }

    /// Decode exactly 80 bytes.
    pub fn decode(b: &[u8]) -> std::result::Result<SegmentHeader, FormatError> {
        if b.len() != SEGMENT_HEADER_LEN {
            return Err(FormatError::Truncated {
                what: "segment header",
                need: SEGMENT_HEADER_LEN,
                have: b.len(),
            });
        }
        if &b[..16] != SEGMENT_MAGIC {
            return Err(FormatError::invalid(
                "segment header",
                "not a tally layout 3 segment (magic)",
            ));
        }
        let u64_at = |i: usize| {
            let mut n = [0u8; 8];
            n.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(n)
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[16..32]);
        let mut prev = [0u8; 32];
        prev.copy_from_slice(&b[48..80]);
        let h = SegmentHeader {
            ledger_id: LedgerId(id),
            number: u64_at(32),
            first_seq: u64_at(40),
            prev_hash: Hash(prev),
        };
        if h.number == 0 && (h.first_seq != 0 || h.prev_hash != Hash::default()) {
            return Err(FormatError::invalid(
                "segment header",
                "segment 0 starts at seq 0 with an all-zero previous hash",
            ));
        }
        Ok(h)
    }
}

/// Append one frame to `out`.
pub fn push_frame(out: &mut Vec<u8>, tag: u8, payload: &[u8]) {
    push_frame_with(out, tag, |out| out.extend_from_slice(payload));
}

/// Append one frame to `out` whose payload `write` appends in place (a decision entry
/// built where it is written); returns where the payload starts in `out`.
pub fn push_frame_with(out: &mut Vec<u8>, tag: u8, write: impl FnOnce(&mut Vec<u8>)) -> usize {
    out.push(tag);
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let start = out.len();
    write(out);
    let len = (out.len() - start) as u32;
    out[len_at..start].copy_from_slice(&len.to_be_bytes());
    start
}

pub(crate) fn max_payload(tag: u8) -> Option<usize> {
    match tag {
        TAG_ENTRY => Some(HEADER_LEN + MAX_BODY_LEN),
        TAG_CHECKPOINT => Some(MAX_CHECKPOINT_LEN),
        TAG_STATE | TAG_STATE_DELTA => Some(MAX_STATE_LEN),
        TAG_TREE => Some(TREE_FRAME_LEN),
        _ => None,
    }
}

/// The magic of a layout 2 segment (entries chained over their bytes).
const SEGMENT_MAGIC_LAYOUT_2: &[u8; 16] = b"tally segment 2\n";

/// The refusal of a directory in ledger layout 1 or 2, or `Ok` when it is neither.
pub fn refuse_old_layout(dir: &Path) -> Result<()> {
    if dir.join(OLD_STORE_DIR).join("db").exists() && !dir.join(LOG_DIR).exists() {
        return Err(Error::OldLayout(dir.to_path_buf()));
    }
    // Layout 2 is told by the first segment's magic (the rest of it reads as layout 3, so
    // only the chain would say it, with every link broken), confirmed by its first group:
    // a layout 3 segment whose magic was changed to layout 2's is left to be read, and
    // reported, as a damaged segment (a finding), not taken for an old ledger.
    let first = dir.join(LOG_DIR).join(segment_name(0));
    let Ok(f) = File::open(&first) else {
        return Ok(());
    };
    let mut start = Vec::with_capacity(GENESIS_GROUP_MAX);
    io::Read::take(f, GENESIS_GROUP_MAX as u64)
        .read_to_end(&mut start)
        .map_err(|e| Error::io(&first, e))?;
    if start.starts_with(SEGMENT_MAGIC_LAYOUT_2) && seals_genesis_as_layout_2(&start) {
        return Err(Error::Layout2(dir.to_path_buf()));
    }
    Ok(())
}

/// Bytes of segment 0 read to find its first group (genesis, tree frame, checkpoint: well
/// under 1 KiB).
const GENESIS_GROUP_MAX: usize = 16 << 10;

/// Whether `segment` (its first bytes) starts with a genesis entry sealed by a checkpoint
/// of size 1 whose head is that entry's chain hash under layout 2's rule
/// ([`ChainRule::EntryBytes`]). Unsigned here: this tells an old ledger from a damaged
/// new one for the refusal's sake; nothing is trusted on it.
fn seals_genesis_as_layout_2(segment: &[u8]) -> bool {
    let mut at = SEGMENT_HEADER_LEN;
    let mut genesis = None;
    while let Some(prefix) = segment.get(at..at + FRAME_PREFIX_LEN) {
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        let Some(payload) = segment.get(at + FRAME_PREFIX_LEN..at + FRAME_PREFIX_LEN + len) else {
            return false;
        };
        match (prefix[0], genesis) {
            (TAG_ENTRY, None) => genesis = Some(payload),
            (_, None) => return false,
            (TAG_CHECKPOINT, Some(entry)) => {
                return Checkpoint::from_text(payload)
                    .is_ok_and(|c| c.size == 1 && c.head == ChainRule::EntryBytes.hash(entry))
            }
            _ => {}
        }
        at += FRAME_PREFIX_LEN + len;
    }
    false
}

/// The segments in `DIR/log`, by number. Any other file there is an error (nothing but
/// the writer puts files in the log), as is a gap in the numbers.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    refuse_old_layout(dir)?;
    let log = dir.join(LOG_DIR);
    let items = match fs::read_dir(&log) {
        Ok(items) => items,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::NotALedger(dir.to_path_buf()))
        }
        Err(e) => return Err(Error::io(&log, e)),
    };
    let mut out = Vec::new();
    for item in items {
        let item = item.map_err(|e| Error::io(&log, e))?;
        let name = item.file_name();
        let number = name
            .to_str()
            .and_then(parse_segment_name)
            .ok_or_else(|| Error::Segment {
                path: item.path(),
                why: "is not a segment file (NNNNNNNNNNNNNNNNNNNN.seg)".into(),
            })?;
        out.push((number, item.path()));
    }
    out.sort();
    for (i, (n, path)) in out.iter().enumerate() {
        if *n != i as u64 {
            return Err(Error::Segment {
                path: path.clone(),
                why: format!("segment {i} is missing (the log's numbers have a gap)"),
            });
        }
    }
    if out.is_empty() {
        return Err(Error::NotALedger(dir.to_path_buf()));
    }
    Ok(out)
}

/// Where a segment's sealed frames end, found by walking its frame prefixes.
#[derive(Clone, Debug)]
pub struct Scan {
    /// The segment's header; `None` when the file is shorter than one (the write that
    /// created it was torn: all of it is unsealed).
    pub header: Option<SegmentHeader>,
    /// The file's length when scanned.
    pub len: u64,
    /// The end of the last complete checkpoint frame (the header's end if none).
    pub sealed_end: u64,
    /// Whether the segment holds any complete checkpoint frame.
    pub sealed: bool,
    /// The last entry frame before the sealed end: its payload's offset and length.
    pub last_entry: Option<(u64, u32)>,
    /// The last checkpoint frame (the one that ends at the sealed end): its payload's
    /// offset and length.
    pub last_checkpoint: Option<(u64, u32)>,
    /// The tree frame of the last checkpoint's group, if it has one: its payload's offset
    /// and length.
    pub last_tree: Option<(u64, u32)>,
    /// The checkpoint frame before the last one, if the segment holds one: its payload's
    /// offset and length.
    pub prev_checkpoint: Option<(u64, u32)>,
    /// Where the last sealed group's frames begin: just after the checkpoint before it,
    /// or after the header if the segment holds no earlier checkpoint.
    pub group_start: u64,
}

impl Scan {
    /// Bytes after the sealed end: a torn write (or, in the live writer's active segment,
    /// a write in progress).
    pub fn unsealed(&self) -> u64 {
        self.len - self.sealed_end
    }
}

/// Read a segment's header and walk its frames up to the last complete checkpoint.
/// Frames are judged by their prefix only (known tag, length within bounds, complete);
/// the first frame that is not complete or well-formed ends the walk.
pub fn scan(path: &Path) -> Result<Scan> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut r = BufReader::with_capacity(64 * 1024, file);
    let mut hb = [0u8; SEGMENT_HEADER_LEN];
    let got = read_full(&mut r, &mut hb).map_err(|e| Error::io(path, e))?;
    if got < SEGMENT_HEADER_LEN {
        return Ok(Scan {
            header: None,
            len,
            sealed_end: 0,
            sealed: false,
            last_entry: None,
            last_checkpoint: None,
            last_tree: None,
            prev_checkpoint: None,
            group_start: 0,
        });
    }
    let header = SegmentHeader::decode(&hb).map_err(|e| Error::Segment {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let mut pos = SEGMENT_HEADER_LEN as u64;
    let mut sealed_end = pos;
    let mut sealed = false;
    let (mut entry, mut last_entry, mut last_checkpoint) = (None, None, None);
    let (mut tree, mut last_tree) = (None, None);
    let (mut prev_checkpoint, mut group_start) = (None, pos);
    loop {
        let mut prefix = [0u8; FRAME_PREFIX_LEN];
        if pos + FRAME_PREFIX_LEN as u64 > len {
            break;
        }
        if read_full(&mut r, &mut prefix).map_err(|e| Error::io(path, e))? < FRAME_PREFIX_LEN {
            break;
        }
        let tag = prefix[0];
        let plen = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as u64;
        match max_payload(tag) {
            Some(max) if plen as usize <= max => {}
            _ => break,
        }
        let end = pos + FRAME_PREFIX_LEN as u64 + plen;
        if end > len {
            break;
        }
        r.seek_relative(plen as i64)
            .map_err(|e| Error::io(path, e))?;
        let at = (pos + FRAME_PREFIX_LEN as u64, plen as u32);
        pos = end;
        match tag {
            TAG_ENTRY => entry = Some(at),
            TAG_TREE => tree = Some(at),
            TAG_CHECKPOINT => {
                group_start = sealed_end;
                sealed_end = pos;
                sealed = true;
                last_entry = entry;
                prev_checkpoint = last_checkpoint;
                last_checkpoint = Some(at);
                last_tree = tree.take();
            }
            _ => {}
        }
    }
    Ok(Scan {
        header: Some(header),
        len,
        sealed_end,
        sealed,
        last_entry,
        last_checkpoint,
        last_tree,
        prev_checkpoint,
        group_start,
    })
}

/// A tree frame's payload: the tree's size and root.
pub fn decode_tree(payload: &[u8]) -> Option<(u64, [u8; 32])> {
    if payload.len() != TREE_FRAME_LEN {
        return None;
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&payload[..8]);
    let mut root = [0u8; 32];
    root.copy_from_slice(&payload[8..]);
    Some((u64::from_be_bytes(size), root))
}

/// A tree frame's payload for the tree of `size` leaves with `root`.
pub fn encode_tree(size: u64, root: &[u8; 32]) -> [u8; TREE_FRAME_LEN] {
    let mut out = [0u8; TREE_FRAME_LEN];
    out[..8].copy_from_slice(&size.to_be_bytes());
    out[8..].copy_from_slice(root);
    out
}

/// The payload of the frame at `at` (offset, length) of the segment `path`, read alone.
pub fn read_payload(path: &Path, at: (u64, u32)) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut buf = vec![0u8; at.1 as usize];
    file.read_exact_at(&mut buf, at.0)
        .map_err(|e| Error::io(path, e))?;
    Ok(buf)
}

/// Bytes of a segment after its last complete checkpoint: never sealed, so never
/// acknowledged. Reported, never removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Torn {
    /// The segment's number.
    pub segment: u64,
    /// The segment file.
    pub path: PathBuf,
    /// Offset of the first unsealed byte.
    pub offset: u64,
    /// How many bytes follow it.
    pub len: u64,
}

/// fsync a directory (after a segment is created in it).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}
