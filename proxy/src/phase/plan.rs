//! The plan phase: what the request is and what it may cost, before the gate is asked.
//! The upstream must be named and the method and path its own; the body at most its
//! `max_request_bytes` (413), whole within the read timeout (408); then it is read
//! strictly and priced ([`price`]), and the agent's headers are allow-listed
//! ([`headers`]). Each refusal here is recorded through the gate as the run's `deny`
//! before it is answered.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_policy::UpstreamKind;
use tally_record::decision::Channel;
use tally_record::money::Nanos;
use tally_record::{Effect, Reason};

use super::{channel_of, effect_of, Call};
use crate::dialect::Refusal;
use crate::proxy::Proxy;
use crate::refuse::{Caught, Pre, Refused};
use crate::request::Endpoint;

mod headers;
mod price;

/// What a request is, priced.
pub(crate) struct Plan {
    pub endpoint: Endpoint,
    pub body: Vec<u8>,
    pub worst: Nanos,
    pub operation: String,
    pub effect: Effect,
    pub args: Option<tally_record::Args>,
    pub price: Option<tally_policy::ModelPrice>,
    pub route_price: Option<Nanos>,
    pub strip_usage: bool,
    /// The billing tiers the call can land on.
    pub lands: crate::tier::Lands,
    /// The agent's headers that go upstream ([`headers::allowed`]).
    pub headers: HeaderMap,
    /// The path forwarded in place of the agent's (Bedrock: the model id in one
    /// spelling); none: the agent's.
    pub upstream_path: Option<String>,
    /// The answers a model call asks for (OpenAI's `n`, Gemini's `candidateCount`;
    /// 1 otherwise), which its worst case reserved for.
    pub choices: u64,
}

/// The plan of `call`, its body read from `body`, or the refusal, recorded.
pub(super) async fn plan(proxy: &Proxy, call: &Call<'_>, body: Incoming) -> Result<Plan, Refusal> {
    let (route, method, rest) = (call.route, call.method.as_str(), call.rest.as_str());
    let u = &route.upstream;
    // The gate's own counts (grants and carve-outs included).
    let remaining = tally_policy::spend_left(&call.caught.standing.limits);
    let planned = async {
        let bytes = read(proxy, call, body).await?;
        let asked = price::Asked {
            name: &route.name,
            upstream: u,
            method,
            rest,
            query: call.head.uri.query(),
            bytes: &bytes,
        };
        price::priced(&proxy.policy, &asked, remaining)
    };
    match planned.await {
        Ok(mut plan) => {
            plan.headers = headers::allowed(&call.head.headers, u);
            Ok(plan)
        }
        Err(pre) => {
            let refused = Refused {
                tool: route.name.clone(),
                target: Some(route.host.clone()),
                channel: channel_of(u.kind),
                effect: if u.kind == UpstreamKind::Http {
                    effect_of(method)
                } else {
                    Effect::Read
                },
            };
            let pre = if pre.preview.is_none() {
                pre.preview(format!("{method} {rest}"))
            } else {
                pre
            };
            Err(proxy.refuse(&call.caught, refused, pre).await)
        }
    }
}

/// The refusal of a request to an upstream the policy does not name, recorded.
pub(super) async fn unknown_upstream(
    proxy: &Proxy,
    caught: &Caught,
    name: &str,
    method: &str,
    path: &str,
) -> Refusal {
    let refused = Refused {
        // A tool name is an identifier: a name no upstream could have is kept in the
        // preview only.
        tool: if tally_policy::upstreams::valid_name(name) {
            name.to_owned()
        } else {
            "proxy".to_owned()
        },
        target: None,
        channel: Channel::Http,
        effect: effect_of(method),
    };
    let pre = Pre::new(
        Reason::ScopeViolation,
        StatusCode::NOT_FOUND,
        format!("no upstream `{name}` in the policy: call /NAME/PATH for an upstream of [upstreams.NAME]"),
    )
    .preview(format!("{method} {path}"));
    proxy.refuse(caught, refused, pre).await
}

/// The body, if the method and path are the upstream's own: at most its
/// `max_request_bytes`, whole within the read timeout.
async fn read(proxy: &Proxy, call: &Call<'_>, body: Incoming) -> Result<Bytes, Pre> {
    let (route, method, rest) = (call.route, call.method.as_str(), call.rest.as_str());
    let u = &route.upstream;
    if !u.methods.iter().any(|m| m == method) {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!("{method} is not allowed to upstream `{}`", route.name),
        ));
    }
    if !path_allowed(&u.paths, &as_checked(u.kind, rest)) {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!("{rest} is not a path upstream `{}` allows", route.name),
        ));
    }
    let limit = usize::try_from(u.max_request_bytes).unwrap_or(usize::MAX);
    if call
        .head
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > u.max_request_bytes)
    {
        return Err(too_large(u.max_request_bytes));
    }
    // The whole body within the read timeout: a client that announces a body and
    // stalls holds its connection (and its peer's place) no longer.
    let reading = Limited::new(body, limit).collect();
    match tokio::time::timeout(proxy.read_timeout, reading).await {
        Err(_) => Err(too_slow(proxy.read_timeout)),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(too_large(u.max_request_bytes))
        }
        Ok(Err(_)) => Err(Pre::new(
            Reason::RequestRefused,
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
    }
}

/// The path the upstream's `paths` are checked against: as sent, except a Bedrock
/// model path, checked with its model id decoded (`/model/arn:aws:...:inference-profile/ID/converse`):
/// its escapes are the id's own, read strictly ([`crate::bedrock`]).
fn as_checked(kind: UpstreamKind, rest: &str) -> std::borrow::Cow<'_, str> {
    match crate::endpoint::Routed::of(kind, rest) {
        Some(r) if kind == UpstreamKind::Bedrock => {
            let method = rest.rsplit('/').next().unwrap_or_default();
            format!("/model/{}/{method}", r.named.unwrap_or_default()).into()
        }
        _ => rest.into(),
    }
}

/// Whether `path` is under one of `prefixes` (a whole segment: `/v1/chat` allows
/// `/v1/chat/completions`, not `/v1/chatx`), with no dot segment or encoded byte.
fn path_allowed(prefixes: &[String], path: &str) -> bool {
    // One spelling per path: no encoded byte, backslash, dot segment, empty segment
    // (`//`) or trailing `/`.
    if path.contains(['%', '\\'])
        || path.len() > 1 && path.ends_with('/')
        || path[1.min(path.len())..]
            .split('/')
            .any(|s| s.is_empty() || s == ".." || s == ".")
    {
        return false;
    }
    prefixes.iter().any(|p| {
        let p = p.trim_end_matches('/');
        path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'))
    })
}

fn too_large(max: u64) -> Pre {
    Pre::new(
        Reason::RequestRefused,
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is over this upstream's max_request_bytes ({max} bytes)"),
    )
}

/// A body that did not arrive within the read timeout: 408 (the connection is closed
/// after it: the rest of the body is never read).
fn too_slow(limit: Duration) -> Pre {
    Pre::new(
        Reason::RequestRefused,
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the request body did not arrive whole within {} ms (tally serve --proxy-read-timeout-ms); nothing was forwarded",
            limit.as_millis()
        ),
    )
    .closing()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_allowed_under_a_prefix_by_whole_segments_in_one_spelling() {
        let prefixes = vec!["/v1/chat".to_owned(), "/v1/messages/".to_owned()];
        for ok in [
            "/v1/chat",
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
        ] {
            assert!(path_allowed(&prefixes, ok), "{ok}");
        }
        for off in [
            "/v1/chatx",
            "/v1/chat/",
            "/v1//chat",
            "/v1/chat/../models",
            "/v1/chat/./completions",
            "/v1/chat/%2e%2e",
            "/v1/chat\\completions",
            "/v2/chat",
            "/",
        ] {
            assert!(!path_allowed(&prefixes, off), "{off}");
        }
    }
}
