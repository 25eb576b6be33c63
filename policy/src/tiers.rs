//! A model's billing tiers (`[prices.UPSTREAM."MODEL".tiers.NAME]`): the rates a call
//! processed at a `service_tier` other than the default is billed at (OpenAI's `flex`
//! and `priority`, Anthropic's `priority`), docs/GATE.md, "Upstreams and prices".

use std::collections::BTreeMap;

use serde::Serialize;
use tally_record::money::Nanos;

use crate::error::PolicyError;
use crate::fields::{line_at, quoted, read_fields, required, usd, usd_or_unset};

/// One tier's rates, nanodollars per million tokens; what it does not name (the output
/// limit, the overheads, web searches) is the model's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TierPrice {
    /// Input tokens.
    #[serde(serialize_with = "usd")]
    pub input_per_mtok: Nanos,
    /// Input tokens read from the cache (default: this tier's input price).
    #[serde(serialize_with = "usd")]
    pub cached_input_per_mtok: Nanos,
    /// Input tokens written to the 5-minute cache; unset, a marked request that can
    /// land on this tier is refused.
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_per_mtok: Option<Nanos>,
    /// Input tokens written to the 1-hour cache; unset, as `cache_write_per_mtok`.
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_1h_per_mtok: Option<Nanos>,
    /// Output tokens.
    #[serde(serialize_with = "usd")]
    pub output_per_mtok: Nanos,
}

/// Tier names that are not a tier of their own: the default tier (billed at the model's
/// rates) as OpenAI and Anthropic name it, and the requests' choices of one.
pub const NOT_A_TIER: &[&str] = &["default", "standard", "auto", "standard_only"];

/// Reads the `tiers` table `item` of the price at `key` (`prices.openai."gpt-5".tiers`).
pub(crate) fn read(
    text: &str,
    item: &toml_edit::Item,
    key: &str,
) -> Result<BTreeMap<String, TierPrice>, PolicyError> {
    let err =
        |key: String, why: String, span: Option<std::ops::Range<usize>>| PolicyError::Invalid {
            key,
            why,
            line: span.map(|s| line_at(text, s.start)),
        };
    let table = item.as_table_like().ok_or_else(|| {
        err(
            key.to_owned(),
            "must be a table of tiers, each `[...tiers.NAME]` with its rates".into(),
            item.span(),
        )
    })?;
    let mut out = BTreeMap::new();
    for (name, item) in table.iter() {
        let at = format!("{key}.{}", quoted(name));
        let line = item.span().map(|s| line_at(text, s.start));
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(err(
                at,
                "a tier is named as the API names it: lower case letters, digits, `_`, `-`".into(),
                item.span(),
            ));
        }
        if NOT_A_TIER.contains(&name) {
            return Err(err(
                at,
                format!("`{name}` is not a tier of its own: the default tier is billed at the model's rates"),
                item.span(),
            ));
        }
        let fields = read_fields(
            text,
            item,
            &at,
            &[
                "input_per_mtok",
                "cached_input_per_mtok",
                "cache_write_per_mtok",
                "cache_write_1h_per_mtok",
                "output_per_mtok",
            ],
        )?;
        let input = required(&fields, "input_per_mtok", &at, line)?;
        let output = required(&fields, "output_per_mtok", &at, line)?;
        let optional = |name: &str| fields.get(name).map(|f| f.usd.clone()).transpose();
        let cached = optional("cached_input_per_mtok")?.unwrap_or(input);
        if cached > input {
            return Err(err(
                format!("{at}.cached_input_per_mtok"),
                "is above input_per_mtok: a cache read is never dearer than the input".into(),
                fields
                    .get("cached_input_per_mtok")
                    .and_then(|f| f.span.clone()),
            ));
        }
        out.insert(
            name.to_owned(),
            TierPrice {
                input_per_mtok: input,
                cached_input_per_mtok: cached,
                cache_write_per_mtok: optional("cache_write_per_mtok")?,
                cache_write_1h_per_mtok: optional("cache_write_1h_per_mtok")?,
                output_per_mtok: output,
            },
        );
    }
    Ok(out)
}
