//! Gemini's usage (`usageMetadata`), as Google bills it: `promptTokenCount` (of it,
//! `cachedContentTokenCount` at the cached price) and `toolUsePromptTokenCount` at the
//! input price; `candidatesTokenCount` and `thoughtsTokenCount` at the output price
//! (thinking is billed as output). `totalTokenCount`, where given, must be the sum of
//! those parts. A stream reports the usage so far in its chunks; it is the call's only
//! once a chunk says the answer ended (a candidate's `finishReason`, or the prompt's
//! `promptFeedback.blockReason`).

use serde_json::Value;

use super::{count, needed, Usage};

/// The usage `usageMetadata` `u` reports.
pub(super) fn usage(u: &Value) -> Result<Usage, String> {
    let prompt = needed(u, "/promptTokenCount")?;
    let cached = count(u, "/cachedContentTokenCount")?.unwrap_or(0);
    let tool = count(u, "/toolUsePromptTokenCount")?.unwrap_or(0);
    let candidates = count(u, "/candidatesTokenCount")?.unwrap_or(0);
    let thoughts = count(u, "/thoughtsTokenCount")?.unwrap_or(0);
    if cached > prompt {
        return Err(format!(
            "{cached} cached tokens reported of {prompt} prompt tokens"
        ));
    }
    let too_many = || "a token count past 2^64".to_owned();
    let output = candidates.checked_add(thoughts).ok_or_else(too_many)?;
    let input = (prompt - cached).checked_add(tool).ok_or_else(too_many)?;
    let sum = prompt
        .checked_add(tool)
        .and_then(|n| n.checked_add(output))
        .ok_or_else(too_many)?;
    if let Some(total) = count(u, "/totalTokenCount")? {
        if total != sum {
            return Err(format!(
                "totalTokenCount {total} is not the sum of its parts ({sum}: prompt, tool-use prompt, candidates, thoughts)"
            ));
        }
    }
    Ok(Usage {
        input,
        cached,
        output,
        ..Usage::default()
    })
}

/// Whether a response (or a stream's chunk) says the answer ended.
pub(super) fn ended(v: &Value) -> bool {
    let finished = v
        .get("candidates")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.get("finishReason").is_some_and(|r| !r.is_null()))
        });
    finished || v.pointer("/promptFeedback/blockReason").is_some()
}
