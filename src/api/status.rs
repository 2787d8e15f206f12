//! The one place where errors become gRPC statuses.
//!
//! | engine error            | code                  | details                                  |
//! |-------------------------|-----------------------|------------------------------------------|
//! | `InvalidArgument`       | `INVALID_ARGUMENT`    | `google.rpc.BadRequest` naming the field |
//! | `TooLarge`              | `RESOURCE_EXHAUSTED`  | `google.rpc.BadRequest` naming the field |
//! | `NotFound`              | `NOT_FOUND`           |                                          |
//! | `FailedPrecondition`    | `FAILED_PRECONDITION` | `google.rpc.ErrorInfo` (LEASE_LOST, ...) |
//! | `Contention`            | `ABORTED`             | retry the call                           |
//! | `RateLimited`           | `RESOURCE_EXHAUSTED`  | RetryInfo + ErrorInfo `RATE_LIMITED`     |
//! | in-flight limit (server)| `RESOURCE_EXHAUSTED`  | RetryInfo + ErrorInfo `OVERLOADED`       |
//! | store `Unavailable`     | `UNAVAILABLE`         | nothing was applied; retry               |
//! | store `Uncertain`       | `UNAVAILABLE`         | ErrorInfo `OUTCOME_UNKNOWN`              |
//! | store `Corrupt`         | `DATA_LOSS`           |                                          |
//! | store `Undecryptable`   | `INTERNAL`            | ErrorInfo `RESPONSE_UNDECRYPTABLE`; names the key id |
//! | store `Closed`          | `UNAVAILABLE`         | shutting down                            |
//! | auth: no/unknown token  | `UNAUTHENTICATED`     |                                          |
//! | auth: client cert unmapped, or token and cert tenants differ | `UNAUTHENTICATED` |               |
//! | auth: role or endpoint  | `PERMISSION_DENIED`   | ErrorInfo `ROLE_NOT_ALLOWED` / `ENDPOINT_NOT_ALLOWED` |
//! | auth off, remote caller (protected mode) | `PERMISSION_DENIED` | ErrorInfo `UNAUTHENTICATED_REMOTE_REFUSED`, metadata `flag`; why not `UNAUTHENTICATED`: see [`crate::auth`] |

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::{ALLOW_REMOTE_FLAG, AuthError};
use crate::engine::EngineError;
use crate::store::StoreError;

/// `ErrorInfo.domain` of every error idemd reports.
pub const ERROR_DOMAIN: &str = "idemd.dev";

fn bad_request(code: Code, field: &str, description: &str) -> Status {
    Status::with_error_details(
        code,
        format!("{field}: {description}"),
        ErrorDetails::with_bad_request_violation(field, description),
    )
}

fn error_info(code: Code, message: String, reason: &str) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::<String, String>::new()),
    )
}

/// `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` (when to retry) and
/// `ErrorInfo` (why): a limit refused the call and nothing was done.
pub fn shed(message: String, retry_after: std::time::Duration, reason: &str) -> Status {
    let mut details = ErrorDetails::with_retry_info(Some(retry_after));
    details.set_error_info(reason, ERROR_DOMAIN, HashMap::<String, String>::new());
    Status::with_error_details(Code::ResourceExhausted, message, details)
}

/// Maps an engine error to the status the caller sees.
pub fn engine_status(error: EngineError) -> Status {
    match error {
        EngineError::InvalidArgument { field, description } => {
            bad_request(Code::InvalidArgument, &field, &description)
        }
        EngineError::TooLarge { field, description } => {
            bad_request(Code::ResourceExhausted, &field, &description)
        }
        EngineError::NotFound(message) => Status::not_found(message),
        EngineError::FailedPrecondition {
            reason,
            description,
        } => error_info(Code::FailedPrecondition, description, reason.as_str()),
        EngineError::Contention(message) => Status::aborted(message),
        EngineError::ClockOffset(message) => error_info(
            Code::Unavailable,
            format!(
                "nothing was applied; retry, on another replica if this one persists: {message}"
            ),
            "CLOCK_OFFSET",
        ),
        EngineError::RateLimited {
            retry_after,
            description,
        } => shed(description, retry_after, "RATE_LIMITED"),
        EngineError::Store(store) => store_status(store),
    }
}

fn store_status(error: StoreError) -> Status {
    match error {
        StoreError::Unavailable(detail) => Status::unavailable(format!(
            "store unavailable, nothing was applied; retry: {detail}"
        )),
        StoreError::Uncertain(detail) => error_info(
            Code::Unavailable,
            format!(
                "store write outcome unknown (it may or may not have been applied); retry the same call to find out: {detail}"
            ),
            "OUTCOME_UNKNOWN",
        ),
        StoreError::InvalidPageToken => bad_request(
            Code::InvalidArgument,
            "page_token",
            "not a token from a previous call",
        ),
        StoreError::Corrupt(detail) => {
            Status::data_loss(format!("stored record is corrupt: {detail}"))
        }
        // Not DATA_LOSS: the value is intact, the server lacks the right key
        // (an operator fixes the keyring; retrying the call does not help).
        StoreError::Undecryptable(detail) => error_info(
            Code::Internal,
            format!("stored response cannot be decrypted: {detail}"),
            "RESPONSE_UNDECRYPTABLE",
        ),
        StoreError::Closed => {
            Status::unavailable("server is shutting down; retry on another replica")
        }
    }
}

/// Maps an authentication failure.
pub fn auth_status(error: AuthError) -> Status {
    match error {
        AuthError::Missing
        | AuthError::Unknown
        | AuthError::MissingCertificate
        | AuthError::BadCertificate(_)
        | AuthError::UnmappedCertificate
        | AuthError::AmbiguousCertificate
        | AuthError::TenantMismatch => Status::unauthenticated(error.to_string()),
        AuthError::BadTenantHeader(description) => {
            bad_request(Code::InvalidArgument, "x-tenant-id", &description)
        }
        AuthError::RoleNotAllowed { .. } => error_info(
            Code::PermissionDenied,
            error.to_string(),
            "ROLE_NOT_ALLOWED",
        ),
        AuthError::EndpointNotAllowed => error_info(
            Code::PermissionDenied,
            error.to_string(),
            "ENDPOINT_NOT_ALLOWED",
        ),
        AuthError::RemoteWithoutAuthentication { .. } => Status::with_error_details(
            Code::PermissionDenied,
            error.to_string(),
            ErrorDetails::with_error_info(
                "UNAUTHENTICATED_REMOTE_REFUSED",
                ERROR_DOMAIN,
                HashMap::from([("flag".to_string(), ALLOW_REMOTE_FLAG.to_string())]),
            ),
        ),
    }
}

/// An invalid-argument status for a wire-level problem found while
/// converting a message (before the engine sees it).
pub fn invalid_field(field: &str, description: &str) -> Status {
    bad_request(Code::InvalidArgument, field, description)
}

/// A batch item whose task panicked: INTERNAL for that item alone.
pub fn item_panicked(error: &tokio::task::JoinError) -> Status {
    Status::internal(format!(
        "idemd failed on this item ({error}); nothing is known to be applied or not, so treat it as uncertain"
    ))
}
