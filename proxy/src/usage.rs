//! What a model call used, as its upstream reports it, and what that costs.
//!
//! * OpenAI Chat Completions: `usage.prompt_tokens`, `usage.completion_tokens`, and
//!   `usage.prompt_tokens_details.cached_tokens` (part of the prompt tokens); a stream
//!   reports it in its last chunk (`choices: []`), which the proxy asks for with
//!   `stream_options.include_usage`.
//! * OpenAI Responses: `usage.input_tokens`, `usage.output_tokens` and
//!   `usage.input_tokens_details.cached_tokens` (part of the input tokens); web searches
//!   are the answer's `output` items of type `web_search_call`. A stream reports the
//!   response in its `response.completed` event (`response.incomplete` and
//!   `response.failed` where they carry usage).
//! * Anthropic: `usage.input_tokens`, `usage.output_tokens`,
//!   `usage.cache_read_input_tokens` (at the cached price) and
//!   `usage.cache_creation_input_tokens` (at the cache-write price; of them,
//!   `usage.cache_creation.ephemeral_1h_input_tokens` at the 1-hour cache-write price);
//!   none of them part of `input_tokens`; `usage.server_tool_use.web_search_requests` at
//!   the per-search price. A stream reports the input in `message_start` and the output
//!   (and, in newer answers, the totals again) in `message_delta`.
//! * Gemini: `usageMetadata` ([`gemini`]): the prompt (less its cached part) and the
//!   tool-use prompt as input, the cached part at the cached price, the candidates and
//!   the thoughts as output; a stream's last `usageMetadata`, once a chunk says the
//!   answer ended.
//! * Bedrock: Converse's `usage` ([`bedrock`]): `inputTokens`, `cacheReadInputTokens` (at
//!   the cached price), `cacheWriteInputTokens` (at the cache-write price) and
//!   `outputTokens`, `totalTokens` checked against them; a ConverseStream's in its
//!   `metadata` event, an AWS event-stream frame ([`StreamUsage::frame`]).
//! * `count_tokens` is free: its answer costs nothing, whatever it says.
//!
//! Read strictly ([`Reported`]): no usage at all is [`Reported::Missing`]; usage that is
//! there but cannot be true (a count that is negative, not a whole number, a part above
//! its whole, a total above what the model can take and give) is
//! [`Reported::Implausible`], never clipped into something believable.

use serde_json::Value;
use tally_policy::ModelPrice;
use tally_record::money::{per_million, Nanos};

use crate::endpoint::Endpoint;

mod bedrock;
mod gemini;

use crate::pruned::{self, Prune};

/// What the readers of `endpoint` read of an answer (or of one event of its stream),
/// declared next to them: the only members [`crate::pruned`] keeps.
fn shape(endpoint: Endpoint) -> &'static Prune {
    match endpoint {
        Endpoint::ChatCompletions => &CHAT,
        Endpoint::Responses => &RESPONSES,
        Endpoint::Messages => &MESSAGES,
        Endpoint::GenerateContent | Endpoint::StreamGenerateContent => &gemini::KEPT,
        Endpoint::Converse | Endpoint::ConverseStream => &bedrock::KEPT,
        // Nothing is read of the others' answers: checked as JSON, kept as `null`.
        _ => &Prune::Skip,
    }
}

/// Chat Completions: the usage ([`chat`]), the tier ([`crate::tier::said`]) and the
/// choices, counted (a stream's usage chunk has none: [`StreamUsage::event_value`]).
const CHAT: Prune = Prune::Fields(&[
    ("usage", Prune::Whole),
    crate::tier::OPENAI,
    ("choices", Prune::Items(&Prune::Skip)),
]);

/// Responses: a response's usage, tier and its output items' types ([`responses`]), at
/// the top (a plain answer) or under `response` (a stream's event, named by its `type`).
const RESPONSES: Prune = Prune::Fields(&[
    ("usage", Prune::Whole),
    crate::tier::OPENAI,
    ("output", Prune::Items(&OUTPUT_TYPE)),
    ("type", Prune::Whole),
    (
        "response",
        Prune::Fields(&[
            ("usage", Prune::Whole),
            crate::tier::OPENAI,
            ("output", Prune::Items(&OUTPUT_TYPE)),
        ]),
    ),
]);

/// A Responses output item: its type (a web search's, [`responses`]).
const OUTPUT_TYPE: Prune = Prune::Fields(&[("type", Prune::Whole)]);

/// Messages: the usage, at the top or under `message` (`message_start`), and the event's
/// type; the tier ([`crate::tier::said`]) is read inside the usage, kept whole.
const MESSAGES: Prune = Prune::Fields(&[
    ("usage", Prune::Whole),
    ("type", Prune::Whole),
    ("message", Prune::Fields(&[("usage", Prune::Whole)])),
]);

/// Tokens (and server tool uses) a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens at the input price.
    pub input: u64,
    /// Input tokens read from the API's cache (at the cached price).
    pub cached: u64,
    /// Input tokens written to the API's 5-minute cache (at the cache-write price).
    pub written: u64,
    /// Input tokens written to the API's 1-hour cache (at its cache-write price).
    pub written_1h: u64,
    /// Output tokens.
    pub output: u64,
    /// Web searches (at the per-use price).
    pub web_searches: u64,
    /// Whether it reports tokens of a modality no price covers (Gemini: output other
    /// than text, input other than text and images): tally does not guess what they
    /// cost.
    pub other_modality: bool,
}

impl Usage {
    /// What it costs at `price`; `None` if more than a `u64` of nanodollars, or if it
    /// reports what `price` has no price for (cache writes, web searches): tally does
    /// not guess.
    pub fn cost(&self, price: &ModelPrice) -> Option<Nanos> {
        let priced = |n: u64, p: Option<Nanos>| -> Option<Nanos> {
            match (n, p) {
                (0, _) => Some(Nanos(0)),
                (n, Some(p)) => per_million(n, p),
                (_, None) => None,
            }
        };
        let searches = match (self.web_searches, price.web_search_per_use) {
            (0, _) => Nanos(0),
            (n, Some(p)) => Nanos(p.0.checked_mul(n)?),
            (_, None) => return None,
        };
        per_million(self.input, price.input_per_mtok)?
            .checked_add(per_million(self.cached, price.cached_input_per_mtok)?)?
            .checked_add(priced(self.written, price.cache_write_per_mtok)?)?
            .checked_add(priced(self.written_1h, price.cache_write_1h_per_mtok)?)?
            .checked_add(per_million(self.output, price.output_per_mtok)?)?
            .checked_add(searches)
    }

    /// Whether it reports a class of usage `price` has no price for (cache writes, web
    /// searches, a modality no price covers): tally does not guess what that costs.
    pub fn unpriced(&self, price: &ModelPrice) -> bool {
        self.other_modality
            || (self.written > 0 && price.cache_write_per_mtok.is_none())
            || (self.written_1h > 0 && price.cache_write_1h_per_mtok.is_none())
            || (self.web_searches > 0 && price.web_search_per_use.is_none())
    }

    /// As an outcome records it (`None` when it reports nothing at all).
    pub fn recorded(&self) -> Option<tally_record::Usage> {
        let u = tally_record::Usage::of(
            self.input,
            self.cached,
            self.written,
            self.written_1h,
            self.output,
            self.web_searches,
        );
        (!u.is_empty()).then_some(u)
    }

    /// Every token it counts.
    pub fn tokens(&self) -> u64 {
        self.input
            .saturating_add(self.cached)
            .saturating_add(self.written)
            .saturating_add(self.written_1h)
            .saturating_add(self.output)
    }
}

/// What an answer says the call used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// No usage: the answer has none (or was cut before it).
    Missing,
    /// Usage that can be true.
    Usage(Usage),
    /// Usage that is there but cannot be true, and why.
    Implausible(String),
}

impl Reported {
    /// The same, judged against the model's limits: more tokens than its context and
    /// its output limit times the `choices` asked for (once per sampling: a web search
    /// is one more) cannot be true. Without a price, unchanged.
    pub fn within(self, price: Option<&ModelPrice>, choices: u64) -> Reported {
        match (self, price) {
            (Reported::Usage(u), Some(p)) => {
                let per_turn = p
                    .context_tokens
                    .saturating_add(p.max_output_tokens.saturating_mul(choices.max(1)));
                let most = per_turn.saturating_mul(u.web_searches.saturating_add(1));
                if u.tokens() > most {
                    Reported::Implausible(format!(
                        "{} tokens reported, above the model's context_tokens + max_output_tokens per choice ({most})",
                        u.tokens()
                    ))
                } else {
                    Reported::Usage(u)
                }
            }
            (r, _) => r,
        }
    }

    /// The usage, if it can be true (implausible usage as none).
    pub fn usage(self) -> Option<Usage> {
        match self {
            Reported::Usage(u) => Some(u),
            Reported::Missing | Reported::Implausible(_) => None,
        }
    }
}

/// A token count at `path` under `v`: `Ok(None)` if absent or null, an error if it is
/// not a whole number a `u64` holds.
fn count(v: &Value, path: &str) -> Result<Option<u64>, String> {
    match v.pointer(path) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(x) => Err(format!(
            "`usage{path}` is {x}: not a whole number of tokens"
        )),
    }
}

/// A count that must be there.
fn needed(v: &Value, path: &str) -> Result<u64, String> {
    count(v, path)?.ok_or_else(|| format!("`usage{path}` is missing from the usage"))
}

/// `usage` as a reader of it says: missing (absent or null), or read by `read`.
fn reported(usage: Option<&Value>, read: impl Fn(&Value) -> Result<Usage, String>) -> Reported {
    match usage {
        None | Some(Value::Null) => Reported::Missing,
        Some(u @ Value::Object(_)) => match read(u) {
            Ok(u) => Reported::Usage(u),
            Err(why) => Reported::Implausible(why),
        },
        Some(x) => Reported::Implausible(format!("`usage` is {x}: not an object")),
    }
}

/// Usage in a complete (not streamed) JSON answer from `endpoint`.
pub fn from_body(endpoint: Endpoint, body: &[u8]) -> Reported {
    answer(endpoint, body).0
}

/// Usage in a complete (not streamed) JSON answer from `endpoint`, and the billing tier
/// it says served it ([`crate::tier::said`]).
pub fn answer(endpoint: Endpoint, body: &[u8]) -> (Reported, Option<String>) {
    if endpoint == Endpoint::CountTokens {
        return (Reported::Usage(Usage::default()), None);
    }
    // Only the members the readers look at are kept ([`pruned`]).
    let Ok(v) = pruned::read(shape(endpoint), body) else {
        return (Reported::Missing, None);
    };
    (of_body(endpoint, &v), crate::tier::said(endpoint, &v))
}

/// What [`answer`] says of an answer already read whole into `v`: the same readers over
/// a whole `Value` (a differential fuzz target compares the two readings).
pub fn answer_of_value(endpoint: Endpoint, v: &Value) -> (Reported, Option<String>) {
    if endpoint == Endpoint::CountTokens {
        return (Reported::Usage(Usage::default()), None);
    }
    (of_body(endpoint, v), crate::tier::said(endpoint, v))
}

fn of_body(endpoint: Endpoint, v: &Value) -> Reported {
    match endpoint {
        Endpoint::ChatCompletions => reported(v.get("usage"), chat),
        Endpoint::Responses => responses(v),
        Endpoint::Messages => reported(v.get("usage"), |u| {
            Ok(Usage {
                output: needed(u, "/output_tokens")?,
                ..anthropic_input(u)?
            })
        }),
        Endpoint::GenerateContent => reported(v.get("usageMetadata"), gemini::usage),
        Endpoint::Converse => reported(v.get("usage"), bedrock::usage),
        _ => Reported::Missing,
    }
}

fn chat(u: &Value) -> Result<Usage, String> {
    let prompt = needed(u, "/prompt_tokens")?;
    let output = needed(u, "/completion_tokens")?;
    let cached = count(u, "/prompt_tokens_details/cached_tokens")?.unwrap_or(0);
    if cached > prompt {
        return Err(format!(
            "{cached} cached tokens reported of {prompt} prompt tokens"
        ));
    }
    Ok(Usage {
        input: prompt - cached,
        cached,
        output,
        ..Usage::default()
    })
}

/// A Responses API response object: its usage and its web searches.
fn responses(response: &Value) -> Reported {
    let searches = response
        .get("output")
        .and_then(Value::as_array)
        .map_or(0, |items| {
            items
                .iter()
                .filter(|i| i.get("type").and_then(Value::as_str) == Some("web_search_call"))
                .count() as u64
        });
    reported(response.get("usage"), |u| {
        let input = needed(u, "/input_tokens")?;
        let output = needed(u, "/output_tokens")?;
        let cached = count(u, "/input_tokens_details/cached_tokens")?.unwrap_or(0);
        if cached > input {
            return Err(format!(
                "{cached} cached tokens reported of {input} input tokens"
            ));
        }
        Ok(Usage {
            input: input - cached,
            cached,
            output,
            web_searches: searches,
            ..Usage::default()
        })
    })
}

/// Anthropic's input (its output left 0): tokens at the input price, read from the
/// cache, written to the 5-minute and to the 1-hour cache; and web searches.
fn anthropic_input(u: &Value) -> Result<Usage, String> {
    let input = needed(u, "/input_tokens")?;
    let written = count(u, "/cache_creation_input_tokens")?.unwrap_or(0);
    // The 1-hour part of the writes, where the answer breaks them down.
    let written_1h = count(u, "/cache_creation/ephemeral_1h_input_tokens")?.unwrap_or(0);
    if written_1h > written {
        return Err(format!(
            "{written_1h} tokens written to the 1-hour cache of {written} written"
        ));
    }
    Ok(Usage {
        input,
        cached: count(u, "/cache_read_input_tokens")?.unwrap_or(0),
        written: written - written_1h,
        written_1h,
        output: 0,
        web_searches: count(u, "/server_tool_use/web_search_requests")?.unwrap_or(0),
        other_modality: false,
    })
}

/// Reads usage from a stream's events, in order.
#[derive(Debug, Clone)]
pub struct StreamUsage {
    endpoint: Endpoint,
    /// Anthropic: the input, from `message_start` (or a later delta).
    input: Option<Usage>,
    /// Anthropic: the output tokens, from `message_delta`.
    output: Option<u64>,
    /// OpenAI: the usage chunk or the final response's.
    whole: Option<Reported>,
    /// The first count that could not be true, if any: the whole stream's usage then is.
    bad: Option<String>,
    /// The billing tier the stream last said served it.
    tier: Option<String>,
    /// Gemini: whether a chunk said the answer ended.
    ended: bool,
    /// Bedrock: the exception a ConverseStream sent, if it sent one.
    excepted: Option<String>,
}

/// What to do with one event of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Pass it on.
    Pass,
    /// Drop it: the usage chunk the proxy asked for and the client did not.
    Drop,
}

impl StreamUsage {
    /// Nothing read yet.
    pub fn new(endpoint: Endpoint) -> StreamUsage {
        StreamUsage {
            endpoint,
            input: None,
            output: None,
            whole: None,
            bad: None,
            tier: None,
            ended: false,
            excepted: None,
        }
    }

    /// The billing tier the stream says served it, if it said.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    fn note(&mut self, r: Result<(), String>) {
        if let (Err(why), None) = (r, &self.bad) {
            self.bad = Some(why);
        }
    }

    /// Reads one event's data; whether to pass it to a client that did not ask for the
    /// usage chunk.
    pub fn event(&mut self, data: &str) -> Keep {
        let Ok(v) = pruned::read_str(shape(self.endpoint), data) else {
            return Keep::Pass;
        };
        self.event_value(&v)
    }

    /// Reads one event's data, as read ([`StreamUsage::event`]).
    fn event_value(&mut self, v: &Value) -> Keep {
        if let Some(t) = crate::tier::said(self.endpoint, v) {
            self.tier = Some(t);
        }
        match self.endpoint {
            Endpoint::ChatCompletions => {
                if v.get("usage").is_some_and(|u| !u.is_null()) {
                    self.whole = Some(reported(v.get("usage"), chat));
                    // The usage chunk has no choices; a chunk that has some is content.
                    let empty = v
                        .get("choices")
                        .and_then(Value::as_array)
                        .is_none_or(Vec::is_empty);
                    if empty {
                        return Keep::Drop;
                    }
                }
                Keep::Pass
            }
            Endpoint::Responses => {
                if let Some("response.completed" | "response.incomplete" | "response.failed") =
                    v.get("type").and_then(Value::as_str)
                {
                    if let Some(r) = v.get("response") {
                        self.whole = Some(responses(r));
                    }
                }
                Keep::Pass
            }
            Endpoint::Messages => {
                match v.get("type").and_then(Value::as_str) {
                    Some("message_start") => {
                        if let Some(u) = v.pointer("/message/usage").filter(|u| !u.is_null()) {
                            let read = anthropic_input(u);
                            self.input = read.as_ref().ok().copied();
                            self.note(read.map(|_| ()));
                        }
                    }
                    Some("message_delta") => {
                        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                            match count(u, "/output_tokens") {
                                Ok(Some(o)) => self.output = Some(o),
                                Ok(None) => {}
                                Err(why) => self.note(Err(why)),
                            }
                            // Newer answers repeat the input (with its searches) in the
                            // delta: the totals, read over the start's.
                            if u.get("input_tokens").is_some() {
                                let read = anthropic_input(u);
                                if let Ok(i) = read {
                                    self.input = Some(i);
                                }
                                self.note(read.map(|_| ()));
                            } else if u.get("server_tool_use").is_some() {
                                match count(u, "/server_tool_use/web_search_requests") {
                                    Ok(n) => {
                                        if let (Some(i), Some(n)) = (self.input.as_mut(), n) {
                                            i.web_searches = n;
                                        }
                                    }
                                    Err(why) => self.note(Err(why)),
                                }
                            }
                        }
                    }
                    _ => {}
                }
                Keep::Pass
            }
            Endpoint::StreamGenerateContent => {
                self.gemini_chunk(v);
                Keep::Pass
            }
            _ => Keep::Pass,
        }
    }

    /// Bedrock: one event of a ConverseStream (an event-stream frame of `kind`, its JSON
    /// `payload`): the `metadata` event's usage is the call's. A stream sends one: a
    /// second, or one after an exception, is a count that cannot be true (the stream's
    /// usage is then implausible, never the last one said).
    pub fn frame(&mut self, kind: &str, payload: &[u8]) {
        if self.endpoint != Endpoint::ConverseStream || kind != "metadata" {
            return;
        }
        if let Some(what) = self.excepted.clone() {
            self.note(Err(format!(
                "a metadata event after the exception `{what}`"
            )));
        }
        if self.whole.is_some() {
            self.note(Err("a second metadata event".to_owned()));
        }
        self.whole = Some(match pruned::read(&bedrock::KEPT, payload) {
            Ok(v) => reported(v.get("usage"), bedrock::usage),
            Err(e) => Reported::Implausible(format!("a metadata event that is not JSON: {e}")),
        });
    }

    /// Bedrock: an exception a ConverseStream sent (`what`, its type): the answer has no
    /// usage after it.
    pub fn exception(&mut self, what: &str) {
        if self.excepted.is_none() {
            self.excepted = Some(what.to_owned());
        }
    }

    /// Gemini: a chunk's usage so far, and whether it ends the answer.
    fn gemini_chunk(&mut self, v: &Value) {
        if v.get("usageMetadata").is_some_and(|u| !u.is_null()) {
            self.whole = Some(reported(v.get("usageMetadata"), gemini::usage));
        }
        self.ended |= gemini::ended(v);
    }

    /// What the stream reported in full, if it did.
    pub fn reported(&self) -> Reported {
        if let Some(why) = &self.bad {
            return Reported::Implausible(why.clone());
        }
        match self.endpoint {
            Endpoint::ChatCompletions | Endpoint::Responses => {
                self.whole.clone().unwrap_or(Reported::Missing)
            }
            Endpoint::Messages => match (self.input, self.output) {
                (Some(i), Some(o)) => Reported::Usage(Usage { output: o, ..i }),
                _ => Reported::Missing,
            },
            Endpoint::CountTokens => Reported::Usage(Usage::default()),
            Endpoint::StreamGenerateContent if self.ended => {
                self.whole.clone().unwrap_or(Reported::Missing)
            }
            Endpoint::ConverseStream => self.whole.clone().unwrap_or(Reported::Missing),
            _ => Reported::Missing,
        }
    }
}

#[cfg(test)]
mod pruned_tests;
#[cfg(test)]
mod tests;
