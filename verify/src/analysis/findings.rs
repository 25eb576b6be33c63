//! Consistency audit: the policy core's verdicts on a ledger's records, each at the
//! record that draws it. The audit judges nothing itself: every finding is an
//! [`Inconsistency`] that [`tally_policy::judge`] returned while the one fold applied
//! the record, the judgement the gate refuses by.

use serde::Serialize;
use tally_policy::Inconsistency;

use crate::event::Seq;

/// One inconsistency, at the record that shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditFinding {
    /// The record's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// What is wrong: the core's verdict (`kind` and its facts).
    #[serde(flatten)]
    pub kind: Inconsistency,
}
