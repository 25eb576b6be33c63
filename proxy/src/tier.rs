//! Billing tiers (`service_tier`): which tiers a request can land on, the rates its
//! worst case is reserved at, and the rates its answer settles at.
//!
//! * OpenAI: a request names `auto`, `default`, `flex` or `priority` (or none, which is
//!   `auto`: the project's default tier); the answer's `service_tier` is the tier that
//!   served it (`default`, `flex`, `priority`, ...).
//! * Anthropic: a request names `auto` (or none) or `standard_only`; the answer's
//!   `usage.service_tier` is the tier that served it (`standard`, `priority`).
//!
//! The default tier is billed at the model's own rates; any other at the rates of its
//! `[prices.U."M".tiers.NAME]`. A request that can land on several tiers is reserved at
//! the dearest of each rate among them; an answer naming a tier with no price, or not
//! saying which of several it landed on, is not priced (`usage_refused: unpriced`,
//! settled at the reservation).

use serde_json::Value;
use tally_policy::{ModelPrice, UpstreamKind};

use crate::endpoint::{Endpoint, RequestError};
use crate::pruned::Prune;

/// The tiers a request can land on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lands {
    /// The default tier only.
    Default,
    /// This tier only.
    Tier(String),
    /// Any: the default or any tier the price lists (`auto`, or no `service_tier`).
    Any,
}

/// The default tier's name in answers from `kind`.
fn default_name(kind: UpstreamKind) -> &'static str {
    match kind {
        UpstreamKind::Anthropic => "standard",
        UpstreamKind::Openai
        | UpstreamKind::AzureOpenai
        | UpstreamKind::Gemini
        | UpstreamKind::Bedrock
        | UpstreamKind::Http => "default",
    }
}

/// The tiers a request to `endpoint` naming `requested` can land on.
pub fn lands(endpoint: Endpoint, requested: Option<&str>) -> Lands {
    match (endpoint.kind(), requested) {
        (_, None | Some("auto")) => Lands::Any,
        (UpstreamKind::Openai, Some("default")) => Lands::Default,
        (UpstreamKind::Anthropic, Some("standard_only")) => Lands::Default,
        (_, Some(t)) => Lands::Tier(t.to_owned()),
    }
}

/// The rates a request landing on `lands` is reserved at: the tier's, or (several
/// possible) the dearest of each; refused, naming `service_tier`, for a tier `price`
/// does not list.
pub fn reserved(price: &ModelPrice, lands: &Lands) -> Result<ModelPrice, RequestError> {
    match lands {
        Lands::Default => Ok(price.clone()),
        Lands::Tier(t) => price.at_tier(t).ok_or_else(|| RequestError::Unpriced {
            field: "service_tier".into(),
            why: format!("`{t}` is a billing tier this model's price has no rates for (tiers.{t})"),
        }),
        Lands::Any => Ok(price
            .tiers
            .keys()
            .filter_map(|t| price.at_tier(t))
            .fold(price.clone(), |most, t| dearest(&most, &t))),
    }
}

/// Each rate of `a` and `b`, the dearer; a cache write priced in only one, unpriced.
fn dearest(a: &ModelPrice, b: &ModelPrice) -> ModelPrice {
    let both = |x: Option<tally_record::money::Nanos>, y| match (x, y) {
        (Some(x), Some(y)) => Some(std::cmp::max(x, y)),
        _ => None,
    };
    ModelPrice {
        input_per_mtok: a.input_per_mtok.max(b.input_per_mtok),
        cached_input_per_mtok: a.cached_input_per_mtok.max(b.cached_input_per_mtok),
        cache_write_per_mtok: both(a.cache_write_per_mtok, b.cache_write_per_mtok),
        cache_write_1h_per_mtok: both(a.cache_write_1h_per_mtok, b.cache_write_1h_per_mtok),
        output_per_mtok: a.output_per_mtok.max(b.output_per_mtok),
        ..a.clone()
    }
}

/// The rates an answer from `kind` that says it was served at `said` settles at, for a
/// request that could land on `lands`: `None` (not priced) for a tier `price` has no
/// rates for, or an answer that does not say which of several tiers served it.
pub fn settled(
    price: &ModelPrice,
    kind: UpstreamKind,
    lands: &Lands,
    said: Option<&str>,
) -> Option<ModelPrice> {
    match (said, lands) {
        (Some(t), _) if t == default_name(kind) => Some(price.clone()),
        (Some(t), _) => price.at_tier(t),
        (None, Lands::Default) => Some(price.clone()),
        (None, Lands::Tier(t)) => price.at_tier(t),
        (None, Lands::Any) => price.tiers.is_empty().then(|| price.clone()),
    }
}

/// The member [`said`] reads where OpenAI says the tier (at the top of an answer or a
/// chunk, or of a Responses event's `response`): kept whole by the usage readers'
/// pruned reading. (Anthropic's is inside the usage, which they keep whole.)
pub(crate) const OPENAI: (&str, Prune) = ("service_tier", Prune::Whole);

/// The tier an answer (a whole body, or one event of a stream) says served it, if it
/// says (`auto` says none): OpenAI's `service_tier` (a Responses event's `response.service_tier`),
/// Anthropic's `usage.service_tier` (a stream's `message_start` or `message_delta`). A
/// value that is not a string is kept as its JSON text, which names no tier.
pub fn said(endpoint: Endpoint, v: &Value) -> Option<String> {
    let at = match endpoint {
        Endpoint::ChatCompletions => v.get("service_tier"),
        Endpoint::Responses => v.get("response").unwrap_or(v).get("service_tier"),
        Endpoint::Messages => v
            .pointer("/usage/service_tier")
            .or_else(|| v.pointer("/message/usage/service_tier")),
        _ => None,
    };
    match at {
        // `auto` is a request's choice, not a tier that served it (a Responses stream's
        // first events echo it): unsaid.
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if t == "auto" => None,
        Some(Value::String(t)) => Some(t.clone()),
        Some(other) => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tally_policy::TierPrice;
    use tally_record::money::Nanos;

    /// $1 in, $2 out; flex at half, priority at double (its cache write unpriced).
    fn price() -> ModelPrice {
        let tier = |i: u64, o: u64, w: Option<u64>| TierPrice {
            input_per_mtok: Nanos(i),
            cached_input_per_mtok: Nanos(i / 10),
            cache_write_per_mtok: w.map(Nanos),
            cache_write_1h_per_mtok: None,
            output_per_mtok: Nanos(o),
        };
        ModelPrice {
            cache_write_per_mtok: Some(Nanos(1_250_000_000)),
            tiers: BTreeMap::from([
                ("flex".into(), tier(500_000_000, 1_000_000_000, Some(1))),
                ("priority".into(), tier(2_000_000_000, 4_000_000_000, None)),
            ]),
            ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
        }
    }

    #[test]
    fn a_request_is_reserved_at_the_dearest_tier_it_can_land_on() {
        let c = Endpoint::ChatCompletions;
        let p = price();
        assert_eq!(lands(c, None), Lands::Any);
        assert_eq!(lands(c, Some("auto")), Lands::Any);
        assert_eq!(lands(c, Some("default")), Lands::Default);
        assert_eq!(
            lands(Endpoint::Messages, Some("standard_only")),
            Lands::Default
        );
        assert_eq!(lands(c, Some("flex")), Lands::Tier("flex".into()));
        let any = reserved(&p, &Lands::Any).expect("priced");
        assert_eq!(
            (
                any.input_per_mtok,
                any.output_per_mtok,
                any.cache_write_per_mtok
            ),
            (Nanos(2_000_000_000), Nanos(4_000_000_000), None),
            "priority's rates; a cache write one tier cannot price, unpriced"
        );
        let flex = reserved(&p, &Lands::Tier("flex".into())).expect("priced");
        assert_eq!(flex.output_per_mtok, Nanos(1_000_000_000));
        assert_eq!(reserved(&p, &Lands::Default).expect("priced"), p);
        match reserved(&p, &Lands::Tier("scale".into())) {
            Err(RequestError::Unpriced { field, .. }) => assert_eq!(field, "service_tier"),
            other => panic!("{other:?}"),
        }
        // No tiers listed: `auto` is the default tier's rates.
        let plain = ModelPrice::new(Nanos(1), Nanos(2));
        assert_eq!(reserved(&plain, &Lands::Any).expect("priced"), plain);
    }

    #[test]
    fn an_answer_settles_at_the_tier_it_says_served_it() {
        let p = price();
        let o = UpstreamKind::Openai;
        let rate = |m: Option<ModelPrice>| m.map(|m| m.output_per_mtok);
        assert_eq!(
            rate(settled(&p, o, &Lands::Any, Some("priority"))),
            Some(Nanos(4_000_000_000))
        );
        assert_eq!(
            rate(settled(&p, o, &Lands::Any, Some("default"))),
            Some(Nanos(2_000_000_000))
        );
        assert_eq!(
            rate(settled(&p, o, &Lands::Default, Some("flex"))),
            Some(Nanos(1_000_000_000))
        );
        assert_eq!(
            settled(&p, o, &Lands::Any, Some("scale")),
            None,
            "no rates: unpriced"
        );
        assert_eq!(
            settled(&p, o, &Lands::Any, None),
            None,
            "which of three: unsaid"
        );
        assert_eq!(
            rate(settled(&p, o, &Lands::Tier("flex".into()), None)),
            Some(Nanos(1_000_000_000))
        );
        let a = UpstreamKind::Anthropic;
        assert_eq!(
            rate(settled(&p, a, &Lands::Any, Some("standard"))),
            Some(Nanos(2_000_000_000))
        );
        assert_eq!(settled(&p, a, &Lands::Any, Some("default")), None);
        let plain = ModelPrice::new(Nanos(1), Nanos(2));
        assert_eq!(settled(&plain, o, &Lands::Any, None), Some(plain));
        // Where each API says it, read as the proxy reads an answer and a stream's event
        // (only the members the readers keep: one not kept reads as unsaid).
        let said_in = |e, v: Value| {
            let text = v.to_string();
            let plain = crate::usage::answer(e, text.as_bytes()).1;
            let mut s = crate::usage::StreamUsage::new(e);
            s.event(&text);
            assert_eq!(s.tier(), plain.as_deref(), "{text}");
            plain
        };
        assert_eq!(
            said_in(
                Endpoint::ChatCompletions,
                serde_json::json!({"service_tier": "flex"})
            )
            .as_deref(),
            Some("flex")
        );
        assert_eq!(said_in(Endpoint::Responses, serde_json::json!({"type": "response.completed", "response": {"service_tier": "priority"}})).as_deref(), Some("priority"));
        assert_eq!(
            said_in(
                Endpoint::Responses,
                serde_json::json!({"service_tier": "default"})
            )
            .as_deref(),
            Some("default")
        );
        assert_eq!(
            said_in(
                Endpoint::Messages,
                serde_json::json!({"usage": {"service_tier": "priority"}})
            )
            .as_deref(),
            Some("priority")
        );
        assert_eq!(said_in(Endpoint::Messages, serde_json::json!({"type": "message_start", "message": {"usage": {"service_tier": "standard"}}})).as_deref(), Some("standard"));
        assert_eq!(
            said_in(
                Endpoint::ChatCompletions,
                serde_json::json!({"service_tier": 5})
            )
            .as_deref(),
            Some("5")
        );
        assert_eq!(
            said_in(
                Endpoint::ChatCompletions,
                serde_json::json!({"service_tier": null})
            ),
            None
        );
        assert_eq!(
            said_in(
                Endpoint::Responses,
                serde_json::json!({"type": "response.created", "response": {"service_tier": "auto"}})
            ),
            None
        );
    }
}
