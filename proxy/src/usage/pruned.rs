//! An answer's JSON read once into only the members the usage readers look at
//! ([`Prune`]): every other member is read and checked as it would be for a
//! [`Value`] (the same reader, its syntax, UTF-8, numbers and depth), and dropped without
//! being kept. A member dropped inside a kept one stays as `null` where the readers
//! count it (a chat chunk's `choices`), and a member that is not the object or array its
//! shape expects is `null`: the readers only ever `get` from it by name, which finds
//! nothing in either.
//!
//! (Not serde's `IgnoredAny`, which skips a number or a string without checking it as
//! a `Value`'s reader does: a number out of range, a string's UTF-8.)
//!
//! Whatever this reader cannot read (bad JSON, or a key serde_json would read as its
//! own private marker) is an error, on which the caller reads the whole [`Value`] as
//! before: an answer reads the same either way.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::endpoint::Endpoint;

/// What of a JSON value is kept.
#[derive(Debug)]
pub(super) enum Prune {
    /// All of it.
    Whole,
    /// An object's named members, each pruned by its shape; anything else is `null`.
    Fields(&'static [(&'static str, Prune)]),
    /// An array's items, each pruned by the shape; anything else is `null`.
    Items(&'static Prune),
    /// Nothing: `null`.
    Skip,
}

const WHOLE: Prune = Prune::Whole;
const TYPE_ONLY: Prune = Prune::Fields(&[("type", WHOLE)]);
const FINISH: Prune = Prune::Fields(&[("finishReason", WHOLE)]);

/// Chat Completions: the usage, its tier, and how many choices (a stream's usage chunk
/// has none).
const CHAT: Prune = Prune::Fields(&[
    ("usage", WHOLE),
    ("service_tier", WHOLE),
    ("choices", Prune::Items(&Prune::Skip)),
]);

/// Responses: a response's usage, tier and its output items' types (web searches), at the
/// top (a plain answer) or under `response` (a stream's event, named by its `type`).
const RESPONSES: Prune = Prune::Fields(&[
    ("usage", WHOLE),
    ("service_tier", WHOLE),
    ("output", Prune::Items(&TYPE_ONLY)),
    ("type", WHOLE),
    (
        "response",
        Prune::Fields(&[
            ("usage", WHOLE),
            ("service_tier", WHOLE),
            ("output", Prune::Items(&TYPE_ONLY)),
        ]),
    ),
]);

/// Messages: the usage, at the top or under `message` (`message_start`), and the type.
const MESSAGES: Prune = Prune::Fields(&[
    ("usage", WHOLE),
    ("type", WHOLE),
    ("message", Prune::Fields(&[("usage", WHOLE)])),
]);

/// Gemini: the usage, and whether a candidate or the prompt's feedback ended it.
const GEMINI: Prune = Prune::Fields(&[
    ("usageMetadata", WHOLE),
    ("candidates", Prune::Items(&FINISH)),
    ("promptFeedback", Prune::Fields(&[("blockReason", WHOLE)])),
]);

/// Bedrock Converse: the usage.
const CONVERSE: Prune = Prune::Fields(&[("usage", WHOLE)]);

/// What the usage readers of `endpoint` read of an answer (or a stream's event); `None`:
/// the whole value.
fn shape(endpoint: Endpoint) -> Option<&'static Prune> {
    match endpoint {
        Endpoint::ChatCompletions => Some(&CHAT),
        Endpoint::Responses => Some(&RESPONSES),
        Endpoint::Messages => Some(&MESSAGES),
        Endpoint::GenerateContent | Endpoint::StreamGenerateContent => Some(&GEMINI),
        Endpoint::Converse => Some(&CONVERSE),
        _ => None,
    }
}

/// `json` read as the usage readers of `endpoint` see it: pruned where it can be, else
/// (or where it cannot be read pruned) the whole [`Value`].
pub(super) fn read(endpoint: Endpoint, json: &[u8]) -> serde_json::Result<Value> {
    if let Some(shape) = shape(endpoint) {
        let mut de = serde_json::Deserializer::from_slice(json);
        let pruned = shape
            .deserialize(&mut de)
            .and_then(|v| de.end().map(|()| v));
        if let Ok(v) = pruned {
            return Ok(v);
        }
    }
    serde_json::from_slice(json)
}

/// Keys serde_json reads as its own markers (a number's or a raw value's) when it reads
/// a [`Value`]: an object with one is left to that reader.
const PRIVATE: &str = "$serde_json::private::";

impl<'de> DeserializeSeed<'de> for &'static Prune {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            Prune::Whole => de::Deserialize::deserialize(d),
            _ => d.deserialize_any(Pruning(self)),
        }
    }
}

/// The visitor of a value pruned by its shape (not [`Prune::Whole`]).
struct Pruning(&'static Prune);

impl<'de> Visitor<'de> for Pruning {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        match self.0 {
            Prune::Items(item) => {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element_seed(*item)? {
                    items.push(v);
                }
                Ok(Value::Array(items))
            }
            _ => {
                while seq.next_element_seed(&Prune::Skip)?.is_some() {}
                Ok(Value::Null)
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let fields = match self.0 {
            Prune::Fields(fields) => *fields,
            _ => &[],
        };
        let mut kept = Map::new();
        while let Some(at) = map.next_key_seed(Key(fields))? {
            match at {
                Some(i) => {
                    let (name, shape) = &fields[i];
                    let v = map.next_value_seed(shape)?;
                    // A member given twice: the last one, as a `Value`'s map keeps it.
                    kept.insert((*name).to_owned(), v);
                }
                None => {
                    map.next_value_seed(&Prune::Skip)?;
                }
            }
        }
        Ok(match self.0 {
            Prune::Fields(_) => Value::Object(kept),
            _ => Value::Null,
        })
    }
}

/// A member's key: which of `fields` it names, if any (an error for serde_json's own
/// markers, which only the [`Value`] reader reads as it does).
struct Key(&'static [(&'static str, Prune)]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member's name")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<Option<usize>, E> {
        if k.starts_with(PRIVATE) {
            return Err(E::custom("a serde_json marker key"));
        }
        Ok(self.0.iter().position(|(name, _)| *name == k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{of_body, StreamUsage};

    const ENDPOINTS: &[Endpoint] = &[
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::GenerateContent,
        Endpoint::StreamGenerateContent,
        Endpoint::Converse,
        Endpoint::ConverseStream,
        Endpoint::Route,
    ];

    /// Answers and events of every dialect, and what a hostile or broken upstream
    /// could send: members twice, of the wrong kind, null, nested, serde_json's private
    /// markers, numbers out of range, bad escapes, trailing bytes, not JSON.
    const BODIES: &[&str] = &[
        r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":100,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":40}},"service_tier":"flex"}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        r#"{"choices":"none","usage":{"prompt_tokens":3,"completion_tokens":2},"service_tier":7}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"usage":null}"#,
        r#"{"usage":null,"usage":{"prompt_tokens":3,"completion_tokens":2},"service_tier":"auto"}"#,
        r#"{"usage":"lots","service_tier":null}"#,
        r#"{"usage":{"prompt_tokens":-1,"completion_tokens":2.5}}"#,
        r#"{"usage":{"prompt_tokens":1e400,"completion_tokens":2}}"#,
        r#"{"note":1e400,"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"note":"\ud800","usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"note":"\u00e9\n","usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}} x"#,
        r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}"#,
        r#"{"$serde_json::private::RawValue":"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}"}"#,
        r#"{"a":{"\u0024serde_json::private::RawValue":"{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}"},"usage":{"input_tokens":1,"output_tokens":2}}"#,
        r#"[{"usage":{"prompt_tokens":1,"completion_tokens":2}}]"#,
        r#""usage""#,
        r#"null"#,
        r#"{"output":[{"type":"web_search_call"},{"type":"message","content":[{"text":"x"}]},{"type":"web_search_call","type":"x"},"s",null],"usage":{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":4}},"service_tier":"priority"}"#,
        r#"{"output":{"type":"web_search_call"},"usage":{"input_tokens":10,"output_tokens":5}}"#,
        r#"{"type":"response.completed","response":{"output":[{"type":"web_search_call"}],"usage":{"input_tokens":10,"output_tokens":5},"service_tier":"flex"}}"#,
        r#"{"type":"response.completed","response":"gone"}"#,
        r#"{"type":"response.failed","response":null}"#,
        r#"{"type":"response.created","response":{"service_tier":"auto"}}"#,
        r#"{"type":"response.incomplete","response":{"usage":{"input_tokens":1,"output_tokens":1}},"response":{"usage":{"input_tokens":2,"output_tokens":2}}}"#,
        r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":5,"cache_creation":{"ephemeral_1h_input_tokens":2},"service_tier":"standard"}}}"#,
        r#"{"type":"message_start","message":[1,2]}"#,
        r#"{"type":"message_delta","usage":{"output_tokens":7,"server_tool_use":{"web_search_requests":2}}}"#,
        r#"{"type":"message_delta","usage":{"output_tokens":7,"input_tokens":3}}"#,
        r#"{"type":"message_delta","usage":{"output_tokens":"7"}}"#,
        r#"{"type":"message_stop"}"#,
        r#"{"type":7}"#,
        r#"{"id":"m","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,"server_tool_use":{"web_search_requests":1}}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"x"}]}}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}"#,
        r#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8,"thoughtsTokenCount":1}}"#,
        r#"{"candidates":[{"finishReason":null},"x"],"usageMetadata":{"promptTokenCount":5}}"#,
        r#"{"candidates":{"finishReason":"STOP"},"promptFeedback":{"blockReason":null}}"#,
        r#"{"promptFeedback":[{"blockReason":"SAFETY"}],"usageMetadata":null}"#,
        r#"{"output":{"message":{}},"usage":{"inputTokens":3,"outputTokens":2,"totalTokens":5},"stopReason":"end_turn"}"#,
        r#"{"usage":{"inputTokens":3,"outputTokens":2,"totalTokens":9}}"#,
        "not json",
        "",
    ];

    #[test]
    fn an_answer_reads_as_its_whole_value_reads() {
        for &endpoint in ENDPOINTS {
            for body in BODIES {
                let whole = serde_json::from_slice::<Value>(body.as_bytes());
                let pruned = read(endpoint, body.as_bytes());
                assert_eq!(whole.is_ok(), pruned.is_ok(), "{endpoint:?} {body}");
                let (Ok(whole), Ok(pruned)) = (whole, pruned) else {
                    continue;
                };
                assert_eq!(
                    of_body(endpoint, &pruned),
                    of_body(endpoint, &whole),
                    "{endpoint:?} {body}"
                );
                assert_eq!(
                    crate::tier::said(endpoint, &pruned),
                    crate::tier::said(endpoint, &whole),
                    "{endpoint:?} {body}"
                );
            }
        }
    }

    #[test]
    fn a_stream_reads_as_its_whole_events_read() {
        for &endpoint in ENDPOINTS {
            // Each event alone, and all of them in order (what comes before matters).
            let mut all = (StreamUsage::new(endpoint), StreamUsage::new(endpoint));
            for body in BODIES {
                let mut one = (StreamUsage::new(endpoint), StreamUsage::new(endpoint));
                for (p, w) in [(&mut one.0, &mut one.1), (&mut all.0, &mut all.1)] {
                    let kept = p.event(body);
                    let whole = match serde_json::from_str::<Value>(body) {
                        Ok(v) => w.event_value(&v),
                        Err(_) => crate::usage::Keep::Pass,
                    };
                    assert_eq!(kept, whole, "{endpoint:?} {body}");
                    assert_eq!(p.reported(), w.reported(), "{endpoint:?} {body}");
                    assert_eq!(p.tier(), w.tier(), "{endpoint:?} {body}");
                }
            }
        }
    }

    #[test]
    fn only_what_the_readers_look_at_is_kept() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"a long answer"}}],"usage":{"prompt_tokens":1,"completion_tokens":2},"service_tier":"flex"}"#;
        let v = read(Endpoint::ChatCompletions, body).expect("read");
        assert_eq!(
            v,
            serde_json::json!({"choices": [null], "usage": {"prompt_tokens": 1, "completion_tokens": 2}, "service_tier": "flex"})
        );
        let body = br#"{"type":"response.completed","response":{"output":[{"type":"message","content":[{"text":"x"}]}],"usage":{"input_tokens":1,"output_tokens":1}}}"#;
        let v = read(Endpoint::Responses, body).expect("read");
        assert_eq!(
            v,
            serde_json::json!({"type": "response.completed", "response": {"output": [{"type": "message"}], "usage": {"input_tokens": 1, "output_tokens": 1}}})
        );
    }
}
