//! `tally prices import`: a published price table (the JSON LiteLLM publishes,
//! `model_prices_and_context_window.json`: model -> `input_cost_per_token`,
//! `output_cost_per_token`, `litellm_provider`, `mode`, ...) read into the policy's
//! model prices (`[prices.UPSTREAM."MODEL"]`), each with its `source` and `as_of`.
//!
//! Strict: an entry that would be written and is malformed (a cost that is not a
//! number of US dollars, a limit that is not a whole number) is an error naming the
//! model and the field, and nothing is written. Entries tally's rates cannot state are
//! skipped and counted: other modes than chat (embeddings, images, audio), other
//! providers than those asked for, and rates that change with the prompt's length.
//!
//! Costs are JSON numbers per token: each is read as the shortest decimal that names
//! the same double (the literal the table writes), its point moved six places, and
//! the result read exactly as a price per million tokens; one finer than a
//! nanodollar per million tokens is refused.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use tally_record::decision::MAX_POLICY_BYTES;
use tally_record::money::{parse_usd, Nanos};

use crate::dates::Date;

mod render;

/// What to import, and how to name it.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// LiteLLM provider (`litellm_provider`) -> the upstream its prices are written
    /// under; empty: every provider, each under its own name.
    pub providers: BTreeMap<String, String>,
    /// Model ids to import (exact, or a prefix ending in `*`); empty: every one.
    pub models: Vec<String>,
    /// Where the table came from, written as each price's `source`.
    pub source: String,
    /// The day the table was published or fetched, written as each price's `as_of`.
    pub as_of: Date,
}

/// One price read from the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportedPrice {
    /// Input tokens, per million.
    pub input: Nanos,
    /// Output tokens, per million.
    pub output: Nanos,
    /// Cache reads, per million (`cache_read_input_token_cost`).
    pub cached_input: Option<Nanos>,
    /// Cache writes, per million (`cache_creation_input_token_cost`).
    pub cache_write: Option<Nanos>,
    /// 1-hour cache writes, per million (`cache_creation_input_token_cost_above_1hr`).
    pub cache_write_1h: Option<Nanos>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `max_input_tokens`, written as `context_tokens`.
    pub context_tokens: Option<u64>,
}

/// What an import wrote and skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    /// The policy text: `[prices.UPSTREAM."MODEL"]` tables to add to a policy that
    /// names those upstreams.
    pub toml: String,
    /// Prices written, by upstream.
    pub written: BTreeMap<String, u64>,
    /// Dated snapshots written as an alias of their model's price (the same rates).
    pub aliased: u64,
    /// Entries skipped, by why (`mode embedding`, `other provider`, ...).
    pub skipped: BTreeMap<String, u64>,
}

impl Imported {
    /// One line: what was written and what was skipped, with counts.
    pub fn summary(&self) -> String {
        let total: u64 = self.written.values().sum();
        let skipped: u64 = self.skipped.values().sum();
        let aliased = match self.aliased {
            0 => String::new(),
            n => format!(", {n} dated ids among their aliases"),
        };
        let written = format!(
            "{total} prices written ({}){aliased}",
            counts(&self.written)
        );
        if skipped == 0 {
            written
        } else {
            format!(
                "{written}; {skipped} entries skipped ({})",
                counts(&self.skipped)
            )
        }
    }
}

/// `a 1, b 2`.
fn counts(m: &BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a price table could not be imported. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// Not JSON, or not an object of models.
    #[error("the price table is not a JSON object of models: {0}")]
    NotATable(String),
    /// An entry that would be written is malformed.
    #[error("model {}: `{field}` {why} (correct the table, or leave the model out with --provider or --model)", shown(.model))]
    Entry {
        /// The model's key in the table.
        model: String,
        /// The field at fault.
        field: String,
        /// What is wrong, and what was expected.
        why: String,
    },
    /// A provider's prices would go under a name that is not an upstream's.
    #[error("provider {}: {}", shown(.provider), "is not an upstream name (letters, digits, `_`, `-`): name its upstream with --provider PROVIDER=UPSTREAM")]
    Upstream {
        /// The provider.
        provider: String,
    },
    /// Two entries price the same model id on one upstream.
    #[error("models {} and {} both price `{id}` on upstream `{upstream}`: narrow the import with --model", shown(.first), shown(.second))]
    Duplicate {
        /// The upstream.
        upstream: String,
        /// The model id.
        id: String,
        /// The first entry's key.
        first: String,
        /// The second entry's key.
        second: String,
    },
    /// `source` cannot be written.
    #[error("the source {} must be 1 to 256 bytes of text without control characters", shown(.0))]
    Source(String),
    /// Nothing matched.
    #[error("no chat model of the table matched ({skipped}): check --provider and --model")]
    Nothing {
        /// What was skipped, with counts.
        skipped: String,
    },
    /// The prices would not fit in a policy.
    #[error("the prices are {bytes} bytes, and a whole policy holds at most {max}: import fewer models (--provider, --model)")]
    TooLarge {
        /// Their size.
        bytes: usize,
        /// A policy's bound.
        max: usize,
    },
}

/// `s` as shown in a message: escaped (control, bidi and quote characters), at most 80
/// characters of it.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_debug).collect();
    if s.chars().count() > 80 {
        out.push_str("...");
    }
    format!("\"{out}\"")
}

/// Import `json` (LiteLLM's `model_prices_and_context_window.json`) as `opts` asks.
pub fn import_litellm(json: &str, opts: &ImportOptions) -> Result<Imported, ImportError> {
    if !render::valid_source(&opts.source) {
        return Err(ImportError::Source(opts.source.clone()));
    }
    let table: Map<String, Value> =
        serde_json::from_str(json).map_err(|e| ImportError::NotATable(e.to_string()))?;
    let mut prices: BTreeMap<(String, String), (String, ImportedPrice)> = BTreeMap::new();
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    // Chat entries of a chosen upstream left unwritten (their rates, or --model): a
    // dated one among them must not fall to its written model's price.
    let mut left_out: Vec<LeftOut> = Vec::new();
    for (key, entry) in &table {
        // LiteLLM's first entry documents the fields; it prices nothing.
        if key == "sample_spec" {
            continue;
        }
        let (upstream, id) = match selected(key, entry, opts, &mut skipped)? {
            Selected::Write(upstream, id) => (upstream, id),
            Selected::LeftOut(upstream, id) => {
                // Its price if it reads as one (it is not written: never an error).
                let object = entry.as_object();
                let price = object.and_then(|e| read_price(key, e).ok()?.ok());
                left_out.push(LeftOut {
                    upstream,
                    id,
                    key: key.clone(),
                    price,
                });
                continue;
            }
            Selected::Skipped => continue,
        };
        let price = match read_price(key, entry.as_object().unwrap_or(&Map::new()))? {
            Ok(price) => price,
            Err(why) => {
                *skipped.entry(why.into()).or_default() += 1;
                left_out.push(LeftOut {
                    upstream,
                    id,
                    key: key.clone(),
                    price: None,
                });
                continue;
            }
        };
        if let Some((first, _)) = prices.get(&(upstream.clone(), id.clone())) {
            return Err(ImportError::Duplicate {
                upstream,
                id,
                first: first.clone(),
                second: key.clone(),
            });
        }
        prices.insert((upstream, id), (key.clone(), price));
    }
    undated_left_out(&prices, &left_out)?;
    finish(prices, skipped, opts)
}

/// A chat entry of a chosen upstream that is not written.
struct LeftOut {
    upstream: String,
    id: String,
    /// The table's key.
    key: String,
    /// Its price, if it has one a policy can state.
    price: Option<ImportedPrice>,
}

/// Refused: a dated snapshot left unwritten whose model is written at other rates. The
/// policy prices a `-YYYYMMDD` id it does not name at its model's price, so the
/// snapshot would be billed at rates the table does not give it.
fn undated_left_out(
    prices: &BTreeMap<(String, String), (String, ImportedPrice)>,
    left_out: &[LeftOut],
) -> Result<(), ImportError> {
    for LeftOut {
        upstream,
        id,
        key,
        price,
    } in left_out
    {
        let Some(base) = crate::upstreams::undated(id) else {
            continue;
        };
        let written = prices.get(&(upstream.clone(), base.to_owned()));
        if written.is_some_and(|(_, at)| price.as_ref() != Some(at)) {
            return Err(ImportError::Entry {
                model: key.clone(),
                field: "(dated snapshot)".to_owned(),
                why: format!(
                    "is left out while `{base}` is written: the policy would price it at \
                     `{base}`'s rates, which the table does not give it; leave `{base}` out \
                     too (--model), or price the snapshot by hand"
                ),
            });
        }
    }
    Ok(())
}

/// What [`selected`] makes of an entry.
enum Selected {
    /// Its upstream and model id: one to write.
    Write(String, String),
    /// A chat entry of a chosen upstream that `--model` leaves out.
    LeftOut(String, String),
    /// Not one to write (counted in `skipped`).
    Skipped,
}

/// The prices read, as policy text: dated snapshots folded into their model's price,
/// summed up, bounded and checked by the policy's own reader.
fn finish(
    mut prices: BTreeMap<(String, String), (String, ImportedPrice)>,
    skipped: BTreeMap<String, u64>,
    opts: &ImportOptions,
) -> Result<Imported, ImportError> {
    if prices.is_empty() {
        return Err(ImportError::Nothing {
            skipped: counts(&skipped),
        });
    }
    let aliases = snapshots(&mut prices);
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    for (upstream, _) in prices.keys() {
        *written.entry(upstream.clone()).or_default() += 1;
    }
    let mut imported = Imported {
        toml: String::new(),
        written,
        aliased: aliases.values().map(|a| a.len() as u64).sum(),
        skipped,
    };
    imported.toml = render::toml(&prices, &aliases, opts, &imported.summary());
    if imported.toml.len() > MAX_POLICY_BYTES {
        return Err(ImportError::TooLarge {
            bytes: imported.toml.len(),
            max: MAX_POLICY_BYTES,
        });
    }
    render::check(&imported.toml)?;
    Ok(imported)
}

/// Dated snapshots (`BASE-YYYYMMDD`, `BASE-YYYY-MM-DD`) priced exactly as their
/// undated model on the same upstream: taken out of `prices` and returned as that
/// model's aliases, so one table prices both.
fn snapshots(
    prices: &mut BTreeMap<(String, String), (String, ImportedPrice)>,
) -> BTreeMap<(String, String), Vec<String>> {
    let mut aliases: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let dated: Vec<(String, String)> = prices.keys().cloned().collect();
    for (upstream, id) in dated {
        let Some(base) = undated(&id) else { continue };
        let key = (upstream.clone(), base.to_owned());
        let same = match (
            prices.get(&key),
            prices.get(&(upstream.clone(), id.clone())),
        ) {
            (Some((_, b)), Some((_, d))) => b == d,
            _ => false,
        };
        if same {
            prices.remove(&(upstream, id.clone()));
            aliases.entry(key).or_default().push(id);
        }
    }
    aliases
}

/// `id` less a date suffix: `-YYYYMMDD` or `-YYYY-MM-DD` (digits only).
fn undated(id: &str) -> Option<&str> {
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let b = id.as_bytes();
    if id.len() > 11 && b[id.len() - 11] == b'-' {
        let d = &id[id.len() - 10..];
        let (y, m, day) = (&d[..4], &d[5..7], &d[8..]);
        if d.as_bytes()[4] == b'-'
            && d.as_bytes()[7] == b'-'
            && digits(y)
            && digits(m)
            && digits(day)
        {
            return Some(&id[..id.len() - 11]);
        }
    }
    let (base, date) = id.rsplit_once('-')?;
    (!base.is_empty() && date.len() == 8 && digits(date)).then_some(base)
}

/// Whether the entry `key` is one to write: its upstream and model id if so; else it
/// is counted in `skipped` under why.
fn selected(
    key: &str,
    entry: &Value,
    opts: &ImportOptions,
    skipped: &mut BTreeMap<String, u64>,
) -> Result<Selected, ImportError> {
    let bad = |field: &str, why: &str| ImportError::Entry {
        model: key.to_owned(),
        field: field.to_owned(),
        why: why.to_owned(),
    };
    let entry = entry
        .as_object()
        .ok_or_else(|| bad("(entry)", "must be an object of fields"))?;
    let provider = match entry.get("litellm_provider") {
        Some(Value::String(p)) => p,
        _ => {
            return Err(bad(
                "litellm_provider",
                "must be the provider's name (text)",
            ))
        }
    };
    let mut skip = |why: String| {
        *skipped.entry(why).or_default() += 1;
        Ok(Selected::Skipped)
    };
    let upstream = match opts.providers.get(provider) {
        Some(u) => u.clone(),
        None if opts.providers.is_empty() => provider.clone(),
        None => return skip("other provider".into()),
    };
    match entry.get("mode") {
        Some(Value::String(m)) if m == "chat" || m == "responses" => {}
        Some(Value::String(m)) if m.len() <= 32 && render::bare(m) => {
            return skip(format!("mode {m}"))
        }
        Some(Value::String(_)) => {
            return Err(bad("mode", "must be a mode's name (chat, embedding, ...)"))
        }
        None => return skip("no mode".into()),
        Some(_) => return Err(bad("mode", "must be text (chat, embedding, ...)")),
    }
    // LiteLLM writes some providers' models as `PROVIDER/ID`; the API's id is ID.
    let id = key
        .strip_prefix(provider.as_str())
        .and_then(|k| k.strip_prefix('/'))
        .unwrap_or(key);
    if !opts.models.is_empty() && !opts.models.iter().any(|m| matches(m, id)) {
        skip("not in --model".into())?;
        return Ok(Selected::LeftOut(upstream, id.to_owned()));
    }
    if !crate::upstreams::valid_name(&upstream) {
        return Err(ImportError::Upstream {
            provider: provider.clone(),
        });
    }
    if !render::valid_id(id) {
        return Err(bad(
            "(model id)",
            "must be 1 to 256 visible ASCII characters, without `\"` or `\\`",
        ));
    }
    Ok(Selected::Write(upstream, id.to_owned()))
}

/// Whether `pattern` (an id, or a prefix ending in `*`) names `id`.
fn matches(pattern: &str, id: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => id.starts_with(prefix),
        None => pattern == id,
    }
}

/// The price of one chat entry, or why it is skipped: rates that change with the
/// prompt's length (`*_above_*_tokens` costs, `tiered_pricing`) or reasoning tokens
/// billed apart from output, which one price per token cannot state.
fn read_price(
    key: &str,
    entry: &Map<String, Value>,
) -> Result<Result<ImportedPrice, &'static str>, ImportError> {
    let tiered = entry.keys().any(|k| {
        k == "tiered_pricing"
            || (k.contains("cost") && k.contains("_above_") && !k.ends_with("_above_1hr"))
    });
    if tiered {
        return Ok(Err("priced by prompt length"));
    }
    let field = Fields { key, entry };
    let input = field
        .cost("input_cost_per_token")?
        .ok_or_else(|| field.missing("input_cost_per_token"))?;
    let output = field
        .cost("output_cost_per_token")?
        .ok_or_else(|| field.missing("output_cost_per_token"))?;
    // A zero rate is a placeholder or a free tier: written, it would record every call
    // at nothing, and no spend budget would bind it. Priced by hand if it is meant.
    if input.0 == 0 || output.0 == 0 {
        return Ok(Err("a zero input or output rate"));
    }
    if let Some(reasoning) = field.cost("output_cost_per_reasoning_token")? {
        if reasoning != output {
            return Ok(Err("reasoning priced apart"));
        }
    }
    let cached_input = field.cost("cache_read_input_token_cost")?;
    if cached_input.is_some_and(|c| c > input) {
        return Err(field.bad(
            "cache_read_input_token_cost",
            "is above input_cost_per_token: a cache read is never dearer than the input",
        ));
    }
    Ok(Ok(ImportedPrice {
        input,
        output,
        cached_input,
        cache_write: field.cost("cache_creation_input_token_cost")?,
        cache_write_1h: field.cost("cache_creation_input_token_cost_above_1hr")?,
        max_output_tokens: field.tokens("max_output_tokens")?,
        context_tokens: field.tokens("max_input_tokens")?,
    }))
}

/// One entry's fields, read strictly.
struct Fields<'a> {
    key: &'a str,
    entry: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn bad(&self, field: &str, why: &str) -> ImportError {
        ImportError::Entry {
            model: self.key.to_owned(),
            field: field.to_owned(),
            why: why.to_owned(),
        }
    }

    fn missing(&self, field: &str) -> ImportError {
        self.bad(
            field,
            "is missing: a chat model needs its input and output costs",
        )
    }

    /// A cost per token, as nanodollars per million tokens; `None` when absent.
    fn cost(&self, field: &str) -> Result<Option<Nanos>, ImportError> {
        let Some(v) = self.entry.get(field) else {
            return Ok(None);
        };
        let per_token = match v.as_f64() {
            Some(f) if f.is_finite() && f >= 0.0 => f,
            _ => return Err(self.bad(field, "must be a number of US dollars per token, 0 or more")),
        };
        per_million(per_token).map(Some).ok_or_else(|| {
            self.bad(
                field,
                &format!("is {per_token} US dollars per token: not a whole number of nanodollars per million tokens"),
            )
        })
    }

    /// A count of tokens, at least 1; `None` when absent.
    fn tokens(&self, field: &str) -> Result<Option<u64>, ImportError> {
        match self.entry.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err(self.bad(field, "must be a whole number of tokens, at least 1")),
            },
        }
    }
}

/// `per_token` US dollars per token as an exact price per million tokens: the
/// shortest decimal naming the double, its point moved six places right.
fn per_million(per_token: f64) -> Option<Nanos> {
    // Rust prints a double as the shortest decimal that reads back as it, never in
    // exponent form.
    let text = format!("{per_token}");
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = format!("{frac:0<6}");
    let (moved, rest) = frac.split_at(6);
    let whole = format!("{whole}{moved}");
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let decimal = if rest.is_empty() {
        whole.to_owned()
    } else {
        format!("{whole}.{rest}")
    };
    parse_usd(&decimal).ok()
}

#[cfg(test)]
mod tests;
