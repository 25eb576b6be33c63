//! What a model request may cost and the body forwarded for it ([`ModelRequest::price`]).

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use tally_policy::{CacheMark, ModelPrice};
use tally_record::money::{per_million, Nanos};

use super::{Endpoint, ModelRequest, RequestError};

/// What the proxy forwards and reserves for one model request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    /// The body to forward (canonical JSON with the proxy's settings).
    pub body: Vec<u8>,
    /// The output tokens asked of the upstream (per choice; 0 for `count_tokens`).
    pub max_tokens: u64,
    /// Whether the proxy set the output limit itself.
    pub injected: bool,
    /// Whether the proxy lowered the request's own limit to what the run can pay
    /// (`clamp_max_tokens`).
    pub clamped: bool,
    /// The input token bound (the body's bytes plus the price's overheads).
    pub input_bound: u64,
    /// The most the call can cost.
    pub worst: Nanos,
}

impl ModelRequest {
    /// The body to forward and the most it can cost at `price`: the limit capped at the
    /// model's, or (absent) the most `remaining` can pay (at least 1), or (with `clamp`,
    /// a limit `remaining` cannot pay) lowered to what it can; for an OpenAI Chat stream,
    /// `stream_options.include_usage` set. Refused where the request can cost what
    /// `price` does not cover.
    pub fn price(
        &self,
        price: &ModelPrice,
        remaining: Nanos,
        clamp: bool,
    ) -> Result<Priced, RequestError> {
        let lands = crate::tier::lands(self.endpoint, self.service_tier.as_deref());
        let price = &crate::tier::reserved(price, &lands)?;
        if self.endpoint == Endpoint::CountTokens {
            return Ok(Priced {
                body: self.render(&BTreeMap::new()).into_bytes(),
                max_tokens: 0,
                injected: false,
                clamped: false,
                input_bound: 0,
                worst: Nanos(0),
            });
        }
        let (input_rate, search_cost) = self.rates(price)?;
        let (mut set, field) = self.settings(price);
        // Measured with the longest count (20 digits) in place: the input bound.
        set.insert(field, self.limit_text(u64::MAX));
        let input_bound = self.input_bound(price, &set)?;
        let input_cost = per_million(input_bound, input_rate).unwrap_or(Nanos::MAX);
        let fixed = input_cost.checked_add(search_cost).unwrap_or(Nanos::MAX);
        let (max_tokens, injected, clamped) = self.output_limit(price, fixed, remaining, clamp);
        set.insert(field, self.limit_text(max_tokens));
        Ok(Priced {
            body: self.render(&set).into_bytes(),
            max_tokens,
            injected,
            clamped,
            input_bound,
            worst: fixed
                .checked_add(self.output_cost(price, max_tokens))
                .unwrap_or(Nanos::MAX),
        })
    }

    /// The rate its input is priced at (the cache-write rate its markers allow), and
    /// what its web searches cost at most; refused where the price has neither.
    fn rates(&self, price: &ModelPrice) -> Result<(Nanos, Nanos), RequestError> {
        let Some(input_rate) = price.input_rate(self.cache) else {
            let key = if self.cache == CacheMark::OneHour {
                "cache_write_1h_per_mtok"
            } else {
                "cache_write_per_mtok"
            };
            return Err(RequestError::unpriced(
                "cache_control",
                format!("can write the prompt to the cache, and this model's price has no {key}"),
            ));
        };
        let search_cost = match (self.web_searches, price.web_search_per_use) {
            (0, _) => Nanos(0),
            (n, Some(p)) => Nanos(p.0.saturating_mul(n)),
            (_, None) => {
                return Err(RequestError::unpriced(
                    "tools",
                    "can search the web, and this model's price has no web_search_per_use",
                ))
            }
        };
        Ok((input_rate, search_cost))
    }

    /// The members the proxy sets over the request's own (an OpenAI Chat stream's
    /// `stream_options.include_usage`), and the member its output limit is set in: the
    /// one the request used, else the endpoint's (for Chat, the one the price names).
    fn settings<'p>(&'p self, price: &'p ModelPrice) -> (BTreeMap<&'p str, String>, &'p str) {
        let mut set: BTreeMap<&str, String> = BTreeMap::new();
        if self.endpoint == Endpoint::ChatCompletions && self.stream {
            let mut o: BTreeMap<String, Box<RawValue>> = self
                .members()
                .get("stream_options")
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default();
            o.insert("include_usage".into(), raw("true"));
            set.insert("stream_options", render(&o));
        }
        let field = match (self.limit_field, self.endpoint) {
            (Some(f), _) => f,
            (None, Endpoint::ChatCompletions) => price.max_tokens_field.as_str(),
            (None, e) => e.limit_field(),
        };
        (set, field)
    }

    /// The JSON text of the member the output limit is set in, with `tokens`: the count
    /// itself, or (Gemini) `generationConfig` with its `maxOutputTokens`, (Bedrock)
    /// `inferenceConfig` with its `maxTokens`.
    fn limit_text(&self, tokens: u64) -> String {
        if self.endpoint.gemini() {
            self.gemini_config(tokens)
        } else if self.endpoint.bedrock() {
            self.bedrock_config(tokens)
        } else {
            tokens.to_string()
        }
    }

    /// The input token bound: the body's bytes (with the proxy's members `set`) less
    /// the images' base64 data, plus each image's bound and the price's overheads for
    /// tools and web searches; refused for an image the price has no bound for.
    fn input_bound(
        &self,
        price: &ModelPrice,
        set: &BTreeMap<&str, String>,
    ) -> Result<u64, RequestError> {
        let image_tokens = match (self.images.count, price.image_tokens) {
            (0, _) => 0,
            (n, Some(each)) => n.saturating_mul(each),
            (_, None) => {
                return Err(RequestError::unpriced(
                    self.images.first.clone().unwrap_or_else(|| "image".into()),
                    "is an image, and this model's price has no image_tokens (the most input tokens one image can cost)",
                ))
            }
        };
        let added = if self.tools {
            price.tool_prompt_tokens
        } else {
            0
        }
        .saturating_add(
            self.web_searches
                .saturating_mul(price.web_search_tokens_per_use),
        );
        Ok((self.rendered_len(set) as u64)
            .saturating_sub(self.images.data_bytes)
            .saturating_add(added)
            .saturating_add(image_tokens))
    }

    /// The output tokens asked of the upstream per choice, whether the proxy set them
    /// itself (`injected`) and whether it lowered the request's own (`clamped`), with
    /// `fixed` the cost of all but the output and `remaining` what the run can pay.
    fn output_limit(
        &self,
        price: &ModelPrice,
        fixed: Nanos,
        remaining: Nanos,
        clamp: bool,
    ) -> (u64, bool, bool) {
        let pays = |left: Nanos| {
            let per_choice = affordable(left, price.output_per_mtok) / self.choices;
            per_choice.clamp(1, price.max_output_tokens)
        };
        match self.max_tokens {
            Some(m) => {
                let m = m.min(price.max_output_tokens);
                let total = fixed
                    .checked_add(self.output_cost(price, m))
                    .unwrap_or(Nanos::MAX);
                if clamp && total > remaining {
                    let lower = pays(remaining.saturating_sub(fixed)).min(m);
                    (lower, false, lower < m)
                } else {
                    (m, false, false)
                }
            }
            None => (pays(remaining.saturating_sub(fixed)), true, false),
        }
    }

    /// What `tokens` of output per choice cost.
    fn output_cost(&self, price: &ModelPrice, tokens: u64) -> Nanos {
        per_million(tokens.saturating_mul(self.choices), price.output_per_mtok)
            .unwrap_or(Nanos::MAX)
    }
}

/// The most tokens `left` pays at `per_mtok` per million (all, if they are free).
fn affordable(left: Nanos, per_mtok: Nanos) -> u64 {
    if per_mtok.0 == 0 {
        return u64::MAX;
    }
    let n = u128::from(left.0) * 1_000_000 / u128::from(per_mtok.0);
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Raw JSON text the proxy writes itself (a literal or a rendered object).
pub(super) fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_else(|_| {
        // Only valid JSON is ever passed; `null` keeps the type total.
        RawValue::from_string("null".into()).expect("null is JSON")
    })
}

/// Members as one JSON object: keys in byte order (a `BTreeMap` of `String`s), each
/// value its exact text.
pub(super) fn render(members: &BTreeMap<String, Box<RawValue>>) -> String {
    let mut out = String::with_capacity(256);
    out.push('{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // A string's JSON form cannot fail.
        out.push_str(&serde_json::to_string(k).unwrap_or_default());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    out
}
