//! What a request is and what it may cost, before the gate is asked: its route's price
//! or its model's, the worst case reserved, the body forwarded (docs/PROXY.md).

use hyper::StatusCode;
use tally_policy::UpstreamKind;
use tally_record::money::Nanos;
use tally_record::{Effect, Reason};

use crate::forward::effect_of;
use crate::proxy::{Proxy, Route};
use crate::refuse::Pre;

/// What a request is, priced.
pub(crate) struct Plan {
    pub body: Vec<u8>,
    pub worst: Nanos,
    pub operation: String,
    pub effect: Effect,
    pub args: Option<tally_record::Args>,
    pub price: Option<tally_policy::ModelPrice>,
    pub route_price: Option<Nanos>,
    pub client_asked_usage: bool,
    pub strip_usage: bool,
}

impl Proxy {
    /// The request `bytes` to `route` priced, or the refusal made before the gate is asked.
    pub(crate) fn plan(
        &self,
        route: &Route,
        method: &str,
        rest: &str,
        bytes: &[u8],
        remaining: Nanos,
    ) -> Result<Plan, Pre> {
        let u = &route.upstream;
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
                body: bytes.to_vec(),
                worst: p.per_call,
                operation: key.clone(),
                effect,
                args,
                price: None,
                route_price: Some(p.per_call),
                client_asked_usage: false,
                strip_usage: false,
            });
        }
        let request = crate::request::parse(u.kind, bytes).map_err(|e| {
            Pre::new(
                Reason::RequestRefused,
                StatusCode::BAD_REQUEST,
                e.to_string(),
            )
        })?;
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
        let priced = request.price(u.kind, price, remaining);
        Ok(Plan {
            body: priced.body,
            worst: priced.worst,
            // Kept as the call's preview (bounded: a model name is at most 256 bytes).
            operation: request.model.clone(),
            // A completion changes nothing upstream: a read, whatever its method.
            effect: Effect::Read,
            args: Some(request.args.clone()),
            price: Some(price.clone()),
            route_price: None,
            client_asked_usage: request.client_asked_usage,
            strip_usage: u.kind == UpstreamKind::Openai
                && request.stream
                && !request.client_asked_usage,
        })
    }
}
