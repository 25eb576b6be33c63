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
    /// Reserved or settled by the runs it started this UTC day, nanodollars: every
    /// one, stopped runs too.
    #[serde(default)]
    pub spend_today_nanos: u64,
    /// What its runs may spend together per UTC day, nanodollars; `None`: only its
    /// principal's budget bounds them.
    #[serde(default)]
    pub budget_per_day_nanos: Option<u64>,
    /// How many runs it may start per UTC day; `None`: no limit of its own.
    #[serde(default)]
    pub runs_per_day: Option<u64>,
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
    /// What its runs may spend together per UTC day, nanodollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_per_day_nanos: Option<u64>,
    /// How many runs it may start per UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_per_day: Option<u64>,
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

/// What a call with a key refused by the key's own limits per UTC day was refused by:
/// answered in the refusal's body (`tally.key` in Anthropic's dialect, `error.key` in
/// OpenAI's), nanodollars.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyDayRefused {
    /// The key's id.
    pub id: String,
    /// Its budget per day, if the call did not fit it.
    #[serde(default)]
    pub budget_per_day_nanos: Option<u64>,
    /// Settled by its calls today.
    #[serde(default)]
    pub settled_today_nanos: Option<u64>,
    /// Reserved by its calls today and not settled.
    #[serde(default)]
    pub held_today_nanos: Option<u64>,
    /// What the refused call would have reserved.
    #[serde(default)]
    pub needed_nanos: Option<u64>,
    /// Its runs per day, if the run's start did not fit them.
    #[serde(default)]
    pub runs_per_day: Option<u64>,
    /// The runs it started today.
    #[serde(default)]
    pub runs_today: Option<u64>,
}
