//! A model request, read strictly, and what it can cost at most.
//!
//! The body is read with the record crate's strict JSON reader ([`tally_record::Args`]):
//! a key given twice at any depth, a bare value that is not an object, nesting past 128
//! or trailing bytes refuse the request, so tally and the upstream can never read two
//! different `model`s or `max_tokens` from one body. What is forwarded is the canonical
//! form of what was read (plus what the proxy sets), never the agent's bytes.
//!
//! # The worst case
//!
//! * **Input tokens** are bounded by the forwarded body's length in bytes: a tokenizer's
//!   token covers at least one byte of the UTF-8 text it encodes, and the tokens an API
//!   adds around each message are fewer than the JSON punctuation around it (at least
//!   `{"role":"","content":""}`, 24 bytes). Inputs that are not text (images, audio,
//!   files: content parts of type `image_url`, `input_audio`, `file`, `image`,
//!   `document`, ...) are priced by the API independently of their bytes, so a request
//!   holding one is refused ([`RequestError::NotText`]).
//! * **Output tokens** are `max_tokens` (OpenAI: `max_completion_tokens` or
//!   `max_tokens`; Anthropic: `max_tokens`) times `n` (OpenAI's choices), capped at the
//!   model's `max_output_tokens` (the forwarded value is capped too, so the upstream
//!   itself enforces the cap). A request without one gets one: what the budget can pay.
//! * The input is priced at the largest of the input, cached-input and cache-write
//!   prices (a prompt token is billed as one of them).

use serde_json::value::RawValue;
use std::collections::BTreeMap;

use serde_json::Value;
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::{per_million, Nanos};
use tally_record::Args;

/// Why a request body cannot be forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Not strict JSON (a duplicate key, bad syntax, trailing bytes, too deep).
    #[error("the request body is not JSON tally can read exactly: {0}")]
    Json(String),
    /// Not a JSON object.
    #[error("the request body must be one JSON object")]
    NotObject,
    /// A field with the wrong type or an impossible value.
    #[error("`{field}` {why}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// Input that is not text: its price does not follow from its size.
    #[error("content of type `{kind}` is not priced by tally's proxy: only text is forwarded")]
    NotText {
        /// The content part's type.
        kind: String,
    },
}

/// Content part types whose token count does not follow from their bytes.
const NOT_TEXT: &[&str] = &[
    "image_url",
    "input_image",
    "image",
    "input_audio",
    "audio",
    "audio_url",
    "file",
    "input_file",
    "document",
    "video",
    "video_url",
];

/// A model request as read.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// Its members, each once, as canonical JSON text.
    members: BTreeMap<String, Box<RawValue>>,
    /// Its `model`.
    pub model: String,
    /// The output tokens it asks for at most, if it says (`max_tokens` or
    /// `max_completion_tokens`), before any cap.
    pub max_tokens: Option<u64>,
    /// OpenAI's `n` (choices), 1 when absent.
    pub choices: u64,
    /// Whether it asks for a stream.
    pub stream: bool,
    /// OpenAI: whether the client itself asked for the usage chunk of a stream.
    pub client_asked_usage: bool,
    /// The canonical request, as the argument digest reads it.
    pub args: Args,
}

/// Reads a model request strictly.
pub fn parse(kind: UpstreamKind, body: &[u8]) -> Result<ModelRequest, RequestError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestError::Json("not UTF-8".into()))?;
    let args = Args::parse(text).map_err(|e| RequestError::Json(e.to_string()))?;
    // The canonical text has every key once and every number exactly; members are read
    // as raw text where their exact digits matter.
    let raw: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(args.canonical()).map_err(|_| RequestError::NotObject)?;
    let model = match raw.get("model").map(|v| v.get()) {
        Some(t) => match serde_json::from_str::<String>(t) {
            Ok(m) if !m.is_empty() && m.len() <= 256 => m,
            _ => {
                return Err(RequestError::Field {
                    field: "model",
                    why: "must be a model name (a string of at most 256 bytes)",
                })
            }
        },
        None => {
            return Err(RequestError::Field {
                field: "model",
                why: "is missing: name the model",
            })
        }
    };
    let count = |field: &'static str| -> Result<Option<u64>, RequestError> {
        match raw.get(field) {
            None => Ok(None),
            Some(v) => v
                .get()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| RequestError::Field {
                    field,
                    why: "must be a whole number",
                }),
        }
    };
    let max_tokens = match kind {
        UpstreamKind::Openai => match (count("max_tokens")?, count("max_completion_tokens")?) {
            (Some(_), Some(_)) => {
                return Err(RequestError::Field {
                    field: "max_completion_tokens",
                    why: "and `max_tokens` are both given: give one",
                })
            }
            (a, b) => a.or(b),
        },
        _ => count("max_tokens")?,
    };
    if max_tokens == Some(0) {
        return Err(RequestError::Field {
            field: "max_tokens",
            why: "must be at least 1",
        });
    }
    let choices = match kind {
        UpstreamKind::Openai => count("n")?.unwrap_or(1),
        _ => 1,
    };
    if choices == 0 || choices > 128 {
        return Err(RequestError::Field {
            field: "n",
            why: "must be between 1 and 128",
        });
    }
    let stream = match raw.get("stream").map(|v| v.get()) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(RequestError::Field {
                field: "stream",
                why: "must be true or false",
            })
        }
    };
    let stream_options: Option<Value> = raw
        .get("stream_options")
        .and_then(|v| serde_json::from_str(v.get()).ok());
    let client_asked_usage = match &stream_options {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => {
                return Err(RequestError::Field {
                    field: "stream_options",
                    why: "`include_usage` must be true or false",
                })
            }
        },
        Some(_) => {
            return Err(RequestError::Field {
                field: "stream_options",
                why: "must be an object",
            })
        }
    };
    // Read for the walk only (a number's digits do not matter to it).
    let whole: Value =
        serde_json::from_str(args.canonical()).map_err(|_| RequestError::NotObject)?;
    not_text(&whole)?;
    Ok(ModelRequest {
        members: raw,
        model,
        max_tokens,
        choices,
        stream,
        client_asked_usage,
        args,
    })
}

/// Refuses content parts that are not text, at any depth.
fn not_text(v: &Value) -> Result<(), RequestError> {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(t)) = o.get("type") {
                if NOT_TEXT.contains(&t.as_str()) {
                    return Err(RequestError::NotText { kind: t.clone() });
                }
            }
            o.values().try_for_each(not_text)
        }
        Value::Array(a) => a.iter().try_for_each(not_text),
        _ => Ok(()),
    }
}

/// What the proxy forwards and reserves for one model request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    /// The body to forward (canonical JSON with the proxy's settings).
    pub body: Vec<u8>,
    /// The output tokens asked of the upstream (per choice).
    pub max_tokens: u64,
    /// Whether the proxy set `max_tokens` itself.
    pub injected: bool,
    /// The input token bound.
    pub input_bound: u64,
    /// The most the call can cost.
    pub worst: Nanos,
}

impl ModelRequest {
    /// The body to forward and the most it can cost: `max_tokens` capped at the model's
    /// limit, or (absent) the most `remaining` can pay at `price` (at least 1); for an
    /// OpenAI stream, `stream_options.include_usage` set.
    pub fn price(&self, kind: UpstreamKind, price: &ModelPrice, remaining: Nanos) -> Priced {
        let mut members = self.members.clone();
        let stream_usage = kind == UpstreamKind::Openai && self.stream;
        if stream_usage {
            let mut o: BTreeMap<String, Box<RawValue>> = members
                .get("stream_options")
                .and_then(|v| serde_json::from_str(v.get()).ok())
                .unwrap_or_default();
            o.insert("include_usage".into(), raw("true"));
            members.insert("stream_options".into(), raw(&render(&o)));
        }
        // The field the proxy sets: the one the request used, else `max_tokens`.
        let field = if members.contains_key("max_completion_tokens") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        // Measured with the longest count (20 digits) in place: the input bound.
        members.insert(field.into(), raw(&u64::MAX.to_string()));
        let input_bound = render(&members).len() as u64;
        let input_price = price.input_worst_per_mtok();
        let input_cost = per_million(input_bound, input_price).unwrap_or(Nanos::MAX);
        let (max_tokens, injected) = match self.max_tokens {
            Some(m) => (m.min(price.max_output_tokens), false),
            None => {
                let left = remaining.saturating_sub(input_cost);
                let per_choice = affordable(left, price.output_per_mtok) / self.choices;
                (per_choice.clamp(1, price.max_output_tokens), true)
            }
        };
        members.insert(field.into(), raw(&max_tokens.to_string()));
        let output_cost = per_million(
            max_tokens.saturating_mul(self.choices),
            price.output_per_mtok,
        )
        .unwrap_or(Nanos::MAX);
        Priced {
            body: render(&members).into_bytes(),
            max_tokens,
            injected,
            input_bound,
            worst: input_cost.checked_add(output_cost).unwrap_or(Nanos::MAX),
        }
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
fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_else(|_| {
        // Only valid JSON is ever passed; `null` keeps the type total.
        RawValue::from_string("null".into()).expect("null is JSON")
    })
}

/// Members as one JSON object: keys in byte order (a `BTreeMap` of `String`s), each
/// value its exact text.
fn render(members: &BTreeMap<String, Box<RawValue>>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn price() -> ModelPrice {
        ModelPrice {
            input_per_mtok: Nanos(1_000_000_000),
            cached_input_per_mtok: Nanos(500_000_000),
            cache_write_per_mtok: None,
            cache_write_1h_per_mtok: None,
            output_per_mtok: Nanos(2_000_000_000),
            max_output_tokens: 1000,
        }
    }

    #[test]
    fn duplicate_keys_at_any_depth_are_refused() {
        for body in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a","max_tokens":1,"max_tokens":100000}"#,
            r#"{"model":"a","messages":[{"role":"user","content":"x","content":"y"}]}"#,
            r#"{"model":"a"} x"#,
            r#"[{"model":"a"}]"#,
            r#"{"model":"a","max_tokens":1.5}"#,
            r#"{"model":"a","max_tokens":-1}"#,
            r#"{"model":"a","max_tokens":"9"}"#,
            r#"{"model":"a","stream":"yes"}"#,
            r#"{"model":"a","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
            r#"{"model":"a","max_tokens":1,"max_completion_tokens":2}"#,
        ] {
            assert!(
                parse(UpstreamKind::Openai, body.as_bytes()).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn numbers_keep_their_digits_and_the_worst_case_bounds_the_call() {
        let body = br#"{"model":"m","temperature":0.10000000000000000001,"max_tokens":1e2,"messages":[{"role":"user","content":"hi"}]}"#;
        let r = parse(UpstreamKind::Openai, body).expect("reads");
        assert_eq!(r.max_tokens, Some(100));
        let p = r.price(UpstreamKind::Openai, &price(), Nanos(0));
        let text = String::from_utf8(p.body.clone()).expect("utf8");
        assert!(
            text.contains("\"temperature\":0.10000000000000000001"),
            "{text}"
        );
        assert!(text.contains("\"max_tokens\":100"), "{text}");
        assert!(!p.injected);
        assert!(p.input_bound >= p.body.len() as u64);
        // 100 output tokens at $2/M + the body's bytes at $1/M, rounded up.
        let want = per_million(p.input_bound, Nanos(1_000_000_000))
            .and_then(|i| i.checked_add(Nanos(200_000)))
            .expect("fits");
        assert_eq!(p.worst, want);
        // A cache-write price above the input price is the input's worst case: a prompt
        // written to the cache whole still fits the reservation.
        let dear = ModelPrice {
            cache_write_per_mtok: Some(Nanos(1_250_000_000)),
            cache_write_1h_per_mtok: Some(Nanos(2_000_000_000)),
            ..price()
        };
        let q = r.price(UpstreamKind::Openai, &dear, Nanos(0));
        let want = per_million(q.input_bound, Nanos(2_000_000_000))
            .and_then(|i| i.checked_add(Nanos(200_000)))
            .expect("fits");
        assert_eq!(q.worst, want);
        let all_written = crate::usage::Usage {
            written_1h: q.input_bound,
            output: 100,
            ..Default::default()
        };
        assert_eq!(all_written.cost(&dear), Some(q.worst));
    }

    #[test]
    fn a_missing_max_tokens_is_what_the_budget_pays() {
        let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let r = parse(UpstreamKind::Openai, body).expect("reads");
        let remaining = Nanos(1_000_000); // $0.001
        let p = r.price(UpstreamKind::Openai, &price(), remaining);
        assert!(p.injected);
        assert!(p.worst <= remaining, "{p:?}");
        assert!(p.max_tokens > 1 && p.max_tokens < 1000, "{p:?}");
        let text = String::from_utf8(p.body).expect("utf8");
        assert!(
            text.contains("\"stream_options\":{\"include_usage\":true}"),
            "{text}"
        );
        // Capped at the model's limit when the budget is large.
        let p = r.price(UpstreamKind::Openai, &price(), Nanos(u64::MAX));
        assert_eq!(p.max_tokens, 1000);
    }
}
