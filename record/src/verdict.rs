//! The gate's verdict on one intended call: what the policy core decides and what the
//! gate answers.

use serde::{Deserialize, Serialize};

/// The gate's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Make the call.
    Allow,
    /// Do not make it.
    Deny,
    /// Do not make it; a human may approve it.
    RequireApproval,
}
