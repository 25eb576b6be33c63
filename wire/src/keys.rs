//! The operator socket's keys (docs/KEYS.md): `POST /v1/keys`, `GET /v1/keys`,
//! `POST /v1/keys/{id}/revoke`, and a run's token again (`GET /v1/runs/{run}/token`).

use serde::{Deserialize, Serialize};

/// How the name of every run a key starts begins: reserved for them, so an agent cannot
/// start one of those names on the agent socket and have a key's calls refused.
pub const KEY_RUN_PREFIX: &str = "key-";

/// One key as it is listed: never the key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyInfo {
    /// Its id (16 lowercase hex digits; the key's first part after `tlk_`).
    pub id: String,
    /// The uid whose runs it starts (its principal).
    pub principal: u32,
    /// The operator's label, as given (escape it before showing it).
    #[serde(default)]
    pub label: Option<String>,
    /// When it was made, ms since the epoch.
    pub created_ms: u64,
    /// How long a call without `x-tally-task` continues the key's current run, ms.
    pub run_window_ms: u64,
    /// When it was revoked, ms since the epoch; `None`: live.
    #[serde(default)]
    pub revoked_ms: Option<u64>,
    /// Reserved or settled by the runs it started this UTC day, nanodollars.
    #[serde(default)]
    pub spend_today_nanos: u64,
}

/// `POST /v1/keys`: a key for a principal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyCreate {
    /// The uid whose runs it starts.
    pub principal: u32,
    /// A label for the operator (at most 200 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// How long a call without `x-tally-task` continues the key's current run, ms
    /// (default a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_window_ms: Option<u64>,
}

/// The answer to `POST /v1/keys`: the key, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyCreated {
    /// The key (`tlk_ID.SECRET`): tally keeps only a MAC of it.
    pub key: String,
    /// Its listing.
    pub info: KeyInfo,
}

/// The answer to `GET /v1/runs/{run}/token`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunToken {
    /// The run.
    pub run: String,
    /// Its token, as its start answered it.
    pub token: String,
}
