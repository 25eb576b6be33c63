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
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (Reported::Missing, None);
    };
    (of_body(endpoint, &v), crate::tier::said(endpoint, &v))
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
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Keep::Pass;
        };
        if let Some(t) = crate::tier::said(self.endpoint, &v) {
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
                self.gemini_chunk(&v);
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
        self.whole = Some(match serde_json::from_slice::<Value>(payload) {
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
mod tests {
    use super::*;

    fn got(u: Usage) -> Reported {
        Reported::Usage(u)
    }

    #[test]
    fn a_converse_stream_says_its_usage_once_and_never_after_an_exception() {
        let big =
            br#"{"usage":{"inputTokens":900000,"outputTokens":900000,"totalTokens":1800000}}"#;
        let wrong = br#"{"usage":{"inputTokens":900000,"outputTokens":900000,"totalTokens":5}}"#;
        let small = br#"{"usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2}}"#;
        let mut one = StreamUsage::new(Endpoint::ConverseStream);
        one.frame("messageStart", b"{}");
        one.frame("metadata", small);
        assert!(matches!(one.reported(), Reported::Usage(u) if u.input == 1 && u.output == 1));
        // A second metadata event does not overwrite the first: the stream is implausible.
        let mut twice = StreamUsage::new(Endpoint::ConverseStream);
        twice.frame("metadata", big);
        twice.frame("metadata", small);
        assert!(matches!(twice.reported(), Reported::Implausible(why) if why.contains("second")));
        let mut twice = StreamUsage::new(Endpoint::ConverseStream);
        twice.frame("metadata", wrong);
        twice.frame("metadata", small);
        assert!(matches!(twice.reported(), Reported::Implausible(why) if why.contains("second")));
        // Usage after an exception cannot be the call's.
        let mut after = StreamUsage::new(Endpoint::ConverseStream);
        after.exception("throttlingException");
        after.frame("metadata", small);
        assert!(
            matches!(after.reported(), Reported::Implausible(why) if why.contains("throttlingException"))
        );
        // An exception and no usage: missing, as any stream that never said it.
        let mut cut = StreamUsage::new(Endpoint::ConverseStream);
        cut.exception("modelStreamErrorException");
        assert_eq!(cut.reported(), Reported::Missing);
    }

    #[test]
    fn usage_is_read_from_bodies_and_streams() {
        let b = br#"{"usage":{"prompt_tokens":100,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":40}}}"#;
        assert_eq!(
            from_body(Endpoint::ChatCompletions, b),
            got(Usage {
                input: 60,
                cached: 40,
                output: 50,
                ..Usage::default()
            })
        );
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7}}"#;
        assert_eq!(
            from_body(Endpoint::Messages, b),
            got(Usage {
                input: 10,
                cached: 7,
                output: 5,
                ..Usage::default()
            })
        );
        assert_eq!(
            from_body(Endpoint::ChatCompletions, br#"{"usage":null}"#),
            Reported::Missing
        );
        assert_eq!(from_body(Endpoint::Messages, b"{}"), Reported::Missing);
        let mut s = StreamUsage::new(Endpoint::Messages);
        s.event(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#,
        );
        assert_eq!(
            s.reported(),
            Reported::Missing,
            "no output yet: a cut stream has no usage"
        );
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":30}}"#);
        assert_eq!(
            s.reported(),
            got(Usage {
                input: 9,
                output: 30,
                ..Usage::default()
            })
        );
        let mut s = StreamUsage::new(Endpoint::ChatCompletions);
        assert_eq!(
            s.event(r#"{"choices":[{"delta":{}}],"usage":null}"#),
            Keep::Pass
        );
        assert_eq!(
            s.event(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#),
            Keep::Drop
        );
        assert_eq!(
            s.reported(),
            got(Usage {
                input: 3,
                output: 4,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn responses_usage_is_read_from_the_body_and_the_final_event() {
        let body = br#"{"id":"resp_1","object":"response","status":"completed",
            "output":[{"type":"web_search_call","id":"ws_1","status":"completed"},
                      {"type":"message","content":[{"type":"output_text","text":"hi"}]}],
            "usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":20},
                     "output_tokens":30,"output_tokens_details":{"reasoning_tokens":10},"total_tokens":150}}"#;
        let want = Usage {
            input: 100,
            cached: 20,
            output: 30,
            web_searches: 1,
            ..Usage::default()
        };
        assert_eq!(from_body(Endpoint::Responses, body), got(want));
        let mut s = StreamUsage::new(Endpoint::Responses);
        s.event(r#"{"type":"response.created","response":{"usage":null}}"#);
        assert_eq!(s.reported(), Reported::Missing);
        s.event(r#"{"type":"response.output_text.delta","delta":"hi"}"#);
        let done = format!(
            r#"{{"type":"response.completed","response":{}}}"#,
            String::from_utf8_lossy(body)
        );
        assert_eq!(s.event(&done), Keep::Pass);
        assert_eq!(s.reported(), got(want));
        let mut s = StreamUsage::new(Endpoint::Responses);
        s.event(r#"{"type":"response.incomplete","response":{"usage":{"input_tokens":5,"output_tokens":7}}}"#);
        assert_eq!(
            s.reported(),
            got(Usage {
                input: 5,
                output: 7,
                ..Usage::default()
            })
        );
        let mut s = StreamUsage::new(Endpoint::Responses);
        s.event(r#"{"type":"response.failed","response":{"usage":null}}"#);
        assert_eq!(s.reported(), Reported::Missing);
        // Chat's field names are not Responses usage.
        assert!(matches!(
            from_body(
                Endpoint::Responses,
                br#"{"usage":{"prompt_tokens":1,"completion_tokens":1}}"#
            ),
            Reported::Implausible(_)
        ));
    }

    #[test]
    fn count_tokens_costs_nothing() {
        let r = from_body(Endpoint::CountTokens, br#"{"input_tokens":4000}"#);
        assert_eq!(r, got(Usage::default()));
        assert_eq!(Usage::default().cost(&price(None, None)), Some(Nanos(0)));
    }

    #[test]
    fn usage_that_cannot_be_true_is_told_from_none() {
        for (endpoint, body) in [
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"prompt_tokens":-1,"completion_tokens":1}}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"prompt_tokens":1.5,"completion_tokens":1}}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"prompt_tokens":"3","completion_tokens":1}}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"prompt_tokens":1e30,"completion_tokens":1}}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"completion_tokens":1}}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":6}}}"#,
            ),
            (Endpoint::ChatCompletions, r#"{"usage":7}"#),
            (
                Endpoint::Messages,
                r#"{"usage":{"input_tokens":1,"output_tokens":-5}}"#,
            ),
            (
                Endpoint::Messages,
                r#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_read_input_tokens":0.5}}"#,
            ),
            (
                Endpoint::Messages,
                r#"{"usage":{"input_tokens":1,"output_tokens":1,"server_tool_use":{"web_search_requests":-1}}}"#,
            ),
            (
                Endpoint::Messages,
                r#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":8,"cache_creation":{"ephemeral_1h_input_tokens":9}}}"#,
            ),
            (Endpoint::Responses, r#"{"usage":{"input_tokens":1}}"#),
        ] {
            assert!(
                matches!(
                    from_body(endpoint, body.as_bytes()),
                    Reported::Implausible(_)
                ),
                "{body}"
            );
        }
        let mut s = StreamUsage::new(Endpoint::Messages);
        s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":-9}}}"#);
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":30}}"#);
        assert!(matches!(s.reported(), Reported::Implausible(_)));
        let mut s = StreamUsage::new(Endpoint::Messages);
        s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":9}}}"#);
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":3.5}}"#);
        assert!(matches!(s.reported(), Reported::Implausible(_)));
        // Above the model's context and output limit: not believed.
        let p = ModelPrice {
            context_tokens: 1000,
            ..price(None, None)
        };
        let big = Reported::Usage(Usage {
            input: 1000,
            output: 1001,
            ..Usage::default()
        });
        assert!(matches!(
            big.clone().within(Some(&p), 1),
            Reported::Implausible(_)
        ));
        assert_eq!(big.clone().within(None, 1), big, "no price, no bound");
        assert_eq!(big.within(Some(&p), 1).usage(), None);
        let fits = Reported::Usage(Usage {
            input: 1000,
            output: 1000,
            ..Usage::default()
        });
        assert_eq!(fits.clone().within(Some(&p), 1), fits);
        // A search is one more turn of sampling.
        let searched = Reported::Usage(Usage {
            input: 3000,
            output: 1000,
            web_searches: 1,
            ..Usage::default()
        });
        assert_eq!(searched.clone().within(Some(&p), 1), searched);
        // Each choice (OpenAI's `n`, Gemini's `candidateCount`) has its own output limit.
        let three = Reported::Usage(Usage {
            input: 1000,
            output: 3000,
            ..Usage::default()
        });
        assert_eq!(three.clone().within(Some(&p), 3), three);
        assert!(matches!(
            three.within(Some(&p), 2),
            Reported::Implausible(_)
        ));
    }

    fn price(cache_write: Option<u64>, cache_write_1h: Option<u64>) -> ModelPrice {
        ModelPrice {
            cached_input_per_mtok: Nanos(300_000_000),
            cache_write_per_mtok: cache_write.map(Nanos),
            cache_write_1h_per_mtok: cache_write_1h.map(Nanos),
            max_output_tokens: 1000,
            ..ModelPrice::new(Nanos(3_000_000_000), Nanos(15_000_000_000))
        }
    }

    #[test]
    fn web_searches_are_priced_per_use_or_not_guessed() {
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"server_tool_use":{"web_search_requests":2}}}"#;
        let u = from_body(Endpoint::Messages, b).usage().expect("usage");
        assert_eq!(u.web_searches, 2);
        let p = ModelPrice {
            web_search_per_use: Some(Nanos(10_000_000)),
            ..price(None, None)
        };
        assert_eq!(u.cost(&p), Some(Nanos(30_000 + 75_000 + 20_000_000)));
        assert_eq!(u.cost(&price(None, None)), None);
        // A stream's delta carries the searches with the totals.
        let mut s = StreamUsage::new(Endpoint::Messages);
        s.event(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}"#,
        );
        s.event(r#"{"type":"message_delta","usage":{"input_tokens":900,"output_tokens":5,"server_tool_use":{"web_search_requests":1}}}"#);
        assert_eq!(
            s.reported(),
            got(Usage {
                input: 900,
                output: 5,
                web_searches: 1,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn cache_writes_are_priced_at_their_own_price_or_not_guessed() {
        // 1000 written, of them 400 to the 1-hour cache; 7 read; 10 plain in; 5 out.
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,
            "cache_creation_input_tokens":1000,
            "cache_creation":{"ephemeral_5m_input_tokens":600,"ephemeral_1h_input_tokens":400}}}"#;
        let u = from_body(Endpoint::Messages, b).usage().expect("usage");
        assert_eq!(
            u,
            Usage {
                input: 10,
                cached: 7,
                written: 600,
                written_1h: 400,
                output: 5,
                web_searches: 0,
                other_modality: false,
            }
        );
        // $3.75 and $6 per million writes: exact nanodollars.
        let p = price(Some(3_750_000_000), Some(6_000_000_000));
        let want = 10 * 3_000 + 7 * 300 + 600 * 3_750 + 400 * 6_000 + 5 * 15_000;
        assert_eq!(u.cost(&p), Some(Nanos(want)));
        // Not at the plain input price (the old count, 25 % and 50 % under the bill).
        assert!(want > (10 + 1000) * 3_000 + 7 * 300 + 5 * 15_000);
        // A write with no price: no cost tally would have to guess.
        assert_eq!(u.cost(&price(Some(3_750_000_000), None)), None);
        assert_eq!(u.cost(&price(None, Some(6_000_000_000))), None);
        // No writes: no write price needed.
        let plain = Usage {
            input: 10,
            output: 5,
            ..Usage::default()
        };
        assert_eq!(plain.cost(&price(None, None)), Some(Nanos(30_000 + 75_000)));
        // Without the breakdown every write is a 5-minute one.
        let b =
            br#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":8}}"#;
        let u = from_body(Endpoint::Messages, b).usage().expect("usage");
        assert_eq!((u.written, u.written_1h), (8, 0));
        let mut s = StreamUsage::new(Endpoint::Messages);
        s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":2,"cache_creation_input_tokens":30}}}"#);
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":3}}"#);
        assert_eq!(
            s.reported(),
            got(Usage {
                input: 2,
                written: 30,
                output: 3,
                ..Usage::default()
            })
        );
    }
}
