//! What the writer checks before it extends a log (docs/FORMAT.md, "Opening for
//! writing"): the tail it is about to write after, cheaply (one commit group, not the
//! whole log).
//!
//! * the genesis entry's signature (the ledger's identity, matched to `ledger.pub`);
//! * the last sealed group: every entry in it decodes, is of this ledger and continues
//!   the chain from the seal before it (the checkpoint before it, or the segment's
//!   header) to the last checkpoint, whose signature verifies under the writer's key (as
//!   does the checkpoint before it, when that one is of the same epoch);
//! * every byte after the sealed end (the rest of the last sealed segment, and every
//!   segment after it): it must be what a crash leaves, a prefix of one group's write:
//!   entries continuing the chain, at most one state frame after them, at most one tree
//!   frame of their size after that, and then the end
//!   of the file, a frame cut short by it, or zero bytes up to it (a file system that
//!   extended the file before writing it); and no checkpoint that verifies may lie
//!   anywhere inside it (a changed frame prefix must not pass for a torn write, which
//!   would drop the sealed groups after it).
//!
//! What passes is kept where it is and reported ([`Torn`]); what does not is refused with
//! [`Error::TailDamaged`], which names the `tally verify` command to run. Damage before
//! the last group is `tally verify`'s to find; state frames are not hashed, and the
//! index replays them only with their check.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{Checkpoint, Entry, EntryType, Hash, LedgerId};
use crate::keys;
use crate::segment::{
    self, max_payload, Scan, SegmentHeader, StateFrame, Torn, FRAME_PREFIX_LEN, SEGMENT_HEADER_LEN,
    TAG_CHECKPOINT, TAG_ENTRY, TAG_TREE,
};

/// The log's sealed end as [`crate::Ledger::open`] found it.
pub(crate) struct Sealed<'a> {
    /// The ledger directory.
    pub dir: &'a Path,
    /// The ledger's id.
    pub ledger_id: LedgerId,
    /// Every segment, by number.
    pub segments: &'a [(u64, PathBuf)],
    /// The position in `segments` of the last segment holding a checkpoint.
    pub index: usize,
    /// That segment's scan.
    pub scan: &'a Scan,
    /// Its last checkpoint: the log's sealed end.
    pub checkpoint: &'a Checkpoint,
    /// The verifying key of the writer's epoch, which signed that checkpoint.
    pub key: [u8; 32],
}

impl Sealed<'_> {
    fn damaged(&self, at: String, why: impl Into<String>) -> Error {
        Error::TailDamaged {
            dir: self.dir.to_path_buf(),
            at,
            why: why.into(),
        }
    }
}

/// Where a byte of a segment is, as the error says it.
fn at(path: &Path, offset: u64) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    format!("segment {name}, byte {offset}")
}

/// Check the tail (see the module's documentation); the torn writes found after the
/// sealed end, each a crash's, to report.
pub(crate) fn check(s: &Sealed<'_>, genesis: &Entry<'_>) -> Result<Vec<Torn>> {
    genesis_signature(s, genesis)?;
    sealed_group(s)?;
    let mut torn = Vec::new();
    let (number, path) = &s.segments[s.index];
    if s.scan.unsealed() > 0 {
        let bytes = read_range(path, s.scan.sealed_end, s.scan.len)?;
        torn.push(remainder(s, *number, path, s.scan.sealed_end, &bytes)?);
    }
    for (number, path) in &s.segments[s.index + 1..] {
        // A segment the writer created after the sealed end (a new segment's first
        // group, torn): its header starts at that end, in the same write as its frames.
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let header = SegmentHeader {
            ledger_id: s.ledger_id,
            number: *number,
            first_seq: s.checkpoint.size,
            prev_hash: s.checkpoint.head,
        }
        .encode();
        let head_len = bytes.len().min(SEGMENT_HEADER_LEN);
        if bytes[..head_len] != header[..head_len] {
            return Err(s.damaged(
                at(path, 0),
                "a segment after the sealed end whose header does not start where the log is sealed",
            ));
        }
        // As a reader reports it: a segment shorter than a header is torn whole.
        torn.push(if bytes.len() < SEGMENT_HEADER_LEN {
            Torn {
                segment: *number,
                path: path.clone(),
                offset: 0,
                len: bytes.len() as u64,
            }
        } else {
            remainder(
                s,
                *number,
                path,
                SEGMENT_HEADER_LEN as u64,
                &bytes[SEGMENT_HEADER_LEN..],
            )?
        });
    }
    torn.retain(|t| t.len > 0);
    Ok(torn)
}

fn genesis_signature(s: &Sealed<'_>, genesis: &Entry<'_>) -> Result<()> {
    let g = genesis
        .genesis()
        .ok_or_else(|| s.damaged("seq 0".into(), "entry 0 is not a genesis entry"))?;
    keys::verify_signature(
        &g.verifying_key,
        &genesis.signed_message(),
        &g.signature,
        "genesis",
    )
    .map_err(|e| s.damaged("seq 0".into(), format!("the genesis entry: {e}")))
}

fn read_range(path: &Path, from: u64, to: u64) -> Result<Vec<u8>> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    f.seek(SeekFrom::Start(from))
        .map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::with_capacity(to.saturating_sub(from) as usize);
    f.take(to.saturating_sub(from))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// A checkpoint frame's text, read strictly, of this ledger.
fn checkpoint_of(s: &Sealed<'_>, path: &Path, at_: (u64, u32)) -> Result<Checkpoint> {
    let text = segment::read_payload(path, at_)?;
    let cp = Checkpoint::from_text(&text)
        .map_err(|e| s.damaged(at(path, at_.0), format!("a checkpoint: {e}")))?;
    if cp.ledger_id != s.ledger_id {
        return Err(s.damaged(at(path, at_.0), "a checkpoint of another ledger"));
    }
    Ok(cp)
}

/// The last sealed group, from the seal before it to the last checkpoint.
fn sealed_group(s: &Sealed<'_>) -> Result<()> {
    let (seq, head, rotated) = group_start(s)?;
    let end = group_frames(s, seq, head, rotated)?;
    group_seal(s, end)
}

/// Where the last sealed group starts (the seq and head its first entry chains to), and
/// whether it must open with a new epoch's certificate.
fn group_start(s: &Sealed<'_>) -> Result<(u64, Hash, bool)> {
    let (number, path) = &s.segments[s.index];
    let scan = s.scan;
    let start = match (scan.prev_checkpoint, scan.header) {
        (Some(prev), _) => {
            let cp = checkpoint_of(s, path, prev)?;
            let rotated = if cp.epoch == s.checkpoint.epoch {
                keys::verify_checkpoint(&cp, &s.key).map_err(|e| {
                    s.damaged(
                        at(path, prev.0),
                        format!("the checkpoint before the last: {e}"),
                    )
                })?;
                false
            } else if cp.epoch.checked_add(1) == Some(s.checkpoint.epoch) {
                // Signed by the epoch before, whose key is gone: the group must then
                // start with the new epoch's certificate (a rotation moves one epoch).
                true
            } else {
                return Err(s.damaged(
                    at(path, prev.0),
                    format!(
                        "the checkpoint before the last is of epoch {}, the last of epoch {}: one group moves at most one epoch forward",
                        cp.epoch, s.checkpoint.epoch
                    ),
                ));
            };
            (cp.size, cp.head, rotated)
        }
        (None, Some(h)) if *number > 0 => {
            // The group is the segment's first: its header must start where the segment
            // before it is sealed.
            let (_, before) = &s.segments[s.index - 1];
            let cp = segment::scan(before)?
                .last_checkpoint
                .map(|c| checkpoint_of(s, before, c))
                .transpose()?;
            if cp.as_ref().map(|c| (c.size, c.head)) != Some((h.first_seq, h.prev_hash)) {
                return Err(s.damaged(
                    at(path, 0),
                    "the segment's header does not start where the segment before it is sealed",
                ));
            }
            (h.first_seq, h.prev_hash, false)
        }
        _ => (0, Hash([0; 32]), false),
    };
    Ok(start)
}

/// The end of the last group's entries: the seq after them, the last one's hash and
/// epoch, and how many there were.
struct GroupEnd {
    seq: u64,
    head: Hash,
    epoch: Option<u32>,
    entries: u64,
}

/// The last group's frames in order: its entries chained, at most one state frame after
/// them, at most one tree frame of their size, and the checkpoint last.
fn group_frames(s: &Sealed<'_>, mut seq: u64, mut head: Hash, rotated: bool) -> Result<GroupEnd> {
    let path = &s.segments[s.index].1;
    let scan = s.scan;
    let bytes = read_range(path, scan.group_start, scan.sealed_end)?;
    let mut pos = 0usize;
    let (mut entries, mut state, mut tree, mut epoch) = (0u64, false, false, None);
    while pos < bytes.len() {
        let here = scan.group_start + pos as u64;
        let (tag, payload) = frame(&bytes[pos..]).ok_or_else(|| {
            s.damaged(
                at(path, here),
                "a frame of the last sealed group does not read",
            )
        })?;
        pos += FRAME_PREFIX_LEN + payload.len();
        match tag {
            TAG_ENTRY => {
                if state {
                    return Err(s.damaged(at(path, here), "an entry after the group's state frame"));
                }
                let e =
                    chained(s, payload, seq, head).map_err(|why| s.damaged(at(path, here), why))?;
                if rotated && entries == 0 && e.header.entry_type != EntryType::Epoch {
                    return Err(s.damaged(
                        at(path, here),
                        "the checkpoint before the last is of the epoch before, but the group does not start with the new epoch's certificate",
                    ));
                }
                seq += 1;
                head = e.hash();
                epoch = Some(e.header.epoch);
                entries += 1;
            }
            TAG_CHECKPOINT => {
                if pos != bytes.len() {
                    return Err(s.damaged(at(path, here), "a checkpoint inside the last group"));
                }
            }
            TAG_TREE => {
                if tree {
                    return Err(s.damaged(at(path, here), "a second tree frame in one group"));
                }
                match segment::decode_tree(payload) {
                    Some((size, _)) if size == seq => tree = true,
                    Some((size, _)) => {
                        return Err(s.damaged(
                            at(path, here),
                            format!("the group's tree frame is of size {size}, but its entries end at size {seq}"),
                        ))
                    }
                    None => return Err(s.damaged(at(path, here), "the group's tree frame does not read")),
                }
            }
            _ if tree => {
                return Err(s.damaged(at(path, here), "a frame after the group's tree frame"));
            }
            tag => {
                if state {
                    return Err(s.damaged(at(path, here), "a second state frame in one group"));
                }
                StateFrame::decode(tag, payload).map_err(|e| {
                    s.damaged(at(path, here), format!("the group's state frame: {e}"))
                })?;
                state = true;
            }
        }
    }
    Ok(GroupEnd {
        seq,
        head,
        epoch,
        entries,
    })
}

/// The last checkpoint seals exactly the group's entries, of their epoch, signed by the
/// writer's key.
fn group_seal(s: &Sealed<'_>, end: GroupEnd) -> Result<()> {
    let path = &s.segments[s.index].1;
    let scan = s.scan;
    let GroupEnd {
        seq,
        head,
        epoch,
        entries,
    } = end;
    let cp = s.checkpoint;
    let sealed_at = at(path, scan.last_checkpoint.map_or(scan.sealed_end, |c| c.0));
    if entries == 0 {
        return Err(s.damaged(sealed_at, "the last checkpoint seals no entry of its own"));
    }
    if (cp.size, cp.head) != (seq, head) {
        return Err(s.damaged(
            sealed_at,
            format!(
                "the last checkpoint seals size {} head {}, but the group's entries end at size {seq} head {head}",
                cp.size, cp.head
            ),
        ));
    }
    if Some(cp.epoch) != epoch {
        return Err(s.damaged(
            sealed_at,
            "the last checkpoint is not of its last entry's epoch",
        ));
    }
    keys::verify_checkpoint(cp, &s.key)
        .map_err(|e| s.damaged(sealed_at, format!("the last checkpoint: {e}")))
}

/// The frame at the start of `b`, if it is whole and its tag known: its tag and payload.
fn frame(b: &[u8]) -> Option<(u8, &[u8])> {
    let prefix = b.get(..FRAME_PREFIX_LEN)?;
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len > max_payload(prefix[0])? {
        return None;
    }
    Some((prefix[0], b.get(FRAME_PREFIX_LEN..FRAME_PREFIX_LEN + len)?))
}

/// An entry frame's payload, decoded strictly, of this ledger, at `seq` after `head`.
fn chained<'a>(
    s: &Sealed<'_>,
    payload: &'a [u8],
    seq: u64,
    head: Hash,
) -> std::result::Result<Entry<'a>, String> {
    let e = Entry::decode(payload).map_err(|e| format!("an entry does not decode: {e}"))?;
    if e.header.ledger_id != s.ledger_id {
        return Err(format!("entry {} is not of this ledger", e.header.seq));
    }
    if e.header.seq != seq {
        return Err(format!(
            "entry {} stands where seq {seq} belongs",
            e.header.seq
        ));
    }
    if e.header.prev_hash != head {
        return Err(format!(
            "entry {seq} does not link to the entry before it (its previous hash is not {head})"
        ));
    }
    Ok(e)
}

/// No checkpoint signed by this ledger's writer lies in the bytes after the sealed end:
/// if one did, a frame before it was changed, and the groups it seals would be dropped.
fn no_hidden_checkpoint(s: &Sealed<'_>, path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    match hidden_checkpoint(s, bytes) {
        Some(found) => Err(s.damaged(
            at(path, offset + found as u64),
            "a checkpoint signed by this ledger's writer lies after the sealed end: a frame before it was changed, and the groups it seals would be dropped",
        )),
        None => Ok(()),
    }
}

/// The bytes after the sealed end of segment `number`, from `offset`: a torn write if they
/// are what a crash leaves, else the damage.
fn remainder(s: &Sealed<'_>, number: u64, path: &Path, offset: u64, bytes: &[u8]) -> Result<Torn> {
    let (mut seq, mut head) = (s.checkpoint.size, s.checkpoint.head);
    let mut pos = 0usize;
    let (mut state, mut tree) = (false, false);
    loop {
        let rest = &bytes[pos..];
        let here = at(path, offset + pos as u64);
        if rest.len() < FRAME_PREFIX_LEN {
            break; // the end, or a frame prefix cut short by it
        }
        let tag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let Some(max) = max_payload(tag) else {
            if rest.iter().all(|&b| b == 0) {
                break; // zeros to the end: a write the file system made room for
            }
            return Err(s.damaged(
                here,
                format!("after the sealed end, a frame of unknown tag {tag} that is not the end of a crashed write"),
            ));
        };
        if len > max {
            return Err(s.damaged(
                here,
                format!("after the sealed end, a frame of {len} bytes, more than its tag allows"),
            ));
        }
        let Some(payload) = rest.get(FRAME_PREFIX_LEN..FRAME_PREFIX_LEN + len) else {
            break; // a frame cut short by the end of the file: the crash
        };
        match tag {
            _ if tree && tag != TAG_CHECKPOINT => {
                return Err(s.damaged(here, "after the sealed end, a frame after a tree frame"))
            }
            TAG_TREE => match segment::decode_tree(payload) {
                Some((size, _)) if size == seq => tree = true,
                _ => {
                    return Err(s.damaged(
                        here,
                        "after the sealed end, a tree frame that is not of the entries before it",
                    ))
                }
            },
            TAG_ENTRY if !state => {
                let e = chained(s, payload, seq, head)
                    .map_err(|why| s.damaged(here.clone(), format!("after the sealed end, {why}")))?;
                seq += 1;
                head = e.hash();
            }
            TAG_ENTRY => {
                return Err(s.damaged(here, "after the sealed end, an entry after a state frame"))
            }
            TAG_CHECKPOINT => {
                return Err(s.damaged(
                    here,
                    "after the sealed end, a whole checkpoint frame (a crashed write ends before its checkpoint)",
                ))
            }
            tag if !state => {
                StateFrame::decode(tag, payload).map_err(|e| {
                    s.damaged(here.clone(), format!("after the sealed end, a state frame: {e}"))
                })?;
                state = true;
            }
            _ => {
                return Err(s.damaged(here, "after the sealed end, a second state frame"))
            }
        }
        pos += FRAME_PREFIX_LEN + len;
    }
    no_hidden_checkpoint(s, path, offset, bytes)?;
    Ok(Torn {
        segment: number,
        path: path.to_path_buf(),
        offset,
        len: bytes.len() as u64,
    })
}

/// The offset in `bytes` of a checkpoint text of this ledger whose signature verifies
/// under the writer's key, if one lies anywhere in them, whatever its frame prefix says
/// (the text ends itself: eight lines).
fn hidden_checkpoint(s: &Sealed<'_>, bytes: &[u8]) -> Option<usize> {
    const FIRST: &[u8] = b"tally checkpoint v1\n";
    let mut from = 0;
    while from + FIRST.len() <= bytes.len() {
        let i = from
            + bytes[from..]
                .windows(FIRST.len())
                .position(|w| w == FIRST)?;
        from = i + 1;
        let window = &bytes[i..bytes.len().min(i + segment::MAX_CHECKPOINT_LEN)];
        let Some(end) = window
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .nth(7)
            .map(|(at, _)| at + 1)
        else {
            continue;
        };
        let Ok(cp) = Checkpoint::from_text(&window[..end]) else {
            continue;
        };
        if cp.ledger_id == s.ledger_id && keys::verify_checkpoint(&cp, &s.key).is_ok() {
            return Some(i.saturating_sub(FRAME_PREFIX_LEN));
        }
    }
    None
}
