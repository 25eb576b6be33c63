//! What an upstream's calls cost (`[prices.UPSTREAM."MODEL"]`,
//! `[prices.UPSTREAM.routes."METHOD /path"]`), read strictly from the policy's text.
//!
//! Prices are US dollars read exactly ([`tally_record::money::parse_usd`]): a quoted
//! string (`"0.15"`), or a TOML number read from its literal text in the file (`0.15`),
//! never through a float. `1e-3`, `1_000` and signs are refused, as `parse_usd` refuses
//! them.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tally_record::money::Nanos;

use super::{valid_path, MaxTokensField, UpstreamKind};
use crate::error::PolicyError;
use crate::fields::{line_at, quoted, read_fields, required, usd, usd_or_unset};
use crate::tiers::TierPrice;

/// Which cache-write rate a request's markers allow (Anthropic's `cache_control`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CacheMark {
    /// No `cache_control`: nothing can be written to the cache.
    None,
    /// `cache_control` with the 5-minute cache (no `ttl`, or `"5m"`).
    FiveMinutes,
    /// `cache_control` with `"ttl": "1h"` somewhere.
    OneHour,
}

/// A model's prices, nanodollars per million tokens (and per use, for server tools).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelPrice {
    /// Input tokens.
    #[serde(serialize_with = "usd")]
    pub input_per_mtok: Nanos,
    /// Input tokens the API reports as read from its cache (default: the input price;
    /// never above it).
    #[serde(serialize_with = "usd")]
    pub cached_input_per_mtok: Nanos,
    /// Input tokens the API writes to its cache (Anthropic's
    /// `cache_creation_input_tokens`, billed above the input price: 1.25x for the
    /// 5-minute cache). No default: tally never guesses a multiplier, so a request that
    /// marks a `cache_control` while this is not set is refused.
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_per_mtok: Option<Nanos>,
    /// Input tokens written to the 1-hour cache (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`, 2x the input price); unset, as
    /// `cache_write_per_mtok` (a `"ttl": "1h"` marker is then refused).
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_1h_per_mtok: Option<Nanos>,
    /// Output tokens.
    #[serde(serialize_with = "usd")]
    pub output_per_mtok: Nanos,
    /// The model's output limit: an injected `max_tokens` is never above it, nor is a
    /// request's own accepted above it. Default 4,096.
    pub max_output_tokens: u64,
    /// The model's context window, tokens: reported usage above it plus
    /// `max_output_tokens` cannot be true. Default 2,000,000 (no model priced today has
    /// a larger one, so the default never rejects a true report).
    pub context_tokens: u64,
    /// Input tokens the provider adds to a request that has `tools` (its tool-use
    /// system prompt; Anthropic documents a few hundred): added to the input bound.
    /// Default 0.
    pub tool_prompt_tokens: u64,
    /// One web search (Anthropic's `web_search` server tool, OpenAI's Responses
    /// `web_search` tool); unset: a request that can search is refused.
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub web_search_per_use: Option<Nanos>,
    /// Input tokens one web search can add (its results), reserved per possible use
    /// and settled as the input tokens the upstream reports. Default 0.
    pub web_search_tokens_per_use: u64,
    /// OpenAI Chat Completions: the field an injected output limit is set as.
    pub max_tokens_field: MaxTokensField,
    /// The input tokens one image can cost at most (Anthropic: about width x height / 750,
    /// images above about 1.15 megapixels resized, so about 1,600; OpenAI: by detail and
    /// tiles, per model). Unset: a request with an image is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_tokens: Option<u64>,
    /// The `service_tier`s billed at rates of their own (`[prices.U."M".tiers.NAME]`),
    /// besides the default tier, billed at the rates above. A request naming any other
    /// tier is refused; an answer reporting one is not priced.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tiers: BTreeMap<String, TierPrice>,
    /// Other model ids that share this price (a dated snapshot, a short name).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Where the rates were read from (`tally prices import` writes the table it read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The day the rates were last known true; with the policy's `max_price_age_days`,
    /// `tally policy check` warns when it is older.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<crate::dates::Date>,
}

impl ModelPrice {
    /// A price with these input and output rates and every other key at its default.
    pub fn new(input_per_mtok: Nanos, output_per_mtok: Nanos) -> ModelPrice {
        ModelPrice {
            input_per_mtok,
            cached_input_per_mtok: input_per_mtok,
            cache_write_per_mtok: None,
            cache_write_1h_per_mtok: None,
            output_per_mtok,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            context_tokens: DEFAULT_CONTEXT_TOKENS,
            tool_prompt_tokens: 0,
            web_search_per_use: None,
            web_search_tokens_per_use: 0,
            max_tokens_field: MaxTokensField::MaxTokens,
            image_tokens: None,
            tiers: BTreeMap::new(),
            aliases: Vec::new(),
            source: None,
            as_of: None,
        }
    }

    /// The most one input token of a request with `mark` can cost: the input price, or
    /// the matching cache-write price where it is dearer (a marked prompt may be
    /// written whole); `None` if the mark needs a price that is not set. A cache read
    /// is never the worst case: it is priced at most the input price.
    pub fn input_rate(&self, mark: CacheMark) -> Option<Nanos> {
        let write = match mark {
            CacheMark::None => return Some(self.input_per_mtok),
            CacheMark::FiveMinutes => self.cache_write_per_mtok?,
            // A 1-hour marker does not stop another block being written for 5 minutes.
            CacheMark::OneHour => self
                .cache_write_1h_per_mtok?
                .max(self.cache_write_per_mtok.unwrap_or(Nanos(0))),
        };
        Some(self.input_per_mtok.max(write))
    }

    /// This price with the rates of tier `name` (`None` if it lists no such tier).
    pub fn at_tier(&self, name: &str) -> Option<ModelPrice> {
        let t = self.tiers.get(name)?;
        Some(ModelPrice {
            input_per_mtok: t.input_per_mtok,
            cached_input_per_mtok: t.cached_input_per_mtok,
            cache_write_per_mtok: t.cache_write_per_mtok,
            cache_write_1h_per_mtok: t.cache_write_1h_per_mtok,
            output_per_mtok: t.output_per_mtok,
            ..self.clone()
        })
    }
}

/// Default `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4_096;
/// Default `context_tokens`.
pub const DEFAULT_CONTEXT_TOKENS: u64 = 2_000_000;

/// A route's price (`http` upstreams).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoutePrice {
    /// Each call, nanodollars.
    #[serde(serialize_with = "usd")]
    pub per_call: Nanos,
}

/// One upstream's prices.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamPrices {
    /// By model name.
    #[serde(flatten)]
    pub models: BTreeMap<String, ModelPrice>,
    /// By `METHOD /path` (exact path).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub routes: BTreeMap<String, RoutePrice>,
}

/// Every upstream's prices. Read from the policy's text ([`Prices::read`]), never
/// through serde's number types.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prices(pub BTreeMap<String, UpstreamPrices>);

impl Serialize for Prices {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Prices {
    /// The typed parse only skips the table: [`Prices::read`] reads it from the text.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prices, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Prices::default())
    }
}

impl Prices {
    /// Whether no upstream is priced.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The price of `model` on `upstream`: the price of that name, else the one naming
    /// it in its `aliases`, else (the dated-suffix rule) the price named `model` less a
    /// `-YYYYMMDD` suffix (a dash and exactly 8 digits). An id named explicitly (a
    /// price's name or alias) is never also covered by the rule.
    pub fn model(&self, upstream: &str, model: &str) -> Option<&ModelPrice> {
        let p = self.0.get(upstream)?;
        if let Some(m) = p.models.get(model) {
            return Some(m);
        }
        if let Some(m) = p
            .models
            .values()
            .find(|m| m.aliases.iter().any(|a| a == model))
        {
            return Some(m);
        }
        p.models.get(undated(model)?)
    }

    /// The price of a Bedrock model id on `upstream` ([`bedrock_ids`]): the first of its
    /// spellings, most specific first, that [`Prices::model`] prices. So a price named
    /// `anthropic.claude-3-5-haiku` covers `anthropic.claude-3-5-haiku-20241022-v1:0` and
    /// the cross-region `us.anthropic.claude-3-5-haiku-20241022-v1:0`, unless a price (or
    /// alias) names one of those itself.
    pub fn bedrock_model(&self, upstream: &str, model: &str) -> Option<&ModelPrice> {
        bedrock_ids(model)
            .into_iter()
            .find_map(|id| self.model(upstream, id))
    }

    /// Which ids each model price covers, as `tally policy check` prints them:
    /// (upstream, price name, ids), the dated-suffix rule written `NAME-YYYYMMDD`; on an
    /// upstream `kind_of` says is `bedrock`, also Bedrock's id rules
    /// ([`Prices::priced`]), written as their patterns.
    pub fn coverage(
        &self,
        kind_of: impl Fn(&str) -> Option<UpstreamKind>,
    ) -> Vec<(String, String, Vec<String>)> {
        let mut out = Vec::new();
        for (upstream, p) in &self.0 {
            for (name, m) in &p.models {
                let mut ids = vec![name.clone()];
                ids.extend(m.aliases.iter().cloned());
                ids.push(format!("{name}-YYYYMMDD"));
                if kind_of(upstream) == Some(UpstreamKind::Bedrock) {
                    ids.extend(super::bedrock::covered(name));
                }
                out.push((upstream.clone(), name.clone(), ids));
            }
        }
        out
    }

    /// The price of a route (`POST /v1/search`) on `upstream`.
    pub fn route(&self, upstream: &str, route: &str) -> Option<&RoutePrice> {
        self.0.get(upstream)?.routes.get(route)
    }

    /// Read `[prices]` from the policy's text, exactly.
    pub(crate) fn read(text: &str) -> Result<Prices, PolicyError> {
        let Ok(doc) = toml_edit::ImDocument::parse(text) else {
            // The typed parse has already accepted the text.
            return Ok(Prices::default());
        };
        let Some(item) = doc.get("prices") else {
            return Ok(Prices::default());
        };
        let read = PriceReader { text };
        let table = item.as_table_like().ok_or_else(|| {
            read.err(
                "prices".into(),
                "must be a table of upstreams".into(),
                item.span(),
            )
        })?;
        let mut out = BTreeMap::new();
        for (upstream, item) in table.iter() {
            out.insert(upstream.to_owned(), read.upstream(upstream, item)?);
        }
        Ok(Prices(out))
    }
}

/// Reads `[prices]` tables out of the policy's text, naming the line of each error.
struct PriceReader<'a> {
    text: &'a str,
}

impl PriceReader<'_> {
    /// An error at `key`, on the line `span` starts.
    fn err(&self, key: String, why: String, span: Option<std::ops::Range<usize>>) -> PolicyError {
        PolicyError::Invalid {
            key,
            why,
            line: span.map(|s| line_at(self.text, s.start)),
        }
    }

    /// The line `item` starts on.
    fn line(&self, item: &toml_edit::Item) -> Option<usize> {
        item.span().map(|s| line_at(self.text, s.start))
    }

    /// `[prices.UPSTREAM]`: its models and its `routes`, each model id named by one
    /// price only.
    fn upstream(
        &self,
        upstream: &str,
        item: &toml_edit::Item,
    ) -> Result<UpstreamPrices, PolicyError> {
        let at = format!("prices.{}", quoted(upstream));
        let t = item.as_table_like().ok_or_else(|| {
            self.err(
                at.clone(),
                "must be a table of models (and `routes`)".into(),
                item.span(),
            )
        })?;
        let mut prices = UpstreamPrices::default();
        for (name, item) in t.iter() {
            if name == "routes" {
                self.routes(&at, item, &mut prices)?;
                continue;
            }
            let key = format!("{at}.{}", quoted(name));
            prices
                .models
                .insert(name.to_owned(), self.model(&key, item)?);
        }
        self.one_price_per_id(&at, t, &prices)?;
        Ok(prices)
    }

    /// `[prices.UPSTREAM.routes]`: a price per call of each `"METHOD /path"`.
    fn routes(
        &self,
        at: &str,
        item: &toml_edit::Item,
        prices: &mut UpstreamPrices,
    ) -> Result<(), PolicyError> {
        let routes = item.as_table_like().ok_or_else(|| {
            self.err(
                format!("{at}.routes"),
                "must be a table of `\"METHOD /path\"` routes".into(),
                item.span(),
            )
        })?;
        for (route, item) in routes.iter() {
            let key = format!("{at}.routes.{}", quoted(route));
            let fields = read_fields(self.text, item, &key, &["per_call"])?;
            let per_call = required(&fields, "per_call", &key, self.line(item))?;
            check_route(route).map_err(|why| self.err(key.clone(), why, item.span()))?;
            prices
                .routes
                .insert(route.to_owned(), RoutePrice { per_call });
        }
        Ok(())
    }

    /// `[prices.UPSTREAM."MODEL"]`: one model's rates, limits and overheads.
    fn model(&self, key: &str, item: &toml_edit::Item) -> Result<ModelPrice, PolicyError> {
        if let Some(old) = item.as_table_like().and_then(|t| t.get("service_tiers")) {
            return Err(self.err(
                format!("{key}.service_tiers"),
                "is replaced by `[prices.UPSTREAM.\"MODEL\".tiers.NAME]` tables giving each tier's own rates (a tier billed at the default rates makes the ledger differ from the bill)".into(),
                old.span(),
            ));
        }
        let fields = read_fields(self.text, item, key, MODEL_FIELDS)?;
        let model = ModelFields {
            read: self,
            key,
            fields: &fields,
        };
        // Read in this order, so that the first of several errors is the one named.
        let input = required(&fields, "input_per_mtok", key, self.line(item))?;
        let output = required(&fields, "output_per_mtok", key, self.line(item))?;
        let cached = model.usd("cached_input_per_mtok")?.unwrap_or(input);
        let cache_write = model.usd("cache_write_per_mtok")?;
        let cache_write_1h = model.usd("cache_write_1h_per_mtok")?;
        let max_output_tokens = model.tokens("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS, 1)?;
        let context_tokens = model.tokens("context_tokens", DEFAULT_CONTEXT_TOKENS, 1)?;
        let tool_prompt_tokens = model.tokens("tool_prompt_tokens", 0, 0)?;
        let web_search_tokens_per_use = model.tokens("web_search_tokens_per_use", 0, 0)?;
        let web_search_per_use = model.usd("web_search_per_use")?;
        if cached > input {
            return Err(self.err(
                format!("{key}.cached_input_per_mtok"),
                "is above input_per_mtok: a cache read is never dearer than the input".into(),
                fields
                    .get("cached_input_per_mtok")
                    .and_then(|f| f.span.clone()),
            ));
        }
        let max_tokens_field = model.max_tokens_field()?;
        let image_tokens = match fields.get("image_tokens") {
            None => None,
            Some(_) => Some(model.tokens("image_tokens", 0, 1)?),
        };
        let tiers = match item.as_table_like().and_then(|t| t.get("tiers")) {
            None => BTreeMap::new(),
            Some(tiers) => crate::tiers::read(self.text, tiers, &format!("{key}.tiers"))?,
        };
        Ok(ModelPrice {
            input_per_mtok: input,
            cached_input_per_mtok: cached,
            cache_write_per_mtok: cache_write,
            cache_write_1h_per_mtok: cache_write_1h,
            output_per_mtok: output,
            max_output_tokens,
            context_tokens,
            tool_prompt_tokens,
            web_search_per_use,
            web_search_tokens_per_use,
            max_tokens_field,
            image_tokens,
            tiers,
            aliases: model.ids("aliases", "model ids")?,
            source: model.source()?,
            as_of: model.as_of()?,
        })
    }

    /// One price per id: a price's name or alias named by another price too is
    /// ambiguous.
    fn one_price_per_id(
        &self,
        at: &str,
        t: &dyn toml_edit::TableLike,
        prices: &UpstreamPrices,
    ) -> Result<(), PolicyError> {
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, m) in &prices.models {
            for id in std::iter::once(name).chain(m.aliases.iter()) {
                if let Some(other) = seen.insert(id.as_str(), name.as_str()) {
                    return Err(self.err(
                        format!("{at}.{}.aliases", quoted(name)),
                        format!("model id `{id}` is covered by prices `{other}` and `{name}`: name each id in one price"),
                        t.get(name).and_then(|i| i.span()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The keys a model's price table may hold.
const MODEL_FIELDS: &[&str] = &[
    "input_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "output_per_mtok",
    "max_output_tokens",
    "context_tokens",
    "tool_prompt_tokens",
    "web_search_per_use",
    "web_search_tokens_per_use",
    "max_tokens_field",
    "image_tokens",
    "tiers",
    "aliases",
    "source",
    "as_of",
];

/// One model's price table, read field by field.
struct ModelFields<'a> {
    read: &'a PriceReader<'a>,
    key: &'a str,
    fields: &'a BTreeMap<String, crate::fields::Field>,
}

impl ModelFields<'_> {
    /// An optional price in USD.
    fn usd(&self, name: &str) -> Result<Option<Nanos>, PolicyError> {
        self.fields.get(name).map(|f| f.usd.clone()).transpose()
    }

    /// A count of tokens, `default` when absent, at least `least`.
    fn tokens(&self, field: &str, default: u64, least: u64) -> Result<u64, PolicyError> {
        match self.fields.get(field) {
            None => Ok(default),
            Some(f) => match f.integer {
                Some(n) if n >= least => Ok(n),
                _ => Err(self.read.err(
                    format!("{}.{field}", self.key),
                    format!("must be a whole number of tokens, at least {least}"),
                    f.span.clone(),
                )),
            },
        }
    }

    /// The request field an injected output limit uses.
    fn max_tokens_field(&self) -> Result<MaxTokensField, PolicyError> {
        match self.fields.get("max_tokens_field") {
            None => Ok(MaxTokensField::MaxTokens),
            Some(f) => match f.text.as_deref() {
                Some("max_tokens") => Ok(MaxTokensField::MaxTokens),
                Some("max_completion_tokens") => Ok(MaxTokensField::MaxCompletionTokens),
                _ => Err(self.read.err(
                    format!("{}.max_tokens_field", self.key),
                    "must be \"max_tokens\" or \"max_completion_tokens\"".into(),
                    f.span.clone(),
                )),
            },
        }
    }

    /// `source`: where the rates came from, 1 to 256 bytes of text without control
    /// characters (it is printed).
    fn source(&self) -> Result<Option<String>, PolicyError> {
        let Some(f) = self.fields.get("source") else {
            return Ok(None);
        };
        match f.text.as_deref() {
            Some(s)
                if !s.is_empty()
                    && s.len() <= 256
                    && !s
                        .chars()
                        .any(|c| c.is_control() || tally_record::words::is_bidi(c)) =>
            {
                Ok(Some(s.to_owned()))
            }
            _ => Err(self.read.err(
                format!("{}.source", self.key),
                "must be text of 1 to 256 bytes without control characters, like \"litellm 2026-12-01\"".into(),
                f.span.clone(),
            )),
        }
    }

    /// `as_of`: the day the rates were known true, `"YYYY-MM-DD"`.
    fn as_of(&self) -> Result<Option<crate::dates::Date>, PolicyError> {
        let Some(f) = self.fields.get("as_of") else {
            return Ok(None);
        };
        match f.text.as_deref().and_then(crate::dates::Date::parse) {
            Some(d) => Ok(Some(d)),
            None => Err(self.read.err(
                format!("{}.as_of", self.key),
                "must be a quoted date, \"YYYY-MM-DD\" (1970 or later)".into(),
                f.span.clone(),
            )),
        }
    }

    /// A list of ids (strings of 1 to 256 bytes), empty when absent.
    fn ids(&self, field: &str, what: &str) -> Result<Vec<String>, PolicyError> {
        match self.fields.get(field) {
            None => Ok(Vec::new()),
            Some(f) => f
                .strings
                .clone()
                .filter(|v| v.iter().all(|s| !s.is_empty() && s.len() <= 256))
                .ok_or_else(|| {
                    self.read.err(
                        format!("{}.{field}", self.key),
                        format!("must be a list of {what} (strings of 1 to 256 bytes)"),
                        f.span.clone(),
                    )
                }),
        }
    }
}

/// `METHOD /path`: an uppercase method, one space, a path starting with `/`.
fn check_route(route: &str) -> Result<(), String> {
    let ok = route.split_once(' ').is_some_and(|(m, p)| {
        !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) && valid_path(p)
    });
    if ok {
        Ok(())
    } else {
        Err("a route is `METHOD /path`, e.g. `POST /v1/search`".into())
    }
}

/// `model` less a dated suffix (`-YYYYMMDD`: a dash and exactly 8 ASCII digits).
pub(crate) fn undated(model: &str) -> Option<&str> {
    let (base, date) = model.rsplit_once('-')?;
    (!base.is_empty() && date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()))
        .then_some(base)
}

/// The geographic prefixes of Bedrock's cross-region inference profiles
/// (`us.anthropic...`).
pub const BEDROCK_GEOS: &[&str] = &["us", "eu", "apac", "us-gov", "jp", "au", "ca", "global"];

/// A Bedrock model id's spellings a price may name, most specific first: the id; without
/// its version suffix (`-vN` or `-vN:M`); then, for a cross-region profile
/// ([`BEDROCK_GEOS`]), both again without its geographic prefix. [`Prices::model`]
/// applies the dated-suffix rule to each.
pub fn bedrock_ids(model: &str) -> Vec<&str> {
    let mut out = vec![model];
    if let Some(v) = unversioned(model) {
        out.push(v);
    }
    let plain = BEDROCK_GEOS.iter().find_map(|g| {
        model
            .strip_prefix(g)
            .and_then(|r| r.strip_prefix('.'))
            .filter(|r| !r.is_empty())
    });
    if let Some(p) = plain {
        out.push(p);
        if let Some(v) = unversioned(p) {
            out.push(v);
        }
    }
    out
}

/// `model` less a Bedrock version suffix: `-v` and digits, then optionally `:` and
/// digits (`-v1:0`, `-v2`); `None` without one.
fn unversioned(model: &str) -> Option<&str> {
    let (base, v) = model.rsplit_once("-v")?;
    let (major, minor) = match v.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (v, None),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    (!base.is_empty() && digits(major) && minor.is_none_or(digits)).then_some(base)
}
