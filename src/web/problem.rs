//! RFC 9457 problem details (`application/problem+json`), the error body of
//! both front doors, and the one mapping from gRPC codes to HTTP statuses.
//!
//! A problem from a gRPC status carries `grpc_code` (the code's name, e.g.
//! `INVALID_ARGUMENT`) and, when the status has `google.rpc` details, a
//! `details` array in their proto3 JSON form (`@type`
//! `type.googleapis.com/google.rpc.BadRequest` with `fieldViolations`,
//! `ErrorInfo` with `reason`, `RetryInfo` with `retryDelay`). The problem
//! `type` is `https://idemd.dev/problems/<name>`: the `error_code` of a
//! Claim outcome (`idempotency_key_reuse`, `request_in_progress`,
//! `outcome_pending`) or of the proxy (`idempotency_key_missing`, ...), or
//! the gRPC code in lower case.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;
use serde_json::{Map, Value, json};
use tonic::Code;
use tonic_types::StatusExt;

use crate::metrics::code_name;

/// Media type of problem details.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// Prefix of every problem `type` URI.
pub const TYPE_PREFIX: &str = "https://idemd.dev/problems/";

/// The HTTP status of a gRPC code: the mapping of `google.rpc.Code`
/// (grpc-gateway and Google APIs use the same one).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        // 499 is nginx's "client closed request", as in `google.rpc.Code`.
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// RFC 9457's own members, in the order it lists them.
const STANDARD: [&str; 4] = ["type", "title", "status", "detail"];

/// A problem being built: RFC 9457's members plus idemd's extensions.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// Members of the JSON object (`type`, `title`, `detail`, extensions).
    members: Map<String, Value>,
    /// The extensions' names in the order they were first set: the order
    /// they are written in (the map alone would sort them).
    extensions: Vec<String>,
    /// `Retry-After`, in whole seconds rounded up, when set.
    retry_after: Option<Duration>,
}

impl Problem {
    /// A problem of kind `name` (the last segment of its `type` URI).
    pub fn new(status: StatusCode, name: &str, detail: impl Into<String>) -> Self {
        let mut members = Map::new();
        members.insert("type".into(), Value::String(format!("{TYPE_PREFIX}{name}")));
        members.insert(
            "title".into(),
            Value::String(status.canonical_reason().unwrap_or("Error").to_string()),
        );
        members.insert("status".into(), json!(status.as_u16()));
        members.insert("detail".into(), Value::String(detail.into()));
        Self {
            status,
            members,
            extensions: Vec::new(),
            retry_after: None,
        }
    }

    /// The problem of a gRPC status: its code's HTTP status, `grpc_code`,
    /// and the status' details; `Retry-After` from its `RetryInfo`.
    pub fn from_status(status: &tonic::Status) -> Self {
        let code = status.code();
        let mut problem = Self::new(
            http_status(code),
            &code_name(code).to_ascii_lowercase(),
            status.message(),
        );
        problem.set("grpc_code", Value::String(code_name(code).to_string()));
        let details = status.get_error_details();
        let mut list = Vec::new();
        if let Some(bad_request) = details.bad_request() {
            let violations: Vec<Value> = bad_request
                .field_violations
                .iter()
                .map(|v| json!({"field": v.field, "description": v.description}))
                .collect();
            list.push(json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": violations,
            }));
        }
        if let Some(info) = details.error_info() {
            list.push(json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": info.reason,
                "domain": info.domain,
                "metadata": info.metadata,
            }));
        }
        if let Some(delay) = details.retry_info().and_then(|retry| retry.retry_delay) {
            list.push(json!({
                "@type": "type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay": format!("{:.3}s", delay.as_secs_f64()),
            }));
            problem.retry_after = Some(delay);
        }
        if !list.is_empty() {
            problem.set("details", Value::Array(list));
        }
        problem
    }

    /// Adds or replaces an extension member.
    pub fn set(&mut self, name: &str, value: Value) -> &mut Self {
        if self.members.insert(name.to_string(), value).is_none() && !STANDARD.contains(&name) {
            self.extensions.push(name.to_string());
        }
        self
    }

    /// Sets `Retry-After`.
    pub fn retry_after(&mut self, after: Duration) -> &mut Self {
        self.retry_after = Some(after);
        self
    }

    /// The JSON object.
    pub fn body(&self) -> Value {
        Value::Object(self.members.clone())
    }

    /// The JSON text: RFC 9457's members first, in the RFC's order (`type`,
    /// `title`, `status`, `detail`), then the extensions in the order they
    /// were set (`state` before `reason`, `field`, `grpc_code` before
    /// `details`). Every
    /// front end (this server's HTTP port, `idemd proxy`, each SDK's
    /// middleware) writes this order, so their bodies compare byte for
    /// byte; serde_json's map alone would sort `detail` first.
    pub fn to_json(&self) -> Vec<u8> {
        let standard = STANDARD
            .iter()
            .filter_map(|name| self.members.get_key_value(*name));
        let extensions = self
            .extensions
            .iter()
            .filter_map(|name| self.members.get_key_value(name.as_str()));
        let mut out = b"{".to_vec();
        for (index, (name, value)) in standard.chain(extensions).enumerate() {
            if index > 0 {
                out.push(b',');
            }
            // Strings and JSON values always serialise.
            out.extend(serde_json::to_vec(name).unwrap_or_default());
            out.push(b':');
            out.extend(serde_json::to_vec(value).unwrap_or_default());
        }
        out.push(b'}');
        out
    }

    /// The HTTP response.
    pub fn response(&self) -> http::Response<Full<Bytes>> {
        let body = self.to_json();
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, retry_after_value(after));
        }
        response
    }
}

/// `Retry-After` in delta-seconds, rounded up so a client never comes back
/// early, and at least 1 (0 would invite an immediate retry).
pub fn retry_after_value(after: Duration) -> HeaderValue {
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(seconds.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::status;

    #[test]
    fn members_are_written_in_the_rfcs_order_then_as_set() {
        let mut problem = Problem::new(StatusCode::CONFLICT, "outcome_pending", "not known");
        problem.set("state", json!("STATE_UNKNOWN"));
        problem.set("reason", json!("boom"));
        problem.set("state", json!("STATE_FAILED"));
        let text = String::from_utf8(problem.to_json()).expect("utf-8");
        assert_eq!(
            text,
            r#"{"type":"https://idemd.dev/problems/outcome_pending","title":"Conflict","status":409,"detail":"not known","state":"STATE_FAILED","reason":"boom"}"#
        );
        let parsed: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(parsed, problem.body());
    }

    #[test]
    fn a_field_violation_becomes_a_400_naming_the_field() {
        let status = status::invalid_field("key", "must not be empty");
        let problem = Problem::from_status(&status);
        assert_eq!(problem.status, StatusCode::BAD_REQUEST);
        let body = problem.body();
        assert_eq!(body["grpc_code"], "INVALID_ARGUMENT");
        assert_eq!(body["type"], "https://idemd.dev/problems/invalid_argument");
        assert_eq!(body["details"][0]["fieldViolations"][0]["field"], "key");
    }

    #[test]
    fn a_shed_call_gets_429_and_retry_after_rounded_up() {
        let status = status::shed("busy".into(), Duration::from_millis(100), "OVERLOADED");
        let problem = Problem::from_status(&status);
        let response = problem.response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let body = problem.body();
        let reasons: Vec<&Value> = body["details"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.get("reason"))
            .collect();
        assert_eq!(reasons, vec![&json!("OVERLOADED")]);
    }

    #[test]
    fn every_code_has_a_status() {
        for code in 0..17 {
            let code = Code::from_i32(code);
            assert!(http_status(code).as_u16() >= 200, "{code:?}");
            assert_eq!(Code::from_i32(code as i32), code);
        }
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
    }
}
