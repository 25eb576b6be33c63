//! A Gemini request (`generateContent`, `streamGenerateContent`), read strictly: the
//! model is the path's, the output limit `generationConfig.maxOutputTokens` (thoughts
//! included, as the API counts them against it), `generationConfig.candidateCount`
//! answers, client `functionDeclarations` tools, images in parts.
//!
//! The API also reads each member under its snake_case name (`generation_config`,
//! `max_output_tokens`), so a body could carry a second limit the proxy did not read:
//! only the members listed here, in their camelCase spelling, are taken; any other is
//! refused, naming it. So is what no price covers: `cachedContent` (input kept
//! upstream), a tool the API runs itself (`googleSearch`, `codeExecution`, `urlContext`,
//! ...), output other than text (`responseModalities`, `speechConfig`, `imageConfig`),
//! media other than images (audio, video, documents) and files the body does not
//! carry (`fileData`). An image is bounded by the price's `image_tokens`, which the
//! operator gives as the most one image costs at the model's highest media resolution:
//! `mediaResolution` is passed as the request gives it.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value;
use tally_policy::CacheMark;

use super::{Members, ModelRequest, RequestError};
use crate::endpoint::Endpoint;
use crate::media::Images;

/// The request members the proxy reads or passes, in the API's camelCase.
const MEMBERS: &[&str] = &[
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "safetySettings",
    "generationConfig",
];

/// The `generationConfig` members passed (camelCase only), and those refused as
/// unpriced, with why.
const CONFIG: &[&str] = &[
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "responseModalities",
    "candidateCount",
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
    "logprobs",
    "thinkingConfig",
    "mediaResolution",
];
const CONFIG_UNPRICED: &[(&str, &str)] = &[
    (
        "speechConfig",
        "asks for audio output, billed at audio rates",
    ),
    (
        "imageConfig",
        "asks for image output, billed at image rates",
    ),
];

/// A Gemini request to `endpoint` for the model its path `named`: the body names none.
pub(super) fn read(
    endpoint: Endpoint,
    named: Option<&str>,
    read: (Vec<(String, std::ops::Range<usize>)>, tally_record::Args),
    whole: Option<Value>,
) -> Result<ModelRequest, RequestError> {
    let raw = Members {
        text: read.1.canonical(),
        members: &read.0,
    };
    let Some(model) = named else {
        return Err(RequestError::Field {
            field: "model",
            why: "must be named in the path (/models/MODEL:generateContent)",
        });
    };
    if raw.get("model").is_some() {
        return Err(RequestError::Field {
            field: "model",
            why: "is named in the path (/models/MODEL:generateContent): leave it out of the body",
        });
    }
    let whole = whole.ok_or(RequestError::NotObject)?;
    request(endpoint, model.to_owned(), read, &whole)
}

/// A Gemini request to `endpoint` for `model` (the path's), its body read as `members`
/// and `whole`.
fn request(
    endpoint: Endpoint,
    model: String,
    read: (Vec<(String, std::ops::Range<usize>)>, tally_record::Args),
    whole: &Value,
) -> Result<ModelRequest, RequestError> {
    let (members, args) = read;
    let raw = Members {
        text: args.canonical(),
        members: &members,
    };
    for (name, _) in raw.members {
        if name == "cachedContent" {
            return Err(RequestError::unpriced(
                "cachedContent",
                "adds input kept upstream (a cache the body does not carry), billed at cache rates and storage",
            ));
        }
        if !MEMBERS.contains(&name.as_str()) {
            return Err(unread(name.clone()));
        }
    }
    let config = config(whole)?;
    let max_tokens = config
        .map(|c| whole_number(c, "maxOutputTokens"))
        .transpose()?
        .flatten();
    if max_tokens == Some(0) {
        return Err(RequestError::Field {
            field: "generationConfig.maxOutputTokens",
            why: "must be at least 1",
        });
    }
    let choices = config
        .map(|c| whole_number(c, "candidateCount"))
        .transpose()?
        .flatten()
        .unwrap_or(1);
    if choices == 0 || choices > 128 {
        return Err(RequestError::Field {
            field: "generationConfig.candidateCount",
            why: "must be between 1 and 128",
        });
    }
    let tools = tools(whole)?;
    let images = images(whole)?;
    Ok(ModelRequest {
        members,
        endpoint,
        model,
        body_model: None,
        max_tokens,
        limit_field: max_tokens.map(|_| "generationConfig"),
        choices,
        stream: endpoint == Endpoint::StreamGenerateContent,
        client_asked_usage: false,
        tools,
        cache: CacheMark::None,
        web_searches: 0,
        service_tier: None,
        images,
        args,
    })
}

/// A member tally does not read: refused, naming it.
fn unread(field: String) -> RequestError {
    RequestError::unpriced(
        field,
        "is not a Gemini request member tally reads (it takes contents, systemInstruction, tools, toolConfig, safetySettings and generationConfig, in camelCase): a member it cannot read could carry what it cannot price",
    )
}

/// `generationConfig`, checked: an object of the members tally reads, text output only.
fn config(whole: &Value) -> Result<Option<&serde_json::Map<String, Value>>, RequestError> {
    let c = match whole.get("generationConfig") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(c)) => c,
        Some(_) => {
            return Err(RequestError::Field {
                field: "generationConfig",
                why: "must be an object",
            })
        }
    };
    for (k, v) in c {
        if let Some((_, why)) = CONFIG_UNPRICED.iter().find(|(n, _)| n == k) {
            return Err(RequestError::unpriced(
                format!("generationConfig.{k}"),
                *why,
            ));
        }
        if !CONFIG.contains(&k.as_str()) {
            return Err(unread(format!("generationConfig.{k}")));
        }
        if k == "thinkingConfig" {
            thinking(v)?;
        }
        if k == "responseModalities" {
            let text_only = v
                .as_array()
                .is_some_and(|m| m.iter().all(|x| x.as_str() == Some("TEXT")));
            if !text_only {
                return Err(RequestError::unpriced(
                    "generationConfig.responseModalities",
                    "asks for output other than TEXT, billed at its own rates",
                ));
            }
        }
    }
    Ok(Some(c))
}

/// The `thinkingConfig` members passed (camelCase only).
const THINKING: &[&str] = &["includeThoughts", "thinkingBudget"];

/// `generationConfig.thinkingConfig`, checked: an object of the members tally reads, its
/// `thinkingBudget` a whole number (the forwarded one is capped at the output limit);
/// `-1` (a budget the model picks itself) is refused, as is any other member (a
/// snake_case spelling the API would also read, or a `thinkingLevel` tally cannot tie to
/// the output limit).
fn thinking(v: &Value) -> Result<(), RequestError> {
    let Value::Object(t) = v else {
        return Err(RequestError::Field {
            field: "generationConfig.thinkingConfig",
            why: "must be an object",
        });
    };
    for (k, x) in t {
        if !THINKING.contains(&k.as_str()) {
            return Err(RequestError::unpriced(
                format!("generationConfig.thinkingConfig.{k}"),
                "is not a thinkingConfig member tally reads (it takes includeThoughts and thinkingBudget, in camelCase): thinking it cannot tie to maxOutputTokens could cost what it cannot bound",
            ));
        }
        if k == "thinkingBudget" && x.as_u64().is_none() {
            return Err(RequestError::Field {
                field: "generationConfig.thinkingConfig.thinkingBudget",
                why: "must be a whole number of tokens (-1, a budget the model picks itself, is not bounded: give one)",
            });
        }
    }
    Ok(())
}

/// A whole number member of `generationConfig`, if given.
fn whole_number(
    c: &serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<Option<u64>, RequestError> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(_) => Err(RequestError::Field {
            field: if key == "maxOutputTokens" {
                "generationConfig.maxOutputTokens"
            } else {
                "generationConfig.candidateCount"
            },
            why: "must be a whole number",
        }),
    }
}

/// Whether it has tools: each an object of `functionDeclarations` (tools the client
/// runs); a tool the API runs or bills itself is refused, naming it.
fn tools(whole: &Value) -> Result<bool, RequestError> {
    let list = match whole.get("tools") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(RequestError::Field {
                field: "tools",
                why: "must be a list",
            })
        }
    };
    for (i, tool) in list.iter().enumerate() {
        let Value::Object(o) = tool else {
            return Err(RequestError::Field {
                field: "tools",
                why: "holds a tool that is not an object",
            });
        };
        if let Some(k) = o.keys().find(|k| k.as_str() != "functionDeclarations") {
            return Err(RequestError::unpriced(
                format!("tools[{i}].{k}"),
                format!("`{k}` is a tool the API runs or bills itself (or one tally does not read), which the policy has no price for"),
            ));
        }
    }
    Ok(!list.is_empty())
}

/// The images in a body's parts (`contents[i].parts[j]`, `systemInstruction.parts[j]`,
/// and a `functionResponse`'s `parts[k]` there): an `inlineData` whose `mimeType` is
/// `image/...` (its base64 `data` left out of the byte bound). Any other media (audio,
/// video, documents), a `fileData` (a file the body does not carry: its tokens are the
/// file's), a media member anywhere else, or one spelt in snake_case (`inline_data`,
/// `file_data`) is refused, naming where it is.
fn images(whole: &Value) -> Result<Images, RequestError> {
    let mut out = Images::default();
    // A set: each media member walked is looked up once, not against every part read.
    let mut read: HashSet<*const Value> = HashSet::new();
    let mut lists: Vec<(String, &Value)> = Vec::new();
    for (i, c) in numbered(whole.get("contents")) {
        lists.push((format!("contents[{i}]"), c));
    }
    if let Some(s) = whole.get("systemInstruction") {
        lists.push(("systemInstruction".into(), s));
    }
    while let Some((at, holder)) = lists.pop() {
        for (j, part) in numbered(holder.get("parts")) {
            let at = format!("{at}.parts[{j}]");
            if let Some(f) = part.get("functionResponse") {
                lists.push((format!("{at}.functionResponse"), f));
            }
            if part.get("fileData").is_some() {
                return Err(RequestError::unpriced(
                    format!("{at}.fileData"),
                    "names a file the body does not carry (an upload, a URL, a video), whose tokens tally cannot bound",
                ));
            }
            for key in ["inlineData"] {
                let Some(media) = part.get(key) else { continue };
                let field = format!("{at}.{key}");
                out.data_bytes = out.data_bytes.saturating_add(image(&field, key, media)?);
                out.count += 1;
                out.first.get_or_insert(field);
                read.insert(media as *const Value);
            }
        }
    }
    elsewhere(whole, &read, &mut String::new())?;
    Ok(out)
}

/// The elements of a list (none if it is not one), numbered.
fn numbered(v: Option<&Value>) -> impl Iterator<Item = (usize, &Value)> {
    v.and_then(Value::as_array)
        .into_iter()
        .flat_map(|a| a.iter().enumerate())
}

/// The base64 bytes of one image (`inlineData.data`; 0 for a `fileData` URI), refused
/// if it is not an image.
fn image(field: &str, key: &str, media: &Value) -> Result<u64, RequestError> {
    let text = |k: &str| media.get(k).and_then(Value::as_str);
    let bad = |why: String| RequestError::unpriced(field.to_owned(), why);
    let Value::Object(o) = media else {
        return Err(bad("is not an object".into()));
    };
    if let Some(k) = o
        .keys()
        .find(|k| !["mimeType", "data", "displayName"].contains(&k.as_str()))
    {
        return Err(bad(format!(
            "holds `{k}`, which tally does not read (an inlineData takes mimeType, data and displayName, in camelCase): a second spelling could name other media"
        )));
    }
    match text("mimeType") {
        Some(m) if m.starts_with("image/") => {}
        Some(m) => {
            return Err(bad(format!(
            "is `{m}` media (audio, video, a document), billed by a measure tally has no price for"
        )))
        }
        None => return Err(bad("is media without a `mimeType` tally can read".into())),
    }
    match (key, text("data")) {
        ("inlineData", Some(d)) => Ok(d.len() as u64),
        _ => Err(bad(
            "is an image tally cannot read (an inlineData without its `data`)".into(),
        )),
    }
}

/// Refuses a media member anywhere but the parts read (`read`), and any snake_case
/// spelling of one, naming its path.
fn elsewhere(v: &Value, read: &HashSet<*const Value>, at: &mut String) -> Result<(), RequestError> {
    // A fixed list, not a map built for each value walked.
    const MEDIA: &[(&str, &str)] = &[
        ("inlineData", "media outside a content part"),
        ("fileData", "media outside a content part"),
        (
            "inline_data",
            "media spelt in snake_case: write `inlineData`",
        ),
        ("file_data", "media spelt in snake_case: write `fileData`"),
    ];
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                if let Some((_, why)) = MEDIA.iter().find(|(name, _)| *name == k.as_str()) {
                    if !read.contains(&(x as *const Value)) {
                        return Err(RequestError::unpriced(
                            at.clone(),
                            format!("is {why}, which tally does not price"),
                        ));
                    }
                } else {
                    elsewhere(x, read, at)?;
                }
                at.truncate(len);
            }
            Ok(())
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let len = at.len();
                // Written in place: no string made for each item.
                write!(at, "[{i}]").expect("writing to a String cannot fail");
                elsewhere(x, read, at)?;
                at.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl ModelRequest {
    /// Gemini: `generationConfig` with `maxOutputTokens` set to `tokens` over the
    /// request's own, `responseModalities` set to `["TEXT"]` (an image model asked for
    /// none answers with images, billed at image rates), a `thinkingConfig.thinkingBudget`
    /// above `tokens` lowered to it, its other members as read (keys in byte order).
    pub(super) fn gemini_config(&self, tokens: u64) -> String {
        type Raw = Box<serde_json::value::RawValue>;
        let mut o: BTreeMap<String, Raw> = self
            .members()
            .get("generationConfig")
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        o.insert(
            "maxOutputTokens".into(),
            super::price::raw(&tokens.to_string()),
        );
        o.insert(
            "responseModalities".into(),
            super::price::raw(r#"["TEXT"]"#),
        );
        let thinking = o
            .get("thinkingConfig")
            .and_then(|t| serde_json::from_str::<BTreeMap<String, Raw>>(t.get()).ok());
        if let Some(mut t) = thinking {
            let budget = t
                .get("thinkingBudget")
                .and_then(|b| b.get().parse::<u64>().ok());
            if budget.is_some_and(|b| b > tokens) {
                t.insert(
                    "thinkingBudget".into(),
                    super::price::raw(&tokens.to_string()),
                );
                o.insert(
                    "thinkingConfig".into(),
                    super::price::raw(&super::price::render(&t)),
                );
            }
        }
        super::price::render(&o)
    }
}
