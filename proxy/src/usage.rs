//! What a model call used, as its upstream reports it, and what that costs.
//!
//! * OpenAI: `usage.prompt_tokens`, `usage.completion_tokens`, and
//!   `usage.prompt_tokens_details.cached_tokens` (part of the prompt tokens); a stream
//!   reports it in its last chunk (`choices: []`), which the proxy asks for with
//!   `stream_options.include_usage`.
//! * Anthropic: `usage.input_tokens`, `usage.output_tokens`,
//!   `usage.cache_read_input_tokens` and `usage.cache_creation_input_tokens` (neither
//!   part of `input_tokens`; cache writes are counted at the input price); a stream
//!   reports the input in `message_start` and the output in `message_delta`.

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
    /// Output tokens.
    pub output: u64,
}

impl Usage {
    /// What it costs at `price` (`None`: more than a `u64` of nanodollars).
    pub fn cost(&self, price: &ModelPrice) -> Option<Nanos> {
        per_million(self.input, price.input_per_mtok)?
            .checked_add(per_million(self.cached, price.cached_input_per_mtok)?)?
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
            let (input, cached) = anthropic_input(v.get("usage")?)?;
            Some(Usage {
                input,
                cached,
                output: count(&v, "/usage/output_tokens")?,
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
    })
}

/// Anthropic's input: (tokens at the input price, tokens read from the cache).
fn anthropic_input(u: &Value) -> Option<(u64, u64)> {
    let input = count(u, "/input_tokens")?;
    let written = count(u, "/cache_creation_input_tokens").unwrap_or(0);
    let read = count(u, "/cache_read_input_tokens").unwrap_or(0);
    Some((input.checked_add(written)?, read))
}

/// Reads usage from a stream's events, in order.
#[derive(Debug, Clone)]
pub struct StreamUsage {
    kind: UpstreamKind,
    input: Option<(u64, u64)>,
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
            UpstreamKind::Anthropic => {
                let (input, cached) = self.input?;
                Some(Usage {
                    input,
                    cached,
                    output: self.output?,
                })
            }
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
                output: 50
            })
        );
        let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7}}"#;
        assert_eq!(
            from_body(UpstreamKind::Anthropic, b),
            Some(Usage {
                input: 10,
                cached: 7,
                output: 5
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
                output: 30
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
                output: 4
            })
        );
    }
}
