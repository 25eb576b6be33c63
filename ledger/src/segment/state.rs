//! State frames (tags 3 and 4): the gate's derived state in the log, its byte format
//! (docs/FORMAT.md) and strict decoding.

use std::io::Write;

use crate::error::FormatError;

use super::{MAX_DELTA_BASE, MAX_STATE_LEN, TAG_STATE};

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
pub(super) fn write_pairs<'a>(
    out: &mut impl Write,
    pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) {
    for (k, v) in pairs {
        // Neither a Vec nor a hasher fails to take bytes.
        let _ = out.write_all(&(k.len() as u32).to_be_bytes());
        let _ = out.write_all(k);
        let _ = out.write_all(&(v.len() as u32).to_be_bytes());
        let _ = out.write_all(v);
    }
}

/// The shortest value worth a delta. LZ4 writes any input under 13 bytes (its `MFLIMIT`
/// of 12, plus one) as literals, one byte longer than the input, so trying a shorter one
/// only costs the compressor's table (a run link's 8-byte seq, in every commit group).
const MIN_DELTA_VALUE: usize = 13;

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
            if value.len() >= MIN_DELTA_VALUE {
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
pub(super) fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

pub(super) fn truncated(need: usize, have: usize) -> FormatError {
    FormatError::Truncated {
        what: "state frame",
        need,
        have,
    }
}

/// Read a varint of at most `max`, strictly: the shortest form only (no final zero
/// byte after the first).
pub(super) fn take_varint(b: &mut &[u8], max: u64) -> std::result::Result<u64, FormatError> {
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

pub(super) fn take_slice<'a>(
    b: &mut &'a [u8],
    len: usize,
) -> std::result::Result<&'a [u8], FormatError> {
    let v = b.get(..len).ok_or(truncated(len, b.len()))?;
    *b = &b[len..];
    Ok(v)
}

pub(super) fn take_bytes(b: &mut &[u8]) -> std::result::Result<Vec<u8>, FormatError> {
    let len: [u8; 4] = b
        .get(..4)
        .and_then(|l| l.try_into().ok())
        .ok_or(truncated(4, b.len()))?;
    *b = &b[4..];
    let len = u32::from_be_bytes(len) as usize;
    Ok(take_slice(b, len)?.to_vec())
}

/// The first 4 bytes of BLAKE3 of `pairs` as [`encode_state`] writes them.
pub(super) fn pairs_check<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> [u8; 4] {
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
