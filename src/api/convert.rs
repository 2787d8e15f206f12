//! Between protobuf and the engine's types: durations and timestamps,
//! stored responses, records, a Claim's outcome. Pure functions, shared by
//! both services' handlers.

use crate::engine::{ClaimOutcome, EngineError, Lease, validate};
use crate::proto::v1 as pb;
use crate::store::{Record, RecordState, StoredResponse};

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

pub(super) fn timestamp(ms: i64) -> prost_types::Timestamp {
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

pub(super) fn response_to_pb(response: &StoredResponse) -> pb::StoredResponse {
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

pub(super) fn state_to_pb(state: RecordState) -> pb::State {
    match state {
        RecordState::InProgress => pb::State::InProgress,
        RecordState::Completed => pb::State::Completed,
        RecordState::Failed => pb::State::Failed,
        RecordState::Unknown => pb::State::Unknown,
    }
}

pub(super) fn lease_to_pb(lease: &Lease) -> pb::Claimed {
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

pub(super) fn claim_response(outcome: ClaimOutcome, fingerprint: Vec<u8>) -> pb::ClaimResponse {
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
