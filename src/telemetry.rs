//! OpenTelemetry traces, exported over OTLP/gRPC.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is
//! not `true`; the other standard variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_BSP_*`…) are honoured by the SDK. When off, [`enabled`] is one
//! relaxed atomic load and no span, context or attribute is ever built: no
//! cost beyond that.
//!
//! Spans:
//! * one `SERVER` span per RPC, named like the gRPC method
//!   (`idemd.v1.Idempotency/Claim`), continuing the caller's trace when the
//!   request carries W3C `traceparent` metadata. Attributes: `rpc.system`,
//!   `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, and from the
//!   handler `idemd.tenant`, `idemd.endpoint`, `idemd.outcome`. Never the key
//!   or a body.
//! * one `INTERNAL` child span per store operation (`store get`,
//!   `store insert`…), with `db.system.name` (the backend).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// Whether spans are exported.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer, once installed.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Keeps the exporter alive; [`TelemetryGuard::shutdown`] flushes what is
/// buffered (call it before the process exits).
#[derive(Debug)]
pub struct TelemetryGuard {
    /// The provider whose batch processor holds unsent spans.
    provider: SdkTracerProvider,
}

impl TelemetryGuard {
    /// Exports buffered spans and stops the exporter.
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "flushing traces at shutdown failed");
        }
    }
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|value| !value.trim().is_empty())
}

/// Installs the OTLP exporter when the environment asks for one. Must run
/// inside the tokio runtime (the gRPC exporter's channel lives on it).
pub fn init_from_env() -> Result<Option<TelemetryGuard>, String> {
    let wanted =
        env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let disabled = std::env::var("OTEL_SDK_DISABLED")
        .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
    if !wanted || disabled {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !env_set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("idemd");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("idemd");
    if TRACER.set(tracer).is_err() {
        return Err("telemetry initialised twice".to_string());
    }
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some(TelemetryGuard { provider }))
}

/// Whether spans are being recorded.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Reads `traceparent`/`tracestate` from gRPC metadata.
struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The context of a new RPC span (child of the caller's `traceparent`, if
/// any), or `None` when tracing is off.
pub fn rpc_context(
    service: &'static str,
    method: &'static str,
    metadata: &tonic::metadata::MetadataMap,
) -> Option<Context> {
    let tracer = TRACER.get().filter(|_| enabled())?;
    let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
    let parent = opentelemetry::propagation::TextMapPropagator::extract(
        &propagator,
        &MetadataExtractor(metadata),
    );
    let span = tracer
        .span_builder(format!("{service}/{method}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", service),
            KeyValue::new("rpc.method", method),
        ])
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

/// Ends an RPC span with its gRPC status.
pub fn end_rpc(context: &Context, code: tonic::Code) {
    let span = context.span();
    span.set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
    if !matches!(
        code,
        tonic::Code::Ok
            | tonic::Code::NotFound
            | tonic::Code::AlreadyExists
            | tonic::Code::FailedPrecondition
            | tonic::Code::InvalidArgument
    ) {
        // Server-side faults only; a caller's mistake is not an error of
        // this span (OpenTelemetry's gRPC server conventions).
        span.set_status(Status::error(format!("{code:?}")));
    }
    span.end();
}

/// Adds idemd attributes (tenant, endpoint, outcome) to the current RPC
/// span. A no-op when tracing is off.
pub fn annotate(attributes: &[(&'static str, &str)]) {
    if !enabled() {
        return;
    }
    let context = Context::current();
    let span = context.span();
    for (key, value) in attributes {
        span.set_attribute(KeyValue::new(*key, value.to_string()));
    }
}

/// The context of a child span for one store operation, or `None` when
/// tracing is off or no RPC span is current.
pub fn store_context(backend: &'static str, operation: &'static str) -> Option<Context> {
    let tracer = TRACER.get().filter(|_| enabled())?;
    let parent = Context::current();
    if !parent.has_active_span() {
        return None;
    }
    let mut span = tracer
        .span_builder(format!("store {operation}"))
        .with_kind(SpanKind::Internal)
        .with_attributes([
            KeyValue::new("db.system.name", backend),
            KeyValue::new("db.operation.name", operation),
        ])
        .start_with_context(tracer, &parent);
    span.set_attribute(KeyValue::new("idemd.store.backend", backend));
    Some(parent.with_span(span))
}

/// Ends a store span, marking failures.
pub fn end_store<T, E: std::fmt::Display>(context: &Context, result: &Result<T, E>) {
    let span = context.span();
    if let Err(error) = result {
        span.set_status(Status::error(error.to_string()));
    }
    span.end();
}
