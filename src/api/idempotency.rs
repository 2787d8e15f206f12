//! The `idemd.v1.Idempotency` service: who the caller is, what it may do,
//! and each RPC as one engine call between two conversions
//! ([`super::convert`]).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::auth::{Action, Authenticator};
use crate::engine::{
    ClaimInput, Disposition, Engine, EngineError, FingerprintInput, PendingInput,
    PreconditionReason, Verdict, validate,
};
use crate::metrics::{self as names, LabelGuard};
use crate::proto::v1 as pb;

use super::convert::{
    claim_response, duration_ms, lease_to_pb, record_to_pb, response_from_pb, timestamp,
};
use super::{batch, status};

/// The `Idempotency` service.
#[derive(Debug, Clone)]
pub struct IdempotencyService {
    /// The state machine every RPC drives.
    pub(super) engine: Arc<Engine>,
    /// Resolves the tenant of each call.
    pub(super) auth: Authenticator,
    /// Caps the tenant/endpoint label values of the metrics.
    pub(super) labels: Arc<LabelGuard>,
}

/// Tenant label of calls that could not be authenticated.
const UNAUTHENTICATED_TENANT: &str = "_unauthenticated";

impl IdempotencyService {
    /// A service over `engine`, authenticating with `auth`.
    pub fn new(engine: Arc<Engine>, auth: Authenticator, labels: Arc<LabelGuard>) -> Self {
        Self {
            engine,
            auth,
            labels,
        }
    }

    /// Authenticates the caller and checks that its role and endpoint
    /// allow-list permit `action` on the request's endpoint; returns the
    /// tenant.
    pub(super) fn tenant<T: HasEndpoint>(
        &self,
        request: &Request<T>,
        action: Action,
    ) -> Result<String, Status> {
        let caller = self
            .auth
            .authenticate_request(request)
            .map_err(status::auth_status)?;
        crate::telemetry::annotate(&[("idemd.tenant", &caller.tenant)]);
        caller
            .authorize(action, request.get_ref().endpoint())
            .map_err(status::auth_status)?;
        Ok(caller.tenant)
    }

    /// Metric labels for a call; malformed endpoints share one value.
    pub(super) fn labels(&self, tenant: &str, endpoint: &str) -> (String, String) {
        let endpoint = if validate::endpoint(endpoint).is_ok() {
            endpoint
        } else {
            "_invalid"
        };
        self.labels.labels(tenant, endpoint)
    }

    pub(super) fn count_claim(&self, tenant: &str, endpoint: &str, outcome: &'static str) {
        crate::telemetry::annotate(&[("idemd.outcome", outcome)]);
        let (tenant, endpoint) = self.labels(tenant, endpoint);
        metrics::counter!(names::CLAIMS, "tenant" => tenant, "endpoint" => endpoint, "outcome" => outcome)
            .increment(1);
    }

    /// One Claim for an authenticated `tenant`: the single RPC and each item
    /// of ClaimBatch, so both answer alike.
    async fn claim_item(
        &self,
        tenant: &str,
        request: pb::ClaimRequest,
    ) -> Result<pb::ClaimResponse, Status> {
        let tenant = tenant.to_owned();
        let endpoint = request.endpoint.clone();
        let fingerprint = match request.fingerprint {
            Some(pb::claim_request::Fingerprint::Request(http)) => FingerprintInput::Request {
                method: http.method,
                path: http.path,
                body: http.body,
                content_type: http.content_type,
                ignore_fields: http.ignore_fields,
            },
            Some(pb::claim_request::Fingerprint::Sha256(digest)) => {
                FingerprintInput::Sha256(digest)
            }
            None => FingerprintInput::Missing,
        };
        let input = ClaimInput {
            endpoint: request.endpoint,
            key: request.key,
            fingerprint,
            lease_ms: duration_ms(request.lease.as_ref()),
            ttl_ms: duration_ms(request.ttl.as_ref()),
            wait_ms: duration_ms(request.wait.as_ref()),
            attempt_id: request.attempt_id,
        };
        let result = match self.engine.claim(&tenant, input).await {
            Ok(result) => result,
            Err(error) => {
                if is_rejection(&error) {
                    self.count_claim(&tenant, &endpoint, "rejected");
                }
                if let EngineError::RateLimited { .. } = error {
                    let (tenant, _) = self.labels(&tenant, &endpoint);
                    metrics::counter!(names::RATE_LIMITED, "tenant" => tenant, "limit" => "new_keys")
                        .increment(1);
                }
                return Err(status::engine_status(error));
            }
        };
        self.count_claim(&tenant, &endpoint, result.outcome.as_str());
        Ok(claim_response(result.outcome, result.fingerprint))
    }

    /// One Complete for an authenticated `tenant`: the single RPC and each
    /// item of CompleteBatch.
    async fn complete_item(
        &self,
        tenant: &str,
        request: pb::CompleteRequest,
    ) -> Result<pb::CompleteResponse, Status> {
        if request.response.is_none() {
            return Err(status::invalid_field("response", "is required"));
        }
        let response = response_from_pb(request.response);
        let size = response.stored_size();
        let expires_at_ms = self
            .engine
            .complete(
                tenant,
                &request.endpoint,
                &request.key,
                &request.lease_token,
                response,
            )
            .await
            .map_err(|error| {
                self.count_lease_lost(tenant, &request.endpoint, &error);
                status::engine_status(error)
            })?;
        let (tenant_label, endpoint_label) = self.labels(tenant, &request.endpoint);
        metrics::counter!(names::COMPLETIONS, "tenant" => tenant_label, "endpoint" => endpoint_label)
            .increment(1);
        metrics::histogram!(names::STORED_RESPONSE_BYTES).record(size as f64);
        Ok(pb::CompleteResponse {
            expires_at: Some(timestamp(expires_at_ms)),
        })
    }

    pub(super) fn count_lease_lost(&self, tenant: &str, endpoint: &str, error: &EngineError) {
        if let EngineError::FailedPrecondition {
            reason: PreconditionReason::LeaseLost,
            ..
        } = error
        {
            let (tenant, endpoint) = self.labels(tenant, endpoint);
            metrics::counter!(names::LEASE_LOST, "tenant" => tenant, "endpoint" => endpoint)
                .increment(1);
        }
    }
}

/// Request messages name the endpoint they act on (or filter by); that is
/// what a token's endpoint allow-list is checked against.
pub trait HasEndpoint {
    /// The endpoint, or empty for "all endpoints".
    fn endpoint(&self) -> &str;
}

macro_rules! has_endpoint {
    ($($message:ty),*) => {
        $(impl HasEndpoint for $message {
            fn endpoint(&self) -> &str {
                &self.endpoint
            }
        })*
    };
}

has_endpoint!(
    pb::ClaimRequest,
    pb::CompleteRequest,
    pb::FailRequest,
    pb::ExtendLeaseRequest,
    pb::LookupRequest,
    pb::ListPendingRequest,
    pb::ReconcileRequest,
    pb::ListAuditEventsRequest,
    pb::ClaimBatchRequest,
    pb::CompleteBatchRequest
);

/// Whether an error means the caller's request was refused as invalid.
pub(super) fn is_rejection(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::InvalidArgument { .. } | EngineError::TooLarge { .. }
    )
}

#[tonic::async_trait]
impl pb::idempotency_server::Idempotency for IdempotencyService {
    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let tenant = match self.tenant(&request, Action::Execute) {
            Ok(tenant) => tenant,
            Err(status) => {
                self.count_claim(
                    UNAUTHENTICATED_TENANT,
                    &request.get_ref().endpoint,
                    "rejected",
                );
                return Err(status);
            }
        };
        self.claim_item(&tenant, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        self.complete_item(&tenant, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn fail(
        &self,
        request: Request<pb::FailRequest>,
    ) -> Result<Response<pb::FailResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let request = request.into_inner();
        let disposition = match pb::Disposition::try_from(request.disposition) {
            Ok(pb::Disposition::Release) => Some(Disposition::Release),
            Ok(pb::Disposition::Unknown) => Some(Disposition::Unknown),
            Ok(pb::Disposition::Failed) => Some(Disposition::Failed),
            Ok(pb::Disposition::Unspecified) | Err(_) => None,
        };
        self.engine
            .fail(
                &tenant,
                &request.endpoint,
                &request.key,
                &request.lease_token,
                disposition,
                &request.reason,
            )
            .await
            .map_err(|error| {
                self.count_lease_lost(&tenant, &request.endpoint, &error);
                status::engine_status(error)
            })?;
        let disposition = match disposition {
            Some(Disposition::Release) => "release",
            Some(Disposition::Unknown) => "unknown",
            Some(Disposition::Failed) | None => "failed",
        };
        let (tenant_label, endpoint_label) = self.labels(&tenant, &request.endpoint);
        metrics::counter!(names::FAILURES, "tenant" => tenant_label, "endpoint" => endpoint_label, "disposition" => disposition)
            .increment(1);
        Ok(Response::new(pb::FailResponse {}))
    }

    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let request = request.into_inner();
        let lease_expires_at_ms = self
            .engine
            .extend_lease(
                &tenant,
                &request.endpoint,
                &request.key,
                &request.lease_token,
                duration_ms(request.lease.as_ref()),
            )
            .await
            .map_err(|error| {
                self.count_lease_lost(&tenant, &request.endpoint, &error);
                status::engine_status(error)
            })?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at: Some(timestamp(lease_expires_at_ms)),
        }))
    }

    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let request = request.into_inner();
        let record = self
            .engine
            .lookup(&tenant, &request.endpoint, &request.key)
            .await
            .map_err(status::engine_status)?;
        Ok(Response::new(pb::LookupResponse {
            record: Some(record_to_pb(&record, request.include_response)),
        }))
    }

    async fn list_pending(
        &self,
        request: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        let tenant = self.tenant(&request, Action::Reconcile)?;
        let request = request.into_inner();
        let page_token = if request.page_token.is_empty() {
            None
        } else {
            Some(hex::decode(&request.page_token).map_err(|_| {
                status::invalid_field("page_token", "not a token from a previous ListPending")
            })?)
        };
        let page = self
            .engine
            .list_pending(
                &tenant,
                PendingInput {
                    endpoint: request.endpoint,
                    older_than_ms: duration_ms(request.older_than.as_ref()),
                    page_size: request.page_size,
                    page_token,
                },
            )
            .await
            .map_err(status::engine_status)?;
        Ok(Response::new(pb::ListPendingResponse {
            records: page
                .records
                .iter()
                .map(|record| record_to_pb(record, false))
                .collect(),
            next_page_token: page.next_page_token.map(hex::encode).unwrap_or_default(),
        }))
    }

    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        use pb::reconcile_request::Verdict as PbVerdict;
        let tenant = self.tenant(&request, Action::Reconcile)?;
        let request = request.into_inner();
        let verdict = request.verdict.map(|verdict| match verdict {
            PbVerdict::Committed(response) => Verdict::Committed(response_from_pb(Some(response))),
            PbVerdict::Released(_) => Verdict::Released,
            PbVerdict::Failed(reason) => Verdict::Failed(reason),
            PbVerdict::Takeover(takeover) => Verdict::Takeover {
                lease_ms: duration_ms(takeover.lease.as_ref()),
            },
        });
        let verdict_name = verdict.as_ref().map_or("none", Verdict::as_str);
        let result = self
            .engine
            .reconcile(&tenant, &request.endpoint, &request.key, verdict)
            .await
            .map_err(status::engine_status)?;
        let (tenant_label, endpoint_label) = self.labels(&tenant, &request.endpoint);
        metrics::counter!(names::RECONCILIATIONS, "tenant" => tenant_label, "endpoint" => endpoint_label, "verdict" => verdict_name)
            .increment(1);
        Ok(Response::new(pb::ReconcileResponse {
            record: result.record.as_ref().map(|r| record_to_pb(r, true)),
            takeover: result.takeover.as_ref().map(lease_to_pb),
        }))
    }

    async fn claim_batch(
        &self,
        request: Request<pb::ClaimBatchRequest>,
    ) -> Result<Response<pb::ClaimBatchResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let batch = request.into_inner();
        batch::check(&batch.endpoint, "claims", batch.claims.len())?;
        // Each item on its own task, so the store sees them together (one
        // group commit on the embedded store, parallel LWTs on CQL) and
        // their CPU spreads over the runtime's threads; the order is kept.
        let service = Arc::new(self.clone());
        let tenant: Arc<str> = tenant.into();
        let endpoint: Arc<str> = batch.endpoint.into();
        let results =
            batch::run_items(batch.claims.into_iter().enumerate().map(|(index, claim)| {
                let (service, tenant, endpoint) =
                    (service.clone(), tenant.clone(), endpoint.clone());
                async move {
                    let claim = batch::with_endpoint("claims", index, &endpoint, claim)?;
                    service.claim_item(&tenant, claim).await
                }
            }))
            .await;
        Ok(Response::new(pb::ClaimBatchResponse {
            results: results
                .into_iter()
                .map(|result| pb::ClaimBatchResult {
                    result: Some(match result {
                        Ok(response) => pb::claim_batch_result::Result::Response(response),
                        Err(status) => {
                            pb::claim_batch_result::Result::Error(batch::item_error(status))
                        }
                    }),
                })
                .collect(),
        }))
    }

    async fn complete_batch(
        &self,
        request: Request<pb::CompleteBatchRequest>,
    ) -> Result<Response<pb::CompleteBatchResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let batch = request.into_inner();
        batch::check(&batch.endpoint, "completions", batch.completions.len())?;
        let service = Arc::new(self.clone());
        let tenant: Arc<str> = tenant.into();
        let endpoint: Arc<str> = batch.endpoint.into();
        let results = batch::run_items(batch.completions.into_iter().enumerate().map(
            |(index, completion)| {
                let (service, tenant, endpoint) =
                    (service.clone(), tenant.clone(), endpoint.clone());
                async move {
                    let completion =
                        batch::with_endpoint("completions", index, &endpoint, completion)?;
                    service.complete_item(&tenant, completion).await
                }
            },
        ))
        .await;
        Ok(Response::new(pb::CompleteBatchResponse {
            results: results
                .into_iter()
                .map(|result| pb::CompleteBatchResult {
                    result: Some(match result {
                        Ok(response) => pb::complete_batch_result::Result::Response(response),
                        Err(status) => {
                            pb::complete_batch_result::Result::Error(batch::item_error(status))
                        }
                    }),
                })
                .collect(),
        }))
    }
}
