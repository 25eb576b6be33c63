//! The plan's headers: the agent's headers that reach the upstream, by kind: what the
//! dialect needs to be read right, nothing that can choose an account, a beta or a
//! billing option (docs/PROXY.md, "Headers"). Every other header is dropped, hop-by-hop,
//! credentials, `expect`, `openai-organization`, `openai-project` and `openai-beta`
//! among them. Forward adds the trace context and the real credential.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use tally_policy::{Upstream, UpstreamKind};

/// The agent's headers that its dialect needs ([`passed`]), and the `anthropic-beta`
/// values the upstream allows (`anthropic_beta`).
pub(super) fn allowed(incoming: &HeaderMap, upstream: &Upstream) -> HeaderMap {
    let kind = upstream.kind;
    let mut out = HeaderMap::new();
    for (name, value) in incoming {
        if passed(kind, name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    if kind == UpstreamKind::Anthropic {
        if let Some(v) = betas(incoming, &upstream.anthropic_beta) {
            out.insert(HeaderName::from_static("anthropic-beta"), v);
        }
    }
    out
}

/// Whether the agent's header `name` reaches an upstream of `kind`.
fn passed(kind: UpstreamKind, name: &str) -> bool {
    matches!(name, "content-type" | "accept")
        || (kind == UpstreamKind::Anthropic && name == "anthropic-version")
}

/// The agent's `anthropic-beta` values that `allowed` lists, in its order, once each;
/// none: no header.
fn betas(incoming: &HeaderMap, allowed: &[String]) -> Option<HeaderValue> {
    let mut kept: Vec<&str> = Vec::new();
    for v in incoming.get_all("anthropic-beta") {
        let Ok(v) = v.to_str() else { continue };
        for b in v.split(',').map(str::trim) {
            if allowed.iter().any(|a| a == b) && !kept.contains(&b) {
                kept.push(b);
            }
        }
    }
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(",")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dialects_headers_and_the_allowed_betas_pass() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("anthropic-version", "2023-06-01"),
            (
                "anthropic-beta",
                "claude-code-20250219, context-1m-2025-08-07",
            ),
            (
                "anthropic-beta",
                "interleaved-thinking-2025-05-14,claude-code-20250219",
            ),
            ("openai-organization", "org-x"),
            ("openai-project", "proj-x"),
            ("openai-beta", "assistants=v2"),
            ("expect", "100-continue"),
            ("connection", "keep-alive"),
            ("user-agent", "claude-cli"),
            ("x-stainless-os", "Linux"),
            ("anthropic-dangerous-direct-browser-access", "true"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let names = |kind| {
            h.keys()
                .filter(|n| passed(kind, n.as_str()))
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(UpstreamKind::Anthropic),
            ["content-type", "accept", "anthropic-version"]
        );
        assert_eq!(names(UpstreamKind::Openai), ["content-type", "accept"]);
        assert_eq!(names(UpstreamKind::Http), ["content-type", "accept"]);
        let allowed = vec![
            "claude-code-20250219".to_owned(),
            "interleaved-thinking-2025-05-14".to_owned(),
        ];
        assert_eq!(
            betas(&h, &allowed).as_ref().and_then(|v| v.to_str().ok()),
            Some("claude-code-20250219,interleaved-thinking-2025-05-14"),
            "the long-context beta (billed at its own rates) is dropped"
        );
        assert_eq!(betas(&h, &[]), None);
    }
}
