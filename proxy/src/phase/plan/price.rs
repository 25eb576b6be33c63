//! The plan's price: the request's endpoint, then its route's price (an `http`
//! upstream) or its model's, the worst case reserved and the body forwarded
//! (docs/PROXY.md, "What is reserved and what is settled").

use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_policy::{Policy, Upstream, UpstreamKind};
use tally_record::money::Nanos;
use tally_record::{Effect, Reason};

use super::Plan;
use crate::phase::effect_of;
use crate::refuse::Pre;
use crate::request::{Endpoint, RequestError};

/// A request as the plan prices it: to which upstream, how, and its body.
pub(super) struct Asked<'a> {
    /// The upstream's name.
    pub name: &'a str,
    pub upstream: &'a Upstream,
    pub method: &'a str,
    /// The path under the upstream's name.
    pub rest: &'a str,
    pub query: Option<&'a str>,
    pub bytes: &'a [u8],
}

/// The request priced with `remaining` to spend, or the refusal made before the gate
/// is asked.
pub(super) fn priced(policy: &Policy, asked: &Asked<'_>, remaining: Nanos) -> Result<Plan, Pre> {
    let (method, rest, name) = (asked.method, asked.rest, asked.name);
    let kind = asked.upstream.kind;
    let Some(endpoint) = Endpoint::of(kind, rest) else {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!(
                "{method} {rest} is not an endpoint tally meters on upstream `{name}` (it meters {}); tally never forwards a call it cannot meter",
                Endpoint::metered(kind)
            ),
        ));
    };
    if !endpoint.query_allowed(asked.query) {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!(
                "the query `?{}` is not forwarded to {rest} on upstream `{name}`",
                asked.query.unwrap_or_default(),
            ),
        ));
    }
    if kind == UpstreamKind::Http {
        route_priced(policy, asked, endpoint)
    } else {
        model_priced(policy, asked, endpoint, remaining)
    }
}

/// A call to an `http` upstream's route, at its `per_call` price.
fn route_priced(policy: &Policy, asked: &Asked<'_>, endpoint: Endpoint) -> Result<Plan, Pre> {
    let key = format!("{} {}", asked.method, asked.rest);
    let Some(p) = policy.prices.route(asked.name, &key) else {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!("`{key}` on upstream `{}` has no price in the policy; tally never forwards a call it cannot price", asked.name),
        ));
    };
    // The request as the loop rules see it: its route and the digest of its body.
    let args = tally_record::Args::from_value(&serde_json::json!({
        "route": key,
        "body_blake3": blake3::hash(asked.bytes).to_hex().to_string(),
    }))
    .ok();
    Ok(Plan {
        endpoint,
        body: asked.bytes.to_vec(),
        worst: p.per_call,
        operation: key.clone(),
        effect: effect_of(asked.method),
        args,
        price: None,
        route_price: Some(p.per_call),
        strip_usage: false,
        lands: crate::tier::Lands::Default,
        headers: HeaderMap::new(),
    })
}

/// A call to a model, read strictly and priced at its model's price.
fn model_priced(
    policy: &Policy,
    asked: &Asked<'_>,
    endpoint: Endpoint,
    remaining: Nanos,
) -> Result<Plan, Pre> {
    let request = crate::request::parse(endpoint, asked.bytes).map_err(refused)?;
    let Some(price) = policy.prices.model(asked.name, &request.model) else {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!(
                "model `{}` on upstream `{}` has no price in the policy; tally never forwards a call it cannot price",
                request.model, asked.name
            ),
        )
        .preview(request.model.clone()));
    };
    let priced = request
        .price(price, remaining, asked.upstream.clamp_max_tokens)
        .map_err(|e| refused(e).preview(request.model.clone()))?;
    Ok(Plan {
        endpoint,
        body: priced.body,
        worst: priced.worst,
        // Kept as the call's preview (bounded: a model name is at most 256 bytes).
        operation: request.model.clone(),
        // A completion changes nothing upstream: a read, whatever its method.
        effect: Effect::Read,
        args: Some(request.args),
        price: Some(price.clone()),
        route_price: None,
        strip_usage: endpoint == Endpoint::ChatCompletions
            && request.stream
            && !request.client_asked_usage,
        lands: crate::tier::lands(endpoint, request.service_tier.as_deref()),
        headers: HeaderMap::new(),
    })
}

/// A request the proxy cannot forward: 403 `scope_violation` for what it cannot price,
/// 400 `request_refused` for a body it cannot read.
fn refused(e: RequestError) -> Pre {
    match e {
        RequestError::Unpriced { .. } => {
            Pre::new(Reason::ScopeViolation, StatusCode::FORBIDDEN, e.to_string())
        }
        e => Pre::new(
            Reason::RequestRefused,
            StatusCode::BAD_REQUEST,
            e.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::from_toml(
            r#"
[ceiling]
spend_cents = 100

[upstreams.openai]
url = "http://127.0.0.1:9"
kind = "openai"
credential = "openai"
paths = ["/v1"]

[upstreams.search]
url = "http://127.0.0.1:9"
kind = "http"
credential = "search"
paths = ["/v1/search"]

[prices.openai."m"]
input_per_mtok = 1
output_per_mtok = 2
max_output_tokens = 100

[prices.search.routes."POST /v1/search"]
per_call = "0.002"
"#,
        )
        .expect("a policy")
    }

    fn plan(
        upstream: &str,
        method: &str,
        rest: &str,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<Plan, Pre> {
        let policy = policy();
        let asked = Asked {
            name: upstream,
            upstream: &policy.upstreams[upstream],
            method,
            rest,
            query,
            bytes: body,
        };
        priced(&policy, &asked, Nanos(1_000_000_000))
    }

    #[test]
    fn a_model_call_is_priced_at_its_worst_case_and_its_limit_forwarded() {
        let body = br#"{"model":"m","messages":[],"max_tokens":50}"#;
        let p = plan("openai", "POST", "/v1/chat/completions", None, body).expect("planned");
        assert_eq!(p.endpoint, Endpoint::ChatCompletions);
        assert_eq!(p.operation, "m");
        assert_eq!(p.effect, Effect::Read);
        assert_eq!(p.body, br#"{"max_tokens":50,"messages":[],"model":"m"}"#);
        // The input bound is the forwarded body's bytes (with a 20-digit limit in
        // place) at $1/M, the output 50 tokens at $2/M.
        let input = (p.body.len() as u64 - 2 + 20) * 1_000;
        assert_eq!(p.worst, Nanos(input + 50 * 2_000));
        assert!(!p.strip_usage);
    }

    #[test]
    fn a_route_is_priced_per_call_and_its_body_forwarded_as_sent() {
        let p = plan("search", "POST", "/v1/search", Some("q=1"), b"any bytes").expect("planned");
        assert_eq!(
            (p.worst, p.route_price),
            (Nanos(2_000_000), Some(Nanos(2_000_000)))
        );
        assert_eq!(p.body, b"any bytes");
        assert_eq!(p.effect, Effect::NonIdempotentWrite);
        assert_eq!(p.operation, "POST /v1/search");
    }

    #[test]
    fn what_cannot_be_metered_read_or_priced_is_refused_before_the_gate() {
        let refused = |upstream, rest, query, body: &[u8]| {
            let pre = plan(upstream, "POST", rest, query, body)
                .err()
                .expect("refused");
            (pre.reason, pre.status)
        };
        let scope = (Reason::ScopeViolation, StatusCode::FORBIDDEN);
        let chat = "/v1/chat/completions";
        assert_eq!(refused("openai", "/v1/batches", None, b"{}"), scope);
        assert_eq!(refused("openai", chat, Some("x=1"), b"{}"), scope);
        assert_eq!(
            refused("openai", chat, None, br#"{"model":"other"}"#),
            scope
        );
        assert_eq!(refused("search", "/v1/search/deep", None, b""), scope);
        assert_eq!(
            refused("openai", chat, None, br#"{"model":"m","model":"m"}"#),
            (Reason::RequestRefused, StatusCode::BAD_REQUEST)
        );
        let unpriced = br#"{"model":"m","messages":[],"service_tier":"flex"}"#;
        let pre = plan("openai", "POST", chat, None, unpriced)
            .err()
            .expect("refused");
        assert_eq!(
            (pre.reason, pre.preview.as_deref()),
            (Reason::ScopeViolation, Some("m"))
        );
    }
}
