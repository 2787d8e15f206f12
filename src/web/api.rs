//! The gRPC API over HTTP/JSON, on `--http-listen` (off by default), for
//! callers that cannot speak gRPC.
//!
//! Every RPC is a `POST` of its request message to a path of its own, and
//! answers `200` with the response message:
//!
//! | path                   | RPC                              |
//! |------------------------|----------------------------------|
//! | `/v1/claim`            | `idemd.v1.Idempotency/Claim`       |
//! | `/v1/complete`         | `idemd.v1.Idempotency/Complete`    |
//! | `/v1/fail`             | `idemd.v1.Idempotency/Fail`        |
//! | `/v1/extend-lease`     | `idemd.v1.Idempotency/ExtendLease` |
//! | `/v1/lookup`           | `idemd.v1.Idempotency/Lookup`      |
//! | `/v1/list-pending`     | `idemd.v1.Idempotency/ListPending` |
//! | `/v1/reconcile`        | `idemd.v1.Idempotency/Reconcile`   |
//! | `/v1/audit-events`     | `idemd.v1.Audit/ListAuditEvents`   |
//!
//! Messages use the standard proto3 JSON mapping (lowerCamelCase names,
//! `bytes` as base64, durations as `"1.5s"`, timestamps in RFC 3339, enums
//! by name; proto field names are accepted too), derived at run time from
//! the service's descriptor set with `prost-reflect` rather than written by
//! hand. Credentials are the gRPC port's: `Authorization: Bearer <token>`,
//! a client certificate over mTLS, or `x-tenant-id` with auth off. Errors
//! are problem details ([`super::problem`]) with the gRPC code and details.

use http::{HeaderValue, Method, StatusCode, header};
use hyper::body::Incoming;

use super::call::{Connection, Services, grpc_request, read_body};
use super::problem::Problem;
use super::serve::{Body, boxed, full};
use crate::proto::json::{self, JsonError};
use crate::proto::v1 as pb;
use crate::proto::v1::audit_server::Audit;
use crate::proto::v1::idempotency_server::Idempotency;

/// Largest JSON request body: a 4 MiB stored response is 5.4 MiB in
/// base64, plus the other fields.
pub const MAX_JSON_BODY_BYTES: usize = 8 * 1024 * 1024;

fn problem(error: JsonError) -> Problem {
    match error {
        JsonError::Invalid(detail) => {
            let mut problem = Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("request body: {detail}"),
            );
            problem.set("grpc_code", "INVALID_ARGUMENT".into());
            problem
        }
        JsonError::Internal(detail) => {
            Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", detail)
        }
    }
}

fn from_json<T: prost::Message + Default>(name: &str, body: &[u8]) -> Result<T, Problem> {
    json::from_json(name, body).map_err(problem)
}

fn to_json<T: prost::Message>(name: &str, message: &T) -> Result<Vec<u8>, Problem> {
    let value = json::to_json(name, message).map_err(problem)?;
    serde_json::to_vec(&value).map_err(|e| problem(JsonError::Internal(e.to_string())))
}

/// The API's routes, each once: generates [`ROUTES`] and [`call`], which
/// decodes the request, calls the RPC in process and encodes its answer.
macro_rules! api {
    ($($path:literal => $service:ident :: $method:ident($request:ident => $response:ident),)*) => {
        /// Paths of the API, in the order of the table above.
        pub const ROUTES: &[&str] = &[$($path),*];

        /// The JSON answer of the RPC at `path` (one of [`ROUTES`]).
        async fn call<S: Services>(
            services: &S,
            path: &str,
            body: &[u8],
            headers: &http::HeaderMap,
            connection: &Connection,
        ) -> Result<Vec<u8>, Problem> {
            match path {
                $($path => {
                    let message: pb::$request =
                        from_json(concat!("idemd.v1.", stringify!($request)), body)?;
                    let request = grpc_request(message, headers, &header::AUTHORIZATION, connection);
                    let response = <S as $service>::$method(services, request)
                        .await
                        .map_err(|status| Problem::from_status(&status))?;
                    to_json(concat!("idemd.v1.", stringify!($response)), response.get_ref())
                })*
                _ => Err(Problem::new(StatusCode::NOT_FOUND, "not_found", format!("no RPC at {path}"))),
            }
        }
    };
}

api! {
    "/v1/claim" => Idempotency::claim(ClaimRequest => ClaimResponse),
    "/v1/complete" => Idempotency::complete(CompleteRequest => CompleteResponse),
    "/v1/fail" => Idempotency::fail(FailRequest => FailResponse),
    "/v1/extend-lease" => Idempotency::extend_lease(ExtendLeaseRequest => ExtendLeaseResponse),
    "/v1/lookup" => Idempotency::lookup(LookupRequest => LookupResponse),
    "/v1/list-pending" => Idempotency::list_pending(ListPendingRequest => ListPendingResponse),
    "/v1/reconcile" => Idempotency::reconcile(ReconcileRequest => ReconcileResponse),
    "/v1/audit-events" => Audit::list_audit_events(ListAuditEventsRequest => ListAuditEventsResponse),
}

/// Handles one request of the JSON API.
pub async fn handle<S: Services>(
    services: &S,
    request: http::Request<Incoming>,
    connection: &Connection,
) -> http::Response<Body> {
    match dispatch(services, request, connection).await {
        Ok(json) => {
            let mut response = http::Response::new(full(json));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(problem) => boxed(problem.response()),
    }
}

async fn dispatch<S: Services>(
    services: &S,
    request: http::Request<Incoming>,
    connection: &Connection,
) -> Result<Vec<u8>, Problem> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let known = ROUTES.contains(&path.as_str());
    if !known {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no RPC at {path}; the API is POST {}", ROUTES.join(", ")),
        ));
    }
    if parts.method != Method::POST {
        let mut problem = Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{path} takes POST, not {}", parts.method),
        );
        problem.set("allow", "POST".into());
        return Err(problem);
    }
    if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE) {
        let json = content_type
            .to_str()
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .is_ok_and(|v| v == "application/json" || v.ends_with("+json"));
        if !json {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "content-type must be application/json",
            ));
        }
    }
    let body = read_body(body, MAX_JSON_BODY_BYTES).await?;
    call(services, &path, &body, &parts.headers, connection).await
}
