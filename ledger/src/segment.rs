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

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, FormatError, Result};
use crate::export::read_full;
use crate::format::{Frame, Hash, LedgerId, HEADER_LEN, MAX_BODY_LEN};

/// The log's directory inside a ledger directory.
pub const LOG_DIR: &str = "log";
/// The sled directory of layout 1, which held the entries themselves.
pub const OLD_STORE_DIR: &str = "store";
/// Segment file magic (16 bytes); the `2` is the ledger layout version.
pub const SEGMENT_MAGIC: &[u8; 16] = b"tally segment 2\n";
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
                "not a tally layout 2 segment (magic)",
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
    out.push(tag);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A state frame's payload of tag [`TAG_STATE`]: `(key_len u32 ‖ key ‖ value_len u32 ‖
/// value)*`, at least one pair (what builds before [`TAG_STATE_DELTA`] wrote; kept for
/// the test vectors of that form).
pub fn encode_state<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    write_pairs(&mut out, pairs);
    out
}

/// The tag 3 form of `pairs`, written to `out` (a buffer, or a hasher for the check of a
/// tag 4 frame).
fn write_pairs<'a>(out: &mut impl Write, pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) {
    for (k, v) in pairs {
        // Neither a Vec nor a hasher fails to take bytes.
        let _ = out.write_all(&(k.len() as u32).to_be_bytes());
        let _ = out.write_all(k);
        let _ = out.write_all(&(v.len() as u32).to_be_bytes());
        let _ = out.write_all(v);
    }
}

/// One value of a state frame, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateValue {
    /// The value itself (kind 0).
    Full(Vec<u8>),
    /// The value as an LZ4 block whose dictionary is the key's previous value (kind 1):
    /// the value of the key once every earlier state frame of the log is applied.
    Delta {
        /// The value's length.
        len: u32,
        /// The LZ4 block (`docs/FORMAT.md`, "Log segments").
        block: Vec<u8>,
    },
}

impl StateValue {
    /// `value` as stored after `base` (the key's previous value, if the writer knows it):
    /// a delta when that is shorter, else whole.
    pub fn encode(value: &[u8], base: Option<&[u8]>) -> StateValue {
        if let Some(base) = base.filter(|b| b.len() <= MAX_DELTA_BASE && !b.is_empty()) {
            if value.len() > 4 {
                let block = lz4_flex::block::compress_with_dict(value, base);
                if block.len() + 4 < value.len() {
                    return StateValue::Delta {
                        len: value.len() as u32,
                        block,
                    };
                }
            }
        }
        StateValue::Full(value.to_vec())
    }

    /// The value, given the key's previous value. A delta with no previous value, with
    /// one longer than [`MAX_DELTA_BASE`], or whose block does not decode to exactly its
    /// length is an error.
    pub fn resolve(self, base: Option<&[u8]>) -> std::result::Result<Vec<u8>, FormatError> {
        match self {
            StateValue::Full(v) => Ok(v),
            StateValue::Delta { len, block } => {
                let base = base.ok_or_else(|| {
                    FormatError::invalid("state frame", "a delta for a key with no previous value")
                })?;
                if len as usize > MAX_STATE_LEN {
                    return Err(FormatError::invalid(
                        "state frame",
                        "a delta longer than a state frame holds",
                    ));
                }
                if base.is_empty() || base.len() > MAX_DELTA_BASE {
                    return Err(FormatError::invalid(
                        "state frame",
                        "a delta against a previous value that no writer deltas against",
                    ));
                }
                let mut out = vec![0u8; len as usize];
                match lz4_flex::block::decompress_into_with_dict(&block, &mut out, base) {
                    Ok(n) if n == out.len() => Ok(out),
                    Ok(_) => Err(FormatError::invalid(
                        "state frame",
                        "a delta that decodes to fewer bytes than its length",
                    )),
                    Err(e) => Err(FormatError::Invalid {
                        what: "state frame",
                        why: format!("a delta that does not decode: {e}"),
                    }),
                }
            }
        }
    }
}

/// Keys and their values, in order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A state frame's pairs, in the order written.
pub type StatePairs = Vec<(Vec<u8>, StateValue)>;

/// A state frame as read from the log: its pairs, and for a frame of tag
/// [`TAG_STATE_DELTA`] the check its decoded pairs must match.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateFrame {
    /// The first 4 bytes of BLAKE3 of the decoded pairs ([`encode_state`] of them); `None`
    /// in a frame of tag [`TAG_STATE`], which has none.
    pub check: Option<[u8; 4]>,
    /// The pairs, in the order written.
    pub pairs: StatePairs,
}

/// Append `n` as an unsigned LEB128 varint (7 bits a byte, low first).
fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn truncated(need: usize, have: usize) -> FormatError {
    FormatError::Truncated {
        what: "state frame",
        need,
        have,
    }
}

/// Read a varint of at most `max`, strictly: the shortest form only (no final zero
/// byte after the first).
fn take_varint(b: &mut &[u8], max: u64) -> std::result::Result<u64, FormatError> {
    let mut n: u64 = 0;
    for i in 0..10 {
        let byte = *b.get(i).ok_or(truncated(i + 1, b.len()))?;
        if i == 9 && byte > 1 {
            break;
        }
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(FormatError::invalid(
                    "state frame",
                    "a length not in its shortest form",
                ));
            }
            if n > max {
                return Err(FormatError::invalid(
                    "state frame",
                    "a length longer than a state frame may be",
                ));
            }
            *b = &b[i + 1..];
            return Ok(n);
        }
    }
    Err(FormatError::invalid("state frame", "a length over 64 bits"))
}

fn take_slice<'a>(b: &mut &'a [u8], len: usize) -> std::result::Result<&'a [u8], FormatError> {
    let v = b.get(..len).ok_or(truncated(len, b.len()))?;
    *b = &b[len..];
    Ok(v)
}

fn take_bytes(b: &mut &[u8]) -> std::result::Result<Vec<u8>, FormatError> {
    let len: [u8; 4] = b
        .get(..4)
        .and_then(|l| l.try_into().ok())
        .ok_or(truncated(4, b.len()))?;
    *b = &b[4..];
    let len = u32::from_be_bytes(len) as usize;
    Ok(take_slice(b, len)?.to_vec())
}

/// The first 4 bytes of BLAKE3 of `pairs` as [`encode_state`] writes them.
fn pairs_check<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> [u8; 4] {
    let mut hasher = blake3::Hasher::new();
    write_pairs(&mut hasher, pairs);
    let mut c = [0u8; 4];
    c.copy_from_slice(&hasher.finalize().as_bytes()[..4]);
    c
}

impl StateFrame {
    /// The payload of a frame of tag [`TAG_STATE_DELTA`] holding `changed` (keys in
    /// strictly increasing order, at least one), each value a delta against
    /// `base(key)` where that is shorter: `check (4)` then, for each pair, `shared`
    /// (varint: bytes the key shares with the previous key of the frame, all it shares;
    /// 0 for the first) ‖ `suffix_len` (varint) ‖ the key's other bytes ‖ `kind` (u8),
    /// then for kind 0 `len` (varint) ‖ the value, for kind 1 `len` (varint, the
    /// value's) ‖ `block_len` (varint) ‖ the LZ4 block ([`StateValue::Delta`]).
    pub fn encode<'a, 'b>(
        changed: &[(&'a [u8], &'a [u8])],
        base: impl Fn(&[u8]) -> Option<&'b [u8]>,
    ) -> Vec<u8> {
        let mut out = pairs_check(changed.iter().copied()).to_vec();
        let mut prev: &[u8] = &[];
        for &(k, v) in changed {
            let shared = prev.iter().zip(k).take_while(|(a, b)| a == b).count();
            put_varint(&mut out, shared as u64);
            put_varint(&mut out, (k.len() - shared) as u64);
            out.extend_from_slice(&k[shared..]);
            prev = k;
            match StateValue::encode(v, base(k)) {
                StateValue::Full(v) => {
                    out.push(0);
                    put_varint(&mut out, v.len() as u64);
                    out.extend_from_slice(&v);
                }
                StateValue::Delta { len, block } => {
                    out.push(1);
                    put_varint(&mut out, u64::from(len));
                    put_varint(&mut out, block.len() as u64);
                    out.extend_from_slice(&block);
                }
            }
        }
        out
    }

    /// Decode a state frame's payload of tag `tag` ([`TAG_STATE`] or
    /// [`TAG_STATE_DELTA`]), strictly: no pair cut short, at least one pair; in a delta
    /// frame keys strictly increasing, each sharing exactly the prefix it shares with the
    /// one before, lengths in their shortest form, known kinds only.
    pub fn decode(tag: u8, mut b: &[u8]) -> std::result::Result<StateFrame, FormatError> {
        let max = MAX_STATE_LEN as u64;
        let check = if tag == TAG_STATE {
            None
        } else {
            let c: [u8; 4] = take_slice(&mut b, 4)?
                .try_into()
                .map_err(|_| truncated(4, 0))?;
            Some(c)
        };
        let mut pairs: StatePairs = Vec::new();
        while !b.is_empty() {
            if tag == TAG_STATE {
                let k = take_bytes(&mut b)?;
                pairs.push((k, StateValue::Full(take_bytes(&mut b)?)));
                continue;
            }
            let prev: &[u8] = pairs.last().map_or(&[], |(k, _)| k.as_slice());
            let shared = take_varint(&mut b, max)? as usize;
            let suffix_len = take_varint(&mut b, max)? as usize;
            let suffix = take_slice(&mut b, suffix_len)?;
            if shared > prev.len() || (shared < prev.len() && suffix.first() == Some(&prev[shared]))
            {
                return Err(FormatError::invalid(
                    "state frame",
                    "a key that does not share exactly its common prefix with the key before",
                ));
            }
            let key = [&prev[..shared], suffix].concat();
            if !pairs.is_empty() && key.as_slice() <= prev {
                return Err(FormatError::invalid(
                    "state frame",
                    "keys not in strictly increasing order",
                ));
            }
            let kind = take_slice(&mut b, 1)?[0];
            let value = match kind {
                0 => {
                    let len = take_varint(&mut b, max)? as usize;
                    StateValue::Full(take_slice(&mut b, len)?.to_vec())
                }
                1 => {
                    let len = take_varint(&mut b, max)? as u32;
                    let block_len = take_varint(&mut b, max)? as usize;
                    // What `StateValue::encode` writes, and nothing else: one form per value.
                    if block_len + 4 >= len as usize {
                        return Err(FormatError::invalid(
                            "state frame",
                            "a delta no shorter than its value (a value that short is whole)",
                        ));
                    }
                    StateValue::Delta {
                        len,
                        block: take_slice(&mut b, block_len)?.to_vec(),
                    }
                }
                _ => {
                    return Err(FormatError::Invalid {
                        what: "state frame",
                        why: format!("unknown value kind {kind}"),
                    })
                }
            };
            pairs.push((key, value));
        }
        if pairs.is_empty() {
            return Err(FormatError::invalid("state frame", "holds no pair"));
        }
        Ok(StateFrame { check, pairs })
    }

    /// The frame's pairs with every delta decoded against `base(key)`, the key's value
    /// before this frame; refused unless they match the frame's check (a delta decoded
    /// against another previous value than the writer's is never taken for state).
    pub fn resolve<'b>(
        self,
        base: impl Fn(&[u8]) -> Option<&'b [u8]>,
    ) -> std::result::Result<Pairs, FormatError> {
        let mut out = Vec::with_capacity(self.pairs.len());
        // The pairs decoded, in their tag 3 form (what the check hashes), are at most what
        // a state frame holds: a delta frame of 64 MiB could otherwise decode to 16 GiB.
        let mut decoded = 0usize;
        for (k, v) in self.pairs {
            let len = match &v {
                StateValue::Full(v) => v.len(),
                StateValue::Delta { len, .. } => *len as usize,
            };
            decoded += 8 + k.len() + len;
            if decoded > MAX_STATE_LEN {
                return Err(FormatError::invalid(
                    "state frame",
                    "its values decode to more than a state frame holds",
                ));
            }
            let value = v.resolve(base(&k)).map_err(|e| FormatError::Invalid {
                what: "state frame",
                why: format!("key `{}`: {e}", String::from_utf8_lossy(&k)),
            })?;
            out.push((k, value));
        }
        if let Some(check) = self.check {
            if pairs_check(out.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))) != check {
                return Err(FormatError::invalid(
                    "state frame",
                    "its values do not match its check (a delta decoded against another previous value than the writer's)",
                ));
            }
        }
        Ok(out)
    }
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

/// The refusal of a directory in ledger layout 1, or `Ok` when it is not one.
pub fn refuse_old_layout(dir: &Path) -> Result<()> {
    if dir.join(OLD_STORE_DIR).join("db").exists() && !dir.join(LOG_DIR).exists() {
        return Err(Error::OldLayout(dir.to_path_buf()));
    }
    Ok(())
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

struct Current {
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
    /// Read the log of the ledger in `dir`. Refuses layout 1 ([`Error::OldLayout`]).
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

/// fsync a directory (after a segment is created in it).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

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

struct Active {
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
