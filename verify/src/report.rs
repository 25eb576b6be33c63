//! The verification report: verdict, what is sealed, anchors, findings, tail.
//! Its JSON form is the stable schema documented in `docs/VERIFY.md`.

use std::fmt::Write as _;

use serde::Serialize;
use tally_ledger::Checkpoint;

use crate::finding::Finding;
use crate::text::plural;
pub use crate::tree::AnchorStatus;

/// The one-word outcome, and the exit code it maps to (docs/CLI.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every entry verified and sealed; every anchor matched.
    Intact,
    /// Tampering or inconsistency found.
    Tampered,
    /// What is there is intact, but evidence is incomplete (unsealed tail, an export cut
    /// short wherever the cut falls, or a required anchor missing).
    Incomplete,
}

/// How the ledger ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Tail {
    /// Every entry is sealed by a checkpoint.
    Complete,
    /// `count` entries from seq `from` are not covered by any valid checkpoint.
    Unsealed {
        /// First unsealed seq.
        from: u64,
        /// How many.
        count: u64,
    },
    /// The export ends between frames without its end marker.
    CutClean {
        /// Where the file ends.
        offset: u64,
    },
    /// The export ends inside a frame: cut mid-record (or a torn write).
    Torn {
        /// Where the torn frame starts.
        offset: u64,
        /// Bytes the frame still needed.
        missing: u64,
    },
    /// The export ends with an end marker the log key did not sign (`ledger.pub` names a
    /// log key): a copy cut at a checkpoint and given a new end marker looks the same.
    UnsignedEnd,
}

/// `ledger.pub` is another ledger's key: the ledger ids differ (checked before any
/// signature, as minisign checks key ids). A user's mistake, not tampering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyMismatch {
    /// The ledger `ledger.pub` belongs to.
    pub key_ledger_id: String,
    /// The ledger that was read (its genesis).
    pub ledger_id: String,
}

/// One anchor's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AnchorResult {
    /// Entries the anchor seals.
    pub size: u64,
    /// Its head hash.
    pub head: String,
    /// What the verifier found.
    pub status: AnchorStatus,
}

/// A checkpoint, as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointSummary {
    /// Entries sealed.
    pub size: u64,
    /// Head hash.
    pub head: String,
    /// Signing epoch.
    pub epoch: u32,
    /// Wall time, ms since the Unix epoch.
    pub time_ms: u64,
}

impl From<&Checkpoint> for CheckpointSummary {
    fn from(c: &Checkpoint) -> CheckpointSummary {
        CheckpointSummary {
            size: c.size,
            head: c.head.to_string(),
            epoch: c.epoch,
            time_ms: c.wall_ms,
        }
    }
}

/// Everything `tally verify` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The ledger id (from `ledger.pub`).
    pub ledger_id: String,
    /// Entries read (genesis, epoch certificates and decisions).
    pub entries: u64,
    /// Decision entries among them.
    pub decisions: u64,
    /// Key epochs seen (genesis is epoch 0).
    pub epochs: u32,
    /// Entries `0..sealed` are verified and covered by a valid checkpoint, with no finding
    /// before it.
    pub sealed: u64,
    /// The checkpoint that seals them.
    pub last_checkpoint: Option<CheckpointSummary>,
    /// Each anchor's result.
    pub anchors: Vec<AnchorResult>,
    /// Whether an anchor was required.
    pub require_anchor: bool,
    /// Decisions decrypted and valid (with an auditor key).
    pub decrypted: Option<u64>,
    /// The auditor key given is not this ledger's recipient (nothing was decrypted).
    pub auditor_key_mismatch: bool,
    /// `ledger.pub` belongs to another ledger; the rest of the report judges the ledger
    /// against its own genesis, and its verdict is never intact.
    pub key_mismatch: Option<KeyMismatch>,
    /// What is wrong, in seq order.
    pub findings: Vec<Finding>,
    /// Findings beyond the kept ones.
    pub findings_omitted: u64,
    /// How the ledger ends.
    pub tail: Tail,
    /// Writes a crash tore in the log's segments (read from a ledger directory): bytes
    /// after a segment's last checkpoint, never sealed, kept in place; the log resumes
    /// after them. They hold nothing the chain needs, so they leave the verdict alone.
    pub torn_writes: Vec<TornWrite>,
    /// The RFC 6962 Merkle root (base64) of the entries read.
    pub tree_root: String,
    /// Each C2SP checkpoint anchor's (or witness view's) result.
    pub tree_anchors: Vec<crate::tree::TreeAnchorResult>,
    /// With a witness policy: what its quorum's cosignatures cover.
    pub witnessed: Option<crate::tree::Witnessed>,
}

/// Bytes of a log segment after its last complete checkpoint (docs/FORMAT.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TornWrite {
    /// The segment's number (its file is `log/<20 digits>.seg`).
    pub segment: u64,
    /// Where the unsealed bytes start in it.
    pub offset: u64,
    /// How many bytes there are.
    pub bytes: u64,
    /// The seq the log resumes at after them.
    pub before_seq: u64,
}

impl Report {
    /// The verdict.
    pub fn verdict(&self) -> Verdict {
        if !self.findings.is_empty() || self.findings_omitted > 0 || self.key_mismatch.is_some() {
            Verdict::Tampered
        } else if !matches!(self.tail, Tail::Complete)
            || self.anchor_required_and_missing()
            || self.witnessed.as_ref().is_some_and(|w| !w.quorum)
        {
            Verdict::Incomplete
        } else {
            Verdict::Intact
        }
    }

    fn anchor_required_and_missing(&self) -> bool {
        self.require_anchor
            && !self
                .anchors
                .iter()
                .any(|a| a.status == AnchorStatus::Matched)
    }

    /// The JSON document `tally verify --json` prints (schema `docs/schemas/verify.json`):
    /// the report's fields with `version` and `verdict` first.
    pub fn to_json(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Doc<'a> {
            version: u32,
            verdict: Verdict,
            #[serde(flatten)]
            report: &'a Report,
        }
        serde_json::to_value(Doc {
            version: crate::analysis::REPORT_VERSION,
            verdict: self.verdict(),
            report: self,
        })
        .unwrap_or_default()
    }

    /// The first finding, if any.
    pub fn first_break(&self) -> Option<&Finding> {
        self.findings.first()
    }

    /// The human-readable report: a verdict line first, then details and findings.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.verdict_text(&mut out);
        self.seal_text(&mut out);
        self.anchors_text(&mut out);
        self.witness_text(&mut out);
        self.damage_text(&mut out);
        self.findings_text(&mut out);
        out
    }

    /// The verdict line: intact, not verified, tampered, or incomplete and why.
    fn verdict_text(&self, out: &mut String) {
        let last = self.entries.saturating_sub(1);
        match self.verdict() {
            Verdict::Intact => {
                let _ = writeln!(
                    out,
                    "INTACT: {} (seq 0..={last}) verified and sealed",
                    match self.entries {
                        1 => "the 1 entry".to_owned(),
                        n => format!("all {n} entries"),
                    }
                );
            }
            Verdict::Tampered => match (&self.key_mismatch, self.findings.first()) {
                (Some(m), _) => {
                    let _ = writeln!(
                        out,
                        "NOT VERIFIED: ledger.pub is the key of ledger {}, but this is ledger {}: give this ledger's ledger.pub",
                        m.key_ledger_id, m.ledger_id
                    );
                }
                (None, Some(f)) => {
                    let _ = writeln!(
                        out,
                        "TAMPERED: first bad seq {}: {} ({})",
                        f.seq,
                        crate::text::shown(&f.detail),
                        f.kind
                    );
                }
                (None, None) => {
                    let _ = writeln!(
                        out,
                        "TAMPERED: {} beyond the kept ones",
                        plural(self.findings_omitted, "finding", "findings")
                    );
                }
            },
            Verdict::Incomplete => self.incomplete_text(out),
        }
    }

    /// The INCOMPLETE verdict line: what is sealed, why the rest is not, and what was
    /// read past the seal.
    fn incomplete_text(&self, out: &mut String) {
        let why = match self.tail {
            Tail::Unsealed { from, count } => format!(
                "{} (seq {from}..={}) {} NOT sealed by any checkpoint",
                plural(count, "entry", "entries"),
                from + count - 1,
                if count == 1 { "is" } else { "are" }
            ),
            Tail::CutClean { offset } => format!(
                "the export ends at byte {offset} without its end marker (cut short, between frames)"
            ),
            Tail::Torn { offset, missing } => format!(
                "the export ends inside the frame at byte {offset}, {} short (cut short, or a torn write)",
                plural(missing, "byte", "bytes")
            ),
            Tail::UnsignedEnd => "the export's end marker is not signed by the log key (a copy cut at a checkpoint looks the same; export it again with this build)".into(),
            Tail::Complete if self.witnessed.as_ref().is_some_and(|w| !w.quorum) => {
                "no checkpoint in it is cosigned by the witness policy's quorum".into()
            }
            _ => "no matching anchor was given, and one is required (--require-anchor)".into(),
        };
        let sealed = match self.sealed {
            0 => "nothing is sealed".to_string(),
            s => format!(
                "seq 0..={} verified and sealed (last sealed seq {})",
                s - 1,
                s - 1
            ),
        };
        let read = match self.tail {
            Tail::CutClean { .. } | Tail::Torn { .. } if self.entries > self.sealed => {
                format!(
                    "; seq {}..={} read but not sealed",
                    self.sealed,
                    self.entries - 1
                )
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "INCOMPLETE: {sealed}; {why}{read}");
    }

    /// The ledger, its entries, and how far they are sealed.
    fn seal_text(&self, out: &mut String) {
        let _ = writeln!(out, "  ledger      {}", self.ledger_id);
        let _ = writeln!(
            out,
            "  entries     {} ({}, {})",
            self.entries,
            plural(self.decisions, "decision", "decisions"),
            plural(self.epochs.into(), "key epoch", "key epochs")
        );
        match &self.last_checkpoint {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "  sealed      seq 0..={} by checkpoint size {} epoch {} head {}",
                    c.size - 1,
                    c.size,
                    c.epoch,
                    &c.head[..16]
                );
            }
            None => {
                let _ = writeln!(out, "  sealed      nothing");
            }
        }
        if let Tail::Unsealed { from, count } = self.tail {
            let _ = writeln!(
                out,
                "  unsealed    seq {from}..={} ({})",
                from + count - 1,
                plural(count, "entry", "entries")
            );
        }
    }

    /// The anchors given, head and tree, each with how it matched.
    fn anchors_text(&self, out: &mut String) {
        for a in &self.anchors {
            let _ = writeln!(
                out,
                "  anchor      size {} head {}: {:?}",
                a.size,
                &a.head[..16],
                a.status
            );
        }
        for a in &self.tree_anchors {
            let _ = writeln!(
                out,
                "  anchor      {} size {} root {}: {:?}",
                crate::text::shown(&a.source),
                a.size,
                a.root,
                a.status
            );
        }
    }

    /// How far the witness policy's quorum cosigned the ledger, if a policy was given.
    fn witness_text(&self, out: &mut String) {
        let Some(w) = &self.witnessed else { return };
        if w.quorum {
            let _ = writeln!(
                out,
                "  witnessed   seq 0..={} by a quorum ({}) at root {}",
                w.size.saturating_sub(1),
                w.witnesses.join(", "),
                w.root.as_deref().unwrap_or("")
            );
            if w.size < self.entries {
                let _ = writeln!(
                    out,
                    "  unwitnessed seq {}..={} (sealed, not yet cosigned)",
                    w.size,
                    self.entries - 1
                );
            }
        } else {
            let _ = writeln!(
                out,
                "  witnessed   nothing: no checkpoint cosigned by the policy's quorum"
            );
        }
    }

    /// Torn writes, a missing required anchor, and what the auditor key decrypted.
    fn damage_text(&self, out: &mut String) {
        for t in &self.torn_writes {
            let _ = writeln!(
                out,
                "  torn write  segment {} at byte {}: {} after its last checkpoint, never sealed (a crash during a write; kept in place, the log resumes at seq {})",
                t.segment,
                t.offset,
                plural(t.bytes, "byte", "bytes"),
                t.before_seq
            );
        }
        if self.require_anchor && self.anchors.is_empty() {
            let _ = writeln!(out, "  anchor      none given, but --require-anchor is set");
        }
        if self.auditor_key_mismatch {
            let why = if self.findings.is_empty() {
                "the auditor key is not this ledger's recipient"
            } else {
                "the auditor key is not the recipient the genesis names (see the findings)"
            };
            let _ = writeln!(out, "  decrypted   nothing: {why}");
        } else if let Some(d) = self.decrypted {
            let _ = writeln!(
                out,
                "  decrypted   {d} of {}, each a valid record",
                plural(self.decisions, "decision", "decisions")
            );
        }
    }

    /// The findings kept, and how many more were left off.
    fn findings_text(&self, out: &mut String) {
        if self.findings.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "findings ({}):",
            self.findings.len() as u64 + self.findings_omitted
        );
        for f in &self.findings {
            let _ = writeln!(
                out,
                "  seq {:<8} {:<26} {}",
                f.seq,
                f.kind.as_str(),
                crate::text::shown(&f.detail)
            );
        }
        if self.findings_omitted > 0 {
            let _ = writeln!(out, "  ... and {} more", self.findings_omitted);
        }
    }
}
