//! Each entry on the walk: its header, seq and hash link, the genesis, epoch certificates
//! and their data keys, and (with the auditor key) the decision it holds, queued for
//! decryption.

use tally_ledger::format::{Entry, EntryType, Header};
use tally_ledger::keys::verify_signature;
use tally_ledger::tlog::merkle::leaf_hash;

use crate::finding::FindingKind;

use super::chain::Suspect;
use super::{differing, full, Walk};

impl Walk<'_> {
    pub(super) fn entry(&mut self, bytes: Vec<u8>) {
        let (at, before_clean) = self.chain.advance();
        // The entry's bytes are hashed once for the tree and (layout 3) the chain.
        let leaf = leaf_hash(&bytes);
        self.tree.leaf(self.ordinal, leaf);
        let hash = self.chain.rule().hash_with_leaf(&bytes, &leaf);
        let expected = self.chain.next_seq();
        let entry = match Entry::decode(&bytes) {
            Ok(e) => e,
            Err(e) => {
                self.settle(true);
                self.find(
                    FindingKind::Malformed,
                    at,
                    format!("entry does not decode: {e}"),
                );
                // Resynchronise on the stored bytes so one bad entry is one finding.
                self.chain.resync(hash);
                return;
            }
        };
        let h = entry.header;
        // No second checkpoint at the disputed one's size says otherwise: its signature
        // stands, and the entry before it was changed. This entry's link is then judged
        // against the head it signs (an attacker without the key who rewrote this link
        // too, re-chaining, is named here as well).
        self.settle(true);
        // This entry's own findings from here on.
        let found_before = self.found();
        self.check_header(&h, at, expected, before_clean, found_before);
        match h.entry_type {
            EntryType::Genesis => self.genesis(&entry, at),
            EntryType::Epoch => self.epoch_cert(&entry, at),
            EntryType::Decision => {
                self.chain.count_decision();
                if self.chain.epoch_keys().is_empty() {
                    self.find(FindingKind::BadGenesis, at, "decision before any genesis");
                } else if h.epoch != self.chain.head_epoch() {
                    self.find(
                        FindingKind::EpochBreak,
                        at,
                        format!(
                            "decision claims epoch {} but epoch {} is in force",
                            h.epoch,
                            self.chain.head_epoch()
                        ),
                    );
                }
            }
            _ => self.find(FindingKind::Malformed, at, "unknown entry type"),
        }
        let clean = self.found() == found_before && h.seq == expected;
        self.chain.link(hash, h.seq, h.wall_ms, clean);
        if self.decrypt.on && h.entry_type == EntryType::Decision {
            self.queue(&h, at, bytes);
        }
        self.check_anchors();
    }

    /// The header against the chain: its ledger, seq, link and wall time.
    fn check_header(
        &mut self,
        h: &Header,
        at: u64,
        expected: u64,
        before_clean: bool,
        found_before: u64,
    ) {
        if at == 0 && h.entry_type == EntryType::Genesis && h.ledger_id != self.chain.ledger_id() {
            // The ids are compared before any signature (as minisign compares key ids):
            // this is another ledger's key, a user's mistake, not tampering. The rest is
            // judged against its own genesis, so the report still says what it holds.
            self.chain.adopt(h.ledger_id);
        } else if h.ledger_id != self.chain.ledger_id() {
            self.find(
                FindingKind::WrongLedger,
                at,
                format!(
                    "entry belongs to ledger {}, not {} (spliced from another ledger)",
                    h.ledger_id,
                    self.chain.ledger_id()
                ),
            );
        }
        if h.seq != expected {
            let what = if h.seq < expected {
                "duplicated or reordered"
            } else {
                "entries missing"
            };
            self.find(
                FindingKind::SeqBreak,
                at,
                format!("expected seq {expected}, found seq {} ({what})", h.seq),
            );
        }
        if h.prev_hash != self.chain.head() {
            // Whose bytes changed, this entry's link or the entry before, a valid
            // checkpoint after this entry tells (see `Suspect`); until then it is the link.
            let from_here = self.found() == found_before && h.seq == expected && at > 0;
            let (found, want) = differing(&h.prev_hash, &self.chain.head());
            self.findings.hashes = Some(full(&h.prev_hash, &self.chain.head()));
            let index = self.findings.next_index();
            self.find(
                FindingKind::BrokenLink,
                at,
                format!("previous-hash {found} is not the hash {want} of the entry before"),
            );
            self.chain.suspect(from_here.then_some(Suspect {
                link_at: at,
                finding: index,
                before_clean,
                stored: self.chain.head(),
                linked: h.prev_hash,
            }));
        }
        if h.wall_ms < self.chain.head_wall() {
            self.find(
                FindingKind::TimeRegression,
                at,
                format!(
                    "wall time {} ms is before the previous entry's {} ms",
                    h.wall_ms,
                    self.chain.head_wall()
                ),
            );
        }
    }

    /// A decision entry queued for decryption, under its epoch's data key.
    fn queue(&mut self, h: &Header, at: u64, bytes: Vec<u8>) {
        if !self.decrypt.queue(h, bytes) {
            self.find(
                FindingKind::Undecryptable,
                at,
                format!(
                    "no data key for epoch {}: its certificate is missing or invalid",
                    h.epoch
                ),
            );
        }
    }

    pub(super) fn genesis(&mut self, entry: &Entry<'_>, seq: u64) {
        let Some(g) = entry.genesis() else { return };
        if !self.chain.epoch_keys().is_empty() {
            self.find(FindingKind::BadGenesis, seq, "a second genesis entry");
            return;
        }
        if self.chain.foreign() {
            // Already reported: ledger.pub belongs to another ledger.
        } else if g.verifying_key != self.opts.public.verifying_key {
            self.find(
                FindingKind::BadGenesis,
                seq,
                format!(
                    "genesis key {} is not the key in ledger.pub {} (wrong verification key, or another ledger)",
                    hex::encode(tally_ledger::format::key_id(&g.verifying_key)),
                    hex::encode(tally_ledger::format::key_id(&self.opts.public.verifying_key))
                ),
            );
        } else if verify_signature(
            &g.verifying_key,
            &entry.signed_message(),
            &g.signature,
            "genesis",
        )
        .is_err()
        {
            self.find(
                FindingKind::BadGenesis,
                seq,
                "genesis signature does not verify",
            );
        }
        self.chain.add_key(g.verifying_key);
        if let Some(auditor) = &self.opts.auditor {
            if auditor.public() != g.recipient {
                self.decrypt.mismatch();
            } else {
                self.add_data_key(0, &g.ephemeral, seq);
            }
        }
    }

    fn epoch_cert(&mut self, entry: &Entry<'_>, at: u64) {
        let h = entry.header;
        let Some(c) = entry.epoch_cert() else { return };
        let current = self.chain.head_epoch();
        if self.chain.epoch_keys().is_empty() {
            self.find(
                FindingKind::BadGenesis,
                at,
                "epoch certificate before any genesis",
            );
            return;
        }
        if current.checked_add(1) != Some(h.epoch) {
            // Not adopted: a claimed epoch never sizes anything (one flipped bit must not
            // make the verifier reserve a key per epoch up to 2^32).
            self.find(
                FindingKind::EpochBreak,
                at,
                format!("certificate for epoch {} follows epoch {current}", h.epoch),
            );
            return;
        }
        let signer = self.chain.epoch_keys()[self.chain.epoch_keys().len() - 1];
        if verify_signature(
            &signer,
            &entry.signed_message(),
            &c.signature,
            "epoch certificate",
        )
        .is_err()
        {
            self.find(
                FindingKind::BadEpochCertificate,
                at,
                format!(
                    "epoch {} key is not certified by epoch {current}'s key",
                    h.epoch
                ),
            );
        }
        // Walk on with the new key (already reported if uncertified), so later entries
        // are judged on their own.
        self.chain.enter_epoch(h.epoch, c.verifying_key);
        if self.decrypt.on {
            self.add_data_key(h.epoch, &c.ephemeral, at);
        }
    }

    fn add_data_key(&mut self, epoch: u32, ephemeral: &[u8; 32], seq: u64) {
        let Some(auditor) = &self.opts.auditor else {
            return;
        };
        match auditor.epoch_key(ephemeral, self.chain.ledger_id(), epoch) {
            Ok(k) => self.decrypt.add_key(epoch, k),
            Err(e) => self.find(
                FindingKind::Undecryptable,
                seq,
                format!("epoch {epoch} data key: {e}"),
            ),
        }
    }
}
