//! Principal budgets in the policy: what one uid may start and spend across all its runs
//! per period (`[principals.default]`, `[principals.uid.N]`; docs/GATE.md, "Principals").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::LimitKey;

/// Principal budgets, by uid: `[principals.default]` for every uid without its own,
/// `[principals.uid.1000]` for uid 1000 (it replaces the default for that uid, whole).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Principals {
    /// The budget of every uid the policy does not name.
    pub default: Option<PrincipalLimits>,
    /// Budgets of named uids (decimal keys), replacing the default for them.
    pub uid: BTreeMap<String, PrincipalLimits>,
}

/// One principal's budget per period. A limit left out is no limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PrincipalToml", into = "PrincipalToml")]
pub struct PrincipalLimits {
    /// Runs it may start per period.
    pub runs: Option<u64>,
    /// Attempts (allows that use one, docs/GATE.md) across its runs per period.
    pub attempts: Option<u64>,
    /// Spend reserved or settled across its runs per period, nanodollars: written
    /// `spend_usd` (exact dollars) or `spend_cents`.
    pub spend_nanos: Option<u64>,
    /// The period, ms. Default 86,400,000 (a day). A period begins with the first run
    /// or call after the one before it ended.
    pub period_ms: u64,
}

impl Default for PrincipalLimits {
    fn default() -> PrincipalLimits {
        PrincipalLimits {
            runs: None,
            attempts: None,
            spend_nanos: None,
            period_ms: 86_400_000,
        }
    }
}

/// A principal's budget as the policy writes it (its spend in cents or exact dollars).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
struct PrincipalToml {
    #[serde(skip_serializing_if = "Option::is_none")]
    runs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_cents: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_usd: Option<crate::prices::Usd>,
    period_ms: u64,
}

impl Default for PrincipalToml {
    fn default() -> PrincipalToml {
        PrincipalLimits::default().into()
    }
}

impl TryFrom<PrincipalToml> for PrincipalLimits {
    type Error = String;

    fn try_from(t: PrincipalToml) -> Result<PrincipalLimits, String> {
        Ok(PrincipalLimits {
            runs: t.runs,
            attempts: t.attempts,
            spend_nanos: crate::prices::one_amount(
                t.spend_cents,
                t.spend_usd,
                LimitKey::SpendCents.as_str(),
                "spend_usd",
            )?,
            period_ms: t.period_ms,
        })
    }
}

impl From<PrincipalLimits> for PrincipalToml {
    fn from(p: PrincipalLimits) -> PrincipalToml {
        PrincipalToml {
            runs: p.runs,
            attempts: p.attempts,
            spend_cents: None,
            spend_usd: p
                .spend_nanos
                .map(|n| crate::prices::Usd(tally_record::money::Nanos(n))),
            period_ms: p.period_ms,
        }
    }
}
