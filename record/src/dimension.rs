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

/// A `limits` dimension's name as people read it in a table or a sentence: `spend` for
/// `spend_nanos`, `deadline` for `deadline_ms`, `owner's spend` for
/// `principal_spend_nanos`; a name this build does not know, as it is.
pub fn label(dimension: &str) -> &str {
    match dimension {
        "spend_nanos" | "spend_cents" => "spend",
        "deadline_ms" => "deadline",
        "side_effects" => "side effects",
        "principal_runs" => "owner's runs",
        "principal_attempts" => "owner's attempts",
        "principal_spend_nanos" => "owner's spend",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn every_limit_dimension_has_a_label_without_units_or_underscores() {
        for d in crate::decision::LIMIT_DIMENSIONS {
            let l = label(d);
            assert!(
                !l.contains('_') && !l.ends_with("nanos") && !l.ends_with("ms"),
                "{d}: {l}"
            );
        }
        assert_eq!(label("spend_nanos"), "spend");
        assert_eq!(label("deadline_ms"), "deadline");
        assert_eq!(label("tokens"), "tokens");
    }
}
