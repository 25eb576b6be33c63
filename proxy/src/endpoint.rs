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
    /// Gemini `/v1beta/models/MODEL:generateContent`.
    GenerateContent,
    /// Gemini `/v1beta/models/MODEL:streamGenerateContent?alt=sse`.
    StreamGenerateContent,
    /// Bedrock `/model/MODEL/converse`.
    Converse,
    /// Bedrock `/model/MODEL/converse-stream` (an AWS event stream).
    ConverseStream,
    /// A route of an `http` upstream: priced per call or by a cost header, no usage.
    Route,
}

impl Endpoint {
    /// The endpoint `path` names on an upstream of `kind`: one exact spelling each, with
    /// or without the `/v1` (for an upstream whose base URL holds it); `None` for a path
    /// the proxy does not meter. An `http` upstream's every path is a [`Endpoint::Route`].
    pub fn of(kind: UpstreamKind, path: &str) -> Option<Endpoint> {
        Routed::of(kind, path).map(|r| r.endpoint)
    }

    /// The paths a model upstream of `kind` meters, as a refusal names them.
    pub fn metered(kind: UpstreamKind) -> &'static str {
        match kind {
            UpstreamKind::Openai => "/v1/chat/completions, /v1/responses",
            UpstreamKind::Anthropic => "/v1/messages, /v1/messages/count_tokens",
            UpstreamKind::Http => "the routes its prices name",
            UpstreamKind::Gemini => {
                "/v1beta/models/MODEL:generateContent, /v1beta/models/MODEL:streamGenerateContent?alt=sse"
            }
            UpstreamKind::AzureOpenai => {
                "/openai/deployments/DEPLOYMENT/chat/completions, /openai/responses (each ?api-version=V)"
            }
            UpstreamKind::Bedrock => "/model/MODEL/converse, /model/MODEL/converse-stream",
        }
    }

    /// Whether a query string may be forwarded: none, except `beta=true` on Anthropic's
    /// endpoints (the Anthropic SDK's beta client, Claude Code's, sends it), and exactly
    /// `alt=sse` on Gemini's stream, which needs it (without it the stream is a JSON
    /// array the proxy does not meter). An `http` route's query is its own. (Azure's
    /// `api-version`: [`api_version_allowed`].)
    pub fn query_allowed(self, query: Option<&str>) -> bool {
        matches!(
            (self, query),
            (Endpoint::StreamGenerateContent, Some("alt=sse"))
                | (Endpoint::Route, _)
                | (
                    Endpoint::ChatCompletions
                        | Endpoint::Responses
                        | Endpoint::Messages
                        | Endpoint::CountTokens
                        | Endpoint::GenerateContent
                        | Endpoint::Converse
                        | Endpoint::ConverseStream,
                    None
                )
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
            Endpoint::GenerateContent | Endpoint::StreamGenerateContent => UpstreamKind::Gemini,
            Endpoint::Converse | Endpoint::ConverseStream => UpstreamKind::Bedrock,
            Endpoint::Route => UpstreamKind::Http,
        }
    }

    /// The member a request's output limit is in, where the endpoint has one fixed.
    pub(crate) fn limit_field(self) -> &'static str {
        match self {
            Endpoint::Responses => "max_output_tokens",
            // Gemini's `generationConfig.maxOutputTokens`, set inside its member.
            Endpoint::GenerateContent | Endpoint::StreamGenerateContent => "generationConfig",
            // Bedrock's `inferenceConfig.maxTokens`, likewise.
            Endpoint::Converse | Endpoint::ConverseStream => "inferenceConfig",
            _ => "max_tokens",
        }
    }

    /// Whether it is one of Bedrock's.
    pub fn bedrock(self) -> bool {
        matches!(self, Endpoint::Converse | Endpoint::ConverseStream)
    }

    /// Whether it is one of Gemini's.
    pub fn gemini(self) -> bool {
        matches!(
            self,
            Endpoint::GenerateContent | Endpoint::StreamGenerateContent
        )
    }
}

/// An endpoint and the model (Gemini) or deployment (Azure OpenAI) its path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The model or deployment in the path, in its one spelling.
    pub named: Option<String>,
}

impl Routed {
    /// The endpoint `path` names on an upstream of `kind`, and the name in it: one exact
    /// spelling each; `None` for a path the proxy does not meter.
    pub fn of(kind: UpstreamKind, path: &str) -> Option<Routed> {
        let plain = |endpoint| {
            Some(Routed {
                endpoint,
                named: None,
            })
        };
        // Azure OpenAI's and Bedrock's paths have no `/v1` in front: matched as they are.
        match kind {
            UpstreamKind::AzureOpenai => return azure(path),
            UpstreamKind::Bedrock => return bedrock(path),
            _ => {}
        }
        let v1 = path.strip_prefix("/v1").unwrap_or(path);
        match (kind, v1) {
            (UpstreamKind::Http, _) => plain(Endpoint::Route),
            (UpstreamKind::Openai, "/chat/completions") => plain(Endpoint::ChatCompletions),
            (UpstreamKind::Openai, "/responses") => plain(Endpoint::Responses),
            (UpstreamKind::Anthropic, "/messages") => plain(Endpoint::Messages),
            (UpstreamKind::Anthropic, "/messages/count_tokens") => plain(Endpoint::CountTokens),
            (UpstreamKind::Gemini, _) => gemini(path),
            _ => None,
        }
    }
}

/// Azure OpenAI's `/openai/responses` and `/openai/deployments/D/chat/completions`, the
/// path exactly as sent.
fn azure(path: &str) -> Option<Routed> {
    if path == "/openai/responses" {
        return Some(Routed {
            endpoint: Endpoint::Responses,
            named: None,
        });
    }
    let d = path
        .strip_prefix("/openai/deployments/")?
        .strip_suffix("/chat/completions")?;
    tally_policy::upstreams::deployment_name(d).then(|| Routed {
        endpoint: Endpoint::ChatCompletions,
        named: Some(d.to_owned()),
    })
}

/// Bedrock's `/model/MODEL/converse` and `/model/MODEL/converse-stream`, the id read
/// strictly ([`crate::bedrock::model_path`]).
fn bedrock(path: &str) -> Option<Routed> {
    let (id, stream) = crate::bedrock::model_path(path)?;
    Some(Routed {
        endpoint: if stream {
            Endpoint::ConverseStream
        } else {
            Endpoint::Converse
        },
        named: Some(id),
    })
}

/// Gemini's `/v1beta/models/MODEL:METHOD` (or `/v1/...`): one method of the two metered,
/// after exactly one `:`, and a model id in one spelling ([`gemini_model`]).
fn gemini(path: &str) -> Option<Routed> {
    let rest = path
        .strip_prefix("/v1beta/models/")
        .or_else(|| path.strip_prefix("/v1/models/"))?;
    let (model, method) = rest.split_once(':')?;
    let endpoint = match method {
        "generateContent" => Endpoint::GenerateContent,
        "streamGenerateContent" => Endpoint::StreamGenerateContent,
        _ => return None,
    };
    gemini_model(model).then(|| Routed {
        endpoint,
        named: Some(model.to_owned()),
    })
}

/// A Gemini model id as the proxy takes it from a path: 1 to 128 bytes of lowercase
/// ASCII letters, digits, `-`, `_` and `.`, starting with a letter or digit, ending
/// with neither `-` nor `.`, no `..`: so no `/`, `:`, `%`, `@`, space or upper case, and
/// one spelling per model (the price is looked up by exactly this id).
pub fn gemini_model(m: &str) -> bool {
    let ok_byte =
        |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.');
    !m.is_empty()
        && m.len() <= 128
        && m.bytes().all(ok_byte)
        && m.as_bytes()[0].is_ascii_alphanumeric()
        && !m.ends_with(['-', '.'])
        && !m.contains("..")
}

/// Azure OpenAI: whether `query` is exactly `api-version=V` with V one of `versions`
/// (the upstream's `api_versions`): the only query forwarded there.
pub fn api_version_allowed(query: Option<&str>, versions: &[String]) -> bool {
    query
        .and_then(|q| q.strip_prefix("api-version="))
        .is_some_and(|v| versions.iter().any(|x| x == v))
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
