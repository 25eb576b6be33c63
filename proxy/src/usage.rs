//! What a model call used, as its upstream reports it, and what that costs.
//!
//! * OpenAI: `usage.prompt_tokens`, `usage.completion_tokens`, and
//!   `usage.prompt_tokens_details.cached_tokens` (part of the prompt tokens); a stream
//!   reports it in its last chunk (`choices: []`), which the proxy asks for with
//!   `stream_options.include_usage`.
//! * Anthropic: `usage.input_tokens`, `usage.output_tokens`,
//!   `usage.cache_read_input_tokens` (at the cached price) and
//!   `usage.cache_creation_input_tokens` (at the cache-write price; of them,
//!   `usage.cache_creation.ephemeral_1h_input_tokens` at the 1-hour cache-write price);
//!   none of them part of `input_tokens`. A cache write the policy gives no price for is
//!   not guessed: the call settles at its reservation. A stream reports the input in
//!   `message_start` and the output in `message_delta`.

use serde_json::Value;
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::{per_million, Nanos};

/// Tokens a call used.
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
}

impl Usage {
    /// What it costs at `price` (`None`: more than a `u64` of nanodollars).
    /// [`Nanos::MAX`] if it reports cache writes `price` has no price for: tally does
    /// not guess, and the call settles at its reservation.
    pub fn cost(&self, price: &ModelPrice) -> Option<Nanos> {
        let unpriced = (self.written > 0 && price.cache_write_per_mtok.is_none())
            || (self.written_1h > 0 && price.cache_write_1h_per_mtok.is_none());
        if unpriced {
            return Some(Nanos::MAX);
        }
        let write = |tokens: u64, per_mtok: Option<Nanos>| match per_mtok {
            Some(p) => per_million(tokens, p),
            None => Some(Nanos(0)),
        };
        per_million(self.input, price.input_per_mtok)?
            .checked_add(per_million(self.cached, price.cached_input_per_mtok)?)?
            .checked_add(write(self.written, price.cache_write_per_mtok)?)?
            .checked_add(write(self.written_1h, price.cache_write_1h_per_mtok)?)?
            .checked_add(per_million(self.output, price.output_per_mtok)?)
    }
}

fn count(v: &Value, path: &str) -> Option<u64> {
    v.pointer(path).and_then(Value::as_u64)
}

/// Usage in a complete (not streamed) JSON answer; `None` if it reports none.
pub fn from_body(kind: UpstreamKind, body: &[u8]) -> Option<Usage> {
    let v: Value = serde_json::from_slice(body).ok()?;
    match kind {
        UpstreamKind::Openai => openai(&v),
        UpstreamKind::Anthropic => {
            let input = anthropic_input(v.get("usage")?)?;
            Some(Usage {
                output: count(&v, "/usage/output_tokens")?,
                ..input
            })
        }
        UpstreamKind::Http => None,
    }
}

fn openai(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    let prompt = count(u, "/prompt_tokens")?;
    let output = count(u, "/completion_tokens")?;
    let cached = count(u, "/prompt_tokens_details/cached_tokens")
        .unwrap_or(0)
        .min(prompt);
    Some(Usage {
        input: prompt - cached,
        cached,
        output,
        ..Usage::default()
    })
}

/// Anthropic's input (its output left 0): tokens at the input price, read from the
/// cache, written to the 5-minute and to the 1-hour cache.
fn anthropic_input(u: &Value) -> Option<Usage> {
    let input = count(u, "/input_tokens")?;
    let written = count(u, "/cache_creation_input_tokens").unwrap_or(0);
    // The 1-hour part of the writes, where the answer breaks them down (at most all).
    let written_1h = count(u, "/cache_creation/ephemeral_1h_input_tokens")
        .unwrap_or(0)
        .min(written);
    Some(Usage {
        input,
        cached: count(u, "/cache_read_input_tokens").unwrap_or(0),
        written: written - written_1h,
        written_1h,
        output: 0,
    })
}

/// Reads usage from a stream's events, in order.
#[derive(Debug, Clone)]
pub struct StreamUsage {
    kind: UpstreamKind,
    input: Option<Usage>,
    output: Option<u64>,
    openai: Option<Usage>,
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
    pub fn new(kind: UpstreamKind) -> StreamUsage {
        StreamUsage {
            kind,
            input: None,
            output: None,
            openai: None,
        }
    }

    /// Reads one event's data; whether to pass it to a client that did not ask for the
    /// usage chunk.
    pub fn event(&mut self, data: &str) -> Keep {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Keep::Pass;
        };
        match self.kind {
            UpstreamKind::Openai => {
                if v.get("usage").is_some_and(Value::is_object) {
                    if let Some(u) = openai(&v) {
                        self.openai = Some(u);
                    }
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
            UpstreamKind::Anthropic => {
                match v.get("type").and_then(Value::as_str) {
                    Some("message_start") => {
                        if let Some(u) = v.pointer("/message/usage") {
                            self.input = anthropic_input(u);
                        }
                    }
                    Some("message_delta") => {
                        if let Some(o) = count(&v, "/usage/output_tokens") {
                            self.output = Some(o);
                        }
                        // Newer answers repeat the input in the delta.
                        if let Some(u) = v.get("usage") {
                            if u.get("input_tokens").is_some() {
                                if let Some(i) = anthropic_input(u) {
                                    self.input = Some(i);
                                }
                            }
                        }
                    }
                    _ => {}
                }
                Keep::Pass
            }
            UpstreamKind::Http => Keep::Pass,
        }
    }

    /// The usage the stream reported in full, if it did.
    pub fn usage(&self) -> Option<Usage> {
        match self.kind {
            UpstreamKind::Openai => self.openai,
            UpstreamKind::Anthropic => Some(Usage {
                output: self.output?,
                ..self.input?
            }),
            UpstreamKind::Http => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_bodies_and_streams() {
        let b = br#"{"usage":{"prompt_tokens":100,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":40}}}"#;
        assert_eq!(
            from_body(UpstreamKind::Openai, b),
            Some(Usage {
                input: 60,
                cached: 40,
                output: 50,
                ..Usage::default()
            })
        );
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7}}"#;
        assert_eq!(
            from_body(UpstreamKind::Anthropic, b),
            Some(Usage {
                input: 10,
                cached: 7,
                output: 5,
                ..Usage::default()
            })
        );
        assert_eq!(from_body(UpstreamKind::Openai, br#"{"usage":null}"#), None);
        let mut s = StreamUsage::new(UpstreamKind::Anthropic);
        s.event(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#,
        );
        assert_eq!(s.usage(), None, "no output yet: a cut stream has no usage");
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":30}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                input: 9,
                cached: 0,
                output: 30,
                ..Usage::default()
            })
        );
        let mut s = StreamUsage::new(UpstreamKind::Openai);
        assert_eq!(
            s.event(r#"{"choices":[{"delta":{}}],"usage":null}"#),
            Keep::Pass
        );
        assert_eq!(
            s.event(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#),
            Keep::Drop
        );
        assert_eq!(
            s.usage(),
            Some(Usage {
                input: 3,
                cached: 0,
                output: 4,
                ..Usage::default()
            })
        );
    }

    fn price(cache_write: Option<u64>, cache_write_1h: Option<u64>) -> ModelPrice {
        ModelPrice {
            input_per_mtok: Nanos(3_000_000_000),
            cached_input_per_mtok: Nanos(300_000_000),
            cache_write_per_mtok: cache_write.map(Nanos),
            cache_write_1h_per_mtok: cache_write_1h.map(Nanos),
            output_per_mtok: Nanos(15_000_000_000),
            max_output_tokens: 1000,
        }
    }

    #[test]
    fn cache_writes_are_priced_at_their_own_price_or_not_guessed() {
        // 1000 written, of them 400 to the 1-hour cache; 7 read; 10 plain in; 5 out.
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,
            "cache_creation_input_tokens":1000,
            "cache_creation":{"ephemeral_5m_input_tokens":600,"ephemeral_1h_input_tokens":400}}}"#;
        let u = from_body(UpstreamKind::Anthropic, b).expect("usage");
        assert_eq!(
            u,
            Usage {
                input: 10,
                cached: 7,
                written: 600,
                written_1h: 400,
                output: 5
            }
        );
        // $3.75 and $6 per million writes: exact nanodollars.
        let p = price(Some(3_750_000_000), Some(6_000_000_000));
        let want = 10 * 3_000 + 7 * 300 + 600 * 3_750 + 400 * 6_000 + 5 * 15_000;
        assert_eq!(u.cost(&p), Some(Nanos(want)));
        // Not at the plain input price (the old count, 25 % and 50 % under the bill).
        assert!(want > (10 + 1000) * 3_000 + 7 * 300 + 5 * 15_000);
        // A write with no price: the most the call could cost (its reservation).
        assert_eq!(u.cost(&price(Some(3_750_000_000), None)), Some(Nanos::MAX));
        assert_eq!(u.cost(&price(None, Some(6_000_000_000))), Some(Nanos::MAX));
        // No writes: no write price needed.
        let plain = Usage {
            input: 10,
            output: 5,
            ..Usage::default()
        };
        assert_eq!(plain.cost(&price(None, None)), Some(Nanos(30_000 + 75_000)));
        // Without the breakdown every write is a 5-minute one; a breakdown above the
        // total is read as all of it.
        let b = br#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":8,
            "cache_creation":{"ephemeral_1h_input_tokens":9}}}"#;
        let u = from_body(UpstreamKind::Anthropic, b).expect("usage");
        assert_eq!((u.written, u.written_1h), (0, 8));
        let mut s = StreamUsage::new(UpstreamKind::Anthropic);
        s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":2,"cache_creation_input_tokens":30}}}"#);
        s.event(r#"{"type":"message_delta","usage":{"output_tokens":3}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                input: 2,
                written: 30,
                output: 3,
                ..Usage::default()
            })
        );
    }
}
