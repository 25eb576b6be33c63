//! What the verifier hands to the analyses: one decrypted, validated decision and where
//! it sits in the chain.

use tally_ledger::Decision;

/// A decision as the auditor sees it after verification and decryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The entry's seq in the chain.
    pub seq: u64,
    /// The ledger's wall time for the entry, ms since the Unix epoch.
    pub wall_ms: u64,
    /// The key epoch it was written in.
    pub epoch: u32,
    /// The decision (raw args were never stored; `args_digest` stands for them).
    pub decision: Decision,
}

impl Event {
    /// The time reports reason with: the writer's `at_ms` where given, else wall time.
    /// (docs/FORMAT.md: agents may append a whole run in one batch.)
    pub fn time_ms(&self) -> u64 {
        self.decision.at_ms.unwrap_or(self.wall_ms)
    }
}
