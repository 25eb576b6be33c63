//! The JSON bodies the daemon sends, as types clients in Rust can deserialize.
//! A successful `POST /v1/decisions` replies with `[Receipt]` ([`tally_ledger::Receipt`]).

use serde::{Deserialize, Serialize};
use tally_ledger::decision::Budget;
use tally_ledger::{Kind, Reason, Status};

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

/// `GET /v1/runs/{run}`: a run's counters.
///
/// The writer cannot decrypt records of past epochs (SPEC 5.4), so the daemon cannot
/// rebuild counters from the store: they cover only decisions appended through this
/// daemon process, from seq [`RunCounters::since_seq`] on. The auditor's `tally handoff`
/// gives the complete picture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCounters {
    /// The run.
    pub run: String,
    /// Counters cover decisions with seq at or after this (the ledger's size when this
    /// daemon started).
    pub since_seq: u64,
    /// Decisions of this run appended since then.
    pub decisions: u64,
    /// The budget from the run's `start` decision, if it was appended since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// `allow` decisions.
    pub allows: u64,
    /// `deny` decisions.
    pub denies: u64,
    /// `outcome` decisions.
    pub outcomes: u64,
    /// Attempts used: `allow` decisions less the slots returned by refunds.
    pub attempts_used: u64,
    /// Attempt slots returned by `refund` decisions (a refund without `slots` returns 1).
    pub attempts_refunded: u64,
    /// Cents reserved by `allow` decisions, less the cents released by refunds.
    pub spend_reserved_cents: u64,
    /// Cents released by `refund` decisions.
    pub spend_released_cents: u64,
    /// Cents settled by `outcome` decisions.
    pub spend_settled_cents: u64,
    /// The run's decision with the highest seq.
    pub last: Option<LastDecision>,
    /// The reason of the run's `stop` decision, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Reason>,
}

/// The last decision of a run that the daemon appended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastDecision {
    /// Its seq.
    pub seq: u64,
    /// Its kind.
    pub kind: Kind,
    /// The writer's `at_ms`, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// Its reason code, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Its outcome status, if an outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}
