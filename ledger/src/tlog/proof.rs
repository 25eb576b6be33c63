//! Proof files: C2SP tlog-proof (c2sp.org/tlog-proof@v1) for one entry, a run bundle
//! (several tlog-proofs against one checkpoint, one after another), and the consistency
//! proof in the form of a C2SP tlog-witness `add-checkpoint` body.
//!
//! In a tally proof the `extra` line carries the entry's exact stored bytes (the leaf
//! data), so the leaf hash is computed, never taken on trust.

use super::merkle::TreeHash;
use super::note::{b64, b64_decode, Note, NoteError};
use crate::format::parse_decimal;

/// The first line of a tlog-proof.
pub const PROOF_HEADER: &str = "c2sp.org/tlog-proof@v1";
/// Most hashes a proof line list may hold (a tree of 2^63 leaves needs 63; one more for
/// a consistency proof's seed).
pub const MAX_PROOF_HASHES: usize = 64;

fn malformed(what: &'static str, why: impl Into<String>) -> NoteError {
    NoteError::Malformed {
        what,
        why: why.into(),
    }
}

/// One tlog-proof.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlogProof {
    /// The `extra` data (a tally proof: the entry's stored bytes).
    pub extra: Option<Vec<u8>>,
    /// The leaf index (the entry's seq).
    pub index: u64,
    /// The inclusion proof, from the leaf's sibling up.
    pub proof: Vec<TreeHash>,
    /// The checkpoint, verbatim (with its signatures and cosignatures).
    pub checkpoint: Note,
}

fn hash_line(line: &str, what: &'static str) -> Result<TreeHash, NoteError> {
    b64_decode(line, what)?
        .as_slice()
        .try_into()
        .map_err(|_| malformed(what, "a proof hash is not 32 bytes"))
}

/// Lines of `text`, each without its newline, refusing a last line without one.
struct Lines<'a> {
    rest: &'a str,
}

impl<'a> Lines<'a> {
    fn next(&mut self, what: &'static str) -> Result<&'a str, NoteError> {
        let i = self
            .rest
            .find('\n')
            .ok_or_else(|| malformed(what, "ends inside a line (no final newline)"))?;
        let line = &self.rest[..i];
        self.rest = &self.rest[i + 1..];
        Ok(line)
    }

    fn peek(&self) -> Option<&'a str> {
        self.rest
            .split('\n')
            .next()
            .filter(|_| !self.rest.is_empty())
    }
}

/// Read a note (text, blank line, signature lines) from `lines`: the signature lines
/// end at the end of the input or at a line that is not one.
fn take_note(lines: &mut Lines<'_>, what: &'static str) -> Result<Note, NoteError> {
    let start = lines.rest;
    let mut len = 0;
    loop {
        let l = lines.next(what)?;
        len += l.len() + 1;
        if l.is_empty() {
            break;
        }
    }
    let mut sigs = 0;
    while let Some(l) = lines.peek() {
        if !l.starts_with('\u{2014}') {
            break;
        }
        let l = lines.next(what)?;
        len += l.len() + 1;
        sigs += 1;
    }
    if sigs == 0 {
        return Err(malformed(what, "the checkpoint has no signature"));
    }
    Note::parse(&start.as_bytes()[..len])
}

impl TlogProof {
    /// The proof's text.
    pub fn to_text(&self) -> String {
        let mut out = format!("{PROOF_HEADER}\n");
        if let Some(e) = &self.extra {
            out.push_str(&format!("extra {}\n", b64(e)));
        }
        out.push_str(&format!("index {}\n", self.index));
        for h in &self.proof {
            out.push_str(&b64(h));
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.checkpoint.to_text());
        out
    }

    /// Parse one proof, strictly, and nothing after it.
    pub fn parse(text: &str) -> Result<TlogProof, NoteError> {
        let mut lines = Lines { rest: text };
        let p = TlogProof::take(&mut lines)?;
        if !lines.rest.is_empty() {
            return Err(malformed("tlog-proof", "bytes after the checkpoint"));
        }
        Ok(p)
    }

    /// Parse a run bundle: one or more proofs, one after another, all against the same
    /// checkpoint (byte for byte).
    pub fn parse_bundle(text: &str) -> Result<Vec<TlogProof>, NoteError> {
        let mut lines = Lines { rest: text };
        let mut out: Vec<TlogProof> = Vec::new();
        while !lines.rest.is_empty() {
            let p = TlogProof::take(&mut lines)?;
            if let Some(first) = out.first() {
                if first.checkpoint != p.checkpoint {
                    return Err(malformed(
                        "run proof",
                        "its proofs are not all against one checkpoint",
                    ));
                }
            }
            out.push(p);
        }
        if out.is_empty() {
            return Err(malformed("run proof", "holds no proof"));
        }
        Ok(out)
    }

    fn take(lines: &mut Lines<'_>) -> Result<TlogProof, NoteError> {
        const WHAT: &str = "tlog-proof";
        if lines.next(WHAT)? != PROOF_HEADER {
            return Err(malformed(
                WHAT,
                format!("does not start with `{PROOF_HEADER}`"),
            ));
        }
        let mut line = lines.next(WHAT)?;
        let mut extra = None;
        if let Some(e) = line.strip_prefix("extra ") {
            extra = Some(b64_decode(e, WHAT)?);
            line = lines.next(WHAT)?;
        }
        let index = line
            .strip_prefix("index ")
            .ok_or_else(|| malformed(WHAT, "expected an `index` line"))?;
        let index =
            parse_decimal(index, "tlog-proof index").map_err(|e| malformed(WHAT, e.to_string()))?;
        let mut proof = Vec::new();
        loop {
            let l = lines.next(WHAT)?;
            if l.is_empty() {
                break;
            }
            if proof.len() == MAX_PROOF_HASHES {
                return Err(malformed(WHAT, "too many proof hashes"));
            }
            proof.push(hash_line(l, WHAT)?);
        }
        let checkpoint = take_note(lines, WHAT)?;
        Ok(TlogProof {
            extra,
            index,
            proof,
            checkpoint,
        })
    }
}

/// A consistency proof, in the form of a tlog-witness `add-checkpoint` body: the old
/// size, the proof, a blank line, the new checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsistencyProof {
    /// The old tree's size.
    pub old: u64,
    /// The RFC 6962 consistency proof from `old` to the checkpoint's size.
    pub proof: Vec<TreeHash>,
    /// The new checkpoint.
    pub checkpoint: Note,
}

/// Most consistency proof lines tlog-witness lets a client send.
pub const MAX_CONSISTENCY_LINES: usize = 63;

impl ConsistencyProof {
    /// The body's text.
    pub fn to_text(&self) -> String {
        let mut out = format!("old {}\n", self.old);
        for h in &self.proof {
            out.push_str(&b64(h));
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.checkpoint.to_text());
        out
    }

    /// Parse a body strictly: canonical decimal, at most 63 proof lines, one note, and
    /// nothing after it.
    pub fn parse(text: &str) -> Result<ConsistencyProof, NoteError> {
        const WHAT: &str = "add-checkpoint body";
        let mut lines = Lines { rest: text };
        let old = lines
            .next(WHAT)?
            .strip_prefix("old ")
            .ok_or_else(|| malformed(WHAT, "expected `old <size>` first"))?;
        let old = parse_decimal(old, "old size").map_err(|e| malformed(WHAT, e.to_string()))?;
        let mut proof = Vec::new();
        loop {
            let l = lines.next(WHAT)?;
            if l.is_empty() {
                break;
            }
            if proof.len() == MAX_CONSISTENCY_LINES {
                return Err(malformed(WHAT, "more than 63 consistency proof lines"));
            }
            proof.push(hash_line(l, WHAT)?);
        }
        let checkpoint = take_note(&mut lines, WHAT)?;
        if !lines.rest.is_empty() {
            return Err(malformed(WHAT, "bytes after the checkpoint"));
        }
        Ok(ConsistencyProof {
            old,
            proof,
            checkpoint,
        })
    }
}
