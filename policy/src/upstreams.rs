//! The upstreams tally's proxy forwards to (`[upstreams.NAME]`) and what their calls cost
//! (`[prices.UPSTREAM."MODEL"]`, `[prices.UPSTREAM.routes."METHOD /path"]`): docs/GATE.md,
//! "Upstreams and prices".
//!
//! Prices are US dollars read exactly ([`tally_record::money::parse_usd`]): a quoted
//! string (`"0.15"`), or a TOML number read from its literal text in the file (`0.15`),
//! never through a float. `1e-3`, `1_000` and signs are refused, as `parse_usd` refuses
//! them.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tally_record::money::{parse_usd, Nanos};

use crate::error::PolicyError;

/// Default `max_request_bytes`: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// Default `timeout_ms`: 120 s.
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 120_000;
/// The largest `max_request_bytes` a policy may give: 64 MiB (the proxy holds a request
/// body whole to parse it).
pub const MAX_REQUEST_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The API an upstream speaks: how the proxy reads requests, usage and errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamKind {
    /// OpenAI's API (chat completions, and every API that copies it).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
    /// Any HTTP API, priced per route or by a cost header.
    Http,
}

/// One upstream (`[upstreams.NAME]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Where it is: `http://` or `https://`, a host, an optional port and base path; no
    /// user, query or fragment.
    pub url: String,
    /// Its API.
    pub kind: UpstreamKind,
    /// The name of the credential the proxy injects (`tally serve --credential
    /// NAME=FILE` gives its secret).
    pub credential: String,
    /// Methods allowed. Default `["POST"]`.
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    /// Allowed path prefixes (each starting with `/`); empty allows none.
    #[serde(default)]
    pub paths: Vec<String>,
    /// The largest request body forwarded; larger gets 413. Default 1 MiB.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: u64,
    /// The longest a call may take, ms (a run's remaining time may make it shorter).
    /// Default 120,000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Extra trusted roots (a PEM file), added to the webpki roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// `http` kind: the response header carrying the call's cost in US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_header: Option<String>,
}

fn default_methods() -> Vec<String> {
    vec!["POST".to_owned()]
}
fn default_max_request_bytes() -> u64 {
    DEFAULT_MAX_REQUEST_BYTES
}
fn default_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_TIMEOUT_MS
}

/// A model's prices, nanodollars per million tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelPrice {
    /// Input tokens.
    #[serde(serialize_with = "usd")]
    pub input_per_mtok: Nanos,
    /// Input tokens the API reports as read from its cache (default: the input price).
    #[serde(serialize_with = "usd")]
    pub cached_input_per_mtok: Nanos,
    /// Input tokens the API writes to its cache (Anthropic's
    /// `cache_creation_input_tokens`, billed above the input price: 1.25x for the
    /// 5-minute cache). No default: tally never guesses a multiplier, so a call that
    /// reports cache writes while this is not set settles at its reservation (the most
    /// it could have cost).
    #[serde(
        serialize_with = "usd_or_unset",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_per_mtok: Option<Nanos>,
    /// Input tokens written to the 1-hour cache (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`, 2x the input price); unset, as
    /// `cache_write_per_mtok`.
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
}

impl ModelPrice {
    /// The most one input token can cost: the largest of the input, cached-input and
    /// cache-write prices (a token of the prompt is billed as one of them).
    pub fn input_worst_per_mtok(&self) -> Nanos {
        self.input_per_mtok
            .max(self.cached_input_per_mtok)
            .max(self.cache_write_per_mtok.unwrap_or(Nanos(0)))
            .max(self.cache_write_1h_per_mtok.unwrap_or(Nanos(0)))
    }
}

/// Default `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4_096;

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

fn usd<S: Serializer>(n: &Nanos, s: S) -> Result<S::Ok, S::Error> {
    // `$0.15` -> `0.15`: the text parse_usd reads back.
    s.serialize_str(n.to_string().trim_start_matches('$'))
}

fn usd_or_unset<S: Serializer>(n: &Option<Nanos>, s: S) -> Result<S::Ok, S::Error> {
    match n {
        Some(n) => usd(n, s),
        // Skipped when unset: never reached.
        None => s.serialize_none(),
    }
}

impl Prices {
    /// Whether no upstream is priced.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The price of `model` on `upstream`.
    pub fn model(&self, upstream: &str, model: &str) -> Option<&ModelPrice> {
        self.0.get(upstream)?.models.get(model)
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
        let mut out = BTreeMap::new();
        let line = |item: &toml_edit::Item| item.span().map(|s| line_at(text, s.start));
        let err =
            |key: String, why: String, span: Option<std::ops::Range<usize>>| PolicyError::Invalid {
                key,
                why,
                line: span.map(|s| line_at(text, s.start)),
            };
        let table = item.as_table_like().ok_or_else(|| {
            err(
                "prices".into(),
                "must be a table of upstreams".into(),
                item.span(),
            )
        })?;
        for (upstream, item) in table.iter() {
            let at = format!("prices.{}", quoted(upstream));
            let t = item.as_table_like().ok_or_else(|| {
                err(
                    at.clone(),
                    "must be a table of models (and `routes`)".into(),
                    item.span(),
                )
            })?;
            let mut prices = UpstreamPrices::default();
            for (name, item) in t.iter() {
                if name == "routes" {
                    let routes = item.as_table_like().ok_or_else(|| {
                        err(
                            format!("{at}.routes"),
                            "must be a table of `\"METHOD /path\"` routes".into(),
                            item.span(),
                        )
                    })?;
                    for (route, item) in routes.iter() {
                        let key = format!("{at}.routes.{}", quoted(route));
                        let fields = read_fields(text, item, &key, &["per_call"])?;
                        let per_call = required(&fields, "per_call", &key, line(item))?;
                        check_route(route).map_err(|why| err(key.clone(), why, item.span()))?;
                        prices
                            .routes
                            .insert(route.to_owned(), RoutePrice { per_call });
                    }
                    continue;
                }
                let key = format!("{at}.{}", quoted(name));
                let fields = read_fields(
                    text,
                    item,
                    &key,
                    &[
                        "input_per_mtok",
                        "cached_input_per_mtok",
                        "cache_write_per_mtok",
                        "cache_write_1h_per_mtok",
                        "output_per_mtok",
                        "max_output_tokens",
                    ],
                )?;
                let input = required(&fields, "input_per_mtok", &key, line(item))?;
                let output = required(&fields, "output_per_mtok", &key, line(item))?;
                let cached = fields
                    .get("cached_input_per_mtok")
                    .map(|f| f.usd.clone())
                    .transpose()?
                    .unwrap_or(input);
                let optional = |name: &str| fields.get(name).map(|f| f.usd.clone()).transpose();
                let cache_write = optional("cache_write_per_mtok")?;
                let cache_write_1h = optional("cache_write_1h_per_mtok")?;
                let max_output_tokens = match fields.get("max_output_tokens") {
                    None => DEFAULT_MAX_OUTPUT_TOKENS,
                    Some(f) => match f.integer {
                        Some(n) if n >= 1 => n,
                        _ => {
                            return Err(err(
                                format!("{key}.max_output_tokens"),
                                "must be a whole number of tokens, at least 1".into(),
                                f.span.clone(),
                            ))
                        }
                    },
                };
                prices.models.insert(
                    name.to_owned(),
                    ModelPrice {
                        input_per_mtok: input,
                        cached_input_per_mtok: cached,
                        cache_write_per_mtok: cache_write,
                        cache_write_1h_per_mtok: cache_write_1h,
                        output_per_mtok: output,
                        max_output_tokens,
                    },
                );
            }
            out.insert(upstream.to_owned(), prices);
        }
        Ok(Prices(out))
    }
}

/// A key as a policy writes it: bare if it can be, else quoted.
fn quoted(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// One field of a price table: its amount (if it reads as one) and integer value.
struct Field {
    usd: Result<Nanos, PolicyError>,
    integer: Option<u64>,
    span: Option<std::ops::Range<usize>>,
}

fn read_fields(
    text: &str,
    item: &toml_edit::Item,
    key: &str,
    allowed: &[&str],
) -> Result<BTreeMap<String, Field>, PolicyError> {
    let invalid =
        |key: String, why: String, span: Option<std::ops::Range<usize>>| PolicyError::Invalid {
            key,
            why,
            line: span.map(|s| line_at(text, s.start)),
        };
    let t = item.as_table_like().ok_or_else(|| {
        invalid(
            key.to_owned(),
            "must be a table of prices".into(),
            item.span(),
        )
    })?;
    let mut out = BTreeMap::new();
    for (name, value) in t.iter() {
        let at = format!("{key}.{name}");
        if !allowed.contains(&name) {
            let span = t.key(name).and_then(|k| k.span()).or(value.span());
            return Err(invalid(
                at,
                format!(
                    "is not a known key here (expected one of: {})",
                    allowed.join(", ")
                ),
                span,
            ));
        }
        let span = value.span();
        let v = value.as_value();
        // The literal text of a number, exactly as written in the file.
        let literal = match v {
            Some(toml_edit::Value::String(s)) => Some(s.value().to_owned()),
            Some(toml_edit::Value::Integer(_)) | Some(toml_edit::Value::Float(_)) => span
                .clone()
                .and_then(|s| text.get(s))
                .map(|t| t.trim().to_owned()),
            _ => None,
        };
        let integer = match v {
            Some(toml_edit::Value::Integer(i)) => u64::try_from(*i.value()).ok(),
            _ => None,
        };
        let usd = match literal {
            Some(l) => parse_usd(&l).map_err(|e| {
                invalid(
                    at.clone(),
                    format!("must be exact US dollars: {e}"),
                    span.clone(),
                )
            }),
            None => Err(invalid(
                at.clone(),
                "must be an amount of US dollars, like 0.15 or \"0.15\"".into(),
                span.clone(),
            )),
        };
        out.insert(name.to_owned(), Field { usd, integer, span });
    }
    Ok(out)
}

fn required(
    fields: &BTreeMap<String, Field>,
    name: &str,
    key: &str,
    line: Option<usize>,
) -> Result<Nanos, PolicyError> {
    match fields.get(name) {
        Some(f) => f.usd.clone(),
        None => Err(PolicyError::Invalid {
            key: format!("{key}.{name}"),
            why: "is missing: give it (US dollars, like 0.15)".into(),
            line,
        }),
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

/// A path prefix: starts with `/`, visible ASCII, no `?`, `#`, `..` segment or `%`.
pub(crate) fn valid_path(p: &str) -> bool {
    p.starts_with('/')
        && p.bytes().all(|b| b.is_ascii_graphic())
        && !p.contains(['?', '#', '%', '\\'])
        && !p.split('/').any(|s| s == ".." || s == ".")
}

/// An upstream's name: a URL path segment (`[A-Za-z0-9_-]`, at most 64 bytes).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Upstream {
    /// What is wrong with this upstream, if anything: the key under
    /// `upstreams.NAME` and why.
    pub(crate) fn problem(&self) -> Option<(&'static str, String)> {
        if let Err(why) = split_url(&self.url) {
            return Some(("url", why));
        }
        if self.credential.is_empty()
            || !self
                .credential
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Some((
                "credential",
                "must name a credential (letters, digits, `_`, `-`, `.`) that `tally serve --credential NAME=FILE` gives".into(),
            ));
        }
        if self.methods.is_empty()
            || self
                .methods
                .iter()
                .any(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
        {
            return Some((
                "methods",
                "must list HTTP methods in upper case, like [\"POST\"]".into(),
            ));
        }
        if let Some(p) = self.paths.iter().find(|p| !valid_path(p)) {
            return Some((
                "paths",
                format!("`{p}` is not a path prefix: start it with `/`, no `?`, `#`, `%` or dot segments"),
            ));
        }
        if self.max_request_bytes == 0 || self.max_request_bytes > MAX_REQUEST_BYTES_LIMIT {
            return Some((
                "max_request_bytes",
                format!("must be between 1 and {MAX_REQUEST_BYTES_LIMIT} bytes"),
            ));
        }
        if self.timeout_ms == 0 {
            return Some(("timeout_ms", "must be at least 1 (ms)".into()));
        }
        if self.ca_file.as_deref() == Some("") {
            return Some(("ca_file", "is empty: give a PEM file's path".into()));
        }
        match (&self.cost_header, self.kind) {
            (Some(_), UpstreamKind::Openai | UpstreamKind::Anthropic) => {
                return Some((
                    "cost_header",
                    "is for `http` upstreams only (model upstreams are priced by usage)".into(),
                ))
            }
            (Some(h), UpstreamKind::Http)
                if h.is_empty()
                    || !h
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
            {
                return Some(("cost_header", format!("`{h}` is not a header name")))
            }
            _ => {}
        }
        None
    }
}

/// An upstream URL's scheme (`http` or `https`), authority and base path (`""` or a
/// path without a trailing `/`).
pub fn split_url(url: &str) -> Result<(&str, &str, &str), String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        format!("`{url}` is not a URL: write http://host[:port][/base] or https://...")
    })?;
    if scheme != "http" && scheme != "https" {
        return Err(format!("`{url}`: the scheme must be http or https"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty()
        || authority.contains('@')
        || !authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
    {
        return Err(format!(
            "`{url}`: give a host and optional port, no user name or password"
        ));
    }
    let path = path.trim_end_matches('/');
    if !path.is_empty() && !valid_path(path) {
        return Err(format!(
            "`{url}`: the base path may not hold `?`, `#`, `%` or dot segments"
        ));
    }
    Ok((scheme, authority, path))
}

/// The 1-based line of byte `at` in `text`.
fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
