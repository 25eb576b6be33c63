//! One request through the proxy: who is calling, what it may cost, the gate's check,
//! the upstream, and the answer (docs/PROXY.md).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tally_gate::{Caller, CheckAnswer, CheckRequest, GateError};
use tally_policy::{UpstreamKind, Verdict};
use tally_record::decision::Channel;
use tally_record::money::Nanos;
use tally_record::{Dimension, Effect, Reason, Status};

use crate::dialect::Refusal;
use crate::proxy::{Proxy, Route};
use crate::refuse::{preview, unavailable, Caught, Pre, Refused};
use crate::stream::{Pump, Settle};
use crate::Body;

/// The agent's headers that reach the upstream, by kind: what the dialect needs to be
/// read right, nothing that can choose an account, a beta or a billing option (docs/
/// PROXY.md, "Headers"). Every other header is dropped, hop-by-hop, credentials, `expect`,
/// `openai-organization`, `openai-project` and `openai-beta` among them.
fn passed(kind: UpstreamKind, name: &str) -> bool {
    matches!(name, "content-type" | "accept")
        || (kind == UpstreamKind::Anthropic && name == "anthropic-version")
}

impl Proxy {
    /// Answers one request. The token is read first, whatever the path: a bad token is
    /// a 401 and nothing is recorded (there is no run to record it in). Past the token,
    /// every refusal is a decision in the run's ledger before it is answered.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let name = parts.next().unwrap_or_default().to_owned();
        let rest = format!("/{}", parts.next().unwrap_or_default());
        let route = self.routes.get(&name);
        let kind = route.map_or(UpstreamKind::Openai, |r| r.upstream.kind);
        let caught = match self.caught(req.headers()).await {
            Ok(c) => c,
            Err(refusal) => return refusal.response(kind),
        };
        let Some(route) = route else {
            let method = req.method().as_str().to_owned();
            let refused = Refused {
                // A tool name is an identifier: a name no upstream could have is kept
                // in the preview only.
                tool: if tally_policy::upstreams::valid_name(&name) {
                    name.clone()
                } else {
                    "proxy".to_owned()
                },
                target: None,
                channel: Channel::Http,
                effect: effect_of(&method),
            };
            let pre = Pre::new(
                Reason::ScopeViolation,
                StatusCode::NOT_FOUND,
                format!("no upstream `{name}` in the policy: call /NAME/PATH for an upstream of [upstreams.NAME]"),
            )
            .preview(format!("{method} {path}"));
            return self.refuse(&caught, refused, pre).await.response(kind);
        };
        match self.forward(route, &rest, caught, req).await {
            Ok(r) => r,
            Err(refusal) => refusal.response(kind),
        }
    }

    /// The run the request's token names, if it may spend.
    async fn caught(&self, headers: &HeaderMap) -> Result<Caught, Refusal> {
        // A field's value without the whitespace around it (RFC 9110 5.5: it is HTTP's,
        // not the value's); the token itself must then be spelt exactly as minted.
        let value = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim_matches([' ', '\t']))
        };
        let bearer = value("authorization").and_then(crate::token::bearer);
        let token = match (bearer, value("x-api-key")) {
            (Some(a), Some(b)) if a != b => {
                return Err(Refusal::token(
                    "two different keys (Authorization and x-api-key): send the run token once",
                ))
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return Err(Refusal::token(
                    "no run token: use the token of your run (the `token` of POST /v1/runs) as the API key",
                ))
            }
        };
        let run = self
            .key
            .run_of(token)
            .ok_or_else(|| Refusal::token("this is not a run token of this tally"))?;
        let operator = Caller {
            uid: None,
            operator: true,
            proxied: false,
        };
        let lookup = run.clone();
        let standing = self
            .gate(move |gate, done| done(gate.run(operator, &lookup)))
            .await
            .map_err(|e| match e {
                GateError::Unavailable(_) => unavailable(),
                _ => Refusal::token("the run of this token is not known to the gate"),
            })?;
        // A real token of a run that may not spend any more: 403 with the reason, its
        // action `stop`, so a client shows why and stops (a 401 reads as a bad key, which
        // agents retry or send the user to log in again). Nothing is recorded: the run
        // has ended, or its deadline has (the next check would stop it).
        if standing.state == tally_wire::RunState::Stopped {
            let reason = standing.stop_reason.unwrap_or(Reason::Completed);
            return Err(Refusal::ended(
                reason,
                format!(
                    "the run of this token has stopped ({}): a new task is a new run, with its own token",
                    reason.as_str()
                ),
            ));
        }
        if tally_policy::past_deadline(&standing.budget, standing.at_ms) {
            return Err(Refusal::ended(
                Reason::RunDeadlineExhausted,
                "the run of this token is past its deadline: a new task is a new run, with its own token"
                    .into(),
            ));
        }
        Ok(Caught { run, standing })
    }

    async fn forward(
        &self,
        route: &Route,
        rest: &str,
        caught: Caught,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Refusal> {
        let (parts, body) = req.into_parts();
        let u = &route.upstream;
        let method = parts.method.as_str().to_owned();
        // The gate's own counts (grants and carve-outs included).
        let remaining = tally_policy::spend_left(&caught.standing.limits);
        let read = async {
            if !u.methods.contains(&method) {
                return Err(Pre::new(
                    Reason::ScopeViolation,
                    StatusCode::FORBIDDEN,
                    format!("{method} is not allowed to upstream `{}`", route.name),
                ));
            }
            if !path_allowed(&u.paths, rest) {
                return Err(Pre::new(
                    Reason::ScopeViolation,
                    StatusCode::FORBIDDEN,
                    format!("{rest} is not a path upstream `{}` allows", route.name),
                ));
            }
            let limit = usize::try_from(u.max_request_bytes).unwrap_or(usize::MAX);
            if parts
                .headers
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n > u.max_request_bytes)
            {
                return Err(too_large(u.max_request_bytes));
            }
            // The whole body within the read timeout: a client that announces a body
            // and stalls holds its connection (and its peer's place) no longer.
            let reading = Limited::new(body, limit).collect();
            let bytes = match tokio::time::timeout(self.read_timeout, reading).await {
                Err(_) => return Err(too_slow(self.read_timeout)),
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    return Err(too_large(u.max_request_bytes))
                }
                Ok(Err(_)) => {
                    return Err(Pre::new(
                        Reason::RequestRefused,
                        StatusCode::BAD_REQUEST,
                        "the request body could not be read",
                    ))
                }
            };
            self.plan(route, &method, rest, parts.uri.query(), &bytes, remaining)
        };
        let plan = match read.await {
            Ok(plan) => plan,
            Err(pre) => {
                let refused = Refused {
                    tool: route.name.clone(),
                    target: Some(route.host.clone()),
                    channel: channel_of(u.kind),
                    effect: if u.kind == UpstreamKind::Http {
                        effect_of(&method)
                    } else {
                        Effect::Read
                    },
                };
                let pre = if pre.preview.is_none() {
                    pre.preview(format!("{method} {rest}"))
                } else {
                    pre
                };
                return Err(self.refuse(&caught, refused, pre).await);
            }
        };
        let timeout_ms = tally_policy::call_timeout(
            &caught.standing.budget,
            caught.standing.at_ms,
            u.timeout_ms,
        );
        // The call's span (with a tracer), the agent's trace its parent; the decision
        // records the trace id, the span's or (without a tracer) the agent's.
        let parent = crate::trace::incoming(&parts.headers);
        let mut span = self.tracer.as_ref().map(|t| {
            crate::trace::CallSpan::start(
                t,
                parent.as_ref(),
                &crate::trace::About {
                    kind: u.kind,
                    upstream: &route.name,
                    host: &route.host,
                    method: &method,
                    model: (u.kind != UpstreamKind::Http).then_some(plan.operation.as_str()),
                    run: &caught.run,
                },
            )
        });
        let trace_id = match &span {
            Some(s) => Some(s.trace_id()),
            None => parent.as_ref().map(|(p, _)| p.trace_id.clone()),
        };
        let check = CheckRequest {
            run: caught.run.clone(),
            worker: None,
            tool: route.name.clone(),
            // A logical operation is the request itself (tool and arguments): concurrent
            // calls to one model are not retries of each other.
            operation: None,
            args: plan.args.clone(),
            args_preview: Some(preview(&plan.operation)),
            effect: plan.effect,
            idempotency_key: None,
            target: Some(route.host.clone()),
            channel: Some(channel_of(u.kind)),
            depth: None,
            reserve_cents: None,
            reserve_nanos: Some(plan.worst.0),
            remote_ref: None,
            credential: None,
            timeout_ms: Some(timeout_ms),
            trace_id,
            refused: None,
        };
        let caller = Caller {
            uid: caught.standing.owner_uid,
            operator: false,
            proxied: true,
        };
        let answer = match self
            .gate(move |gate, done| gate.check(caller, check, done))
            .await
        {
            Ok(a) => a,
            Err(GateError::Stopped(a)) => *a,
            Err(e) => {
                if let Some(mut s) = span {
                    s.decided("error", Some(Reason::GateUnavailable.as_str()), None);
                    s.finish();
                }
                return Err(match e {
                    GateError::Unavailable(_) => unavailable(),
                    GateError::RunStopped { reason, .. } => Refusal::ended(
                        reason,
                        format!("the run of this token has stopped ({})", reason.as_str()),
                    ),
                    GateError::RunNotFound(_) => {
                        Refusal::token("the run of this token is not known to the gate")
                    }
                    e => Refusal::own(
                        StatusCode::FORBIDDEN,
                        tally_wire::ErrorCode::Refused,
                        format!("the gate refused the call: {e}"),
                    ),
                });
            }
        };
        if let Some(s) = &mut span {
            s.decided(
                verdict(answer.decision),
                answer.reason.map(|r| r.as_str()),
                answer.seq,
            );
        }
        let attempt = match allowed(&answer, plan.worst) {
            Ok(a) => a,
            Err(mut r) => {
                r.recorded = answer.seq.map(|seq| (caught.run.clone(), seq));
                if let Some(s) = span {
                    s.finish();
                }
                return Err(r);
            }
        };
        let deadline = Instant::now()
            + Duration::from_millis(answer.timeout_ms.unwrap_or(timeout_ms).min(timeout_ms));
        let settle = Settle {
            run: caught.run.clone(),
            attempt,
            seq: answer.seq,
            caller,
            effect: plan.effect,
            kind: u.kind,
            endpoint: plan.endpoint,
            price: plan.price.clone(),
            route_price: plan.route_price,
            lands: plan.lands.clone(),
            cost_header: u.cost_header.clone(),
            // What the gate reserved: the most this call may settle.
            reserved: Nanos(answer.reserve_nanos.unwrap_or(plan.worst.0)),
        };
        // The upstream request: the base path, the agent's path and query, its headers
        // less the hop-by-hop and credentials, the real credential.
        let query = parts
            .uri
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let uri = format!(
            "{}://{}{}{rest}{query}",
            route.scheme, route.authority, route.base
        );
        let mut out = Request::builder()
            .method(parts.method.clone())
            .uri(&uri)
            .body(Full::new(Bytes::from(plan.body)))
            .map_err(|_| {
                Refusal::own(
                    StatusCode::BAD_REQUEST,
                    tally_wire::ErrorCode::InvalidRequest,
                    "the request cannot be forwarded",
                )
            })?;
        // The upstream's traceparent: the proxy's span, or (without a tracer) the agent's
        // valid one as it came; an invalid one never.
        let onward = match &span {
            Some(s) => Some(s.outgoing()),
            None => parent,
        };
        *out.headers_mut() = outgoing(&parts.headers, route, onward.as_ref());
        let sent = tokio::time::timeout_at(deadline.into(), route.client.request(out)).await;
        let pump = Pump::new(self.shared(), settle, deadline, span);
        let response = match sent {
            Err(_) => {
                pump.settle_now(Status::Timeout, None).await;
                return Err(Refusal::own(
                    StatusCode::GATEWAY_TIMEOUT,
                    tally_wire::ErrorCode::UpstreamTimeout,
                    "the upstream did not answer within the call's time (the run's deadline or the upstream's timeout_ms)",
                ));
            }
            Ok(Err(e)) => {
                // Never connected: nothing happened upstream. Else it may have.
                let status = if e.is_connect() {
                    Status::Rejected
                } else {
                    Status::Unknown
                };
                pump.settle_now(status, None).await;
                return Err(Refusal::own(
                    StatusCode::BAD_GATEWAY,
                    tally_wire::ErrorCode::UpstreamUnreachable,
                    format!("the upstream could not be reached: {e}"),
                ));
            }
            Ok(Ok(r)) => r,
        };
        if response.status().is_redirection() {
            if let Some(refusal) = crate::redirect::refused(&uri, response.headers()) {
                pump.settle_now(
                    Status::Rejected,
                    Some("redirect_refused:scope_violation".into()),
                )
                .await;
                return Err(refusal);
            }
        }
        Ok(pump.answer(response, plan.client_asked_usage, plan.strip_usage))
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

fn channel_of(kind: UpstreamKind) -> Channel {
    match kind {
        UpstreamKind::Http => Channel::Http,
        UpstreamKind::Openai | UpstreamKind::Anthropic => Channel::Model,
    }
}

/// An HTTP method's effect class: what it may change upstream (RFC 9110 9.2).
pub(crate) fn effect_of(method: &str) -> Effect {
    match Method::from_bytes(method.as_bytes()) {
        Ok(Method::GET) | Ok(Method::HEAD) | Ok(Method::OPTIONS) => Effect::Read,
        Ok(Method::PUT) | Ok(Method::DELETE) => Effect::IdempotentWrite,
        _ => Effect::NonIdempotentWrite,
    }
}

/// A verdict as spans and logs name it.
fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
        Verdict::RequireApproval => "require_approval",
    }
}

/// The attempt of an allow, or the refusal in words: a refusal for money says what the
/// call needed (`needed`, its worst case) and what the run and its owner have left.
fn allowed(a: &CheckAnswer, needed: Nanos) -> Result<u64, Refusal> {
    if a.decision == Verdict::Allow {
        if let Some(attempt) = a.attempt {
            return Ok(attempt);
        }
    }
    let reason = a.reason.unwrap_or(Reason::GateUnavailable);
    let mut words = match a.cause {
        Some(cause) => format!(
            "the gate refused the call: {} ({})",
            reason.as_str(),
            cause.as_str()
        ),
        None => format!("the gate refused the call: {}", reason.as_str()),
    };
    let money = [
        Reason::ReservationInsufficient,
        Reason::BudgetExceeded,
        Reason::PrincipalBudgetExceeded,
    ];
    if money.contains(&reason) || a.cause.is_some_and(|c| money.contains(&c)) {
        // The gate's own counts as it decided: settled plus held of each limit.
        let left = |dimension: &str, whose: &str| {
            a.limits.get(dimension).map(|l| {
                format!(
                    "{whose} has {} left of {}",
                    Nanos(tally_policy::left(l)),
                    Nanos(l.limit)
                )
            })
        };
        let mut parts = vec![format!("the call may cost up to {needed}")];
        parts.extend(left(Dimension::SpendNanos.as_str(), "the run"));
        parts.extend(left(tally_policy::PRINCIPAL_SPEND, "its owner's budget"));
        words = format!("{words}: {}", parts.join("; "));
    }
    let mut r = Refusal::reason(reason, a.retry_after_ms, words);
    r.cause = a.cause;
    Err(r)
}

/// The headers sent upstream: the agent's that its dialect needs ([`passed`]), the
/// `anthropic-beta` values the upstream allows (`anthropic_beta`), the trace context
/// replaced by `trace`, and the real credential (docs/PROXY.md).
fn outgoing(incoming: &HeaderMap, route: &Route, trace: Option<&crate::trace::Trace>) -> HeaderMap {
    let kind = route.upstream.kind;
    let mut out = HeaderMap::new();
    for (name, value) in incoming {
        if passed(kind, name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    if kind == UpstreamKind::Anthropic {
        if let Some(v) = betas(incoming, &route.upstream.anthropic_beta) {
            out.insert(HeaderName::from_static("anthropic-beta"), v);
        }
    }
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
        UpstreamKind::Anthropic => ("x-api-key", secret.to_owned()),
        UpstreamKind::Openai | UpstreamKind::Http => ("authorization", format!("Bearer {secret}")),
    };
    if let Ok(mut v) = HeaderValue::from_str(&value) {
        v.set_sensitive(true);
        out.insert(HeaderName::from_static(name), v);
    }
    out
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
}
