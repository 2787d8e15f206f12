//! Decoding of every `idemd.v1` request message, then what the gRPC layer
//! does with it before the store: the conversions of `src/api` (mirrored in
//! `idemd_fuzz`, they are private), the engine's public validators, the
//! fingerprint of `ClaimRequest.request`, the pending-page and audit-page
//! tokens.
//!
//! Input: one selector byte (message type, modulo 8), then the encoded
//! message. Besides "never panics": a decoded message re-encodes to bytes
//! of exactly `encoded_len()` that decode to the same message.
#![no_main]

use std::fmt::Debug;

use idemd::api::audit::timestamp_ms;
use idemd::api::{duration_ms, response_from_pb};
use idemd::audit::{AuditCursor, key_sha256};
use idemd::engine::{Policy, validate};
use idemd::fingerprint::{self, RequestParts};
use idemd::proto::v1 as pb;
use idemd::store::embedded::codec;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Decodes `bytes`; when that works, checks the re-encoding round trip.
fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let encoded = message.encode_to_vec();
    assert_eq!(encoded.len(), message.encoded_len());
    let again = M::decode(encoded.as_slice()).expect("re-encoded message must decode");
    assert_eq!(again, message, "decode(encode(m)) != m");
    assert_eq!(again.encode_to_vec(), encoded, "encoding is not canonical");
    Some(message)
}

/// `Engine::identity` without the tenant (the tenant never comes from the
/// message body).
fn identity(endpoint: &str, key: &str) -> bool {
    validate::endpoint(endpoint).is_ok() && validate::key(key).is_ok()
}

fn check_response(field: &str, response: Option<pb::StoredResponse>) {
    let response = response_from_pb(response);
    let _ = response.stored_size();
    let _ = validate::response(field, &response, Policy::default().max_response_bytes);
}

fn claim(request: pb::ClaimRequest) {
    let policy = Policy::default();
    let _ = identity(&request.endpoint, &request.key);
    let _ = validate::attempt_id(&request.attempt_id);
    let _ = validate::positive_duration("lease", duration_ms(request.lease.as_ref()));
    let _ = validate::positive_duration("ttl", duration_ms(request.ttl.as_ref()));
    let _ = validate::non_negative_duration("wait", duration_ms(request.wait.as_ref()));
    match request.fingerprint {
        Some(pb::claim_request::Fingerprint::Request(http)) => {
            // As Engine::compute_fingerprint (private).
            if http.method.trim().is_empty()
                || !http.method.bytes().all(|b| b.is_ascii_alphabetic())
            {
                return;
            }
            let ignore: Vec<&str> = http
                .ignore_fields
                .iter()
                .chain(policy.ignore_fields.iter())
                .map(String::as_str)
                .collect();
            let parts = RequestParts {
                method: &http.method,
                path: &http.path,
                body: &http.body,
                content_type: &http.content_type,
            };
            if let Ok(digest) = fingerprint::fingerprint_v1(&parts, &ignore) {
                assert_eq!(digest.len(), fingerprint::FINGERPRINT_LEN);
            }
        }
        Some(pb::claim_request::Fingerprint::Sha256(digest)) => {
            let _ = digest.len() == fingerprint::FINGERPRINT_LEN;
        }
        None => {}
    }
}

fn list_pending(request: pb::ListPendingRequest) {
    if !request.endpoint.is_empty() {
        let _ = validate::endpoint(&request.endpoint);
    }
    let _ = validate::non_negative_duration("older_than", duration_ms(request.older_than.as_ref()));
    if request.page_token.is_empty() {
        return;
    }
    // The API hex-decodes the token; the embedded store decodes the bytes.
    let Ok(bytes) = hex::decode(&request.page_token) else {
        return;
    };
    if let Ok((since, id)) = codec::decode_pending_position("tenant", &bytes) {
        assert_eq!(
            codec::pending_position(since, &id),
            bytes,
            "page token does not round-trip"
        );
    }
}

fn list_audit_events(request: pb::ListAuditEventsRequest) {
    if !request.endpoint.is_empty() {
        let _ = validate::endpoint(&request.endpoint);
    }
    if !request.key.is_empty() && validate::key(&request.key).is_ok() {
        assert_eq!(key_sha256(&request.key).len(), 64);
    }
    if let Some(since) = request.since.as_ref() {
        let _ = AuditCursor::before(timestamp_ms(since));
    }
    let _ = usize::try_from(request.page_size).unwrap_or(usize::MAX);
    if let Some(cursor) = AuditCursor::from_token(&request.page_token) {
        assert_eq!(AuditCursor::from_token(&cursor.to_token()), Some(cursor));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % 8 {
        0 => {
            if let Some(request) = decode::<pb::ClaimRequest>(bytes) {
                claim(request);
            }
        }
        1 => {
            if let Some(request) = decode::<pb::CompleteRequest>(bytes) {
                let _ = identity(&request.endpoint, &request.key);
                let _ = validate::lease_token(&request.lease_token);
                if request.response.is_some() {
                    check_response("response", request.response);
                }
            }
        }
        2 => {
            if let Some(request) = decode::<pb::FailRequest>(bytes) {
                let _ = identity(&request.endpoint, &request.key);
                let _ = validate::lease_token(&request.lease_token);
                let _ = pb::Disposition::try_from(request.disposition);
                let _ = validate::reason("reason", &request.reason);
            }
        }
        3 => {
            if let Some(request) = decode::<pb::ExtendLeaseRequest>(bytes) {
                let _ = identity(&request.endpoint, &request.key);
                let _ = validate::lease_token(&request.lease_token);
                let _ = validate::positive_duration("lease", duration_ms(request.lease.as_ref()));
            }
        }
        4 => {
            if let Some(request) = decode::<pb::LookupRequest>(bytes) {
                let _ = identity(&request.endpoint, &request.key);
            }
        }
        5 => {
            if let Some(request) = decode::<pb::ListPendingRequest>(bytes) {
                list_pending(request);
            }
        }
        6 => {
            if let Some(request) = decode::<pb::ReconcileRequest>(bytes) {
                use pb::reconcile_request::Verdict;
                let _ = identity(&request.endpoint, &request.key);
                match request.verdict {
                    Some(Verdict::Committed(response)) => {
                        check_response("committed", Some(response))
                    }
                    Some(Verdict::Failed(reason)) => {
                        let _ = validate::reason("failed", &reason);
                    }
                    Some(Verdict::Takeover(takeover)) => {
                        let _ = validate::positive_duration(
                            "lease",
                            duration_ms(takeover.lease.as_ref()),
                        );
                    }
                    Some(Verdict::Released(_)) | None => {}
                }
            }
        }
        _ => {
            if let Some(request) = decode::<pb::ListAuditEventsRequest>(bytes) {
                list_audit_events(request);
            }
        }
    }
});
