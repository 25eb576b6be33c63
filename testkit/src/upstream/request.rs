//! What the fake reads from a request: which API it is for, and the numbers and parts
//! its model name and body ask it to bill.

use serde_json::Value;

/// Which API a request is for, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    Chat,
    Responses,
    Messages,
    CountTokens,
    /// Gemini's `generateContent` (`stream`: `streamGenerateContent`).
    Gemini,
    /// Bedrock's `converse` (`stream`: `converse-stream`).
    Bedrock,
}

/// Where a request's key is, by its path: Gemini's `x-goog-api-key` on `/v1beta/`,
/// Azure OpenAI's `api-key` on `/openai/`, Anthropic's `x-api-key`, else OpenAI's
/// `Authorization: Bearer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyAt {
    Bearer,
    XApiKey,
    Goog,
    Azure,
    /// Bedrock: a SigV4 signature by the fake's AWS credential.
    Sigv4,
}

pub(super) fn key_at(path: &str, api: Api) -> KeyAt {
    match api {
        Api::Gemini => KeyAt::Goog,
        Api::Bedrock => KeyAt::Sigv4,
        Api::Messages | Api::CountTokens => KeyAt::XApiKey,
        _ if path.starts_with("/openai/") => KeyAt::Azure,
        _ => KeyAt::Bearer,
    }
}

/// Gemini's model and whether it streams, from `/v1beta/models/MODEL:METHOD` (or
/// `/v1/...`).
pub(super) fn gemini_path(path: &str) -> Option<(String, bool)> {
    let p = path.split('?').next().unwrap_or("");
    let (model, method) = p
        .strip_prefix("/v1beta/models/")
        .or_else(|| p.strip_prefix("/v1/models/"))?
        .split_once(':')?;
    Some((model.to_owned(), method == "streamGenerateContent"))
}

pub(super) fn api_of(path: &str) -> Api {
    let p = path.split('?').next().unwrap_or("");
    if gemini_path(path).is_some() {
        Api::Gemini
    } else if super::bedrock::bedrock_path(path).is_some() {
        Api::Bedrock
    } else if p == "/openai/responses" {
        Api::Responses
    } else if p.starts_with("/v1/messages/count_tokens") {
        Api::CountTokens
    } else if p.starts_with("/v1/messages") {
        Api::Messages
    } else if p.starts_with("/v1/responses") {
        Api::Responses
    } else {
        Api::Chat
    }
}

/// The usage one answer reports, as the model's name (or its script) chose it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Numbers {
    pub(super) input: u64,
    pub(super) output: u64,
    /// Anthropic: cache writes; OpenAI: cached input tokens (part of `input`).
    pub(super) third: u64,
    /// Anthropic: 1-hour cache writes (part of `third`); OpenAI: reasoning tokens.
    pub(super) fourth: u64,
    pub(super) searches: u64,
}

/// How many tool results the conversation in `json` already carries.
pub(super) fn tool_results(api: Api, json: &Value) -> usize {
    let items = |key: &str| {
        json.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match api {
        Api::Messages | Api::CountTokens => items("messages")
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("tool_result"))
            .count(),
        Api::Chat => items("messages")
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
            .count(),
        Api::Responses => items("input")
            .iter()
            .filter(|m| m.get("type").and_then(Value::as_str) == Some("function_call_output"))
            .count(),
        Api::Gemini | Api::Bedrock => 0,
    }
}

/// How many images `json` holds where its API takes one.
pub(super) fn images(api: Api, json: &Value) -> u64 {
    let list = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let typed = |v: &Value, t: &str| v.get("type").and_then(Value::as_str) == Some(t);
    let mut n = 0;
    let (items, inner, image) = match api {
        Api::Messages | Api::CountTokens => ("messages", "content", "image"),
        Api::Chat => ("messages", "content", "image_url"),
        Api::Responses => ("input", "content", "input_image"),
        Api::Gemini | Api::Bedrock => return 0,
    };
    for item in list(json, items) {
        let parts = if typed(&item, "function_call_output") {
            list(&item, "output")
        } else {
            list(&item, inner)
        };
        for part in parts {
            if typed(&part, image) {
                n += 1;
            } else if typed(&part, "tool_result") {
                n += list(&part, "content")
                    .iter()
                    .filter(|c| typed(c, image))
                    .count() as u64;
            }
        }
    }
    n
}

pub(super) fn has_tools(json: &Value) -> bool {
    json.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
}

/// The numbers after a prefix: `fake-usage-10-5` -> 10, 5, then zeros.
pub(super) fn numbers_after(model: &str, prefix: &str) -> impl FnMut() -> u64 {
    let mut it = model[prefix.len()..]
        .split('-')
        .map(|n| n.parse::<u64>().unwrap_or(0))
        .collect::<Vec<_>>()
        .into_iter();
    move || it.next().unwrap_or(0)
}
