//! The daemon's own answers, beside the gate's: its health.

use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok`: the ledger accepts appends.
    pub status: String,
    /// The ledger id, hex.
    pub ledger_id: String,
    /// Entries sealed by the latest checkpoint.
    pub size: u64,
    /// The current key epoch.
    pub epoch: u32,
    /// Append requests holding an in-flight slot right now.
    pub in_flight: usize,
}
