//! Money in the policy: spend limits (`spend_usd` or `spend_cents`), credentials' period
//! spend, and `[tool_prices]` (a tool's price per call). Every amount is read exactly
//! through `tally_record::money` (dollars as quoted decimal text, cents as integers) and
//! kept in nanodollars; a TOML float is refused, as it would pass through binary floating
//! point.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tally_record::decision::Budget;
use tally_record::money::{parse_usd, Nanos};
use tally_record::LimitKey;

/// An exact amount of US dollars as the policy writes it: a quoted decimal (`"0.15"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usd(pub Nanos);

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // `$1.25` without its `$`: the text parse_usd reads back exactly.
        s.serialize_str(&self.0.to_string()[1..])
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Usd, D::Error> {
        d.deserialize_any(UsdVisitor)
    }
}

struct UsdVisitor;

const QUOTE: &str = "write US dollars as a quoted decimal, like \"12.50\" (a TOML number would pass through binary floating point; amounts are exact)";

impl Visitor<'_> for UsdVisitor {
    type Value = Usd;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("US dollars as a quoted decimal, like \"12.50\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Usd, E> {
        parse_usd(v).map(Usd).map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Usd, E> {
        Err(E::custom(QUOTE))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Usd, E> {
        Err(E::custom(QUOTE))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Usd, E> {
        Err(E::custom(QUOTE))
    }
}

/// A budget as the policy writes it: spend as `spend_usd` (exact dollars) or
/// `spend_cents`, never both.
#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct BudgetToml {
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_cents: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_usd: Option<Usd>,
    #[serde(skip_serializing_if = "Option::is_none")]
    side_effects: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    polls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    depth: Option<u64>,
}

/// One amount given in cents or in exact dollars: nanodollars, or why not.
pub(crate) fn one_amount(
    cents: Option<u64>,
    usd: Option<Usd>,
    cents_key: &str,
    usd_key: &str,
) -> Result<Option<u64>, String> {
    match (cents, usd) {
        (Some(_), Some(_)) => Err(format!(
            "`{cents_key}` and `{usd_key}` are the same amount in two units: give one of them"
        )),
        (Some(c), None) => Nanos::from_cents(c).map(|n| Some(n.0)).ok_or_else(|| {
            format!("`{cents_key}` = {c} is too large (at most 1844674407370 cents)")
        }),
        (None, Some(u)) => Ok(Some(u.0 .0)),
        (None, None) => Ok(None),
    }
}

/// `#[serde(with)]` for a policy's budget: read with `spend_usd` or `spend_cents`, kept
/// with `spend_nanos` alone, written with `spend_usd`.
pub(crate) mod budget {
    use super::*;

    pub fn serialize<S: Serializer>(b: &Budget, s: S) -> Result<S::Ok, S::Error> {
        BudgetToml {
            attempts: b.attempts,
            deadline_ms: b.deadline_ms,
            spend_cents: None,
            spend_usd: b.spend().map(Usd),
            side_effects: b.side_effects,
            polls: b.polls,
            depth: b.depth,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Budget, D::Error> {
        let t = BudgetToml::deserialize(d)?;
        let spend_nanos = one_amount(
            t.spend_cents,
            t.spend_usd,
            LimitKey::SpendCents.as_str(),
            "spend_usd",
        )
        .map_err(de::Error::custom)?;
        Ok(Budget {
            attempts: t.attempts,
            deadline_ms: t.deadline_ms,
            spend_cents: None,
            spend_nanos,
            side_effects: t.side_effects,
            polls: t.polls,
            depth: t.depth,
        })
    }
}

/// Nanodollars per period from a credential's `spend_cents_per_period` or
/// `spend_usd_per_period`.
pub(crate) fn period_spend(cents: Option<u64>, usd: Option<Usd>) -> Result<Option<u64>, String> {
    one_amount(cents, usd, "spend_cents_per_period", "spend_usd_per_period")
}
