//! The one place every RPC passes through, whichever door it came in by
//! (the gRPC port, or the HTTP front doors of [`crate::web`] calling in
//! process): admission (load shedding), the engine once the store is open,
//! the `idemd_rpc_duration_seconds` metric and the RPC's span.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::api::IdempotencyService;
use crate::proto::v1 as pb;

/// The engine once the store is open; Idempotency RPCs before that are
/// refused with `UNAVAILABLE`.
#[derive(Clone)]
pub(super) struct EngineSlot {
    /// Set once the store is open.
    pub(super) service: Arc<OnceLock<IdempotencyService>>,
    /// RPCs in progress, for load shedding.
    in_flight: Arc<AtomicUsize>,
    /// Most RPCs in progress at once; 0 = unlimited.
    max_in_flight: usize,
}

/// How long a shed caller is told to wait: long enough for a burst to
/// drain, short enough not to add visible latency to a retry.
const SHED_RETRY_AFTER: Duration = Duration::from_millis(100);

/// Releases an in-flight slot when the RPC ends (however it ends).
struct InFlightSlot(Arc<AtomicUsize>);

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl EngineSlot {
    pub(super) fn new(max_in_flight: usize) -> Self {
        Self {
            service: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight,
        }
    }

    fn get(&self) -> Result<&IdempotencyService, Status> {
        self.service
            .get()
            .ok_or_else(|| Status::unavailable("idemd is starting: the store is not open yet"))
    }

    /// Takes an in-flight slot, or sheds the call when all are taken:
    /// refusing early and cheaply keeps latency bounded for the calls
    /// already admitted instead of queueing everyone.
    fn admit(&self) -> Result<InFlightSlot, Status> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = InFlightSlot(Arc::clone(&self.in_flight));
        if self.max_in_flight > 0 && before >= self.max_in_flight {
            metrics::counter!(crate::metrics::RATE_LIMITED, "tenant" => "_all", "limit" => "in_flight")
                .increment(1);
            return Err(crate::api::status::shed(
                format!(
                    "idemd is at its limit of {} calls in progress; retry shortly",
                    self.max_in_flight
                ),
                SHED_RETRY_AFTER,
                "OVERLOADED",
            ));
        }
        Ok(slot)
    }
}

/// Delegates every RPC to the service once it exists, records each call's
/// latency and status code (`idemd_rpc_duration_seconds`) and, with tracing
/// on, runs it in its span (see [`crate::telemetry`]): the one place every
/// RPC passes through. Every request message has an `endpoint` field (the
/// endpoint, or the endpoint filter), recorded on the span.
macro_rules! delegate {
    ($service:path, $service_name:literal { $($method:ident($request:ty) -> $response:ty, $name:literal;)* }) => {
        #[tonic::async_trait]
        impl $service for EngineSlot {
            $(
                async fn $method(&self, request: Request<$request>) -> Result<Response<$response>, Status> {
                    let started = std::time::Instant::now();
                    let span = crate::telemetry::rpc_context($service_name, $name, request.metadata());
                    let admitted = self.admit();
                    let result = match (admitted.and_then(|slot| self.get().map(|service| (slot, service))), &span) {
                        (Ok((_slot, service)), Some(context)) => {
                            let context = context.clone();
                            let endpoint = request.get_ref().endpoint.clone();
                            opentelemetry::context::FutureExt::with_context(async move {
                                crate::telemetry::annotate(&[("idemd.endpoint", &endpoint)]);
                                <IdempotencyService as $service>::$method(service, request).await
                            }, context).await
                        }
                        (Ok((_slot, service)), None) => <IdempotencyService as $service>::$method(service, request).await,
                        (Err(status), _) => Err(status),
                    };
                    let code = result.as_ref().map_or_else(|status| status.code(), |_| tonic::Code::Ok);
                    if let Some(context) = &span {
                        crate::telemetry::end_rpc(context, code);
                    }
                    metrics::histogram!(
                        crate::metrics::RPC_DURATION,
                        "rpc" => $name,
                        "code" => crate::metrics::code_name(code)
                    )
                    .record(started.elapsed().as_secs_f64());
                    result
                }
            )*
        }
    };
}

delegate! {
    pb::idempotency_server::Idempotency, "idemd.v1.Idempotency" {
        claim(pb::ClaimRequest) -> pb::ClaimResponse, "Claim";
        complete(pb::CompleteRequest) -> pb::CompleteResponse, "Complete";
        fail(pb::FailRequest) -> pb::FailResponse, "Fail";
        extend_lease(pb::ExtendLeaseRequest) -> pb::ExtendLeaseResponse, "ExtendLease";
        lookup(pb::LookupRequest) -> pb::LookupResponse, "Lookup";
        list_pending(pb::ListPendingRequest) -> pb::ListPendingResponse, "ListPending";
        reconcile(pb::ReconcileRequest) -> pb::ReconcileResponse, "Reconcile";
        claim_batch(pb::ClaimBatchRequest) -> pb::ClaimBatchResponse, "ClaimBatch";
        complete_batch(pb::CompleteBatchRequest) -> pb::CompleteBatchResponse, "CompleteBatch";
    }
}

delegate! {
    pb::audit_server::Audit, "idemd.v1.Audit" {
        list_audit_events(pb::ListAuditEventsRequest) -> pb::ListAuditEventsResponse, "ListAuditEvents";
    }
}
