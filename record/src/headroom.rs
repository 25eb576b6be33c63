//! How close a run is to each of its limits, as every view shows it (the live page,
//! `tally top`, `tally runs`, `GET /v1/runs`); the policy core computes it.

use serde::{Deserialize, Serialize};

use crate::LimitKey;

/// One dimension's headroom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headroom {
    /// The dimension (`attempts`, `spend_nanos`, `side_effects`, `deadline_ms`, `polls`,
    /// `depth`, `rate`).
    pub dimension: LimitKey,
    /// Used.
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// Used per mille of the limit, 0..=1000.
    pub permille: u32,
}

/// How close a run is to its limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Closeness {
    /// The nearest limit's dimension (`None`: the run has no limit).
    pub nearest: Option<LimitKey>,
    /// The nearest limit's per mille used, 0..=1000.
    pub permille: u32,
    /// Every dimension, nearest first (ties by dimension name).
    pub each: Vec<Headroom>,
}
