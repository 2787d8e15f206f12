//! Helpers shared by the fuzz targets.
//!
//! The gRPC handlers in `src/api` convert protobuf messages with private
//! functions (`duration_ms`, `response_from_pb`, `timestamp_ms`). The fuzz
//! package cannot call them, so this file carries exact copies; keep them in
//! step with `src/api/mod.rs` and `src/api/audit.rs` (fuzz/README.md names
//! the visibility change that would make the copies unnecessary).

use idemd::proto::v1 as pb;
use idemd::store::StoredResponse;

/// Copy of `idemd::api::duration_ms` (private): signed milliseconds of a
/// protobuf duration, `None` when absent.
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

/// Copy of `idemd::api::response_from_pb` (private).
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

/// Copy of `idemd::api::audit::timestamp_ms` (private).
pub fn timestamp_ms(value: &prost_types::Timestamp) -> i64 {
    value
        .seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(value.nanos) / 1_000_000)
}

/// Splits fuzz input at the first NUL byte: the part before (if any NUL is
/// present) and the part after. Without a NUL, the head is empty.
pub fn split_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&[], data),
    }
}

/// Newline-separated lines of `bytes` as strings (lossy UTF-8).
pub fn lines(bytes: &[u8]) -> Vec<String> {
    if bytes.is_empty() {
        return Vec::new();
    }
    String::from_utf8_lossy(bytes)
        .split('\n')
        .map(str::to_string)
        .collect()
}

/// RFC 6901 escaping of one reference token (inverse of the unescaping in
/// `idemd::fingerprint::canonical_json::parse_pointer`).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
