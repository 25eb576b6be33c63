//! Every error reply of the daemon's sockets: `{"error": {"code", "message", "field"?,
//! "line"?, "column"?}}`.

use serde::{Deserialize, Serialize};

/// Every error reply: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// One typed error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `unknown_field`, `body_too_large`,
    /// `rate_limited`, `ledger_unavailable` (docs/DAEMON.md lists them all).
    pub code: String,
    /// What a person should read.
    pub message: String,
    /// The field path at fault (`budget.attempts`, `kind`), when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// 1-based line of the request body at fault (NDJSON batches, JSON syntax errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column within that line, for JSON syntax and type errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
}
