//! Gemini's usage (`usageMetadata`), as Google bills it: `promptTokenCount` (of it,
//! `cachedContentTokenCount` at the cached price) and `toolUsePromptTokenCount` at the
//! input price; `candidatesTokenCount` and `thoughtsTokenCount` at the output price
//! (thinking is billed as output). `totalTokenCount`, where given, must be the sum of
//! those parts. Tokens of a modality no price covers (`candidatesTokensDetails` other
//! than `TEXT`: images or audio out; `promptTokensDetails` other than `TEXT` and
//! `IMAGE`, the latter priced through `image_tokens`) make the usage unpriced: tally
//! does not guess what they cost. A stream reports the usage so far in its chunks; it is the call's only
//! once a chunk says the answer ended (a candidate's `finishReason`, or the prompt's
//! `promptFeedback.blockReason`).

use serde_json::Value;

use super::{count, needed, Prune, Usage};

/// What Gemini's readers read of an answer or a stream's chunk: the usage ([`usage`]),
/// and whether a candidate or the prompt's feedback ended it ([`ended`]).
pub(super) const KEPT: Prune = Prune::Fields(&[
    ("usageMetadata", Prune::Whole),
    (
        "candidates",
        Prune::Items(&Prune::Fields(&[("finishReason", Prune::Whole)])),
    ),
    (
        "promptFeedback",
        Prune::Fields(&[("blockReason", Prune::Whole)]),
    ),
]);

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
        other_modality: other_modality(u, "/promptTokensDetails", &["TEXT", "IMAGE"])?
            || other_modality(u, "/cacheTokensDetails", &["TEXT", "IMAGE"])?
            || other_modality(u, "/candidatesTokensDetails", &["TEXT"])?,
        ..Usage::default()
    })
}

/// Whether the per-modality counts at `path` (a list of `{modality, tokenCount}`) name
/// tokens of a modality other than those `priced`: audio, video or document input, and
/// image or audio output, are billed at rates no price has. An entry tally cannot read
/// is an error.
fn other_modality(u: &Value, path: &str, priced: &[&str]) -> Result<bool, String> {
    let list = match u.pointer(path) {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Array(a)) => a,
        Some(x) => return Err(format!("`usageMetadata{path}` is {x}: not a list")),
    };
    let mut other = false;
    for e in list {
        let Some(m) = e.get("modality").and_then(Value::as_str) else {
            return Err(format!(
                "`usageMetadata{path}` holds {e}: an entry without its modality"
            ));
        };
        let tokens = count(e, "/tokenCount")?.unwrap_or(0);
        other |= tokens > 0 && !priced.contains(&m);
    }
    Ok(other)
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
