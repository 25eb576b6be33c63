//! The budget dimensions a run's `limits` name (`attempts`, `spend_nanos`, ...): one
//! file, so no crate spells a dimension's key by hand. [`Dimension`] is a dimension of a
//! run's own budget; [`LimitKey`] is a key of a `limits` snapshot, which names those and
//! more (the owner's shared limits, the rate, the cents of records before nanodollars).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// A key of a `limits` snapshot (in a record, on every wire): a dimension and its
/// `{used, limit}`. Written as its snake_case name. A name this build does not know
/// reads as [`LimitKey::Unknown`], kept as written: the record's validation refuses it
/// in a stored decision (`limits`: unknown dimension), and a view shows it as it is.
///
/// Keys compare, order and hash by their names, so a map of them iterates, and is
/// written, in the byte order of the names (canonical JSON), and looks up by `&str`.
#[derive(Clone, Debug)]
pub enum LimitKey {
    /// Attempts.
    Attempts,
    /// Run time, ms.
    DeadlineMs,
    /// Spend, cents: records written before nanodollars (read as `spend_nanos`).
    SpendCents,
    /// Spend, nanodollars (10⁻⁹ USD).
    SpendNanos,
    /// Side effects.
    SideEffects,
    /// Polls of one remote operation.
    Polls,
    /// Chain depth.
    Depth,
    /// Calls per window.
    Rate,
    /// The owner's runs at once.
    PrincipalRuns,
    /// The owner's attempts, over all its runs.
    PrincipalAttempts,
    /// The owner's spend, nanodollars, over all its runs.
    PrincipalSpendNanos,
    /// A name this build does not know, as written.
    Unknown(Box<str>),
}

impl LimitKey {
    /// Every key this build knows, in the byte order of their names.
    pub const KNOWN: [LimitKey; 11] = [
        LimitKey::Attempts,
        LimitKey::DeadlineMs,
        LimitKey::Depth,
        LimitKey::Polls,
        LimitKey::PrincipalAttempts,
        LimitKey::PrincipalRuns,
        LimitKey::PrincipalSpendNanos,
        LimitKey::Rate,
        LimitKey::SideEffects,
        LimitKey::SpendCents,
        LimitKey::SpendNanos,
    ];

    /// Why a `limits` snapshot naming a key this build does not know is refused.
    pub(crate) const UNKNOWN_WHY: &'static str = "unknown dimension (known: attempts, deadline_ms, spend_cents, spend_nanos, side_effects, polls, depth, rate, principal_runs, principal_attempts, principal_spend_nanos)";

    /// The key of a budget dimension.
    pub const fn of(dimension: Dimension) -> LimitKey {
        match dimension {
            Dimension::Attempts => LimitKey::Attempts,
            Dimension::SpendNanos => LimitKey::SpendNanos,
            Dimension::SideEffects => LimitKey::SideEffects,
            Dimension::Polls => LimitKey::Polls,
            Dimension::DeadlineMs => LimitKey::DeadlineMs,
            Dimension::Depth => LimitKey::Depth,
        }
    }

    /// The key named `name`: a known one, or [`LimitKey::Unknown`].
    pub fn from_name(name: &str) -> LimitKey {
        match name {
            "attempts" => LimitKey::Attempts,
            "deadline_ms" => LimitKey::DeadlineMs,
            "spend_cents" => LimitKey::SpendCents,
            "spend_nanos" => LimitKey::SpendNanos,
            "side_effects" => LimitKey::SideEffects,
            "polls" => LimitKey::Polls,
            "depth" => LimitKey::Depth,
            "rate" => LimitKey::Rate,
            "principal_runs" => LimitKey::PrincipalRuns,
            "principal_attempts" => LimitKey::PrincipalAttempts,
            "principal_spend_nanos" => LimitKey::PrincipalSpendNanos,
            other => LimitKey::Unknown(other.into()),
        }
    }

    /// The key's name as it appears in JSON.
    pub fn as_str(&self) -> &str {
        match self {
            LimitKey::Attempts => "attempts",
            LimitKey::DeadlineMs => "deadline_ms",
            LimitKey::SpendCents => "spend_cents",
            LimitKey::SpendNanos => "spend_nanos",
            LimitKey::SideEffects => "side_effects",
            LimitKey::Polls => "polls",
            LimitKey::Depth => "depth",
            LimitKey::Rate => "rate",
            LimitKey::PrincipalRuns => "principal_runs",
            LimitKey::PrincipalAttempts => "principal_attempts",
            LimitKey::PrincipalSpendNanos => "principal_spend_nanos",
            LimitKey::Unknown(name) => name,
        }
    }

    /// Whether this build knows the key.
    pub const fn is_known(&self) -> bool {
        !matches!(self, LimitKey::Unknown(_))
    }

    /// The budget dimension the key is, if it is one of a run's own.
    pub const fn dimension(&self) -> Option<Dimension> {
        match self {
            LimitKey::Attempts => Some(Dimension::Attempts),
            LimitKey::SpendNanos => Some(Dimension::SpendNanos),
            LimitKey::SideEffects => Some(Dimension::SideEffects),
            LimitKey::Polls => Some(Dimension::Polls),
            LimitKey::DeadlineMs => Some(Dimension::DeadlineMs),
            LimitKey::Depth => Some(Dimension::Depth),
            _ => None,
        }
    }

    /// The key's name as people read it in a table or a sentence: `spend` for
    /// `spend_nanos`, `deadline` for `deadline_ms`, `owner's spend` for
    /// `principal_spend_nanos`; a name this build does not know, as it is.
    pub fn label(&self) -> &str {
        match self {
            LimitKey::SpendNanos | LimitKey::SpendCents => "spend",
            LimitKey::DeadlineMs => "deadline",
            LimitKey::SideEffects => "side effects",
            LimitKey::PrincipalRuns => "owner's runs",
            LimitKey::PrincipalAttempts => "owner's attempts",
            LimitKey::PrincipalSpendNanos => "owner's spend",
            other => other.as_str(),
        }
    }
}

impl From<Dimension> for LimitKey {
    fn from(dimension: Dimension) -> LimitKey {
        LimitKey::of(dimension)
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for LimitKey {
    fn eq(&self, other: &LimitKey) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for LimitKey {}

impl PartialOrd for LimitKey {
    fn partial_cmp(&self, other: &LimitKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LimitKey {
    fn cmp(&self, other: &LimitKey) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for LimitKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Borrow<str> for LimitKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl Serialize for LimitKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LimitKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LimitKey, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LimitKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a dimension's name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<LimitKey, E> {
                Ok(LimitKey::from_name(name))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::{Dimension, LimitKey};

    #[test]
    fn every_limit_dimension_has_a_label_without_units_or_underscores() {
        for d in LimitKey::KNOWN {
            let l = d.label();
            assert!(
                !l.contains('_') && !l.ends_with("nanos") && !l.ends_with("ms"),
                "{d}: {l}"
            );
        }
        assert_eq!(LimitKey::SpendNanos.label(), "spend");
        assert_eq!(LimitKey::DeadlineMs.label(), "deadline");
        assert_eq!(LimitKey::from_name("tokens").label(), "tokens");
    }

    #[test]
    fn a_key_reads_back_as_its_name_and_orders_by_it() {
        let mut names: Vec<&str> = LimitKey::KNOWN.iter().map(LimitKey::as_str).collect();
        for (key, name) in LimitKey::KNOWN.iter().zip(&names) {
            assert_eq!(&LimitKey::from_name(name), key);
            assert!(key.is_known(), "{key}");
            let json = serde_json::to_string(key).expect("a key writes");
            assert_eq!(json, format!("\"{name}\""));
            let back: LimitKey = serde_json::from_str(&json).expect("a key reads");
            assert_eq!(&back, key);
        }
        let sorted = names.clone();
        names.sort_unstable();
        assert_eq!(names, sorted, "KNOWN is in the names' byte order");
        let unknown: LimitKey = serde_json::from_str("\"tokens\"").expect("any name reads");
        assert!(!unknown.is_known());
        assert_eq!(unknown.as_str(), "tokens");
        assert!(
            LimitKey::SpendNanos < unknown && LimitKey::from_name("rates") < LimitKey::SideEffects
        );
    }

    #[test]
    fn each_budget_dimension_is_its_own_key() {
        for d in [
            Dimension::Attempts,
            Dimension::SpendNanos,
            Dimension::SideEffects,
            Dimension::Polls,
            Dimension::DeadlineMs,
            Dimension::Depth,
        ] {
            let key = LimitKey::from(d);
            assert_eq!(key.dimension(), Some(d));
            let json = serde_json::to_string(&d).expect("a dimension writes");
            assert_eq!(json, format!("\"{}\"", key.as_str()));
        }
        assert_eq!(LimitKey::PrincipalSpendNanos.dimension(), None);
    }
}
