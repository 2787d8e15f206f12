//! What the store keeps per idempotency key: the record's identity, its
//! lifecycle state and the stored response. Plain data: every backend
//! encodes it its own way (`embedded::codec`, the CQL row).

/// Identity of a record: what one idempotency key means.
///
/// The tenant is always part of it, so no lookup can cross tenants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey {
    /// The authenticated tenant (from credentials, never from the request).
    pub tenant: String,
    /// The logical endpoint, e.g. `POST /v1/payments`.
    pub endpoint: String,
    /// The client's idempotency key.
    pub key: String,
}

/// Lifecycle state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// A caller holds the claim and is running the side effect.
    InProgress,
    /// The response is stored; every retry replays it.
    Completed,
    /// The side effect failed definitively; needs a decision.
    Failed,
    /// The side effect may or may not have happened; needs a decision.
    Unknown,
}

impl RecordState {
    /// Stable lowercase name (logs, metrics, storage).
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "in_progress",
            RecordState::Completed => "completed",
            RecordState::Failed => "failed",
            RecordState::Unknown => "unknown",
        }
    }
}

/// A response as an HTTP front end would send it, stored verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u32,
    /// Headers in the order given, repeats kept (replay must be verbatim).
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Pointer to a body kept elsewhere, for responses too large to store.
    pub body_ref: String,
}

impl StoredResponse {
    /// Bytes this response occupies in a record: what `max_response_bytes`
    /// limits and what a cache of responses is charged.
    pub fn stored_size(&self) -> usize {
        self.body.len()
            + self.body_ref.len()
            + self
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
    }
}

/// One idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Which key this is.
    pub id: RecordKey,
    /// Where in the lifecycle it is.
    pub state: RecordState,
    /// Fingerprint of the request that claimed the key; never overwritten.
    pub fingerprint: Vec<u8>,
    /// 1 for the first execution, incremented on each takeover.
    pub attempt: u32,
    /// Fencing token of the current holder (at least 128 random bits). Kept
    /// after completion so that a retried Complete can be recognized.
    pub lease_token: String,
    /// The `attempt_id` of the Claim call that created the current lease:
    /// lets a retried Claim RPC get its own lease back.
    pub attempt_id: String,
    /// When the key was first claimed.
    pub created_at_ms: i64,
    /// Last state change; for FAILED/UNKNOWN records, when they started to
    /// need a decision.
    pub updated_at_ms: i64,
    /// While IN_PROGRESS: after this the claim is stale.
    pub lease_expires_at_ms: i64,
    /// When the response was stored (COMPLETED only).
    pub completed_at_ms: Option<i64>,
    /// End of the dedup window; the record is absent from then on.
    pub expires_at_ms: i64,
    /// The stored response (COMPLETED only).
    pub response: Option<StoredResponse>,
    /// Why the record is FAILED or UNKNOWN.
    pub reason: String,
}

impl Record {
    /// Whether the record still exists at `now_ms` (expiry is exclusive).
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms < self.expires_at_ms
    }

    /// Whether the record needs a decision at `now_ms`: IN_PROGRESS past
    /// its lease, or FAILED, or UNKNOWN.
    pub fn needs_decision(&self, now_ms: i64) -> bool {
        match self.state {
            RecordState::InProgress => now_ms >= self.lease_expires_at_ms,
            RecordState::Failed | RecordState::Unknown => true,
            RecordState::Completed => false,
        }
    }

    /// The instant from which the record needs a decision (`None` for
    /// completed records): the sort key of the pending index.
    pub fn pending_since_ms(&self) -> Option<i64> {
        match self.state {
            RecordState::InProgress => Some(self.lease_expires_at_ms),
            RecordState::Failed | RecordState::Unknown => Some(self.updated_at_ms),
            RecordState::Completed => None,
        }
    }
}
