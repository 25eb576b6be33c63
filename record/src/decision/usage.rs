//! What an upstream reported a proxied call used: the tokens of each price class and the
//! server tool uses its `settled_nanos` prices (an outcome's `usage`).

use serde::{Deserialize, Serialize};

use crate::error::DecisionError;
use crate::strict::present;

/// The usage an upstream reported for one proxied call, as the proxy read it from the
/// answer (docs/FORMAT.md, "usage"). Each count is written only when above 0, so one
/// usage has one spelling; a count the answer did not report is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Input tokens at the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub input_tokens: Option<u64>,
    /// Input tokens read from the provider's cache (at the cached-input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub cached_tokens: Option<u64>,
    /// Input tokens written to the provider's 5-minute cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub cache_write_tokens: Option<u64>,
    /// Input tokens written to the provider's 1-hour cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub cache_write_1h_tokens: Option<u64>,
    /// Output tokens (reasoning tokens included, as the providers bill them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub output_tokens: Option<u64>,
    /// Server-side web searches (at the per-use price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub web_searches: Option<u64>,
}

impl Usage {
    /// A usage from its counts, each written only when above 0.
    pub fn of(
        input: u64,
        cached: u64,
        cache_write: u64,
        cache_write_1h: u64,
        output: u64,
        web_searches: u64,
    ) -> Usage {
        let some = |n: u64| (n > 0).then_some(n);
        Usage {
            input_tokens: some(input),
            cached_tokens: some(cached),
            cache_write_tokens: some(cache_write),
            cache_write_1h_tokens: some(cache_write_1h),
            output_tokens: some(output),
            web_searches: some(web_searches),
        }
    }

    /// Its counts by name, in the order they are written (absent as 0).
    pub fn counts(&self) -> [(&'static str, u64); 6] {
        [
            ("input_tokens", self.input_tokens.unwrap_or(0)),
            ("cached_tokens", self.cached_tokens.unwrap_or(0)),
            ("cache_write_tokens", self.cache_write_tokens.unwrap_or(0)),
            (
                "cache_write_1h_tokens",
                self.cache_write_1h_tokens.unwrap_or(0),
            ),
            ("output_tokens", self.output_tokens.unwrap_or(0)),
            ("web_searches", self.web_searches.unwrap_or(0)),
        ]
    }

    /// Every input token, of whatever price class.
    pub fn input(&self) -> u64 {
        [
            self.input_tokens,
            self.cached_tokens,
            self.cache_write_tokens,
            self.cache_write_1h_tokens,
        ]
        .into_iter()
        .flatten()
        .fold(0u64, u64::saturating_add)
    }

    /// Output tokens.
    pub fn output(&self) -> u64 {
        self.output_tokens.unwrap_or(0)
    }

    /// Nothing reported at all.
    pub fn is_empty(&self) -> bool {
        self.counts().iter().all(|(_, n)| *n == 0)
    }

    /// One spelling: no count written as 0, and at least one count.
    pub(crate) fn validate(&self) -> Result<(), DecisionError> {
        let written = [
            self.input_tokens,
            self.cached_tokens,
            self.cache_write_tokens,
            self.cache_write_1h_tokens,
            self.output_tokens,
            self.web_searches,
        ];
        if written.contains(&Some(0)) {
            return Err(DecisionError::Invalid {
                field: "usage",
                why: "a count is written only above 0; leave out what the upstream reported as 0",
            });
        }
        if self.is_empty() {
            return Err(DecisionError::Invalid {
                field: "usage",
                why: "an empty usage is left out, not written as {}",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_per_usage() {
        let u = Usage::of(100, 0, 5, 0, 50, 2);
        assert_eq!(
            serde_json::to_string(&u).expect("json"),
            r#"{"input_tokens":100,"cache_write_tokens":5,"output_tokens":50,"web_searches":2}"#
        );
        assert!(u.validate().is_ok());
        assert_eq!((u.input(), u.output()), (105, 50));
        assert!(Usage::of(0, 0, 0, 0, 0, 0).validate().is_err());
        let zero: Usage = serde_json::from_str(r#"{"input_tokens":0}"#).expect("parses");
        assert!(zero.validate().is_err());
        assert!(serde_json::from_str::<Usage>(r#"{"input_tokens":1,"input_tokens":2}"#).is_err());
        assert!(serde_json::from_str::<Usage>(r#"{"tokens":1}"#).is_err());
        assert!(serde_json::from_str::<Usage>(r#"{"input_tokens":-1}"#).is_err());
        assert!(serde_json::from_str::<Usage>(r#"{"input_tokens":null}"#).is_err());
    }
}
