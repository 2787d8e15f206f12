//! The engine's inputs and answers, as the gRPC layer hands them over and
//! gets them back (no protobuf types: `api` converts).

use std::time::Duration;

use crate::store::{Record, RecordState, StoredResponse};

/// What identifies a request's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintInput {
    /// The server computes fingerprint v1.
    Request {
        /// HTTP method.
        method: String,
        /// Path.
        path: String,
        /// Body bytes.
        body: Vec<u8>,
        /// Media type.
        content_type: String,
        /// Request-specific volatile fields.
        ignore_fields: Vec<String>,
    },
    /// A digest computed by the caller (must be 32 bytes).
    Sha256(Vec<u8>),
    /// The caller sent neither (an error).
    Missing,
}

/// A Claim call. Durations are signed milliseconds as sent (`None` when
/// absent) so that validation sees negative values.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    /// Logical endpoint.
    pub endpoint: String,
    /// Idempotency key.
    pub key: String,
    /// Request fingerprint source.
    pub fingerprint: FingerprintInput,
    /// Requested lease.
    pub lease_ms: Option<i64>,
    /// Requested dedup window.
    pub ttl_ms: Option<i64>,
    /// How long to wait for an in-flight duplicate.
    pub wait_ms: Option<i64>,
    /// Identifies this Claim call across transport retries.
    pub attempt_id: String,
}

/// A lease handed to a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Fencing token.
    pub lease_token: String,
    /// When the lease runs out.
    pub lease_expires_at_ms: i64,
    /// Execution attempt number.
    pub attempt: u32,
    /// When the record expires.
    pub expires_at_ms: i64,
}

/// What a Claim tells the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Run the side effect.
    Claimed(Lease),
    /// Return the stored response.
    Replayed {
        /// As stored.
        response: StoredResponse,
        /// When it was stored.
        completed_at_ms: i64,
    },
    /// Someone else is running it.
    InProgress {
        /// Hint for the retry.
        retry_after: Duration,
        /// When the holder's lease runs out.
        lease_expires_at_ms: i64,
    },
    /// Different request under the same key.
    Mismatch,
    /// Needs reconciliation.
    Pending {
        /// Stored state.
        state: RecordState,
        /// Why.
        reason: String,
    },
}

impl ClaimOutcome {
    /// Stable lowercase name (logs, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            ClaimOutcome::Claimed(_) => "claimed",
            ClaimOutcome::Replayed { .. } => "replayed",
            ClaimOutcome::InProgress { .. } => "in_progress",
            ClaimOutcome::Mismatch => "mismatch",
            ClaimOutcome::Pending { .. } => "pending",
        }
    }
}

/// Result of a Claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimResult {
    /// What to do.
    pub outcome: ClaimOutcome,
    /// The digest compared.
    pub fingerprint: Vec<u8>,
}

/// How a holder ends a claim without a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Nothing happened: delete the claim.
    Release,
    /// It may have happened: UNKNOWN.
    Unknown,
    /// It failed definitively: FAILED.
    Failed,
}

/// A reconciler's decision on a pending record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The side effect happened; store this response.
    Committed(StoredResponse),
    /// It did not happen; delete the record.
    Released,
    /// It failed; record the reason.
    Failed(String),
    /// Give a new lease to the reconciler.
    Takeover {
        /// Requested lease in signed milliseconds.
        lease_ms: Option<i64>,
    },
}

impl Verdict {
    /// Stable lowercase name (logs, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Committed(_) => "committed",
            Verdict::Released => "released",
            Verdict::Failed(_) => "failed",
            Verdict::Takeover { .. } => "takeover",
        }
    }
}

/// Result of a Reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileResult {
    /// The record after the decision (`None` after `released`).
    pub record: Option<Record>,
    /// The new lease after `takeover`.
    pub takeover: Option<Lease>,
}

/// A ListPending call.
#[derive(Debug, Clone, Default)]
pub struct PendingInput {
    /// Only this endpoint (empty: all).
    pub endpoint: String,
    /// Only records at least this old (signed ms).
    pub older_than_ms: Option<i64>,
    /// Requested page size (0: default).
    pub page_size: u32,
    /// Continuation token from the previous page.
    pub page_token: Option<Vec<u8>>,
}

/// Records that need a decision, for the pending gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSummary {
    /// Count per state name (in_progress past lease, unknown, failed).
    pub counts: Vec<(&'static str, usize)>,
    /// How long the oldest has needed a decision.
    pub oldest_age: Duration,
}

/// What [`Engine::audit_events`] reads (the RPC's fields, as given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditRequest {
    /// Only this endpoint (required with `key`); empty for all.
    pub endpoint: String,
    /// Only this key's history; empty for the timeline.
    pub key: String,
    /// Events at or after this instant (Unix ms).
    pub since_ms: Option<i64>,
    /// Page size; 0 for the default.
    pub page_size: usize,
    /// Resume token; empty for the first page.
    pub page_token: String,
}
