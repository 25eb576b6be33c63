//! The budget dimensions a run's `limits` name (`attempts`, `spend_nanos`, ...): one
//! enum, so no crate spells a dimension's key by hand.

use serde::{Deserialize, Serialize};

/// A budget dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Attempts.
    Attempts,
    /// Spend, nanodollars (10⁻⁹ USD).
    SpendNanos,
    /// Side effects.
    SideEffects,
    /// Polls of one remote operation.
    Polls,
    /// Run time, ms.
    DeadlineMs,
    /// Chain depth.
    Depth,
}

impl Dimension {
    /// The dimension's name as it appears in JSON and in `limits` snapshots.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Attempts => "attempts",
            Dimension::SpendNanos => "spend_nanos",
            Dimension::SideEffects => "side_effects",
            Dimension::Polls => "polls",
            Dimension::DeadlineMs => "deadline_ms",
            Dimension::Depth => "depth",
        }
    }
}
