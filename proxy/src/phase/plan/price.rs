//! The plan's price: the request's endpoint, then its route's price (an `http`
//! upstream) or its model's, the worst case reserved and the body forwarded
//! (docs/PROXY.md, "What is reserved and what is settled").

use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_policy::{Policy, Upstream, UpstreamKind};
use tally_record::money::Nanos;
use tally_record::{Effect, Reason};

use super::Plan;
use crate::endpoint::{api_version_allowed, Routed};
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
    let Some(routed) = Routed::of(kind, rest) else {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!(
                "{method} {rest} is not an endpoint tally meters on upstream `{name}` (it meters {}); tally never forwards a call it cannot meter",
                Endpoint::metered(kind)
            ),
        ));
    };
    let endpoint = routed.endpoint;
    query_allowed(asked, endpoint)?;
    if kind == UpstreamKind::Http {
        route_priced(policy, asked, endpoint)
    } else {
        model_priced(policy, asked, &routed, remaining)
    }
}

/// Refuses a query the endpoint does not take: Azure OpenAI's must be one
/// `api-version` the upstream lists; Gemini's stream must say `alt=sse`.
fn query_allowed(asked: &Asked<'_>, endpoint: Endpoint) -> Result<(), Pre> {
    let (rest, name, query) = (asked.rest, asked.name, asked.query);
    let versions = &asked.upstream.api_versions;
    let (ok, why) = if asked.upstream.kind == UpstreamKind::AzureOpenai {
        (
            api_version_allowed(query, versions),
            format!(
                "Azure OpenAI calls take exactly `?api-version=V`, V one of the upstream's api_versions ({})",
                versions.join(", ")
            ),
        )
    } else if endpoint == Endpoint::StreamGenerateContent && query.is_none() {
        (
            false,
            "a Gemini stream is metered as server-sent events only: call it with `?alt=sse`".into(),
        )
    } else {
        (endpoint.query_allowed(query), String::new())
    };
    if ok {
        return Ok(());
    }
    let q = query
        .map(|q| format!("the query `?{q}`"))
        .unwrap_or_else(|| "no query".into());
    let mut message = format!("{q} is not forwarded to {rest} on upstream `{name}`");
    if !why.is_empty() {
        message = format!("{message}: {why}");
    }
    Err(Pre::new(
        Reason::ScopeViolation,
        StatusCode::FORBIDDEN,
        message,
    ))
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
        upstream_path: None,
        choices: 1,
    })
}

/// A call to a model, read strictly and priced at its model's price (Azure OpenAI:
/// its deployment's model's).
fn model_priced(
    policy: &Policy,
    asked: &Asked<'_>,
    routed: &Routed,
    remaining: Nanos,
) -> Result<Plan, Pre> {
    let endpoint = routed.endpoint;
    let request = crate::request::parse_named(endpoint, routed.named.as_deref(), asked.bytes)
        .map_err(refused)?;
    let model = priced_as(asked, &request)?;
    let price = policy.prices.priced(endpoint.kind(), asked.name, model);
    let Some(price) = price else {
        return Err(Pre::new(
            Reason::ScopeViolation,
            StatusCode::FORBIDDEN,
            format!(
                "model `{model}` on upstream `{}` has no price in the policy; tally never forwards a call it cannot price",
                asked.name
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
        // Kept as the call's preview (bounded: a model name is at most 256 bytes): the
        // model priced (Azure OpenAI: the deployment's, so metrics and traces name it).
        operation: model.to_owned(),
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
        upstream_path: endpoint
            .bedrock()
            .then(|| crate::bedrock::upstream_path(request.stream, &request.model)),
        choices: request.choices,
    })
}

/// The model a request is priced as: its own, or (Azure OpenAI) the one its deployment
/// maps to in the upstream's `deployments`; a deployment not listed is refused naming
/// it, and so is a body `model` that names neither the deployment nor its model.
fn priced_as<'a>(
    asked: &'a Asked<'_>,
    request: &'a crate::request::ModelRequest,
) -> Result<&'a str, Pre> {
    let u = asked.upstream;
    if u.kind != UpstreamKind::AzureOpenai {
        return Ok(&request.model);
    }
    let deployment = &request.model;
    let scope = |message: String| {
        Pre::new(Reason::ScopeViolation, StatusCode::FORBIDDEN, message).preview(deployment.clone())
    };
    let Some(model) = u.deployments.get(deployment) else {
        return Err(scope(format!(
            "deployment `{deployment}` is not in upstreams.{}.deployments: tally prices only the deployments the policy maps to a model",
            asked.name
        )));
    };
    match &request.body_model {
        Some(b) if b != deployment && b != model => Err(scope(format!(
            "the body's model `{b}` is neither deployment `{deployment}` nor its model `{model}`: name one model per call"
        ))),
        _ => Ok(model),
    }
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
