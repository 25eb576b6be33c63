//! Spans over OTLP, and the W3C Trace Context an agent sends with a check
//! (`tally_ledger::trace`: parsed strictly, an invalid one ignored). A decision records
//! the id of the trace it belongs to wherever that trace exists outside tally's own
//! sampler (the agent's, sampled or not) or tally exports it, so an auditor joins the
//! ledger to the traces; a root span tally does not sample names a trace nobody holds,
//! and its id is not recorded.
//!
//! Sampling is decided at the head, by the SDK's parent-based sampler: a span whose
//! caller sent a `traceparent` is exported exactly when the caller sampled it; a span
//! that starts its own trace (no valid `traceparent`) is exported with the probability
//! `serve --otlp-sample` gives (the SDK's trace-id ratio sampler, so one trace id always
//! gets the same answer). A span that is not sampled still has its trace id, which the
//! decision records: it is only never built or sent.

use opentelemetry::trace::{SpanKind, Tracer as _};
use opentelemetry::KeyValue;

/// The export batch and queue: an export per 2,048 spans (a quarter of the HTTP posts
/// and protobuf framings of the SDK's 512), up to 8,192 spans queued (about a second of
/// checks at full speed; more are dropped, never held in memory without bound).
const MAX_EXPORT_BATCH: usize = 2048;
const MAX_QUEUE: usize = 8192;

/// The ratio of root spans sampled when `--otlp-sample` is not given (docs/OPERATOR.md).
pub const DEFAULT_SAMPLE: f64 = 0.1;

/// Spans exported over OTLP/HTTP by the OpenTelemetry SDK's batch processor (its own
/// thread: a slow or absent collector never holds a check up; spans it cannot send are
/// dropped, never queued without bound).
pub(crate) struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

/// A span being timed.
pub(crate) struct CheckSpan(opentelemetry_sdk::trace::Span);

pub use tally_proxy::trace::{incoming, remote, Trace};

/// The exporter's HTTP client: reqwest's blocking client over `tls`, the one TLS
/// configuration every HTTPS client of tally uses (tally-proxy's `tls::client_config`:
/// ring, the Mozilla roots). Handed to the exporter, so it never builds reqwest's own
/// TLS setup, which has no crypto provider in this build (reqwest's rustls without
/// one: the MCP gateway hands it tally's configuration too).
fn http_client(tls: rustls::ClientConfig) -> Result<reqwest::blocking::Client, String> {
    reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| format!("the OTLP exporter's HTTP client: {e}"))
}

impl Exporter {
    /// Export to `endpoint` (`http://host:4318`, `/v1/traces` added when no path is
    /// given), sampling root spans at `sample` (0 to 1). Builds the HTTP client on a
    /// thread of its own: a blocking client must not be made (or dropped) on an async
    /// worker.
    pub fn new(endpoint: &str, sample: f64) -> Result<Exporter, String> {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler};
        if !(0.0..=1.0).contains(&sample) {
            return Err(format!("the sample ratio {sample} is not between 0 and 1"));
        }
        // The one reading of a URL tally sends to: what is sent is the URL as written,
        // `/v1/traces` where it gives no path.
        let read = tally_record::url::UpstreamUrl::parse(endpoint).map_err(|e| e.to_string())?;
        let url = if read.base().is_empty() {
            format!(
                "{}://{}/v1/traces",
                read.scheme().as_str(),
                read.authority()
            )
        } else {
            read.as_str()
        };
        let tls = tally_proxy::tls::client_config(None).map_err(|e| e.to_string())?;
        let built = std::thread::spawn(move || {
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(http_client(tls)?)
                .with_endpoint(url)
                .with_timeout(std::time::Duration::from_secs(5))
                .build()
                .map_err(|e| e.to_string())
        })
        .join()
        .map_err(|_| "building the OTLP exporter panicked".to_owned())??;
        let batch = BatchSpanProcessor::builder(built)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_export_batch_size(MAX_EXPORT_BATCH)
                    .with_max_queue_size(MAX_QUEUE)
                    .build(),
            )
            .build();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                sample,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("tally")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("tally");
        Ok(Exporter { provider, tracer })
    }

    /// The tracer, for the model proxy's spans (same provider, sampler and export).
    pub fn boxed(&self) -> opentelemetry::global::BoxedTracer {
        opentelemetry::global::BoxedTracer::new(Box::new(self.tracer.clone()))
    }

    /// Start the span of a check of `tool` in `run`, a child of the agent's
    /// `traceparent` if it sent a valid one. GenAI semantic conventions: the span is
    /// `execute_tool {tool}`, kind internal, with `gen_ai.operation.name` and
    /// `gen_ai.tool.name`. Its name and attributes are built only when it is sampled.
    pub fn check(&self, tool: &str, run: &str, parent: Option<&Trace>) -> CheckSpan {
        use opentelemetry::trace::Span as _;
        let cx = remote(parent);
        let mut span = self
            .tracer
            .span_builder("execute_tool")
            .with_kind(SpanKind::Internal)
            .start_with_context(&self.tracer, &cx);
        if span.is_recording() {
            span.update_name(format!("execute_tool {tool}"));
            span.set_attributes([
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("tally.run", run.to_owned()),
            ]);
        }
        CheckSpan(span)
    }

    /// Send what is batched and stop (at shutdown).
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

impl CheckSpan {
    /// The span's trace id (32 lowercase hex) if the span is sampled (exported), else
    /// `None`.
    pub fn exported_trace_id(&self) -> Option<String> {
        use opentelemetry::trace::Span as _;
        let sc = self.0.span_context();
        sc.is_sampled().then(|| sc.trace_id().to_string())
    }

    /// End it with the gate's answer.
    pub fn end(mut self, decision: &'static str, reason: Option<&'static str>, seq: Option<u64>) {
        use opentelemetry::trace::{Span as _, Status};
        if !self.0.is_recording() {
            return;
        }
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
