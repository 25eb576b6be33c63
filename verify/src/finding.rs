//! Findings: what the verifier found wrong, each naming the entry (seq) where it is.

use std::fmt;

use serde::Serialize;

/// What kind of break a finding is. Stable snake_case names in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    /// An entry that does not decode (strict format rules).
    Malformed,
    /// An entry of another ledger (spliced in).
    WrongLedger,
    /// An entry whose seq is not the next one (gap, duplicate or reorder).
    SeqBreak,
    /// An entry whose previous-hash is not the hash of the entry before it.
    BrokenLink,
    /// An entry whose bytes no longer hash to what the chain recorded for it (the next
    /// entry's previous-hash, sealed by a valid checkpoint, or the head a valid checkpoint
    /// right after it signs): it was changed after it was written. Found without the
    /// auditor key.
    EntryAltered,
    /// Genesis missing, not matching `ledger.pub`, or badly signed.
    BadGenesis,
    /// An entry whose epoch breaks continuity.
    EpochBreak,
    /// An epoch certificate not signed by the previous epoch's key.
    BadEpochCertificate,
    /// The ledger's wall time goes backwards.
    TimeRegression,
    /// A checkpoint that does not parse.
    CheckpointMalformed,
    /// A checkpoint of another ledger.
    CheckpointWrongLedger,
    /// A checkpoint whose key id or signature is wrong for its epoch.
    CheckpointBadSignature,
    /// A checkpoint signed with another epoch's key than the one in force at its size
    /// (e.g. old records re-sealed with a later key).
    CheckpointWrongEpoch,
    /// A checkpoint whose head is not the chain's hash at its size.
    CheckpointHeadMismatch,
    /// Two checkpoints (or a checkpoint and an anchor) of the same size with different heads.
    Fork,
    /// A second checkpoint of the same size and head (the ledger keeps one per size, so
    /// copies were added; one finding per position, however many copies).
    CheckpointDuplicate,
    /// A checkpoint at a position other than right after the entry it seals, or sealing
    /// entries that are not present (the ledger was truncated).
    CheckpointMisplaced,
    /// A checkpoint dated before the entries it seals.
    CheckpointTime,
    /// An anchor the ledger does not contain: truncation or rollback.
    AnchorMissing,
    /// An anchor that is not a valid checkpoint of this ledger.
    AnchorInvalid,
    /// The export's framing is broken (unknown tag, bad counts, trailing bytes).
    ExportMalformed,
    /// The store could not be read.
    StoreError,
    /// A decision that does not decrypt with the auditor key.
    Undecryptable,
    /// A decrypted decision that breaks docs/FORMAT.md or is not canonical.
    InvalidDecision,
    /// A cosigned checkpoint that does not hold: a known witness's (or the log key's)
    /// signature that does not verify, a root that is not the entries' Merkle root, or
    /// one not standing right after the checkpoint of its size.
    CosignatureInvalid,
    /// The export's signed end names other counts or another Merkle root than the export
    /// holds, or its signature does not verify.
    ExportEndMismatch,
    /// A decision whose `prev_seq` is not the seq of its run's previous decision.
    RunLinkBroken,
}

impl FindingKind {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Malformed => "malformed",
            FindingKind::WrongLedger => "wrong_ledger",
            FindingKind::SeqBreak => "seq_break",
            FindingKind::BrokenLink => "broken_link",
            FindingKind::EntryAltered => "entry_altered",
            FindingKind::BadGenesis => "bad_genesis",
            FindingKind::EpochBreak => "epoch_break",
            FindingKind::BadEpochCertificate => "bad_epoch_certificate",
            FindingKind::TimeRegression => "time_regression",
            FindingKind::CheckpointMalformed => "checkpoint_malformed",
            FindingKind::CheckpointWrongLedger => "checkpoint_wrong_ledger",
            FindingKind::CheckpointBadSignature => "checkpoint_bad_signature",
            FindingKind::CheckpointWrongEpoch => "checkpoint_wrong_epoch",
            FindingKind::CheckpointHeadMismatch => "checkpoint_head_mismatch",
            FindingKind::Fork => "fork",
            FindingKind::CheckpointDuplicate => "checkpoint_duplicate",
            FindingKind::CheckpointMisplaced => "checkpoint_misplaced",
            FindingKind::CheckpointTime => "checkpoint_time",
            FindingKind::AnchorMissing => "anchor_missing",
            FindingKind::AnchorInvalid => "anchor_invalid",
            FindingKind::ExportMalformed => "export_malformed",
            FindingKind::StoreError => "store_error",
            FindingKind::Undecryptable => "undecryptable",
            FindingKind::InvalidDecision => "invalid_decision",
            FindingKind::CosignatureInvalid => "cosignature_invalid",
            FindingKind::ExportEndMismatch => "export_end_mismatch",
            FindingKind::RunLinkBroken => "run_link_broken",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What kind of break.
    pub kind: FindingKind,
    /// Where it is: the position of the first bad entry in the ledger as read (equal to
    /// its seq while the chain is intact; a duplicate or inserted entry is named by where
    /// it stands, so a finding never falls inside the range reported as sealed). For a
    /// checkpoint or anchor: its size. For a torn or malformed export: the position the
    /// next entry would have had.
    pub seq: u64,
    /// Why, in words (hashes shortened as far as they still differ).
    pub detail: String,
    /// For a hash that is not what the chain gives (`broken_link`, `entry_altered`,
    /// `checkpoint_head_mismatch`, a forking anchor): both hashes in full.
    pub hashes: Option<Hashes>,
}

/// Two hashes that should be equal, in full (64 hex digits each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hashes {
    /// The hash the entry or checkpoint states.
    pub found: String,
    /// The hash the chain gives there.
    pub expected: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seq {}: {}: {}",
            self.seq,
            self.kind,
            crate::text::shown(&self.detail)
        )
    }
}
