//! A Bedrock Converse request (`converse`, `converse-stream`), read strictly: the model
//! is the path's, the output limit `inferenceConfig.maxTokens`, client tools in
//! `toolConfig.tools[].toolSpec`, images in content blocks (`image.source.bytes`), cache
//! checkpoints (`cachePoint`) at the cache-write price.
//!
//! Only the members listed here are taken; any other is refused, naming it. So is what
//! no price covers: a guardrail (`guardrailConfig`, `guardContent`: billed by
//! Guardrails), model-specific fields (`additionalModelRequestFields`, which could carry
//! a second output limit or thinking tally cannot bound), a stored prompt
//! (`promptVariables`), a service tier or latency-optimized inference, media other than
//! images (`document`, `video`), an image or file the body does not carry
//! (`s3Location`), a tool Bedrock runs itself (`systemTool`), and a 1-hour cache
//! checkpoint (its writes are not told apart from the 5-minute ones in the usage).

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use tally_policy::CacheMark;

use super::{ModelRequest, RequestError};
use crate::endpoint::Endpoint;
use crate::media::Images;

/// The request members the proxy reads or passes.
const MEMBERS: &[&str] = &[
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "additionalModelResponseFieldPaths",
    "requestMetadata",
    "performanceConfig",
];

/// Members refused as unpriced, and why.
const UNPRICED: &[(&str, &str)] = &[
    (
        "guardrailConfig",
        "runs a Bedrock guardrail, billed by Guardrails per text unit",
    ),
    (
        "additionalModelRequestFields",
        "passes model-specific fields tally does not read (a second output limit, thinking, a tool the model runs), which could cost what it cannot bound",
    ),
    (
        "promptVariables",
        "fills a stored prompt (Prompt management) the body does not carry",
    ),
    (
        "serviceTier",
        "asks for a service tier billed at its own rates",
    ),
];

/// The `inferenceConfig` members passed.
const CONFIG: &[&str] = &["maxTokens", "temperature", "topP", "stopSequences"];

/// A Converse request to `endpoint` for the model its path `named`.
pub(super) fn read(
    endpoint: Endpoint,
    named: Option<&str>,
    read: (Vec<(String, std::ops::Range<usize>)>, tally_record::Args),
    whole: Option<Value>,
) -> Result<ModelRequest, RequestError> {
    let Some(model) = named else {
        return Err(RequestError::Field {
            field: "modelId",
            why: "must be named in the path (/model/MODEL/converse)",
        });
    };
    let whole = whole.ok_or(RequestError::NotObject)?;
    let (members, args) = read;
    for (name, _) in &members {
        if let Some((_, why)) = UNPRICED.iter().find(|(n, _)| n == name) {
            return Err(RequestError::unpriced(name.clone(), *why));
        }
        if !MEMBERS.contains(&name.as_str()) {
            return Err(unread(name.clone()));
        }
    }
    if let Some(p) = whole.get("performanceConfig") {
        if p != &serde_json::json!({"latency": "standard"}) {
            return Err(RequestError::unpriced(
                "performanceConfig",
                "asks for latency-optimized inference, billed at its own rates (only {\"latency\": \"standard\"} is forwarded)",
            ));
        }
    }
    let max_tokens = config(&whole)?;
    let mut walk = Walk::default();
    walk.messages(whole.get("messages"))?;
    walk.system(whole.get("system"))?;
    let tools = walk.tools(whole.get("toolConfig"))?;
    Ok(ModelRequest {
        members,
        endpoint,
        model: model.to_owned(),
        body_model: None,
        max_tokens,
        limit_field: max_tokens.map(|_| "inferenceConfig"),
        choices: 1,
        stream: endpoint == Endpoint::ConverseStream,
        client_asked_usage: false,
        tools,
        cache: walk.cache,
        web_searches: 0,
        service_tier: None,
        images: walk.images,
        args,
    })
}

/// A member tally does not read: refused, naming it.
fn unread(field: String) -> RequestError {
    RequestError::unpriced(
        field,
        "is not a Converse request member tally reads (it takes messages, system, inferenceConfig, toolConfig, additionalModelResponseFieldPaths, requestMetadata and performanceConfig): a member it cannot read could carry what it cannot price",
    )
}

/// `inferenceConfig`, checked: an object of the members tally reads; its `maxTokens`.
fn config(whole: &Value) -> Result<Option<u64>, RequestError> {
    let c = match whole.get("inferenceConfig") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(c)) => c,
        Some(_) => {
            return Err(RequestError::Field {
                field: "inferenceConfig",
                why: "must be an object",
            })
        }
    };
    if let Some(k) = c.keys().find(|k| !CONFIG.contains(&k.as_str())) {
        return Err(RequestError::unpriced(
            format!("inferenceConfig.{k}"),
            "is not an inferenceConfig member tally reads (it takes maxTokens, temperature, topP and stopSequences)",
        ));
    }
    match c.get("maxTokens") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => Ok(n.as_u64()),
        Some(_) => Err(RequestError::Field {
            field: "inferenceConfig.maxTokens",
            why: "must be a whole number of at least 1",
        }),
    }
}

/// What the walk of a body's content blocks found.
struct Walk {
    images: Images,
    cache: CacheMark,
}

impl Default for Walk {
    fn default() -> Walk {
        Walk {
            images: Images::default(),
            cache: CacheMark::None,
        }
    }
}

/// One content block: an object with one member, its kind.
fn one<'v>(at: &str, b: &'v Value) -> Result<(&'v str, &'v Value), RequestError> {
    match b {
        Value::Object(o) if o.len() == 1 => {
            let (k, v) = o.iter().next().expect("one member");
            Ok((k.as_str(), v))
        }
        _ => Err(RequestError::unpriced(
            at.to_owned(),
            "is not a content block tally reads (an object with one member: text, image, toolUse, toolResult, reasoningContent or cachePoint)",
        )),
    }
}

/// The elements of a list, or a refusal naming `field`.
fn list<'v>(v: Option<&'v Value>, field: &'static str) -> Result<&'v [Value], RequestError> {
    match v {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(RequestError::Field {
            field,
            why: "must be a list",
        }),
    }
}

/// A block kind refused as unpriced, and why; `None` for one tally does not know.
fn refused_block(kind: &str) -> Option<&'static str> {
    match kind {
        "document" | "video" | "audio" => Some(
            "is media other than an image (a document, video or audio), billed by a measure tally has no price for",
        ),
        "guardContent" => Some("is checked by a Bedrock guardrail, billed by Guardrails"),
        _ => None,
    }
}

impl Walk {
    /// `messages[i]`: `{role, content: [blocks]}`.
    fn messages(&mut self, v: Option<&Value>) -> Result<(), RequestError> {
        for (i, m) in list(v, "messages")?.iter().enumerate() {
            let at = format!("messages[{i}]");
            let Value::Object(o) = m else {
                return Err(RequestError::Field {
                    field: "messages",
                    why: "holds a message that is not an object",
                });
            };
            if let Some(k) = o
                .keys()
                .find(|k| !["role", "content"].contains(&k.as_str()))
            {
                return Err(RequestError::unpriced(
                    format!("{at}.{k}"),
                    "is not a message member tally reads (it takes role and content)",
                ));
            }
            for (j, b) in list(o.get("content"), "messages")?.iter().enumerate() {
                self.block(&format!("{at}.content[{j}]"), b)?;
            }
        }
        Ok(())
    }

    /// A message's content block.
    fn block(&mut self, at: &str, b: &Value) -> Result<(), RequestError> {
        let (kind, v) = one(at, b)?;
        match kind {
            "text" | "toolUse" | "reasoningContent" => Ok(()),
            "image" => self.image(&format!("{at}.image"), v),
            "cachePoint" => self.cache_point(&format!("{at}.cachePoint"), v),
            "toolResult" => self.tool_result(&format!("{at}.toolResult"), v),
            k => Err(self.other(at, k)),
        }
    }

    /// A block of a kind read nowhere here: refused, unpriced or unread.
    fn other(&self, at: &str, kind: &str) -> RequestError {
        let field = format!("{at}.{kind}");
        match refused_block(kind) {
            Some(why) => RequestError::unpriced(field, why),
            None => RequestError::unpriced(
                field,
                "is not a content block tally reads here: a block it cannot read could carry what it cannot price",
            ),
        }
    }

    /// A `toolResult`: its `content` blocks of text, json or images.
    fn tool_result(&mut self, at: &str, v: &Value) -> Result<(), RequestError> {
        for (k, b) in list(v.get("content"), "toolResult.content")?
            .iter()
            .enumerate()
        {
            let here = format!("{at}.content[{k}]");
            match one(&here, b)? {
                ("text" | "json", _) => {}
                ("image", img) => self.image(&format!("{here}.image"), img)?,
                (kind, _) => return Err(self.other(&here, kind)),
            }
        }
        Ok(())
    }

    /// An image: `{format, source: {bytes}}`, its base64 bytes counted; an image in S3
    /// (the body does not carry it) is refused.
    fn image(&mut self, at: &str, v: &Value) -> Result<(), RequestError> {
        let bad = |why: &str| RequestError::unpriced(at.to_owned(), why.to_owned());
        let Value::Object(o) = v else {
            return Err(bad("is not an object"));
        };
        if o.keys()
            .any(|k| !["format", "source"].contains(&k.as_str()))
        {
            return Err(bad(
                "holds a member tally does not read (an image takes format and source)",
            ));
        }
        let bytes = match o.get("source") {
            Some(Value::Object(s)) if s.len() == 1 => match s.get("bytes") {
                Some(Value::String(b)) => b.len() as u64,
                _ if s.contains_key("s3Location") => {
                    return Err(bad(
                        "is an image in S3 (s3Location), which the body does not carry: its tokens tally cannot bound",
                    ))
                }
                _ => return Err(bad("is an image tally cannot read (a source of base64 bytes)")),
            },
            _ => return Err(bad("is an image tally cannot read (a source of base64 bytes)")),
        };
        self.images.data_bytes = self.images.data_bytes.saturating_add(bytes);
        self.images.count += 1;
        self.images.first.get_or_insert_with(|| at.to_owned());
        Ok(())
    }

    /// A cache checkpoint: `{type: "default"}`, its `ttl` absent or `"5m"`.
    fn cache_point(&mut self, at: &str, v: &Value) -> Result<(), RequestError> {
        let ok = match v {
            Value::Object(o) => {
                o.get("type") == Some(&Value::String("default".into()))
                    && o.keys().all(|k| k == "type" || k == "ttl")
                    && o.get("ttl").is_none_or(|t| t == "5m")
            }
            _ => false,
        };
        if !ok {
            return Err(RequestError::unpriced(
                at.to_owned(),
                "is not a cache checkpoint tally prices: {\"type\": \"default\"}, with no ttl or \"5m\" (a 1-hour cache's writes are not told apart in the usage)",
            ));
        }
        self.cache = self.cache.max(CacheMark::FiveMinutes);
        Ok(())
    }

    /// `system`: blocks of text or cache checkpoints.
    fn system(&mut self, v: Option<&Value>) -> Result<(), RequestError> {
        for (i, b) in list(v, "system")?.iter().enumerate() {
            let at = format!("system[{i}]");
            match one(&at, b)? {
                ("text", _) => {}
                ("cachePoint", c) => self.cache_point(&format!("{at}.cachePoint"), c)?,
                (kind, _) => return Err(self.other(&at, kind)),
            }
        }
        Ok(())
    }

    /// `toolConfig`: `{tools: [{toolSpec} | {cachePoint}], toolChoice}`; whether it has
    /// tools. A `systemTool` (a tool Bedrock runs) is refused.
    fn tools(&mut self, v: Option<&Value>) -> Result<bool, RequestError> {
        let o: &Map<String, Value> = match v {
            None | Some(Value::Null) => return Ok(false),
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(RequestError::Field {
                    field: "toolConfig",
                    why: "must be an object",
                })
            }
        };
        if let Some(k) = o
            .keys()
            .find(|k| !["tools", "toolChoice"].contains(&k.as_str()))
        {
            return Err(RequestError::unpriced(
                format!("toolConfig.{k}"),
                "is not a toolConfig member tally reads (it takes tools and toolChoice)",
            ));
        }
        let mut any = false;
        for (i, t) in list(o.get("tools"), "toolConfig.tools")?.iter().enumerate() {
            let at = format!("toolConfig.tools[{i}]");
            match one(&at, t)? {
                ("toolSpec", _) => any = true,
                ("cachePoint", c) => self.cache_point(&format!("{at}.cachePoint"), c)?,
                (kind, _) => {
                    return Err(RequestError::unpriced(
                        format!("{at}.{kind}"),
                        format!("`{kind}` is a tool Bedrock runs or bills itself (or one tally does not read), which the policy has no price for"),
                    ))
                }
            }
        }
        Ok(any)
    }
}

impl ModelRequest {
    /// Bedrock: `inferenceConfig` with `maxTokens` set to `tokens` over the request's
    /// own, its other members as read (keys in byte order).
    pub(super) fn bedrock_config(&self, tokens: u64) -> String {
        type Raw = Box<serde_json::value::RawValue>;
        let mut o: BTreeMap<String, Raw> = self
            .members()
            .get("inferenceConfig")
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        o.insert("maxTokens".into(), super::price::raw(&tokens.to_string()));
        super::price::render(&o)
    }
}
