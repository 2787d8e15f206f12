//! The gRPC layer: `idemd.v1.Idempotency` and `idemd.v1.Audit` handlers.
//!
//! Each handler authenticates the caller (the tenant comes from credentials
//! only), converts the protobuf request into an engine call, and converts the
//! result back. Errors become statuses in [`status`] and nowhere else. This
//! layer never sees a storage type beyond the engine's domain records.

pub mod audit;
pub mod status;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::auth::{Action, Authenticator};
use crate::engine::{
    ClaimInput, ClaimOutcome, Disposition, Engine, EngineError, FingerprintInput, Lease,
    PendingInput, PreconditionReason, Verdict, validate,
};
use crate::metrics::{self as names, LabelGuard};
use crate::proto::v1 as pb;
use crate::store::{Record, RecordState, StoredResponse};

/// The `Idempotency` service.
#[derive(Debug, Clone)]
pub struct IdempotencyService {
    /// The state machine every RPC drives.
    engine: Arc<Engine>,
    /// Resolves the tenant of each call.
    auth: Authenticator,
    /// Caps the tenant/endpoint label values of the metrics.
    labels: Arc<LabelGuard>,
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
    fn tenant<T: HasEndpoint>(
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
    fn labels(&self, tenant: &str, endpoint: &str) -> (String, String) {
        let endpoint = if validate::endpoint(endpoint).is_ok() {
            endpoint
        } else {
            "_invalid"
        };
        self.labels.labels(tenant, endpoint)
    }

    fn count_claim(&self, tenant: &str, endpoint: &str, outcome: &'static str) {
        crate::telemetry::annotate(&[("idemd.outcome", outcome)]);
        let (tenant, endpoint) = self.labels(tenant, endpoint);
        metrics::counter!(names::CLAIMS, "tenant" => tenant, "endpoint" => endpoint, "outcome" => outcome)
            .increment(1);
    }

    fn count_lease_lost(&self, tenant: &str, endpoint: &str, error: &EngineError) {
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
    pb::ListAuditEventsRequest
);

/// Whether an error means the caller's request was refused as invalid.
fn is_rejection(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::InvalidArgument { .. } | EngineError::TooLarge { .. }
    )
}

/// Signed milliseconds of a protobuf duration, `None` when absent. Positive
/// sub-millisecond durations round up to 1 ms and negative ones stay
/// negative, so validation sees the sign the caller sent.
pub fn duration_ms(duration: Option<&prost_types::Duration>) -> Option<i64> {
    let duration = duration?;
    let nanos = i128::from(duration.seconds) * 1_000_000_000 + i128::from(duration.nanos);
    let millis = if nanos > 0 {
        (nanos + 999_999) / 1_000_000
    } else {
        -((-nanos + 999_999) / 1_000_000)
    };
    Some(i64::try_from(millis).unwrap_or(if millis > 0 { i64::MAX } else { i64::MIN }))
}

fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // rem_euclid(1000) < 1000, so the product fits an i32.
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// The longest `FailRequest.reason` the API accepts: front doors that write
/// reasons of their own (the proxy's upstream errors) cut theirs to it.
pub const MAX_REASON_BYTES: usize = validate::MAX_REASON_BYTES;

/// Checks an idempotency key by the API's rule, for front doors that read
/// keys from somewhere other than a request message (the proxy's
/// `Idempotency-Key` header); the error describes what is wrong, without
/// the field name, which the caller knows better.
pub fn check_key(key: &str) -> Result<(), String> {
    validate::key(key).map_err(|error| match error {
        EngineError::InvalidArgument { description, .. } => description,
        other => other.to_string(),
    })
}

/// A protobuf duration (saturating).
pub fn duration(value: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(value.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(value.subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf duration as a `std` one; negative parts count as zero.
pub fn std_duration(value: &prost_types::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from(value.seconds).unwrap_or(0))
        + std::time::Duration::from_nanos(u64::try_from(value.nanos).unwrap_or(0))
}

/// A protobuf timestamp as a `SystemTime`; instants before 1970 count as
/// the epoch.
pub fn system_time(value: &prost_types::Timestamp) -> std::time::SystemTime {
    std::time::UNIX_EPOCH
        + std_duration(&prost_types::Duration {
            seconds: value.seconds,
            nanos: value.nanos,
        })
}

/// A stored response as the engine keeps it; an absent message is the
/// empty response (status 0), which validation then judges.
pub fn response_from_pb(response: Option<pb::StoredResponse>) -> StoredResponse {
    let response = response.unwrap_or_default();
    StoredResponse {
        status: response.status,
        headers: response
            .headers
            .into_iter()
            .map(|header| (header.name, header.value))
            .collect(),
        body: response.body,
        body_ref: response.body_ref,
    }
}

fn response_to_pb(response: &StoredResponse) -> pb::StoredResponse {
    pb::StoredResponse {
        status: response.status,
        headers: response
            .headers
            .iter()
            .map(|(name, value)| pb::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        body: response.body.clone(),
        body_ref: response.body_ref.clone(),
    }
}

fn state_to_pb(state: RecordState) -> pb::State {
    match state {
        RecordState::InProgress => pb::State::InProgress,
        RecordState::Completed => pb::State::Completed,
        RecordState::Failed => pb::State::Failed,
        RecordState::Unknown => pb::State::Unknown,
    }
}

fn lease_to_pb(lease: &Lease) -> pb::Claimed {
    pb::Claimed {
        lease_token: lease.lease_token.clone(),
        lease_expires_at: Some(timestamp(lease.lease_expires_at_ms)),
        attempt: lease.attempt,
        expires_at: Some(timestamp(lease.expires_at_ms)),
    }
}

/// A record as the API shows it: never the lease token or attempt id.
pub fn record_to_pb(record: &Record, include_response: bool) -> pb::Record {
    pb::Record {
        endpoint: record.id.endpoint.clone(),
        key: record.id.key.clone(),
        state: state_to_pb(record.state).into(),
        fingerprint: record.fingerprint.clone(),
        attempt: record.attempt,
        created_at: Some(timestamp(record.created_at_ms)),
        lease_expires_at: (record.state == RecordState::InProgress)
            .then(|| timestamp(record.lease_expires_at_ms)),
        completed_at: record.completed_at_ms.map(timestamp),
        expires_at: Some(timestamp(record.expires_at_ms)),
        response: if include_response {
            record.response.as_ref().map(response_to_pb)
        } else {
            None
        },
        reason: record.reason.clone(),
    }
}

fn claim_response(outcome: ClaimOutcome, fingerprint: Vec<u8>) -> pb::ClaimResponse {
    use pb::claim_response::Outcome;
    let (outcome, http_status, error_code) = match outcome {
        ClaimOutcome::Claimed(lease) => (Outcome::Claimed(lease_to_pb(&lease)), 0, ""),
        ClaimOutcome::Replayed {
            response,
            completed_at_ms,
        } => {
            let status = response.status;
            (
                Outcome::Replayed(pb::Replayed {
                    response: Some(response_to_pb(&response)),
                    completed_at: Some(timestamp(completed_at_ms)),
                }),
                status,
                "",
            )
        }
        ClaimOutcome::InProgress {
            retry_after,
            lease_expires_at_ms,
        } => (
            Outcome::InProgress(pb::InProgress {
                retry_after: Some(duration(retry_after)),
                lease_expires_at: Some(timestamp(lease_expires_at_ms)),
            }),
            409,
            "request_in_progress",
        ),
        ClaimOutcome::Mismatch => (
            Outcome::Mismatch(pb::FingerprintMismatch {}),
            422,
            "idempotency_key_reuse",
        ),
        ClaimOutcome::Pending { state, reason } => (
            Outcome::Pending(pb::OutcomePending {
                state: state_to_pb(state).into(),
                reason,
            }),
            409,
            "outcome_pending",
        ),
    };
    pb::ClaimResponse {
        outcome: Some(outcome),
        http_status,
        error_code: error_code.to_string(),
        fingerprint,
    }
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
        let request = request.into_inner();
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
        Ok(Response::new(claim_response(
            result.outcome,
            result.fingerprint,
        )))
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let tenant = self.tenant(&request, Action::Execute)?;
        let request = request.into_inner();
        if request.response.is_none() {
            return Err(status::invalid_field("response", "is required"));
        }
        let response = response_from_pb(request.response);
        let size = response.stored_size();
        let expires_at_ms = self
            .engine
            .complete(
                &tenant,
                &request.endpoint,
                &request.key,
                &request.lease_token,
                response,
            )
            .await
            .map_err(|error| {
                self.count_lease_lost(&tenant, &request.endpoint, &error);
                status::engine_status(error)
            })?;
        let (tenant_label, endpoint_label) = self.labels(&tenant, &request.endpoint);
        metrics::counter!(names::COMPLETIONS, "tenant" => tenant_label, "endpoint" => endpoint_label)
            .increment(1);
        metrics::histogram!(names::STORED_RESPONSE_BYTES).record(size as f64);
        Ok(Response::new(pb::CompleteResponse {
            expires_at: Some(timestamp(expires_at_ms)),
        }))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_sign() {
        let d = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(duration_ms(None), None);
        assert_eq!(duration_ms(d(0, 0).as_ref()), Some(0));
        assert_eq!(duration_ms(d(0, 1).as_ref()), Some(1));
        assert_eq!(duration_ms(d(0, -1).as_ref()), Some(-1));
        assert_eq!(duration_ms(d(-5, 0).as_ref()), Some(-5000));
        assert_eq!(duration_ms(d(1, 500_000_000).as_ref()), Some(1500));
    }

    #[test]
    fn timestamps_handle_negative_instants() {
        assert_eq!(
            timestamp(-1),
            prost_types::Timestamp {
                seconds: -1,
                nanos: 999_000_000
            }
        );
        assert_eq!(
            timestamp(1500),
            prost_types::Timestamp {
                seconds: 1,
                nanos: 500_000_000
            }
        );
    }
}
