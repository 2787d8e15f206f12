//! The `idemd.v1.Audit` handler: reads the audit log, scoped to the
//! caller's tenant like every other RPC.

use tonic::{Request, Response, Status};

use super::convert::{duration, timestamp};
use super::idempotency::IdempotencyService;
use super::status;
use crate::audit::AuditEvent;
use crate::auth::Action;
use crate::engine::AuditRequest;
use crate::proto::v1 as pb;

fn event_to_pb(event: AuditEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        endpoint: event.endpoint,
        key_sha256: event.key_sha256,
        at: Some(timestamp(event.at_ms)),
        from_state: event.from_state,
        to_state: event.to_state,
        replayed: event.replayed,
        attempt: event.attempt,
        response_status: event.response_status,
        fingerprint_prefix: event.fingerprint_prefix,
        latency: Some(duration(std::time::Duration::from_micros(event.latency_us))),
    }
}

/// Unix ms of a protobuf timestamp (saturating; `since` only bounds a scan).
pub fn timestamp_ms(value: &prost_types::Timestamp) -> i64 {
    value
        .seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(value.nanos) / 1_000_000)
}

#[tonic::async_trait]
impl pb::audit_server::Audit for IdempotencyService {
    async fn list_audit_events(
        &self,
        request: Request<pb::ListAuditEventsRequest>,
    ) -> Result<Response<pb::ListAuditEventsResponse>, Status> {
        let tenant = self.tenant(&request, Action::ReadAudit)?;
        let request = request.into_inner();
        let (events, next) = self
            .engine
            .audit_events(
                &tenant,
                AuditRequest {
                    endpoint: request.endpoint,
                    key: request.key,
                    since_ms: request.since.as_ref().map(timestamp_ms),
                    page_size: usize::try_from(request.page_size).unwrap_or(usize::MAX),
                    page_token: request.page_token,
                },
            )
            .await
            .map_err(status::engine_status)?;
        Ok(Response::new(pb::ListAuditEventsResponse {
            events: events.into_iter().map(event_to_pb).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }
}
