//! A span per proxied call, under the OpenTelemetry GenAI semantic conventions (a model
//! upstream) or the HTTP client conventions (an `http` upstream), exported by the
//! daemon's tracer (`serve --otlp-endpoint`, sampled as `--otlp-sample` says).
//!
//! W3C Trace Context: the agent's `traceparent` (parsed strictly by
//! `tally_record::trace`) makes the span its child, and the decision records its trace id.
//! The upstream is sent a `traceparent` naming the proxy's span, as an intermediary that
//! takes part in the trace must (W3C Trace Context, "Mutating the traceparent field"):
//! its own span id, the sampled flag its sampler chose, and the agent's `tracestate`.
//! Without a tracer the proxy takes no part: a valid `traceparent` is passed on as it
//! came (written canonically), an invalid one is not passed on at all.

use hyper::header::HeaderMap;
use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::KeyValue;
use tally_policy::UpstreamKind;
use tally_record::trace::Traceparent;

use crate::usage::Usage;

/// A caller's W3C trace context: its valid `traceparent` and the `tracestate` with it.
pub type Trace = (Traceparent, Option<String>);

/// The trace context of a request's headers (exactly one valid `traceparent`, and its
/// `tracestate`), or `None`.
pub fn incoming(headers: &HeaderMap) -> Option<Trace> {
    let values = |name| {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("-"))
    };
    tally_record::trace::incoming(values("traceparent"), values("tracestate"))
}

/// The context a span starts in: the caller's remote span, if it sent a valid
/// `traceparent` (with its `tracestate`, when the SDK's W3C parser accepts it), else none.
pub fn remote(parent: Option<&Trace>) -> opentelemetry::Context {
    let Some((p, state)) = parent else {
        return opentelemetry::Context::new();
    };
    let (Ok(trace), Ok(span)) = (TraceId::from_hex(&p.trace_id), SpanId::from_hex(&p.span_id))
    else {
        return opentelemetry::Context::new();
    };
    let state = state
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let flags = if p.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    opentelemetry::Context::new()
        .with_remote_span_context(SpanContext::new(trace, span, flags, true, state))
}

/// What the span of a call says before the gate decides.
pub(crate) struct About<'a> {
    pub kind: UpstreamKind,
    pub upstream: &'a str,
    pub host: &'a str,
    pub method: &'a str,
    /// The model asked for (a model upstream).
    pub model: Option<&'a str>,
    pub run: &'a str,
}

/// One proxied call's span, from before the gate's check to the call's outcome.
pub(crate) struct CallSpan(BoxedSpan);

impl CallSpan {
    /// Start it, a child of `parent`. Its name and attributes are built only when the
    /// sampler keeps it.
    pub fn start(tracer: &BoxedTracer, parent: Option<&Trace>, about: &About<'_>) -> CallSpan {
        let cx = remote(parent);
        let mut span = tracer
            .span_builder("chat")
            .with_kind(SpanKind::Client)
            .start_with_context(tracer, &cx);
        if span.is_recording() {
            let mut kv = vec![
                KeyValue::new("server.address", about.host.to_owned()),
                KeyValue::new("tally.upstream", about.upstream.to_owned()),
                KeyValue::new("tally.run", about.run.to_owned()),
            ];
            let provider = match about.kind {
                UpstreamKind::Openai => Some("openai"),
                UpstreamKind::Anthropic => Some("anthropic"),
                UpstreamKind::Gemini => Some("gcp.gemini"),
                UpstreamKind::AzureOpenai => Some("azure.ai.openai"),
                UpstreamKind::Bedrock => Some("aws.bedrock"),
                UpstreamKind::Http => None,
            };
            match (provider, about.model) {
                (Some(p), model) => {
                    let model = model.unwrap_or_default();
                    span.update_name(format!("chat {model}"));
                    kv.extend([
                        KeyValue::new("gen_ai.operation.name", "chat"),
                        KeyValue::new("gen_ai.provider.name", p),
                        // The attribute's name before the conventions renamed it.
                        KeyValue::new("gen_ai.system", p),
                        KeyValue::new("gen_ai.request.model", model.to_owned()),
                    ]);
                }
                (None, _) => {
                    span.update_name(about.method.to_owned());
                    kv.push(KeyValue::new(
                        "http.request.method",
                        about.method.to_owned(),
                    ));
                }
            }
            span.set_attributes(kv);
        }
        CallSpan(span)
    }

    /// Its trace id (32 lowercase hex), sampled or not: recorded on the decision.
    pub fn trace_id(&self) -> String {
        self.0.span_context().trace_id().to_string()
    }

    /// The `traceparent` (and `tracestate`) the upstream is sent: this span as the
    /// parent, with the sampled flag the sampler chose.
    pub fn outgoing(&self) -> Trace {
        let sc = self.0.span_context();
        let state = sc.trace_state().header();
        (
            Traceparent {
                trace_id: sc.trace_id().to_string(),
                span_id: sc.span_id().to_string(),
                sampled: sc.is_sampled(),
            },
            (!state.is_empty()).then_some(state),
        )
    }

    /// The gate's answer.
    pub fn decided(
        &mut self,
        decision: &'static str,
        reason: Option<&'static str>,
        seq: Option<u64>,
    ) {
        if !self.0.is_recording() {
            return;
        }
        self.0
            .set_attribute(KeyValue::new("tally.decision", decision));
        if let Some(r) = reason {
            self.0.set_attribute(KeyValue::new("tally.reason", r));
            self.0.set_attribute(KeyValue::new("error.type", r));
            self.0.set_status(Status::error(r));
        }
        if let Some(s) = seq {
            self.0.set_attribute(KeyValue::new(
                "tally.seq",
                i64::try_from(s).unwrap_or(i64::MAX),
            ));
        }
    }

    /// End it where the call ends without being made (the gate refused it).
    pub fn finish(mut self) {
        self.0.end();
    }

    /// End it with the call's outcome: its status as recorded, the upstream's HTTP
    /// status (if it answered) and the tokens it reported (a model call).
    pub fn end(mut self, outcome: &'static str, http: Option<u16>, usage: Option<Usage>) {
        if !self.0.is_recording() {
            return;
        }
        self.0
            .set_attribute(KeyValue::new("tally.outcome", outcome));
        if let Some(code) = http {
            self.0
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        if let Some(u) = usage {
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            self.0.set_attributes([
                KeyValue::new(
                    "gen_ai.usage.input_tokens",
                    n(u.input.saturating_add(u.cached)),
                ),
                KeyValue::new("gen_ai.usage.cache_read.input_tokens", n(u.cached)),
                KeyValue::new("gen_ai.usage.output_tokens", n(u.output)),
            ]);
        }
        if outcome != "ok" {
            self.0.set_attribute(KeyValue::new("error.type", outcome));
            self.0.set_status(Status::error(outcome));
        }
        self.0.end();
    }
}
