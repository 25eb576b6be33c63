//! Approval requests on the operator socket (`GET /v1/approvals`,
//! `GET /v1/approvals/{id}`; docs/APPROVALS.md): each `require_approval` the gate
//! recorded, with the context a human answers it from, and its state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::decision::{Limit, Scope};
use tally_record::{Effect, LimitKey, Reason};

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestState {
    /// Nobody has answered it; the run is live and before its deadline.
    Pending,
    /// An approver granted its scope.
    Approved,
    /// An approver refused it.
    Denied,
    /// The run's deadline passed before anyone answered.
    Expired,
    /// The run stopped before anyone answered.
    Moot,
}

impl RequestState {
    /// Every state, in the order a listing shows them.
    pub const ALL: &'static [RequestState] = &[
        RequestState::Pending,
        RequestState::Approved,
        RequestState::Denied,
        RequestState::Expired,
        RequestState::Moot,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Pending => "pending",
            RequestState::Approved => "approved",
            RequestState::Denied => "denied",
            RequestState::Expired => "expired",
            RequestState::Moot => "moot",
        }
    }
}

/// One approval request: the refused call, what granting it would cost, where its run
/// stood, who asked, and where the request stands now. Every text in it but `id` was
/// chosen by the agent: escape and bound it before showing it to anyone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// The request's id (16 lowercase hex characters): what `tally approve` and
    /// `tally deny` name.
    pub id: String,
    /// Where it stands.
    pub state: RequestState,
    /// The run.
    pub run: String,
    /// The ledger seq of the `deny` record that is the request.
    pub seq: u64,
    /// The run time it was refused at, ms.
    pub at_ms: u64,
    /// The refused call's tool.
    pub tool: String,
    /// Its logical operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Its side-effect class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Its destination (target or upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// BLAKE3 of its arguments' canonical JSON, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
    /// The bounded preview of its arguments the agent gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_preview: Option<String>,
    /// `approval_required`.
    pub reason: Reason,
    /// The refusal a grant would lift.
    pub cause: Reason,
    /// The scope an approval needs to let exactly this call through.
    pub cost: Scope,
    /// Every dimension of the run, used and limit, when it was refused.
    pub limits: BTreeMap<LimitKey, Limit>,
    /// Calls the run was allowed before this one.
    pub calls: u64,
    /// Run time left before the run's deadline when it was refused, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_ms: Option<u64>,
    /// Run time left before it expires, ms, now (pending requests of runs with a
    /// deadline only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// The Unix uid that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The worker that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The credential the run is under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Who answered it (approved or denied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    /// The approver's note with the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
