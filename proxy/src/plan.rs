//! What a request is and what it may cost, before the gate is asked: its route's price
//! or its model's, the worst case reserved, the body forwarded (docs/PROXY.md).

use hyper::StatusCode;
use tally_policy::UpstreamKind;
use tally_record::money::Nanos;
use tally_record::{Effect, Reason};

use crate::forward::effect_of;
use crate::proxy::{Proxy, Route};
use crate::refuse::Pre;
use crate::request::{Endpoint, RequestError};

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
    pub client_asked_usage: bool,
    pub strip_usage: bool,
    /// The billing tiers the call can land on.
    pub lands: crate::tier::Lands,
}

impl Proxy {
    /// The request `bytes` to `route` priced, or the refusal made before the gate is asked.
    pub(crate) fn plan(
        &self,
        route: &Route,
        method: &str,
        rest: &str,
        query: Option<&str>,
        bytes: &[u8],
        remaining: Nanos,
    ) -> Result<Plan, Pre> {
        let u = &route.upstream;
        let Some(endpoint) = Endpoint::of(u.kind, rest) else {
            return Err(Pre::new(
                Reason::ScopeViolation,
                StatusCode::FORBIDDEN,
                format!(
                    "{method} {rest} is not an endpoint tally meters on upstream `{}` (it meters {}); tally never forwards a call it cannot meter",
                    route.name,
                    Endpoint::metered(u.kind)
                ),
            ));
        };
        if !endpoint.query_allowed(query) {
            return Err(Pre::new(
                Reason::ScopeViolation,
                StatusCode::FORBIDDEN,
                format!(
                    "the query `?{}` is not forwarded to {rest} on upstream `{}`",
                    query.unwrap_or_default(),
                    route.name
                ),
            ));
        }
        if u.kind == UpstreamKind::Http {
            let key = format!("{method} {rest}");
            let Some(p) = self.policy.prices.route(&route.name, &key) else {
                return Err(Pre::new(
                    Reason::ScopeViolation,
                    StatusCode::FORBIDDEN,
                    format!("`{key}` on upstream `{}` has no price in the policy; tally never forwards a call it cannot price", route.name),
                ));
            };
            let effect = effect_of(method);
            // The request as the loop rules see it: its route and the digest of its body.
            let args = tally_record::Args::from_value(&serde_json::json!({
                "route": key,
                "body_blake3": blake3::hash(bytes).to_hex().to_string(),
            }))
            .ok();
            return Ok(Plan {
                endpoint,
                body: bytes.to_vec(),
                worst: p.per_call,
                operation: key.clone(),
                effect,
                args,
                price: None,
                route_price: Some(p.per_call),
                client_asked_usage: false,
                strip_usage: false,
                lands: crate::tier::Lands::Default,
            });
        }
        let request = crate::request::parse(endpoint, bytes).map_err(refused)?;
        let Some(price) = self.policy.prices.model(&route.name, &request.model) else {
            return Err(Pre::new(
                Reason::ScopeViolation,
                StatusCode::FORBIDDEN,
                format!(
                    "model `{}` on upstream `{}` has no price in the policy; tally never forwards a call it cannot price",
                    request.model, route.name
                ),
            )
            .preview(request.model.clone()));
        };
        let priced = request
            .price(price, remaining, u.clamp_max_tokens)
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
            client_asked_usage: request.client_asked_usage,
            strip_usage: endpoint == Endpoint::ChatCompletions
                && request.stream
                && !request.client_asked_usage,
            lands: crate::tier::lands(endpoint, request.service_tier.as_deref()),
        })
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
