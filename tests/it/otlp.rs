//! Traces: a real `idemd` process exports spans over OTLP/gRPC to an
//! in-process collector (the OTLP TraceService, implemented here with
//! `opentelemetry-proto` + tonic on port 0). Checks one span per RPC, the
//! continuation of the caller's W3C `traceparent`, child spans per store
//! operation, the attributes, and that no raw key leaves the process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::process::{idemd_command, sigterm, spawn_command};
use crate::common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// Every span received, with the service name of its resource.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("lock");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(name)) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            Some(Value::IntValue(i)) => Some(i.to_string()),
            _ => None,
        })
}

impl Collector {
    /// A collector serving on port 0, and its address.
    async fn start() -> (Collector, std::net::SocketAddr) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(idemd::net::incoming(listener)),
        );
        (collector, addr)
    }

    /// Waits (bounded) until `predicate` holds for the spans received.
    async fn wait_for(&self, what: &str, predicate: impl Fn(&[(String, Span)]) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if predicate(&self.0.lock().expect("lock")) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let names: Vec<String> = self
                    .0
                    .lock()
                    .expect("lock")
                    .iter()
                    .map(|(_, s)| s.name.clone())
                    .collect();
                panic!("timed out waiting for {what}; spans received: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().expect("lock").clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_spans_continue_the_callers_trace_and_nest_store_spans() {
    let (collector, collector_addr) = Collector::start().await;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = idemd_command(dir.path(), &[]);
    command
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        )
        // Export quickly: the test waits for the batch.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_SDK_DISABLED");
    let mut process = spawn_command(command);
    assert_eq!(process.serving["traces"], true, "{}", process.serving);
    let mut client = connect(process.addr).await;

    // The caller's trace: 16-byte trace id, 8-byte parent span id.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let key = "otlp-key-never-exported-7731";
    let mut request = as_tenant("acme", claim(PAYMENTS, key, 42));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{caller_span}-01")
            .parse()
            .expect("ascii"),
    );
    let lease = claimed(&client.claim(request).await.expect("claim").into_inner());
    // A call without traceparent starts its own trace.
    client
        .lookup(as_tenant(
            "acme",
            idemd::proto::v1::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                include_response: false,
            },
        ))
        .await
        .expect("lookup");
    assert!(!lease.lease_token.is_empty());

    collector
        .wait_for("the Claim span and the Lookup span", |spans| {
            spans
                .iter()
                .any(|(_, s)| s.name == "idemd.v1.Idempotency/Claim")
                && spans
                    .iter()
                    .any(|(_, s)| s.name == "idemd.v1.Idempotency/Lookup")
        })
        .await;
    let spans = collector.spans();
    let (service, claim_span) = spans
        .iter()
        .find(|(_, s)| s.name == "idemd.v1.Idempotency/Claim")
        .expect("claim span");
    assert_eq!(service, "idemd", "service.name defaults to idemd");
    assert_eq!(
        hex::encode(&claim_span.trace_id),
        trace_id,
        "caller's trace"
    );
    assert_eq!(
        hex::encode(&claim_span.parent_span_id),
        caller_span,
        "child of the caller's span"
    );
    assert_eq!(claim_span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(
        attribute(claim_span, "rpc.method").as_deref(),
        Some("Claim")
    );
    assert_eq!(attribute(claim_span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute(claim_span, "idemd.tenant").as_deref(),
        Some("acme")
    );
    assert_eq!(
        attribute(claim_span, "idemd.endpoint").as_deref(),
        Some(PAYMENTS)
    );
    assert_eq!(
        attribute(claim_span, "idemd.outcome").as_deref(),
        Some("claimed")
    );
    assert_eq!(
        attribute(claim_span, "rpc.grpc.status_code").as_deref(),
        Some("0")
    );

    // Store operations of the Claim are its children, in the same trace.
    collector
        .wait_for("the Claim's store spans", |spans| {
            spans
                .iter()
                .any(|(_, s)| s.name == "store insert" && s.trace_id == claim_span.trace_id)
        })
        .await;
    let spans = collector.spans();
    let store_spans: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.trace_id == claim_span.trace_id && s.name.starts_with("store "))
        .collect();
    assert!(
        store_spans.iter().any(|s| s.name == "store insert"),
        "a fresh claim inserts"
    );
    for span in &store_spans {
        assert_eq!(span.parent_span_id, claim_span.span_id, "{}", span.name);
        assert_eq!(
            attribute(span, "db.system.name").as_deref(),
            Some("embedded")
        );
    }

    let (_, lookup_span) = spans
        .iter()
        .find(|(_, s)| s.name == "idemd.v1.Idempotency/Lookup")
        .expect("lookup span");
    assert!(lookup_span.parent_span_id.is_empty(), "a root span");
    assert_ne!(lookup_span.trace_id, claim_span.trace_id, "its own trace");

    // The key is never exported, in any attribute of any span.
    for (_, span) in &spans {
        for kv in &span.attributes {
            assert!(
                !format!("{:?}", kv.value).contains(key),
                "{} carries the raw key in {}",
                span.name,
                kv.key
            );
        }
    }
    sigterm(&process);
    let status = tokio::task::spawn_blocking(move || process.child.wait().expect("wait"))
        .await
        .expect("join");
    assert_eq!(status.code(), Some(0));
}

/// Without `OTEL_EXPORTER_OTLP_ENDPOINT` traces are off (the server's
/// start-up event says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_are_off_by_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = idemd_command(dir.path(), &[]);
    command
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let mut process = spawn_command(command);
    assert_eq!(process.serving["traces"], false, "{}", process.serving);
    let _ = process.child.kill();
    let _ = process.child.wait();
}

/// A request through `idemd proxy` carrying a W3C `traceparent` header:
/// the Claim and Complete it causes are spans of the caller's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_requests_join_the_callers_trace() {
    let (collector, collector_addr) = Collector::start().await;
    let upstream = crate::common::http::Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = crate::common::process::proxy_command(dir.path(), upstream.addr);
    command
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SDK_DISABLED");
    let mut process = spawn_command(command);
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let traceparent = format!("00-{trace_id}-b7ad6b7169203331-01");
    let answer = crate::common::http::send(
        process.addr,
        "POST",
        "/v1/orders",
        &[
            ("idempotency-key", "traced-1"),
            ("traceparent", &traceparent),
        ],
        b"{}",
    )
    .await;
    assert_eq!(answer.status, 201);
    // The upstream sees the caller's trace context too.
    assert_eq!(
        upstream.last_headers("/v1/orders").get("traceparent"),
        Some(&traceparent)
    );
    collector
        .wait_for("the proxied Claim and Complete spans", |spans| {
            ["Claim", "Complete"].iter().all(|rpc| {
                spans.iter().any(|(_, s)| {
                    s.name == format!("idemd.v1.Idempotency/{rpc}")
                        && hex::encode(&s.trace_id) == trace_id
                })
            })
        })
        .await;
    sigterm(&process);
    let _ = process.child.wait();
}
