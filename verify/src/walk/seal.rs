//! Checkpoints on the walk: each one's signature, size and head against the entries
//! walked, what it vouches for, the end position and the anchors.

use tally_ledger::keys::verify_checkpoint;
use tally_ledger::Checkpoint;

use crate::finding::{Finding, FindingKind};
use crate::report::AnchorStatus;

use super::sealed::Disputed;
use super::{differing, full, Walk};

impl Walk<'_> {
    /// Leave the current position: say how many copies of a checkpoint stood there.
    pub(super) fn end_position(&mut self) {
        if let (Some(i), n) = (self.here.duplicate.take(), self.here.duplicates) {
            if n > 1 {
                if let Some(f) = self.findings.kept.get_mut(i) {
                    f.detail = format!(
                        "{n} more checkpoints of size {} after the first (the ledger keeps one per size: copies were added)",
                        f.seq
                    );
                }
            }
        }
        self.here.duplicates = 0;
        self.here.count = 0;
        self.here.head = None;
        self.here.text = None;
    }

    /// A second stored checkpoint at this position: the store keeps one per size, so it
    /// was added. One finding per position, however many copies.
    fn duplicate_checkpoint(&mut self, n: u64) {
        self.here.duplicates += 1;
        if self.here.duplicates == 1 {
            if let Some(i) = self.findings.next_index() {
                self.here.duplicate = Some(i);
            }
            self.find(
                FindingKind::CheckpointDuplicate,
                n,
                format!(
                    "a second checkpoint of size {n} (the ledger keeps one per size: copies were added)"
                ),
            );
        }
    }

    pub(super) fn checkpoint(&mut self, text: &[u8]) {
        let n = self.chain.next_seq();
        if self.here.text.as_deref() == Some(text) {
            // An exact copy of the checkpoint just read: no need to check it again.
            self.duplicate_checkpoint(n);
            return;
        }
        let cp = match Checkpoint::from_text(text) {
            Ok(cp) => cp,
            Err(e) => {
                self.find(
                    FindingKind::CheckpointMalformed,
                    n,
                    format!("checkpoint after seq {}: {e}", n.saturating_sub(1)),
                );
                return;
            }
        };
        match self.check_seal(&cp, "checkpoint") {
            Ok(()) => self.vouched(n),
            Err((FindingKind::CheckpointHeadMismatch, why))
                if self.chain.last_clean() && self.here.count == 0 && n > 0 =>
            {
                // Validly signed, over another head than the clean entry before it: what
                // follows says which of the two was changed (`Disputed`).
                self.findings.hashes = None;
                self.here.disputed = Some(Disputed {
                    n,
                    entry: self.chain.position() - 1,
                    stored: self.chain.head(),
                    signed: cp.head,
                    mismatch: why,
                });
                self.chain.clear_suspect();
                self.here.text = Some(text.to_vec());
                self.here.count += 1;
                return;
            }
            Err((FindingKind::CheckpointHeadMismatch, _))
                if self
                    .here
                    .disputed
                    .as_ref()
                    .is_some_and(|d| d.signed == cp.head) =>
            {
                // Another valid checkpoint signing the disputed head: a copy (the ledger
                // keeps one per size), and one more witness against the entry.
                self.findings.hashes = None;
                self.here.count += 1;
                self.duplicate_checkpoint(n);
                return;
            }
            Err((kind, why)) => {
                if kind == FindingKind::Fork {
                    // A second valid checkpoint here that disagrees with a disputed one:
                    // the disputed one is the odd one (a fork), not the entry.
                    self.settle(false);
                }
                if kind == FindingKind::CheckpointHeadMismatch {
                    // The entries since the last broken link do not hash to what was
                    // signed: nothing tells which side of that link was changed.
                    self.chain.clear_suspect();
                }
                self.find(kind, cp.size.min(n), why);
                return;
            }
        }
        // Only valid checkpoints count as copies: an invalid one is its own finding.
        self.here.text = Some(text.to_vec());
        self.here.count += 1;
        if self.here.count > 1 {
            self.duplicate_checkpoint(n);
            return;
        }
        self.tree_broken();
        if !self.findings.broken && self.chain.key_mismatch().is_none() {
            // Nothing is sealed under another ledger's key.
            self.sealed.seal(self.ordinal, cp);
        }
    }

    /// Whether the tree has found something: nothing read after its first finding is
    /// sealed (what was sealed since is taken back). Call before sealing a checkpoint.
    fn tree_broken(&mut self) {
        let (first, done) = self.tree.progress();
        self.sealed.settle(first, done);
        if first != u64::MAX {
            self.findings.broken = true;
        }
    }

    /// A valid checkpoint of size `n` signs the chain as read: every entry since the last
    /// broken link is as written, that link included, so the entry before the link is the
    /// one whose bytes were changed (unless it has a finding of its own already).
    pub(super) fn vouched(&mut self, n: u64) {
        let Some(s) = self.chain.take_suspect() else {
            return;
        };
        let (Some(i), true) = (s.finding, s.before_clean) else {
            return;
        };
        let entry = s.link_at - 1;
        let (found, want) = differing(&s.stored, &s.linked);
        self.findings.kept[i] = Finding {
            kind: FindingKind::EntryAltered,
            seq: entry,
            detail: format!(
                "entry {entry} was changed after it was written: its bytes hash to {found}, \
                 but entry {} (sealed by the checkpoint of size {n}) records {want}",
                s.link_at
            ),
            hashes: Some(full(&s.stored, &s.linked)),
        };
    }

    /// Settle a disputed checkpoint: `changed`, the entry before it was changed after it
    /// was sealed (and the walk goes on from the head the checkpoint signs, so the next
    /// entry's link is judged against what was sealed: one changed entry, one finding);
    /// else the checkpoint's head is the odd one.
    pub(super) fn settle(&mut self, changed: bool) {
        let Some(d) = self.here.disputed.take() else {
            return;
        };
        if changed {
            let (found, want) = differing(&d.stored, &d.signed);
            self.findings.hashes = Some(full(&d.stored, &d.signed));
            self.find(
                FindingKind::EntryAltered,
                d.entry,
                format!(
                    "entry {} was changed after it was sealed: its bytes hash to {found}, \
                     but the checkpoint of size {} signs {want}",
                    d.entry, d.n
                ),
            );
            self.chain.resume_from(d.signed);
        } else {
            self.findings.hashes = Some(full(&d.signed, &d.stored));
            self.find(FindingKind::CheckpointHeadMismatch, d.n, d.mismatch);
        }
    }

    /// Check a checkpoint or anchor against the chain at the current position.
    fn check_seal(&mut self, cp: &Checkpoint, what: &str) -> Result<(), (FindingKind, String)> {
        self.check_place(cp, what)?;
        self.check_signature(cp, what)?;
        self.check_head(cp, what)?;
        if cp.wall_ms < self.chain.head_wall() {
            return Err((
                FindingKind::CheckpointTime,
                format!(
                    "{what} time {} ms is before the entry it seals ({} ms)",
                    cp.wall_ms,
                    self.chain.head_wall()
                ),
            ));
        }
        Ok(())
    }

    /// Whether a checkpoint or anchor is of this ledger and of the size read so far.
    fn check_place(&self, cp: &Checkpoint, what: &str) -> Result<(), (FindingKind, String)> {
        let n = self.chain.next_seq();
        if cp.ledger_id != self.chain.ledger_id() {
            return Err((
                FindingKind::CheckpointWrongLedger,
                format!(
                    "{what} belongs to ledger {}, not {}",
                    cp.ledger_id,
                    self.chain.ledger_id()
                ),
            ));
        }
        if cp.size != n {
            return Err((
                FindingKind::CheckpointMisplaced,
                if cp.size > n {
                    format!("{what} seals {} entries but only {n} precede it (entries were removed: truncated)", cp.size)
                } else {
                    format!(
                        "{what} seals {} entries but stands after entry {}",
                        cp.size,
                        n - 1
                    )
                },
            ));
        }
        Ok(())
    }

    /// Whether a checkpoint or anchor is validly signed by the key of the epoch of the
    /// entry it seals.
    fn check_signature(&self, cp: &Checkpoint, what: &str) -> Result<(), (FindingKind, String)> {
        let n = self.chain.next_seq();
        let key = self.chain.epoch_keys().get(cp.epoch as usize).copied();
        if cp.epoch != self.chain.head_epoch() {
            let signed = match key {
                Some(k) if verify_checkpoint(cp, &k).is_ok() => "validly signed",
                _ => "claiming to be signed",
            };
            return Err((
                FindingKind::CheckpointWrongEpoch,
                format!(
                    "{what} is {signed} by epoch {}'s key, but entry {} is in epoch {} (re-sealed with another epoch's key)",
                    cp.epoch,
                    n - 1,
                    self.chain.head_epoch()
                ),
            ));
        }
        let Some(key) = key else {
            return Err((
                FindingKind::CheckpointBadSignature,
                format!(
                    "{what} claims epoch {} but the ledger has no key for it here",
                    cp.epoch
                ),
            ));
        };
        if let Err(e) = verify_checkpoint(cp, &key) {
            return Err((
                FindingKind::CheckpointBadSignature,
                format!("{what} of epoch {}: {e}", cp.epoch),
            ));
        }
        Ok(())
    }

    /// Whether a checkpoint or anchor signs the head the chain hashes to here, and the
    /// same head as the others at this size.
    fn check_head(&mut self, cp: &Checkpoint, what: &str) -> Result<(), (FindingKind, String)> {
        let n = self.chain.next_seq();
        // The first head seen at this size (a checkpoint's or an anchor's) is the one
        // others must match: a constant-time check, however many checkpoints follow.
        match self.here.head {
            Some(h) if h != cp.head => {
                return Err((
                    FindingKind::Fork,
                    format!("two validly signed checkpoints of size {n} with different heads"),
                ));
            }
            Some(_) => {}
            None => self.here.head = Some(cp.head),
        }
        if cp.head != self.chain.head() {
            let (found, want) = differing(&cp.head, &self.chain.head());
            // Taken by the finding the caller makes of this error.
            self.findings.hashes = Some(full(&cp.head, &self.chain.head()));
            return Err((
                FindingKind::CheckpointHeadMismatch,
                format!("{what} head {found} is not the chain's hash {want} at size {n}"),
            ));
        }
        Ok(())
    }

    pub(super) fn check_anchors(&mut self) {
        self.end_position();
        let n = self.chain.next_seq();
        let mut i = 0;
        while i < self.anchors.len() {
            if self.anchors[i].0.size == n && self.anchors[i].1.is_none() {
                let anchor = self.anchors[i].0.clone();
                let status = match self.check_seal(&anchor, "anchor") {
                    Ok(()) => AnchorStatus::Matched,
                    Err((kind, why)) => {
                        let kind = match kind {
                            FindingKind::CheckpointHeadMismatch | FindingKind::Fork => {
                                FindingKind::Fork
                            }
                            _ => FindingKind::AnchorInvalid,
                        };
                        self.find(kind, n, why);
                        AnchorStatus::Mismatch
                    }
                };
                self.anchors[i].1 = Some(status);
                // The anchor's head stays in `here.head` so a stored checkpoint of the
                // same size with another head is reported as a fork.
            }
            i += 1;
        }
    }

    /// Anchors the walk never met: each a finding.
    pub(super) fn missing_anchors(&mut self) {
        let n = self.chain.position();
        for i in 0..self.anchors.len() {
            if self.anchors[i].1.is_none() {
                let a = self.anchors[i].0.clone();
                let why = if a.ledger_id != self.chain.ledger_id() {
                    format!(
                        "anchor belongs to ledger {}, not {}",
                        a.ledger_id,
                        self.chain.ledger_id()
                    )
                } else {
                    format!(
                        "anchor seals {} entries but the ledger has {n}: it was truncated or rolled back",
                        a.size
                    )
                };
                let kind = if a.ledger_id != self.chain.ledger_id() {
                    FindingKind::AnchorInvalid
                } else {
                    FindingKind::AnchorMissing
                };
                self.find(kind, n.min(a.size), why);
                self.anchors[i].1 = Some(AnchorStatus::Missing);
            }
        }
    }
}
