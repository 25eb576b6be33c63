//! Notifications (`tally serve --notify URL`; docs/APPROVALS.md, "Notifications"): the
//! JSON body the daemon POSTs to each receiver when an approval request is made,
//! answered or expires. docs/schemas/notify.json is its schema.

use serde::{Deserialize, Serialize};

use crate::ApprovalRequest;

/// What happened to the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NotifyKind {
    /// The gate recorded a new approval request.
    Requested,
    /// An approver approved or denied it (the request's `state` says which).
    Answered,
    /// Its run's deadline passed before anyone answered.
    Expired,
}

impl NotifyKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyKind::Requested => "requested",
            NotifyKind::Answered => "answered",
            NotifyKind::Expired => "expired",
        }
    }
}

/// One notification: the event, the request as the operator socket lists it at that
/// moment, when, and a plain-words `text` a Slack incoming webhook (or any chat bridge)
/// shows as it is. In `text`, every string the agent chose is stripped of control
/// characters, ANSI escapes and bidi overrides, has Slack's `&`, `<`, `>` escaped and is
/// cut to a bound; `request` carries the agent's strings as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notification {
    /// What happened.
    pub event: NotifyKind,
    /// The request.
    pub request: ApprovalRequest,
    /// When the daemon saw it happen, ms since the Unix epoch on its clock.
    pub at_ms: u64,
    /// The event in plain words (Slack's `text`).
    pub text: String,
}
