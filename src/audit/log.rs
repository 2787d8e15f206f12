//! The audit log's contract: one [`AuditEvent`] per transition, how a
//! reader pages through them ([`AuditQuery`], [`AuditCursor`]), and the
//! [`AuditLog`] trait each backend implements. The module docs of
//! [`crate::audit`] state what an append promises.

use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::store::StoreError;

/// How long audit events are kept when not configured.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Most events one query returns.
pub const MAX_PAGE: usize = 1000;

/// One transition (or replay) of an audited key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditEvent {
    /// The authenticated tenant.
    pub tenant: String,
    /// The endpoint of the key.
    pub endpoint: String,
    /// Hex SHA-256 of the idempotency key: lets `idemd audit --key K` find a
    /// key's history without storing the key.
    pub key_sha256: String,
    /// When the transition became durable (Unix ms).
    pub at_ms: i64,
    /// Orders events of the same millisecond and makes `(at_ms, event_id)`
    /// unique, which is what pages resume from. See [`new_event_id`].
    pub event_id: i64,
    /// State before (`none` for a first claim).
    pub from_state: String,
    /// State after (`claimed`, `completed`, `released`, a verdict…).
    pub to_state: String,
    /// True when a Claim was answered with the stored response.
    pub replayed: bool,
    /// Attempt number of the record after the transition.
    pub attempt: u32,
    /// HTTP status of the stored response, 0 when there is none.
    pub response_status: u32,
    /// First 12 hex digits of the request fingerprint.
    pub fingerprint_prefix: String,
    /// Time from the RPC entering the engine to the transition, in µs.
    pub latency_us: u64,
}

impl AuditEvent {
    /// The position of this event in its tenant's timeline.
    pub fn cursor(&self) -> AuditCursor {
        AuditCursor {
            at_ms: self.at_ms,
            event_id: self.event_id,
        }
    }
}

/// A position in a tenant's timeline: events strictly after it are next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditCursor {
    /// Event time (Unix ms).
    pub at_ms: i64,
    /// Tie-breaker within the millisecond.
    pub event_id: i64,
}

impl AuditCursor {
    /// The cursor just before every event at or after `since_ms`.
    pub fn before(since_ms: i64) -> Self {
        Self {
            at_ms: since_ms.saturating_sub(1),
            event_id: i64::MAX,
        }
    }

    /// The opaque page token form (`at_ms.event_id`).
    pub fn to_token(self) -> String {
        format!("{}.{}", self.at_ms, self.event_id)
    }

    /// Parses a page token made by [`AuditCursor::to_token`].
    pub fn from_token(token: &str) -> Option<Self> {
        let (at, id) = token.split_once('.')?;
        Some(Self {
            at_ms: at.parse().ok()?,
            event_id: id.parse().ok()?,
        })
    }
}

/// What to read from the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    /// Always scoped to one tenant.
    pub tenant: String,
    /// Only this endpoint's events, when set.
    pub endpoint: Option<String>,
    /// Only this key's events (requires `endpoint`), when set.
    pub key_sha256: Option<String>,
    /// Events strictly after this position, oldest first.
    pub after: AuditCursor,
    /// At most this many events.
    pub limit: usize,
    /// Now (Unix ms): events older than the retention are never returned.
    pub now_ms: i64,
}

/// Append-only storage of audit events. Implementations never build a
/// `tonic::Status`; they report [`StoreError`].
#[async_trait]
pub trait AuditLog: Send + Sync + std::fmt::Debug {
    /// Backend name for metrics and logs.
    fn backend_name(&self) -> &'static str;

    /// Appends `events`; they are durable when this returns `Ok`.
    async fn append(&self, events: &[AuditEvent]) -> Result<(), StoreError>;

    /// Events matching `query`, ordered by `(at_ms, event_id)`, at most
    /// `query.limit`, none older than the retention.
    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditEvent>, StoreError>;

    /// Removes up to `batch` events older than the retention; returns how
    /// many. Backends with native expiry return 0.
    async fn sweep(&self, now_ms: i64, batch: usize) -> Result<usize, StoreError>;

    /// Flushes and releases resources.
    async fn close(&self) -> Result<(), StoreError>;
}

/// Hex SHA-256 of an idempotency key, as audit events store it.
pub fn key_sha256(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A fresh positive event id: increasing within this process (so one
/// replica's events of the same millisecond keep their order, e.g. a claim
/// and its immediate completion), from a random start (so two replicas'
/// ids do not collide). Events from different replicas in the same
/// millisecond are ordered arbitrarily; their clocks are not comparable at
/// that grain anyway.
pub fn new_event_id() -> i64 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicI64> = std::sync::OnceLock::new();
    NEXT.get_or_init(|| {
        // Below 2^62: a process can never count past i64::MAX from here.
        std::sync::atomic::AtomicI64::new((rand::random::<u64>() >> 2) as i64)
    })
    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The retention as milliseconds, for cut-off arithmetic.
pub(crate) fn retention_ms(retention: Duration) -> i64 {
    i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)
}
