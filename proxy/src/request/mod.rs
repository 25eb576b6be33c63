//! A model request, read strictly, and what it can cost at most.
//!
//! The body is read with the record crate's strict JSON reader ([`tally_record::Args`]):
//! a key given twice at any depth, a bare value that is not an object, nesting past 128
//! or trailing bytes refuse the request, so tally and the upstream can never read two
//! different `model`s or `max_tokens` from one body. What is forwarded is the canonical
//! form of what was read (plus what the proxy sets), never the agent's bytes.
//!
//! # Endpoints
//!
//! The endpoint is decided by the exact path ([`crate::endpoint::Routed::of`]): OpenAI
//! Chat Completions (`/v1/chat/completions`) and Responses (`/v1/responses`), Anthropic
//! Messages (`/v1/messages`) and its free `count_tokens`, Gemini's
//! `/v1beta/models/MODEL:generateContent` and `:streamGenerateContent` (or `/v1/...`;
//! the model is the path's, [`gemini`]), Azure OpenAI's
//! `/openai/deployments/DEPLOYMENT/chat/completions` and `/openai/responses` (matched as
//! sent, with no `/v1` in front). Any other path of a model upstream is not metered, so
//! it is refused.
//!
//! # The worst case
//!
//! * **Input tokens** are bounded by the forwarded body's length in bytes: a tokenizer's
//!   token covers at least one byte of the UTF-8 text it encodes, and the tokens an API
//!   adds around each message are fewer than the JSON punctuation around it (at least
//!   `{"role":"","content":""}`, 24 bytes). To that the provider's own additions are
//!   added, as the price configures them: `tool_prompt_tokens` when the request has
//!   `tools`, `web_search_tokens_per_use` per possible web search. Each image
//!   ([`crate::media`]) adds the price's `image_tokens` (its base64 data left out of the
//!   bytes); a request with an image and no `image_tokens` is refused, and so is audio,
//!   a file, a document or video, which no price covers.
//! * The input is priced at the **input rate**; where the body marks a `cache_control`
//!   (Anthropic), the whole input at the dearer cache-write rate (the 1-hour one only if
//!   a marker says `"ttl": "1h"`). A cache read is never dearer than the input.
//! * **Output tokens** are the request's limit (Chat: `max_completion_tokens` or
//!   `max_tokens`; Responses: `max_output_tokens`; Messages: `max_tokens`; Gemini:
//!   `generationConfig.maxOutputTokens`, a `thinkingBudget` above it lowered to it) times
//!   the choices (Chat's `n`, Gemini's `candidateCount`), capped at the model's `max_output_tokens` (the forwarded value is
//!   capped too, so the upstream itself enforces the cap). A request without one gets
//!   one: what the budget can pay.
//! * **Billing tiers** ([`crate::tier`]): every rate at the dearest tier the request can
//!   land on (`auto`, or no `service_tier`: the default or any tier the price lists).
//! * **Server tools**: each possible web search (`max_uses` of Anthropic's `web_search`
//!   tool, `max_tool_calls` of a Responses request with a `web_search` tool) at
//!   `web_search_per_use`.
//! * What can cost money with no price in the policy is refused, naming the field
//!   ([`RequestError::Unpriced`]): other server tools, `mcp_servers`, a `service_tier`
//!   the price has no rates for, state kept upstream (`previous_response_id`), a cache
//!   marker without its cache-write price.

use std::ops::Range;

use serde_json::Value;
use tally_policy::CacheMark;
use tally_record::Args;

pub use crate::endpoint::{Endpoint, RequestError};

/// Members that make a call cost what no price covers, per endpoint, and why.
const UNPRICED: &[(Endpoint, &str, &str)] = &[
    (
        Endpoint::ChatCompletions,
        "web_search_options",
        "searches the web, which Chat Completions bills per search without reporting a count",
    ),
    (
        Endpoint::ChatCompletions,
        "audio",
        "asks for audio output, billed at audio rates",
    ),
    (
        Endpoint::ChatCompletions,
        "prediction",
        "bills rejected predicted tokens the request does not bound",
    ),
    (
        Endpoint::ChatCompletions,
        "data_sources",
        "searches Azure data sources (On Your Data), billed by those services and adding input the body does not carry",
    ),
    (
        Endpoint::ChatCompletions,
        "dataSources",
        "searches Azure data sources (On Your Data), billed by those services and adding input the body does not carry",
    ),
    (
        Endpoint::ChatCompletions,
        "enhancements",
        "runs Azure vision enhancements (OCR, grounding), billed by those services",
    ),
    (
        Endpoint::Responses,
        "previous_response_id",
        "adds input kept upstream that the body does not carry",
    ),
    (
        Endpoint::Responses,
        "conversation",
        "adds input kept upstream that the body does not carry",
    ),
    (
        Endpoint::Responses,
        "prompt",
        "adds a stored prompt the body does not carry",
    ),
    (
        Endpoint::Messages,
        "mcp_servers",
        "lets the upstream call MCP servers on the run's behalf",
    ),
    (
        Endpoint::Messages,
        "container",
        "runs code in a container, billed per hour",
    ),
];

/// A model request as read.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// Its members in key order, each once: where their canonical JSON text is in `args`.
    members: Vec<(String, Range<usize>)>,
    /// The endpoint it is for.
    pub endpoint: Endpoint,
    /// Its `model`: the body's, or the one its path names (Gemini's model, Azure
    /// OpenAI's deployment).
    pub model: String,
    /// The body's own `model` where the path names one (Azure OpenAI: the deployment's
    /// model or the deployment again), for the plan to check.
    pub body_model: Option<String>,
    /// The output tokens it asks for at most, if it says, before any cap.
    pub max_tokens: Option<u64>,
    /// The member its limit was given in, if any.
    limit_field: Option<&'static str>,
    /// OpenAI's `n` (choices), 1 when absent.
    pub choices: u64,
    /// Whether it asks for a stream.
    pub stream: bool,
    /// OpenAI: whether the client itself asked for the usage chunk of a stream.
    pub client_asked_usage: bool,
    /// Whether it has tools (a non-empty `tools`): the provider adds its tool prompt.
    pub tools: bool,
    /// The cache writes its markers allow.
    pub cache: CacheMark,
    /// The most web searches it can make (server tools).
    pub web_searches: u64,
    /// Its `service_tier`, if it names one.
    pub service_tier: Option<String>,
    /// Its images.
    pub images: crate::media::Images,
    /// The canonical request, as the argument digest reads it.
    pub args: Args,
}

/// Reads a request to `endpoint` strictly: the body read once, then what it asks
/// (model, stream, tier, output limit, choices, usage chunk), what no price covers
/// refused, and what its tools, cache markers and images add.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ModelRequest, RequestError> {
    parse_named(endpoint, None, body)
}

/// [`parse`], for a path that names the model (Gemini) or deployment (Azure OpenAI)
/// as `named`: Gemini's body names none; Azure's may, kept as `body_model`.
pub fn parse_named(
    endpoint: Endpoint,
    named: Option<&str>,
    body: &[u8],
) -> Result<ModelRequest, RequestError> {
    let tally_record::args::Read {
        args,
        members,
        value: whole,
        ..
    } = read(body)?;
    let raw = Members {
        text: args.canonical(),
        members: &members,
    };
    if endpoint.gemini() {
        return gemini::read(endpoint, named, (members, args), whole);
    }
    if endpoint.bedrock() {
        return bedrock::read(endpoint, named, (members, args), whole);
    }
    let (model, body_model) = match named {
        None => (model_of(raw)?, None),
        Some(n) => (
            n.to_owned(),
            raw.get("model").map(|_| model_of(raw)).transpose()?,
        ),
    };
    let whole = whole.ok_or(RequestError::NotObject)?;
    let stream = stream_of(raw)?;
    let service_tier = service_tier_of(&whole)?;
    if endpoint == Endpoint::CountTokens {
        // Free: read for its model only, forwarded as read.
        return Ok(ModelRequest {
            members,
            endpoint,
            model,
            body_model,
            max_tokens: None,
            limit_field: None,
            choices: 1,
            stream,
            client_asked_usage: false,
            tools: false,
            cache: CacheMark::None,
            web_searches: 0,
            service_tier,
            images: crate::media::Images::default(),
            args,
        });
    }
    let (max_tokens, limit_field) = limit_of(endpoint, raw)?;
    let choices = choices_of(endpoint, raw)?;
    let client_asked_usage = asked_usage(endpoint, &whole)?;
    unpriced(endpoint, &whole)?;
    let (tools, web_searches) = tools_of(endpoint, &whole)?;
    let cache = if endpoint == Endpoint::Messages {
        cache_mark(&whole)?
    } else {
        CacheMark::None
    };
    let images = crate::media::images(endpoint, &whole)?;
    Ok(ModelRequest {
        members,
        endpoint,
        model,
        body_model,
        max_tokens,
        limit_field,
        choices,
        stream,
        client_asked_usage,
        tools,
        cache,
        web_searches,
        service_tier,
        images,
        args,
    })
}

/// The body read once, strictly: the canonical text (every key once, every number
/// exactly) and where each member is in it (read as raw text where their exact digits
/// matter), and the value the walks read (none where serde_json reads none from the
/// canonical text: a number beyond an `f64`, nesting of 128).
fn read(body: &[u8]) -> Result<tally_record::args::Read, RequestError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestError::Json("not UTF-8".into()))?;
    let read = Args::read(text).map_err(|e| RequestError::Json(e.to_string()))?;
    if !read.args.canonical().starts_with('{') {
        return Err(RequestError::NotObject);
    }
    Ok(read)
}

/// Its `model`: a name of at most 256 bytes.
fn model_of(raw: Members<'_>) -> Result<String, RequestError> {
    match raw.get("model") {
        Some(t) => match serde_json::from_str::<String>(t) {
            Ok(m) if !m.is_empty() && m.len() <= 256 => Ok(m),
            _ => Err(RequestError::Field {
                field: "model",
                why: "must be a model name (a string of at most 256 bytes)",
            }),
        },
        None => Err(RequestError::Field {
            field: "model",
            why: "is missing: name the model",
        }),
    }
}

/// Whether it asks for a stream.
fn stream_of(raw: Members<'_>) -> Result<bool, RequestError> {
    match raw.get("stream") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(RequestError::Field {
            field: "stream",
            why: "must be true or false",
        }),
    }
}

/// Its `service_tier`, if it names one.
fn service_tier_of(whole: &Value) -> Result<Option<String>, RequestError> {
    match whole.get("service_tier") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(t)) => Ok(Some(t.clone())),
        Some(_) => Err(RequestError::Field {
            field: "service_tier",
            why: "must be a string",
        }),
    }
}

/// A whole number member, if given.
fn count(raw: Members<'_>, field: &'static str) -> Result<Option<u64>, RequestError> {
    match raw.get(field) {
        None => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| RequestError::Field {
            field,
            why: "must be a whole number",
        }),
    }
}

/// The output tokens it asks for at most (at least 1), and the member it says so in:
/// one of Chat's two, Responses' `max_output_tokens` (never Chat's), `max_tokens`
/// elsewhere.
fn limit_of(
    endpoint: Endpoint,
    raw: Members<'_>,
) -> Result<(Option<u64>, Option<&'static str>), RequestError> {
    let (max_tokens, limit_field) = match endpoint {
        Endpoint::ChatCompletions => {
            match (
                count(raw, "max_tokens")?,
                count(raw, "max_completion_tokens")?,
            ) {
                (Some(_), Some(_)) => {
                    return Err(RequestError::Field {
                        field: "max_completion_tokens",
                        why: "and `max_tokens` are both given: give one",
                    })
                }
                (Some(m), None) => (Some(m), Some("max_tokens")),
                (None, Some(m)) => (Some(m), Some("max_completion_tokens")),
                (None, None) => (None, None),
            }
        }
        Endpoint::Responses => {
            for field in ["max_tokens", "max_completion_tokens"] {
                if raw.get(field).is_some() {
                    return Err(RequestError::Field {
                        field,
                        why: "is not a Responses API field: give `max_output_tokens`",
                    });
                }
            }
            let m = count(raw, "max_output_tokens")?;
            (m, m.map(|_| "max_output_tokens"))
        }
        _ => {
            let m = count(raw, "max_tokens")?;
            (m, m.map(|_| "max_tokens"))
        }
    };
    if max_tokens == Some(0) {
        return Err(RequestError::Field {
            field: "max_tokens",
            why: "must be at least 1",
        });
    }
    Ok((max_tokens, limit_field))
}

/// OpenAI Chat's `n` (choices): 1 to 128, 1 when absent; 1 elsewhere.
fn choices_of(endpoint: Endpoint, raw: Members<'_>) -> Result<u64, RequestError> {
    let choices = match endpoint {
        Endpoint::ChatCompletions => count(raw, "n")?.unwrap_or(1),
        _ => 1,
    };
    if choices == 0 || choices > 128 {
        return Err(RequestError::Field {
            field: "n",
            why: "must be between 1 and 128",
        });
    }
    Ok(choices)
}

/// OpenAI Chat: whether the client itself asked for a stream's usage chunk
/// (`stream_options.include_usage`).
fn asked_usage(endpoint: Endpoint, whole: &Value) -> Result<bool, RequestError> {
    match (endpoint, whole.get("stream_options")) {
        (Endpoint::ChatCompletions, Some(Value::Object(o))) => match o.get("include_usage") {
            None | Some(Value::Bool(false)) => Ok(false),
            Some(Value::Bool(true)) => Ok(true),
            Some(_) => Err(RequestError::Field {
                field: "stream_options",
                why: "`include_usage` must be true or false",
            }),
        },
        (_, None) => Ok(false),
        (_, Some(Value::Object(_))) => Ok(false),
        (_, Some(_)) => Err(RequestError::Field {
            field: "stream_options",
            why: "must be an object",
        }),
    }
}

/// Refuses the members that make a call cost what no price covers ([`UNPRICED`],
/// Chat's non-text `modalities`, a Responses `background`).
fn unpriced(endpoint: Endpoint, whole: &Value) -> Result<(), RequestError> {
    for (at, name, why) in UNPRICED {
        if *at == endpoint && whole.get(*name).is_some_and(|v| !v.is_null()) {
            return Err(RequestError::unpriced(*name, *why));
        }
    }
    if endpoint == Endpoint::ChatCompletions {
        if let Some(m) = whole.get("modalities").and_then(Value::as_array) {
            if m.iter().any(|x| x.as_str() != Some("text")) {
                return Err(RequestError::unpriced(
                    "modalities",
                    "asks for output other than text, billed at its own rates",
                ));
            }
        }
    }
    if endpoint == Endpoint::Responses && whole.get("background") == Some(&Value::Bool(true)) {
        return Err(RequestError::unpriced(
            "background",
            "answers later, out of the proxy's sight, so its usage cannot be read",
        ));
    }
    Ok(())
}

/// Whether the request has tools, and the most web searches they can make; a tool that
/// can cost what no price covers is refused.
fn tools_of(endpoint: Endpoint, whole: &Value) -> Result<(bool, u64), RequestError> {
    let list = match whole.get("tools") {
        None | Some(Value::Null) => return Ok((false, 0)),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(RequestError::Field {
                field: "tools",
                why: "must be a list",
            })
        }
    };
    let mut searches: u64 = 0;
    let mut searching = false;
    for (i, tool) in list.iter().enumerate() {
        let kind = match tool.get("type") {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(t.as_str()),
            Some(_) => {
                return Err(RequestError::Field {
                    field: "tools",
                    why: "has a `type` that is not a string",
                })
            }
        };
        let field = format!("tools[{i}].type");
        match (endpoint, kind) {
            // A tool the client runs itself: its cost is the tokens of its schema.
            (Endpoint::Messages, None | Some("custom")) => {}
            (Endpoint::ChatCompletions | Endpoint::Responses, Some("function" | "custom")) => {}
            (Endpoint::Messages, Some(t)) if t.starts_with("web_search_") => {
                let uses = match tool.get("max_uses") {
                    Some(Value::Number(n)) => n.as_u64().filter(|&n| n >= 1),
                    _ => None,
                };
                let Some(uses) = uses else {
                    return Err(RequestError::unpriced(
                        format!("tools[{i}].max_uses"),
                        "is missing or not a whole number of at least 1: a web search tool without a bound can search without end",
                    ));
                };
                searches = searches.saturating_add(uses);
            }
            (Endpoint::Responses, Some(t)) if t.starts_with("web_search") => searching = true,
            (_, Some(t)) => {
                return Err(RequestError::unpriced(
                    field,
                    format!("`{t}` is a tool the provider runs or bills itself, which the policy has no price for"),
                ))
            }
            (_, None) => {
                return Err(RequestError::Field {
                    field: "tools",
                    why: "holds a tool without a `type`",
                })
            }
        }
    }
    if searching {
        // Responses: every call of a built-in tool in one response, at most.
        let uses = match whole.get("max_tool_calls") {
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        let Some(uses) = uses else {
            return Err(RequestError::unpriced(
                "max_tool_calls",
                "is missing: a web search tool without a bound on its calls can search without end",
            ));
        };
        searches = searches.saturating_add(uses);
    }
    Ok((!list.is_empty(), searches))
}

/// The cache writes a body's `cache_control` markers allow, at any depth.
fn cache_mark(v: &Value) -> Result<CacheMark, RequestError> {
    let mut mark = CacheMark::None;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(c) = o.get("cache_control") {
                    let ttl = match c {
                        Value::Null => None,
                        Value::Object(c) => Some(c.get("ttl")),
                        _ => {
                            return Err(RequestError::Field {
                                field: "cache_control",
                                why: "must be an object",
                            })
                        }
                    };
                    let this = match ttl {
                        None => CacheMark::None,
                        Some(None) => CacheMark::FiveMinutes,
                        Some(Some(Value::String(t))) if t == "5m" => CacheMark::FiveMinutes,
                        Some(Some(Value::String(t))) if t == "1h" => CacheMark::OneHour,
                        Some(Some(_)) => {
                            return Err(RequestError::Field {
                                field: "cache_control",
                                why: "has a `ttl` other than \"5m\" or \"1h\"",
                            })
                        }
                    };
                    mark = mark.max(this);
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    Ok(mark)
}

mod bedrock;
mod body;
mod gemini;
mod price;

use body::Members;
pub use price::Priced;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod gemini_tests;

#[cfg(test)]
mod bedrock_tests;
