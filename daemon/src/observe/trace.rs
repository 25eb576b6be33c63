//! W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` header an
//! agent may send with a check. Its trace id is recorded on the decision, so an auditor
//! can join the ledger to the agent's traces. A header that is not exactly a valid
//! version-00 `traceparent` is ignored (the check goes on without a trace id), never an
//! error: tracing must not change what the gate decides.

/// A parsed `traceparent`: trace id, parent span id, flags.
pub(crate) struct Parent {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
}

/// A `traceparent` value, parsed strictly: `00-{32 hex}-{16 hex}-{2 hex}`, lowercase,
/// neither id all zeros. Anything else is `None`.
pub(crate) fn parent(traceparent: &str) -> Option<Parent> {
    let mut parts = traceparent.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version != "00" {
        return None;
    }
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) || zero(trace) || zero(parent) {
        return None;
    }
    Some(Parent {
        trace_id: trace.to_owned(),
        span_id: parent.to_owned(),
        sampled: u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1),
    })
}

/// Spans exported over OTLP/HTTP by the OpenTelemetry SDK's batch processor (its own
/// thread: a slow or absent collector never holds a check up; spans it cannot send are
/// dropped, never queued without bound).
pub(crate) struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

/// A span being timed.
pub(crate) struct CheckSpan(opentelemetry_sdk::trace::Span);

impl Exporter {
    /// Export to `endpoint` (`http://host:4318`, `/v1/traces` added when no path is
    /// given). Builds the HTTP client on a thread of its own: a blocking client must not
    /// be made (or dropped) on an async worker.
    pub fn new(endpoint: &str) -> Result<Exporter, String> {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_otlp::WithExportConfig;
        let url = match endpoint.split_once("://") {
            Some((_, rest)) if !rest.trim_end_matches('/').contains('/') => {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            }
            _ => endpoint.to_owned(),
        };
        let built = std::thread::spawn(move || {
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(url)
                .with_timeout(std::time::Duration::from_secs(5))
                .build()
                .map_err(|e| e.to_string())
        })
        .join()
        .map_err(|_| "building the OTLP exporter panicked".to_owned())??;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(built)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("tally")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("tally");
        Ok(Exporter { provider, tracer })
    }

    /// Start the span of a check of `tool` in `run`, a child of the agent's
    /// `traceparent` if it sent a valid one. GenAI semantic conventions: the span is
    /// `execute_tool {tool}`, kind internal, with `gen_ai.operation.name` and
    /// `gen_ai.tool.name`.
    pub fn check(&self, tool: &str, run: &str, parent: Option<&Parent>) -> CheckSpan {
        use opentelemetry::trace::{
            SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
            Tracer as _,
        };
        use opentelemetry::KeyValue;
        let cx = match parent.and_then(|p| {
            Some(SpanContext::new(
                TraceId::from_hex(&p.trace_id).ok()?,
                SpanId::from_hex(&p.span_id).ok()?,
                if p.sampled {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::default()
                },
                true,
                TraceState::default(),
            ))
        }) {
            Some(sc) => opentelemetry::Context::new().with_remote_span_context(sc),
            None => opentelemetry::Context::new(),
        };
        let span = self
            .tracer
            .span_builder(format!("execute_tool {tool}"))
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("tally.run", run.to_owned()),
            ])
            .start_with_context(&self.tracer, &cx);
        CheckSpan(span)
    }

    /// Send what is batched and stop (at shutdown).
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

impl CheckSpan {
    /// The span's trace id (32 lowercase hex).
    pub fn trace_id(&self) -> String {
        use opentelemetry::trace::Span as _;
        self.0.span_context().trace_id().to_string()
    }

    /// End it with the gate's answer.
    pub fn end(mut self, decision: &'static str, reason: Option<&'static str>, seq: Option<u64>) {
        use opentelemetry::trace::{Span as _, Status};
        use opentelemetry::KeyValue;
        self.0
            .set_attribute(KeyValue::new("tally.decision", decision));
        if let Some(r) = reason {
            self.0.set_attribute(KeyValue::new("tally.reason", r));
            self.0.set_attribute(KeyValue::new("error.type", r));
        }
        if let Some(s) = seq {
            self.0.set_attribute(KeyValue::new(
                "tally.seq",
                i64::try_from(s).unwrap_or(i64::MAX),
            ));
        }
        if decision != "allow" {
            self.0
                .set_status(Status::error(reason.unwrap_or("refused")));
        }
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    fn trace_id(s: &str) -> Option<String> {
        super::parent(s).map(|p| p.trace_id)
    }

    #[test]
    fn only_an_exact_traceparent_gives_a_trace_id() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            trace_id(ok).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }
}
