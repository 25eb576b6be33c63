//! The API a request is made to ([`Endpoint`], decided from its exact path) and why a
//! request to it cannot be forwarded ([`RequestError`]): what the request reader, the
//! price, the media and tier readers and the usage reader all speak of, depending on
//! none of them.

use tally_policy::UpstreamKind;

/// The API a request is made to, decided from its exact path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    ChatCompletions,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// Anthropic `/v1/messages/count_tokens`: free.
    CountTokens,
    /// A route of an `http` upstream: priced per call or by a cost header, no usage.
    Route,
}

impl Endpoint {
    /// The endpoint `path` names on an upstream of `kind`: one exact spelling each, with
    /// or without the `/v1` (for an upstream whose base URL holds it); `None` for a path
    /// the proxy does not meter. An `http` upstream's every path is a [`Endpoint::Route`].
    pub fn of(kind: UpstreamKind, path: &str) -> Option<Endpoint> {
        let path = path.strip_prefix("/v1").unwrap_or(path);
        match (kind, path) {
            (UpstreamKind::Http, _) => Some(Endpoint::Route),
            (UpstreamKind::Openai, "/chat/completions") => Some(Endpoint::ChatCompletions),
            (UpstreamKind::Openai, "/responses") => Some(Endpoint::Responses),
            (UpstreamKind::Anthropic, "/messages") => Some(Endpoint::Messages),
            (UpstreamKind::Anthropic, "/messages/count_tokens") => Some(Endpoint::CountTokens),
            _ => None,
        }
    }

    /// The paths a model upstream of `kind` meters, as a refusal names them.
    pub fn metered(kind: UpstreamKind) -> &'static str {
        match kind {
            UpstreamKind::Openai => "/v1/chat/completions, /v1/responses",
            UpstreamKind::Anthropic => "/v1/messages, /v1/messages/count_tokens",
            UpstreamKind::Http => "the routes its prices name",
        }
    }

    /// Whether a query string may be forwarded: none, except `beta=true` on Anthropic's
    /// endpoints (the Anthropic SDK's beta client, Claude Code's, sends it). An `http`
    /// route's query is its own.
    pub fn query_allowed(self, query: Option<&str>) -> bool {
        matches!(
            (self, query),
            (_, None)
                | (Endpoint::Route, _)
                | (
                    Endpoint::Messages | Endpoint::CountTokens,
                    Some("beta=true")
                )
        )
    }

    /// The API kind it belongs to.
    pub fn kind(self) -> UpstreamKind {
        match self {
            Endpoint::ChatCompletions | Endpoint::Responses => UpstreamKind::Openai,
            Endpoint::Messages | Endpoint::CountTokens => UpstreamKind::Anthropic,
            Endpoint::Route => UpstreamKind::Http,
        }
    }

    /// The member a request's output limit is in, where the endpoint has one fixed.
    pub(crate) fn limit_field(self) -> &'static str {
        match self {
            Endpoint::Responses => "max_output_tokens",
            _ => "max_tokens",
        }
    }
}

/// Why a request body cannot be forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Not strict JSON (a duplicate key, bad syntax, trailing bytes, too deep).
    #[error("the request body is not JSON tally can read exactly: {0}")]
    Json(String),
    /// Not a JSON object.
    #[error("the request body must be one JSON object")]
    NotObject,
    /// A field with the wrong type or an impossible value.
    #[error("`{field}` {why}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// A field that can make the call cost what the policy gives no price for (a server
    /// tool, a billing tier, state kept upstream): never forwarded unpriced.
    #[error("`{field}` {why}; tally never forwards a call it cannot price")]
    Unpriced {
        /// The field, as a path into the body (`tools[2].type`).
        field: String,
        /// What it would cost, and what the policy would need.
        why: String,
    },
}

impl RequestError {
    pub(crate) fn unpriced(field: impl Into<String>, why: impl Into<String>) -> RequestError {
        RequestError::Unpriced {
            field: field.into(),
            why: why.into(),
        }
    }
}
