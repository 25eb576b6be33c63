//! Bedrock's usage (Converse's `usage`, a ConverseStream's `metadata` event), as AWS
//! bills it: `inputTokens` at the input price, `cacheReadInputTokens` at the cached
//! price, `cacheWriteInputTokens` at the cache-write price (none of them part of
//! `inputTokens`), `outputTokens` at the output price. `totalTokens`, where given, must
//! be the sum of those parts.

use serde_json::Value;

use super::{count, needed, Prune, Usage};

/// What Bedrock's reader reads of a Converse answer or a ConverseStream's `metadata`
/// event: the usage ([`usage`]).
pub(super) const KEPT: Prune = Prune::Fields(&[("usage", Prune::Whole)]);

/// The usage `usage` `u` reports.
pub(super) fn usage(u: &Value) -> Result<Usage, String> {
    let input = needed(u, "/inputTokens")?;
    let output = needed(u, "/outputTokens")?;
    let cached = count(u, "/cacheReadInputTokens")?.unwrap_or(0);
    let written = count(u, "/cacheWriteInputTokens")?.unwrap_or(0);
    let sum = input
        .checked_add(output)
        .and_then(|n| n.checked_add(cached))
        .and_then(|n| n.checked_add(written))
        .ok_or_else(|| "a token count past 2^64".to_owned())?;
    if let Some(total) = count(u, "/totalTokens")? {
        if total != sum {
            return Err(format!(
                "totalTokens {total} is not the sum of its parts ({sum}: input, output, cache reads, cache writes)"
            ));
        }
    }
    Ok(Usage {
        input,
        cached,
        written,
        output,
        ..Usage::default()
    })
}
