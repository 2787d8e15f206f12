//! Errors of the engine: what went wrong, in the caller's terms.
//!
//! Every variant carries what the caller needs to fix or retry the request
//! (the offending field, the precondition that failed). The gRPC layer maps
//! them to status codes in exactly one place (`api::status`).

use crate::store::StoreError;

/// Why a precondition failed; surfaced as `google.rpc.ErrorInfo.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreconditionReason {
    /// The caller's lease token is not the record's current one (never
    /// issued, or fenced out by a takeover).
    LeaseLost,
    /// Reconcile on a record that does not need a decision.
    NotPending,
    /// The record is already completed (with a different response).
    AlreadyCompleted,
    /// The record is FAILED or UNKNOWN: only Reconcile may decide it.
    NotInProgress,
    /// The audit log was asked for while no endpoint is audited.
    AuditDisabled,
}

impl PreconditionReason {
    /// The `ErrorInfo.reason` string (stable API).
    pub fn as_str(self) -> &'static str {
        match self {
            PreconditionReason::LeaseLost => "LEASE_LOST",
            PreconditionReason::NotPending => "NOT_PENDING",
            PreconditionReason::AlreadyCompleted => "ALREADY_COMPLETED",
            PreconditionReason::NotInProgress => "NOT_IN_PROGRESS",
            PreconditionReason::AuditDisabled => "AUDIT_DISABLED",
        }
    }
}

/// An engine failure. Nothing was changed in the store unless the variant
/// says the outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A request field is malformed or out of range.
    #[error("{field}: {description}")]
    InvalidArgument {
        /// The field path, e.g. `key` or `request.ignore_fields[2]`.
        field: String,
        /// What is wrong with it.
        description: String,
    },
    /// A request field is larger than a limit allows.
    #[error("{field}: {description}")]
    TooLarge {
        /// The field path.
        field: String,
        /// The size and the limit.
        description: String,
    },
    /// No live record for the key.
    #[error("{0}")]
    NotFound(String),
    /// This replica's clock may be too far off the cluster's to grant or
    /// extend a lease (see `engine::skew`); another replica can.
    #[error("{0}")]
    ClockOffset(String),
    /// The record is not in a state that allows the operation.
    #[error("{description}")]
    FailedPrecondition {
        /// Machine-readable reason.
        reason: PreconditionReason,
        /// Human-readable explanation.
        description: String,
    },
    /// The record kept changing under the operation; retry.
    #[error("{0}")]
    Contention(String),
    /// The tenant created keys faster than its limit allows; nothing was
    /// written.
    #[error("{description}")]
    RateLimited {
        /// When a retry can succeed.
        retry_after: std::time::Duration,
        /// Human-readable explanation.
        description: String,
    },
    /// The store failed (nothing applied, or the outcome is unknown).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    /// An invalid-argument error for `field`.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        EngineError::InvalidArgument {
            field: field.into(),
            description: description.into(),
        }
    }

    /// A too-large error for `field`.
    pub fn too_large(field: impl Into<String>, description: impl Into<String>) -> Self {
        EngineError::TooLarge {
            field: field.into(),
            description: description.into(),
        }
    }

    /// A failed precondition.
    pub fn precondition(reason: PreconditionReason, description: impl Into<String>) -> Self {
        EngineError::FailedPrecondition {
            reason,
            description: description.into(),
        }
    }
}

/// Result type of engine operations.
pub type EngineResult<T> = Result<T, EngineError>;
