//! How old the policy's model prices are: a price older than the policy's
//! `max_price_age_days`, or with no `as_of` to tell, is one `tally policy check` warns
//! of. A warning only: prices are enforced as written, whatever their age.

use std::fmt;

use crate::dates::Date;
use crate::upstreams::Prices;

/// A model price past the policy's bound on age.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StalePrice {
    /// Its upstream.
    pub upstream: String,
    /// Its name.
    pub model: String,
    /// Its `as_of`, if it has one.
    pub as_of: Option<Date>,
    /// Its age in days on the day checked (`None` without an `as_of`, or with one after
    /// the day checked).
    pub age_days: Option<u32>,
    /// The bound, days.
    pub max_days: u64,
}

impl fmt::Display for StalePrice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = format!(
            "prices.{}.{}",
            crate::fields::quoted(&self.upstream),
            crate::fields::quoted(&self.model)
        );
        match (self.as_of, self.age_days) {
            (Some(d), Some(age)) => write!(
                f,
                "`{at}` is {age} days old (as_of {d}; max_price_age_days = {}): import a current price table (`tally prices import`) or check the rates and update as_of",
                self.max_days
            ),
            (Some(d), None) => write!(
                f,
                "`{at}` is dated after today (as_of {d}; max_price_age_days = {}): a day to come vouches for nothing; give the day its rates were known true",
                self.max_days
            ),
            (None, _) => write!(
                f,
                "`{at}` has no as_of, so its age is unknown (max_price_age_days = {}): give the day its rates were known true",
                self.max_days
            ),
        }
    }
}

/// The model prices in `prices` older than `max_days` on `today`, or with no `as_of`,
/// by upstream and name; none when there is no bound.
pub fn stale_prices(prices: &Prices, max_days: Option<u64>, today: Date) -> Vec<StalePrice> {
    let Some(max_days) = max_days else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (upstream, p) in &prices.0 {
        for (model, m) in &p.models {
            // A price dated after today is named too: a date to come would silence
            // the warning for ever.
            let age_days = m.as_of.filter(|d| *d <= today).map(|d| d.days_until(today));
            if age_days.is_some_and(|a| u64::from(a) <= max_days) {
                continue;
            }
            out.push(StalePrice {
                upstream: upstream.clone(),
                model: model.clone(),
                as_of: m.as_of,
                age_days,
                max_days,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    const POLICY: &str = r#"
max_price_age_days = 90

[upstreams.openai]
url = "https://api.openai.com"
kind = "openai"
credential = "openai"
paths = ["/v1/chat/completions"]

[prices.openai."gpt-4o-mini"]
input_per_mtok = "0.15"
output_per_mtok = "0.60"
source = "model_prices_and_context_window.json"
as_of = "2026-09-08"

[prices.openai."gpt-4o"]
input_per_mtok = "2.50"
output_per_mtok = "10"
"#;

    fn day(text: &str) -> Date {
        Date::parse(text).expect("a date")
    }

    #[test]
    fn a_price_past_the_bound_or_undated_is_stale() {
        let p = Policy::from_toml(POLICY).expect("valid");
        let m = p.prices.model("openai", "gpt-4o-mini").expect("priced");
        assert_eq!(
            m.source.as_deref(),
            Some("model_prices_and_context_window.json")
        );
        // 90 days old on the bound: only the undated price is named.
        let on = p.stale_prices(day("2026-12-07"));
        assert_eq!(on.len(), 1);
        assert_eq!((on[0].model.as_str(), on[0].age_days), ("gpt-4o", None));
        assert!(on[0].to_string().contains("has no as_of"), "{}", on[0]);
        // Checked on a day before its as_of: named, as a date to come.
        let before = p.stale_prices(day("2026-09-07"));
        let early = before
            .iter()
            .find(|s| s.model == "gpt-4o-mini")
            .expect("a future as_of is named");
        assert_eq!(early.age_days, None);
        assert!(early.to_string().contains("dated after today"), "{early}");
        let after = p.stale_prices(day("2026-12-08"));
        assert_eq!(after.len(), 2);
        let old = after
            .iter()
            .find(|s| s.model == "gpt-4o-mini")
            .expect("named");
        assert_eq!(old.age_days, Some(91));
        assert!(
            old.to_string().starts_with("`prices.openai.gpt-4o-mini` is 91 days old (as_of 2026-09-08; max_price_age_days = 90)"),
            "{old}"
        );
        // A clock before the price's day: named too (as dated after today).
        assert_eq!(p.stale_prices(day("2026-01-01")).len(), 2);
    }

    #[test]
    fn without_a_bound_nothing_is_stale() {
        let text = POLICY.replace("max_price_age_days = 90\n", "");
        let p = Policy::from_toml(&text).expect("valid");
        assert!(p.stale_prices(day("2099-01-01")).is_empty());
    }

    #[test]
    fn a_bad_bound_date_or_source_is_refused_naming_its_key() {
        for (from, to, key) in [
            (
                "max_price_age_days = 90",
                "max_price_age_days = 0",
                "max_price_age_days",
            ),
            (
                "as_of = \"2026-09-08\"",
                "as_of = \"2026-02-30\"",
                "prices.openai.gpt-4o-mini.as_of",
            ),
            (
                "as_of = \"2026-09-08\"",
                "as_of = 2026-09-08",
                "prices.openai.gpt-4o-mini.as_of",
            ),
            (
                "source = \"model_prices_and_context_window.json\"",
                "source = \"a\\u001b[2Jb\"",
                "prices.openai.gpt-4o-mini.source",
            ),
            (
                "source = \"model_prices_and_context_window.json\"",
                "source = \"\"",
                "prices.openai.gpt-4o-mini.source",
            ),
        ] {
            let text = POLICY.replace(from, to);
            match Policy::from_toml(&text) {
                Err(crate::PolicyError::Invalid { key: k, .. }) => assert_eq!(k, key, "{to}"),
                other => panic!("{to}: {other:?}"),
            }
        }
    }
}
