//! What the verifier hands to the analyses: one decrypted, validated decision and where
//! it sits in the chain.

use std::cmp::Ordering;
use std::fmt;

use serde::{Serialize, Serializer};
use tally_ledger::Decision;

/// Where a decision sits: its seq in its ledger, and, in a merged audit of several
/// ledgers, which ledger and its place in the merged order (docs/FLEET.md).
///
/// Seqs compare by that place: in one ledger, by seq. A seq in one ledger prints (and
/// serializes) as the number; in a merged audit as `L:SEQ`, the `L`-th ledger given
/// (from 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Seq {
    /// Its place in the order the audit reads decisions (its seq, in one ledger).
    pub order: u64,
    /// The ledger it is in: 0 in a one-ledger audit, else from 1 in the order given.
    pub ledger: u16,
    /// Its seq in that ledger.
    pub seq: u64,
}

impl Seq {
    /// A seq of a one-ledger audit.
    pub fn single(seq: u64) -> Seq {
        Seq {
            order: seq,
            ledger: 0,
            seq,
        }
    }
}

impl PartialEq for Seq {
    fn eq(&self, other: &Seq) -> bool {
        self.order == other.order
    }
}

impl Eq for Seq {}

impl PartialOrd for Seq {
    fn partial_cmp(&self, other: &Seq) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Seq {
    fn cmp(&self, other: &Seq) -> Ordering {
        self.order.cmp(&other.order)
    }
}

impl std::hash::Hash for Seq {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.order.hash(h);
    }
}

/// A one-ledger seq equals its number.
impl PartialEq<u64> for Seq {
    fn eq(&self, other: &u64) -> bool {
        self.ledger == 0 && self.seq == *other
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ledger {
            0 => write!(f, "{}", self.seq),
            l => write!(f, "{l}:{}", self.seq),
        }
    }
}

impl Serialize for Seq {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.ledger {
            0 => s.serialize_u64(self.seq),
            _ => s.collect_str(self),
        }
    }
}

/// A decision as the auditor sees it after verification and decryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Where it sits.
    pub seq: Seq,
    /// The ledger's wall time for the entry, ms since the Unix epoch.
    pub wall_ms: u64,
    /// The key epoch it was written in.
    pub epoch: u32,
    /// The decision (raw args were never stored; `args_digest` stands for them), boxed:
    /// a decision is about a kilobyte, and an event is handed on a few times.
    pub decision: Box<Decision>,
}

impl Event {
    /// The time reports reason with: the writer's `at_ms` where given, else wall time.
    /// (docs/FORMAT.md: agents may append a whole run in one batch.)
    pub fn time_ms(&self) -> u64 {
        self.decision.at_ms.unwrap_or(self.wall_ms)
    }
}
