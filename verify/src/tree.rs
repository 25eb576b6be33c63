//! The walk's Merkle-tree checks: the RFC 6962 tree of the entries read (O(log n)
//! memory), C2SP checkpoint anchors (and witnesses' views) matched by root at their size,
//! the cosigned checkpoints a ledger or export carries judged under a witness policy,
//! and the signed end of an export.

use std::collections::BTreeSet;

use serde::Serialize;
use tally_ledger::export::SignedEnd;
use tally_ledger::tlog::merkle::{Frontier, TreeHash};
use tally_ledger::tlog::note::{b64, Note, TreeHead, Vkey};
use tally_ledger::tlog::policy::Policy;
use tally_ledger::LedgerId;

use crate::finding::FindingKind;

/// Whether an anchor was found in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnchorStatus {
    /// The ledger contains exactly this checkpoint.
    Matched,
    /// The ledger reaches the anchor's size but disagrees with it.
    Mismatch,
    /// The ledger is shorter than the anchor.
    Missing,
}

/// A C2SP checkpoint the ledger must contain: an auditor's anchor, or a witness's view.
#[derive(Clone, Debug)]
pub struct TreeAnchor {
    /// Where it came from (`anchor FILE`, `witness w1`), for the report.
    pub source: String,
    /// The checkpoint.
    pub note: Note,
}

/// What a tree anchor came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeAnchorResult {
    /// Where it came from.
    pub source: String,
    /// Its size.
    pub size: u64,
    /// Its root (base64, as in the checkpoint).
    pub root: String,
    /// `matched`, `mismatch` or `missing`.
    pub status: AnchorStatus,
}

/// What the witnesses' cosignatures cover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Witnessed {
    /// Entries `0..size` are in the largest checkpoint a quorum cosigned (0: none).
    pub size: u64,
    /// Its root (base64), if any.
    pub root: Option<String>,
    /// The policy's witnesses whose valid cosignatures it carries.
    pub witnesses: Vec<String>,
    /// Whether the policy's quorum cosigned any checkpoint of the ledger.
    pub quorum: bool,
}

/// The tree the walk keeps, and what it checks against it.
pub(crate) struct TreeCheck {
    frontier: Frontier,
    origin: String,
    log_key: Option<Vkey>,
    policy: Option<Policy>,
    anchors: Vec<(TreeHead, TreeAnchor, Option<AnchorStatus>)>,
    pub(crate) witnessed: Option<Witnessed>,
}

/// A finding the tree checks make: kind, seq, detail.
pub(crate) type TreeFinding = (FindingKind, u64, String);

impl TreeCheck {
    pub(crate) fn new(
        ledger: LedgerId,
        log_key: Option<Vkey>,
        policy: Option<Policy>,
        anchors: &[TreeAnchor],
        out: &mut Vec<TreeFinding>,
    ) -> TreeCheck {
        let origin = tally_ledger::tlog::origin(ledger);
        let log_key = log_key.or_else(|| {
            policy
                .as_ref()
                .and_then(|p| p.log(&origin))
                .map(|l| l.vkey.clone())
        });
        let mut list = Vec::new();
        for a in anchors {
            match TreeHead::parse(&a.note.text) {
                Ok(h) if h.origin == origin => list.push((h, a.clone(), None)),
                Ok(h) => out.push((
                    FindingKind::AnchorInvalid,
                    0,
                    format!(
                        "{}: a checkpoint of {}, not of {origin}",
                        a.source, h.origin
                    ),
                )),
                Err(e) => out.push((FindingKind::AnchorInvalid, 0, format!("{}: {e}", a.source))),
            }
        }
        list.sort_by_key(|(h, _, _)| h.size);
        let witnessed = policy.as_ref().map(|_| Witnessed {
            size: 0,
            root: None,
            witnesses: Vec::new(),
            quorum: false,
        });
        TreeCheck {
            frontier: Frontier::new(),
            origin,
            log_key,
            policy,
            anchors: list,
            witnessed,
        }
    }

    /// The log key checkpoints are checked with, if known.
    pub(crate) fn has_log_key(&self) -> bool {
        self.log_key.is_some()
    }

    /// Add the next leaf (an entry's leaf hash) and check the anchors of the new size.
    pub(crate) fn push(&mut self, leaf: TreeHash, out: &mut Vec<TreeFinding>) {
        self.frontier.push(leaf);
        let size = self.frontier.size();
        if !self
            .anchors
            .iter()
            .any(|(h, _, s)| h.size == size && s.is_none())
        {
            return;
        }
        let root = self.frontier.root();
        for (h, a, status) in &mut self.anchors {
            if h.size != size || status.is_some() {
                continue;
            }
            if let Some(k) = &self.log_key {
                if let Err(e) = k.verify(&a.note) {
                    out.push((
                        FindingKind::AnchorInvalid,
                        size,
                        format!("{}: {e}", a.source),
                    ));
                    *status = Some(AnchorStatus::Mismatch);
                    continue;
                }
            }
            if h.root == root {
                *status = Some(AnchorStatus::Matched);
            } else {
                out.push((
                    FindingKind::Fork,
                    size,
                    format!(
                        "{} holds root {} at size {size}, but the entries' Merkle root there is {} (a fork: the ledger is not the one it saw)",
                        a.source,
                        b64(&h.root),
                        b64(&root)
                    ),
                ));
                *status = Some(AnchorStatus::Mismatch);
            }
        }
    }

    /// A cosigned checkpoint read right after the checkpoint of size `at`.
    pub(crate) fn cosigned(&mut self, bytes: &[u8], at: u64, out: &mut Vec<TreeFinding>) {
        let bad = |why: String| (FindingKind::CosignatureInvalid, at, why);
        let note = match Note::parse(bytes) {
            Ok(n) => n,
            Err(e) => return out.push(bad(format!("cosigned checkpoint: {e}"))),
        };
        let head = match TreeHead::parse(&note.text) {
            Ok(h) => h,
            Err(e) => return out.push(bad(format!("cosigned checkpoint: {e}"))),
        };
        if head.origin != self.origin {
            return out.push(bad(format!(
                "cosigned checkpoint of {}, not of {}",
                head.origin, self.origin
            )));
        }
        if head.size != at || head.size != self.frontier.size() {
            return out.push(bad(format!(
                "a cosigned checkpoint of size {} stands after entry {}",
                head.size,
                at.saturating_sub(1)
            )));
        }
        let root = self.frontier.root();
        if head.root != root {
            return out.push(bad(format!(
                "the cosigned checkpoint of size {at} has root {}, but the entries' Merkle root is {} (a fork)",
                b64(&head.root),
                b64(&root)
            )));
        }
        if let Some(k) = &self.log_key {
            if let Err(e) = k.verify(&note) {
                return out.push(bad(format!("cosigned checkpoint of size {at}: {e}")));
            }
        }
        let Some(policy) = &self.policy else { return };
        let mut cosigned = BTreeSet::new();
        for (i, w) in policy.witnesses.iter().enumerate() {
            let Some(sig) = note.sig_of(&w.vkey.name, w.vkey.key_id()) else {
                continue;
            };
            match w.vkey.verify_cosignature(&note.text, sig) {
                Ok(_) => {
                    cosigned.insert(i);
                }
                Err(e) => out.push(bad(format!("witness {}: {e}", w.name))),
            }
        }
        if policy.quorum_met(&cosigned) {
            if let Some(w) = &mut self.witnessed {
                if at >= w.size {
                    *w = Witnessed {
                        size: at,
                        root: Some(b64(&root)),
                        witnesses: cosigned
                            .iter()
                            .map(|i| policy.witnesses[*i].name.clone())
                            .collect(),
                        quorum: true,
                    };
                }
            }
        }
    }

    /// The export's signed end, once read: it must name what the export holds. With
    /// `altered` (an entry was already named as changed after it was written) a root that
    /// differs while the counts agree is that change, and not found again.
    pub(crate) fn signed_end(
        &self,
        ledger: LedgerId,
        end: &SignedEnd,
        checkpoints: u64,
        altered: bool,
        out: &mut Vec<TreeFinding>,
    ) {
        let size = self.frontier.size();
        let Some(k) = &self.log_key else { return };
        let msg = SignedEnd::message(ledger, end.entries, end.checkpoints, &end.root);
        if tally_ledger::keys::verify_signature(&k.public, &msg, &end.signature, "export end")
            .is_err()
        {
            out.push((
                FindingKind::ExportEndMismatch,
                size,
                "the export's signed end does not verify under the log key".into(),
            ));
            return;
        }
        let root = self.frontier.root();
        let counts = end.entries == size && end.checkpoints == checkpoints;
        if !counts || (end.root != root && !altered) {
            out.push((
                FindingKind::ExportEndMismatch,
                size,
                format!(
                    "the signed end names {} entries, {} checkpoints and root {}; the export holds {size}, {checkpoints} and root {}",
                    end.entries,
                    end.checkpoints,
                    b64(&end.root),
                    b64(&root)
                ),
            ));
        }
    }

    /// At the end: anchors beyond the ledger's end.
    pub(crate) fn finish(&mut self, out: &mut Vec<TreeFinding>) -> Vec<TreeAnchorResult> {
        let size = self.frontier.size();
        let mut results = Vec::new();
        for (h, a, status) in &mut self.anchors {
            if status.is_none() {
                out.push((
                    FindingKind::AnchorMissing,
                    size.min(h.size),
                    format!(
                        "{} holds size {}, but the ledger has {size} entries: it was truncated or rolled back",
                        a.source, h.size
                    ),
                ));
                *status = Some(AnchorStatus::Missing);
            }
            results.push(TreeAnchorResult {
                source: a.source.clone(),
                size: h.size,
                root: b64(&h.root),
                status: status.unwrap_or(AnchorStatus::Missing),
            });
        }
        results
    }

    /// The root of the entries read so far.
    pub(crate) fn root(&self) -> TreeHash {
        self.frontier.root()
    }
}
