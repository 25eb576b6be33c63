//! One request through the proxy, as named phases over one context ([`Call`])
//! (docs/PROXY.md, "How a call flows"):
//!
//! 1. [`authenticate`]: the run the agent's token names; a bad token is a 401, a run
//!    that may not spend a 403, and nothing is recorded (there is no run to record in);
//! 2. [`plan`]: the upstream, the body read strictly and priced (the most the call may
//!    cost), the agent's headers allow-listed; a refusal here is the run's `deny`;
//! 3. [`check`]: the gate's check reserves the worst case; a refusal is answered in the
//!    upstream's dialect;
//! 4. [`forward`]: the request sent upstream within the call's time, a redirect never
//!    followed;
//! 5. [`pump`]: the answer relayed (JSON or SSE) while its usage and digest are read;
//! 6. [`settle`]: the outcome recorded with the gate.
//!
//! Once the check allowed the call, settle always runs, once: the check arms a
//! [`settle::Settling`], which forward and pump tell what happened, and which settles
//! what it holds when it is finished or, whatever ended the call first (an early
//! return, a client gone before the answer, a panic), when it is dropped.

use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Request, Response};
use tally_policy::UpstreamKind;
use tally_record::decision::Channel;
use tally_record::Effect;

use crate::dialect::Refusal;
use crate::proxy::{Proxy, Route};
use crate::refuse::Caught;
use crate::Body;

mod authenticate;
mod check;
mod forward;
mod keyed;
mod plan;
mod pump;
mod settle;

/// One proxied request, as the phases know it once its run and upstream are.
pub(crate) struct Call<'p> {
    /// The upstream it is for.
    pub route: &'p Route,
    /// The path under the upstream's name (`/v1/messages`).
    pub rest: String,
    /// Its method, as sent.
    pub method: String,
    /// Its head: the URI (for the query) and the agent's headers.
    pub head: Parts,
    /// The agent's valid trace context, if it sent one.
    pub parent: Option<crate::trace::Trace>,
    /// What authenticate found: the run the token names and its standing.
    pub caught: Caught,
}

impl Proxy {
    /// Answers one request. The token is read first, whatever the path: a bad token is
    /// a 401 and nothing is recorded (there is no run to record it in). Past the token,
    /// every refusal is a decision in the run's ledger before it is answered.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let (head, body) = req.into_parts();
        let path = head.uri.path().to_owned();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let name = parts.next().unwrap_or_default().to_owned();
        let rest = format!("/{}", parts.next().unwrap_or_default());
        let route = self.routes.get(&name);
        let kind = route.map_or(UpstreamKind::Openai, |r| r.upstream.kind);
        let caught = match authenticate::authenticate(self, &head.headers).await {
            Ok(c) => c,
            Err(refusal) => return refusal.response(kind),
        };
        let Some(route) = route else {
            let method = head.method.as_str();
            return plan::unknown_upstream(self, &caught, &name, method, &path)
                .await
                .response(kind);
        };
        let call = Call {
            route,
            rest,
            method: head.method.as_str().to_owned(),
            parent: crate::trace::incoming(&head.headers),
            head,
            caught,
        };
        match self.proxied(&call, body).await {
            Ok(r) => r,
            Err(refusal) => refusal.response(kind),
        }
    }

    /// The phases past authenticate: plan, check, forward, pump, and settle, which runs
    /// once the check allowed the call whatever happens after it.
    async fn proxied(&self, call: &Call<'_>, body: Incoming) -> Result<Response<Body>, Refusal> {
        let mut plan = plan::plan(self, call, body).await?;
        let mut settling = check::check(self, call, &mut plan).await?;
        let strip_usage = plan.strip_usage;
        let sent = (plan.upstream_path.as_deref(), plan.body);
        match forward::forward(call, sent, plan.headers, &mut settling).await {
            // Pump settles when the answer has ended (in its own task).
            Ok(answer) => Ok(pump::pump(
                answer,
                (strip_usage, call.route.withheld),
                settling,
            )),
            Err(refusal) => {
                settling.settle().await;
                Err(refusal)
            }
        }
    }
}

/// The channel a call to an upstream of `kind` is on.
fn channel_of(kind: UpstreamKind) -> Channel {
    match kind {
        UpstreamKind::Http => Channel::Http,
        UpstreamKind::Openai
        | UpstreamKind::Anthropic
        | UpstreamKind::Gemini
        | UpstreamKind::AzureOpenai
        | UpstreamKind::Bedrock => Channel::Model,
    }
}

/// An HTTP method's effect class: what it may change upstream (RFC 9110 9.2).
fn effect_of(method: &str) -> Effect {
    match Method::from_bytes(method.as_bytes()) {
        Ok(Method::GET) | Ok(Method::HEAD) | Ok(Method::OPTIONS) => Effect::Read,
        Ok(Method::PUT) | Ok(Method::DELETE) => Effect::IdempotentWrite,
        _ => Effect::NonIdempotentWrite,
    }
}
