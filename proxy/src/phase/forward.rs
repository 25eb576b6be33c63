//! The forward phase: the planned request sent to the upstream with the real credential
//! (the agent's key never is; a `bedrock` upstream's call is signed with the operator's
//! AWS credential instead, [`crate::bedrock::sign`]), within the call's time; a redirect is never followed,
//! and refused unless it stays on the upstream ([`crate::redirect`]) and the upstream's
//! URL is not secret (given by `url_file`), whose `Location` may echo it. What went wrong
//! is told to the settle phase with the refusal the agent gets.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tally_policy::UpstreamKind;
use tally_record::Status;

use super::settle::{Ended, Settling};
use super::Call;
use crate::dialect::Refusal;
use crate::proxy::Route;

/// The upstream's answer to `body` with the plan's `headers`, at the plan's `path` (the
/// agent's path where the plan has none); else the refusal, its outcome told to
/// `settling`.
pub(super) async fn forward(
    call: &Call<'_>,
    (path, body): (Option<&str>, Vec<u8>),
    headers: HeaderMap,
    settling: &mut Settling,
) -> Result<Response<Incoming>, Refusal> {
    let route = call.route;
    // The upstream's traceparent: the proxy's span, or (without a tracer) the agent's
    // valid one as it came; an invalid one never.
    let onward = settling.outgoing().or_else(|| call.parent.clone());
    let (out, uri) = match upstream_request(call, (path, body), headers, onward.as_ref()) {
        Ok(built) => built,
        // Nothing was sent.
        Err(refusal) => return refused(settling, Status::Rejected, None, refusal),
    };
    let sent = tokio::time::timeout_at(settling.deadline.into(), route.client.request(out)).await;
    let response = match sent {
        Err(_) => {
            let refusal = Refusal::own(
                StatusCode::GATEWAY_TIMEOUT,
                tally_wire::ErrorCode::UpstreamTimeout,
                "the upstream did not answer within the call's time (the run's deadline or the upstream's timeout_ms)",
            );
            return refused(settling, Status::Timeout, None, refusal);
        }
        Ok(Err(e)) => {
            // Never connected: nothing happened upstream. Else it may have.
            let status = if e.is_connect() {
                Status::Rejected
            } else {
                Status::Unknown
            };
            let refusal = Refusal::own(
                StatusCode::BAD_GATEWAY,
                tally_wire::ErrorCode::UpstreamUnreachable,
                format!("the upstream could not be reached: {e}"),
            );
            return refused(settling, status, None, refusal);
        }
        Ok(Ok(r)) => r,
    };
    if response.status().is_redirection() {
        let refused_here = if route.withheld {
            Some(crate::redirect::withheld())
        } else {
            crate::redirect::refused(&uri, response.headers())
        };
        if let Some(refusal) = refused_here {
            let observed = Some("redirect_refused:scope_violation".into());
            return refused(settling, Status::Rejected, observed, refusal);
        }
    }
    Ok(response)
}

/// The upstream request: the base path, the agent's path (or the plan's) and query, the
/// plan's `headers`, the trace context and the real credential (a `bedrock` upstream's
/// call signed, [`signed`]); and its URI. Else the refusal: nothing is sent.
fn upstream_request(
    call: &Call<'_>,
    (path, body): (Option<&str>, Vec<u8>),
    headers: HeaderMap,
    onward: Option<&crate::trace::Trace>,
) -> Result<(Request<Full<Bytes>>, String), Refusal> {
    let route = call.route;
    let query = call
        .head
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let uri = format!(
        "{}://{}{}{}{query}",
        route.scheme,
        route.authority,
        route.base,
        path.unwrap_or(&call.rest)
    );
    let body = Bytes::from(body);
    let mut out = Request::builder()
        .method(call.head.method.clone())
        .uri(&uri)
        .body(Full::new(body.clone()))
        .map_err(|_| {
            Refusal::own(
                StatusCode::BAD_REQUEST,
                tally_wire::ErrorCode::InvalidRequest,
                "the request cannot be forwarded",
            )
        })?;
    *out.headers_mut() = outgoing(headers, route, onward);
    if let Some(signer) = &route.aws {
        signed(out.headers_mut(), signer, route, &uri, &body)?;
    }
    Ok((out, uri))
}

/// `headers` with the SigV4 signature of a `POST` of `body` to `uri` by `signer` (over
/// every header sent, the `host` set to the upstream's authority), or the refusal if
/// it cannot be signed (nothing is sent).
fn signed(
    headers: &mut HeaderMap,
    signer: &crate::bedrock::sign::AwsSigner,
    route: &Route,
    uri: &str,
    body: &[u8],
) -> Result<(), Refusal> {
    let host = HeaderValue::from_str(&route.authority).map_err(|_| unsignable())?;
    headers.insert(hyper::header::HOST, host);
    let signature = signer
        .sign(uri, headers, body, std::time::SystemTime::now())
        .map_err(|_| unsignable())?;
    for (name, value) in signature {
        headers.insert(name, value);
    }
    Ok(())
}

/// The refusal of a call the proxy cannot sign.
fn unsignable() -> Refusal {
    Refusal::own(
        StatusCode::BAD_REQUEST,
        tally_wire::ErrorCode::InvalidRequest,
        "the request cannot be signed for the upstream",
    )
}

/// `refusal`, its outcome (`status`, with no answer) told to `settling`.
fn refused(
    settling: &mut Settling,
    status: Status,
    observed: Option<String>,
    refusal: Refusal,
) -> Result<Response<Incoming>, Refusal> {
    let effect = settling.facts().effect;
    settling.ended(Ended::without_answer(status, effect, observed));
    Err(refusal)
}

/// The headers sent upstream: the plan's (`allowed`), the trace context replaced by
/// `trace`, no compression, and the real credential (docs/PROXY.md).
fn outgoing(allowed: HeaderMap, route: &Route, trace: Option<&crate::trace::Trace>) -> HeaderMap {
    let mut out = allowed;
    if let Some((parent, state)) = trace {
        if let Ok(v) = HeaderValue::from_str(&parent.header()) {
            out.insert(HeaderName::from_static("traceparent"), v);
        }
        if let Some(v) = state
            .as_deref()
            .and_then(tally_record::trace::tracestate)
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            out.insert(HeaderName::from_static("tracestate"), v);
        }
    }
    // Usage is read from the answer's bytes: no compression.
    out.insert(
        hyper::header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let secret = route.secret.as_str();
    let (name, value) = match route.upstream.kind {
        // Signed once the request is whole ([`signed`]): no key header.
        UpstreamKind::Bedrock => return out,
        UpstreamKind::Anthropic => ("x-api-key", secret.to_owned()),
        UpstreamKind::Gemini => ("x-goog-api-key", secret.to_owned()),
        UpstreamKind::AzureOpenai => ("api-key", secret.to_owned()),
        UpstreamKind::Openai | UpstreamKind::Http => ("authorization", format!("Bearer {secret}")),
    };
    if let Ok(mut v) = HeaderValue::from_str(&value) {
        v.set_sensitive(true);
        out.insert(HeaderName::from_static(name), v);
    }
    out
}
