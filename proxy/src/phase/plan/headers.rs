//! The plan's headers: the agent's headers that reach the upstream, by kind: what the
//! dialect needs to be read right, nothing that can choose an account, a beta or a
//! billing option (docs/PROXY.md, "Headers"). Every other header is dropped, hop-by-hop,
//! credentials, `expect`, `openai-organization`, `openai-project` and `openai-beta`
//! among them. A model upstream gets `content-type: application/json` (the body is the
//! JSON the proxy wrote) and an `accept` only of JSON or server-sent events. Forward
//! adds the trace context and the real credential.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use tally_policy::{Upstream, UpstreamKind};

/// The agent's headers that its dialect needs ([`passed`]), and the `anthropic-beta`
/// values the upstream allows (`anthropic_beta`).
pub(super) fn allowed(incoming: &HeaderMap, upstream: &Upstream) -> HeaderMap {
    let kind = upstream.kind;
    let mut out = HeaderMap::new();
    let model = kind.is_model();
    for (name, value) in incoming {
        if passed(kind, name.as_str()) && (!model || model_value(name.as_str(), value)) {
            out.append(name.clone(), value.clone());
        }
    }
    if model {
        // The body forwarded is the canonical JSON the proxy wrote, whatever the agent
        // said it sent.
        out.insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
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

/// Whether the agent's header `name` keeps `value` for a model upstream: never its
/// `content-type` (the proxy sets `application/json`), an `accept` only of
/// `application/json` or `text/event-stream`; any other passed header as it is.
fn model_value(name: &str, value: &HeaderValue) -> bool {
    match name {
        "content-type" => false,
        "accept" => value.to_str().is_ok_and(|v| {
            let v = v.trim();
            v.eq_ignore_ascii_case("application/json")
                || v.eq_ignore_ascii_case("text/event-stream")
        }),
        _ => true,
    }
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

    #[test]
    fn a_model_upstream_gets_json_and_only_the_accepts_it_answers() {
        let up = |kind: UpstreamKind| {
            let mut u: Upstream = serde_json::from_value(
                serde_json::json!({"kind": "http", "url": "https://x.example", "credential": "k"}),
            )
            .expect("upstream");
            u.kind = kind;
            u
        };
        let with = |ct: &'static str, accept: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static(ct));
            h.insert(hyper::header::ACCEPT, HeaderValue::from_static(accept));
            h
        };
        for kind in [
            UpstreamKind::Openai,
            UpstreamKind::Anthropic,
            UpstreamKind::Gemini,
            UpstreamKind::AzureOpenai,
            UpstreamKind::Bedrock,
        ] {
            let out = allowed(&with("text/plain", "text/event-stream"), &up(kind));
            assert_eq!(
                out.get("content-type").map(|v| v.as_bytes()),
                Some(&b"application/json"[..]),
                "{kind:?}"
            );
            assert_eq!(out.get_all("content-type").iter().count(), 1);
            assert_eq!(
                out.get("accept").map(|v| v.as_bytes()),
                Some(&b"text/event-stream"[..])
            );
            let out = allowed(&with("application/json", "*/*"), &up(kind));
            assert_eq!(out.get("accept"), None, "{kind:?}");
            let out = allowed(&with("application/json", "application/json"), &up(kind));
            assert_eq!(
                out.get("accept").map(|v| v.as_bytes()),
                Some(&b"application/json"[..])
            );
        }
        // An http upstream's route gets the agent's own.
        let out = allowed(&with("text/plain", "*/*"), &up(UpstreamKind::Http));
        assert_eq!(
            out.get("content-type").map(|v| v.as_bytes()),
            Some(&b"text/plain"[..])
        );
        assert_eq!(out.get("accept").map(|v| v.as_bytes()), Some(&b"*/*"[..]));
    }

    #[test]
    fn an_agents_aws_signing_headers_never_reach_bedrock() {
        let u: Upstream = serde_json::from_value(serde_json::json!({"kind": "bedrock",
            "url": "https://bedrock-runtime.us-east-1.amazonaws.com", "credential": "aws",
            "aws_region": "us-east-1"}))
        .expect("upstream");
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("authorization", "AWS4-HMAC-SHA256 Credential=AKIAAGENT/..."),
            ("x-amz-date", "20250101T000000Z"),
            ("x-amz-security-token", "agent-token"),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
            ("x-amz-user-agent", "Boto3/1.43.11"),
            ("amz-sdk-invocation-id", "x"),
            ("x-amzn-bedrock-guardrailidentifier", "g"),
            ("content-type", "application/json"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let out = allowed(&h, &u);
        let names: Vec<&str> = out.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type"]);
    }
}
