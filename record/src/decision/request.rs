//! An approval request: the context a `require_approval` deny carries (docs/FORMAT.md,
//! "Approval requests"; docs/APPROVALS.md). The policy core computes it with the
//! decision; `tally verify`'s replay computes it again and compares.

use serde::{Deserialize, Serialize};

use super::Scope;
use crate::codes::Reason;
use crate::strict::present;

/// What a human needs to answer a `require_approval`: which request it is, the limit
/// that was reached, what granting exactly this call would cost, and where the run
/// stood. The call itself, the standing (`limits`) and who asked (`uid`, `worker`,
/// `credential`) are the deny record's own fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The request's id: 16 lowercase hex characters (docs/FORMAT.md).
    pub id: String,
    /// The refusal a grant would lift.
    pub cause: Reason,
    /// The scope an approval needs to let exactly this call through.
    pub cost: Scope,
    /// Calls the run was allowed before this one.
    pub calls: u64,
    /// Run time left before the run's deadline, ms (none: the run has no deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub left_ms: Option<u64>,
}
