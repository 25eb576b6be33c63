//! The walk's own findings: each kept with the ordinal of the frame it was made at (the
//! tree's are merged in at the end: `treefeed`), at most `max_findings` of them, the
//! rest counted.

use crate::finding::{Finding, FindingKind, Hashes};

/// The findings the walk made so far.
pub(super) struct Findings {
    /// Most findings kept.
    max: usize,
    pub(super) kept: Vec<Finding>,
    /// The ordinal of the frame each kept finding was made at.
    pub(super) ordinals: Vec<u64>,
    /// Findings made past `max`.
    pub(super) omitted: u64,
    /// Something was found (by the walk or the tree): nothing read after it is sealed.
    pub(super) broken: bool,
    /// The full hashes of the mismatch about to be reported (taken by the next finding).
    pub(super) hashes: Option<Hashes>,
}

impl Findings {
    pub(super) fn new(max: usize) -> Findings {
        Findings {
            max,
            kept: Vec::new(),
            ordinals: Vec::new(),
            omitted: 0,
            broken: false,
            hashes: None,
        }
    }

    /// A finding made at the frame `ordinal`, with the hashes set for it (if any).
    pub(super) fn find(&mut self, ordinal: u64, kind: FindingKind, seq: u64, detail: String) {
        self.broken = true;
        if self.kept.len() < self.max {
            self.kept.push(Finding {
                kind,
                seq,
                detail,
                hashes: self.hashes.take(),
            });
            self.ordinals.push(ordinal);
        } else {
            self.omitted += 1;
        }
        self.hashes = None;
    }

    /// Findings made so far, kept or counted.
    pub(super) fn found(&self) -> u64 {
        self.kept.len() as u64 + self.omitted
    }

    /// The index the next finding gets, if it is kept.
    pub(super) fn next_index(&self) -> Option<usize> {
        (self.kept.len() < self.max).then_some(self.kept.len())
    }
}
