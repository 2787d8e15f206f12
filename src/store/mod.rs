//! Storage: the [`Store`] trait and its backends.
//!
//! The trait is the only seam between the engine and storage. It is shaped
//! after what a distributed store with lightweight transactions can do
//! atomically on one row, so that the embedded backend and the CQL backend
//! implement the same contract:
//!
//! * every write is conditional: insert-if-absent, replace-if, delete-if,
//!   with the condition being the row's state and lease token;
//! * expiry is native: a record whose `expires_at_ms` has passed is absent for
//!   every method, whether or not a sweeper has removed it yet;
//! * the pending index (records that need a decision) is maintained by the
//!   backend with the record, never by the caller.
//!
//! Backends never build a `tonic::Status`: they report [`StoreError`], which
//! distinguishes "nothing was applied" from "the outcome is unknown".
//!
//! Backends: [`embedded`] (one durable file, single node) and [`cql`]
//! (ScyllaDB / Cassandra lightweight transactions, many replicas); and
//! [`memory`], nothing durable, for the engine's unit tests and benchmarks.
//! What backends share sits here, above them: [`response`] (a stored
//! response's bytes, sealed or not), [`instrumented`] (metrics and spans
//! around any backend) and [`transfer`] (copying records from one store
//! into another as they are: the move from the embedded store to CQL).

pub mod cql;
pub mod embedded;
pub mod instrumented;
pub mod memory;
pub mod response;
pub mod transfer;
#[cfg(test)]
mod transfer_tests;

use std::time::Duration;

use async_trait::async_trait;

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

/// The condition of a conditional write: the row must be live, in this
/// state, and held with this lease token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Required current state.
    pub state: RecordState,
    /// Required current lease token.
    pub lease_token: String,
    /// Not part of the condition: the pending-index position of the record
    /// the expectation was taken from, so that a backend whose index is a
    /// separate table can drop the entry the write makes stale.
    pub pending_since_ms: Option<i64>,
}

impl Expected {
    /// The condition that `record` satisfies right now.
    pub fn matching(record: &Record) -> Self {
        Self {
            state: record.state,
            lease_token: record.lease_token.clone(),
            pending_since_ms: record.pending_since_ms(),
        }
    }

    /// Whether `record` satisfies the condition.
    pub fn is_met_by(&self, record: &Record) -> bool {
        record.state == self.state && record.lease_token == self.lease_token
    }
}

/// Result of [`Store::insert_if_absent`].
// The record is moved once from the store to the engine and never held in
// bulk, so boxing it would only add an allocation per write.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The record was written.
    Inserted,
    /// A live record exists; nothing was written.
    Exists(Record),
}

/// Result of a conditional replace or delete.
#[allow(clippy::large_enum_variant)] // see InsertOutcome
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// The condition held and the write was applied.
    Applied,
    /// The condition did not hold; nothing was written. `current` is the
    /// live record (if any) as of the check.
    Conflict {
        /// The live record at the time of the check, `None` when absent.
        current: Option<Record>,
    },
}

/// A page request over the pending index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingQuery {
    /// Whose records.
    pub tenant: String,
    /// Only this endpoint, when set.
    pub endpoint: Option<String>,
    /// Only records created at or before this instant, when set.
    pub created_at_or_before_ms: Option<i64>,
    /// Maximum records to return.
    pub page_size: usize,
    /// Continuation from a previous page ([`PendingPage::next_page_token`]);
    /// opaque to the caller, meaningful only to the backend that issued it.
    pub page_token: Option<Vec<u8>>,
}

/// A page of records that need a decision, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingPage {
    /// Records that needed a decision when read.
    pub records: Vec<Record>,
    /// Present when more records may follow.
    pub next_page_token: Option<Vec<u8>>,
}

/// How many of a tenant's records need a decision, by state: what the
/// pending gauges report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingCounts {
    /// IN_PROGRESS past their lease.
    pub in_progress: u64,
    /// UNKNOWN.
    pub unknown: u64,
    /// FAILED.
    pub failed: u64,
    /// The oldest `pending_since` among them.
    pub oldest_since_ms: Option<i64>,
    /// The count stopped at its bound: there are more.
    pub truncated: bool,
}

/// Rows per ListPending page when counting.
const COUNT_PAGE_SIZE: usize = 1000;

/// Counts the tenant's records that need a decision at `now_ms` by paging
/// through [`Store::list_pending`], reading at most about `max_records`.
/// What the engine does for a backend that keeps no summary, and what the
/// CQL sealer stores as one.
pub async fn count_pending<S: Store + ?Sized>(
    store: &S,
    tenant: &str,
    now_ms: i64,
    max_records: usize,
) -> StoreResult<PendingCounts> {
    let mut counts = PendingCounts::default();
    let mut token = None;
    let mut seen = 0;
    loop {
        let query = PendingQuery {
            tenant: tenant.to_string(),
            endpoint: None,
            created_at_or_before_ms: None,
            page_size: COUNT_PAGE_SIZE,
            page_token: token,
        };
        let page = store.list_pending(&query, now_ms).await?;
        for record in &page.records {
            match record.state {
                RecordState::InProgress => counts.in_progress += 1,
                RecordState::Unknown => counts.unknown += 1,
                RecordState::Failed => counts.failed += 1,
                RecordState::Completed => continue,
            }
            let since = record.pending_since_ms().unwrap_or(now_ms);
            counts.oldest_since_ms = Some(counts.oldest_since_ms.map_or(since, |o| o.min(since)));
        }
        seen += page.records.len();
        token = page.next_page_token;
        if token.is_none() {
            return Ok(counts);
        }
        if seen >= max_records {
            counts.truncated = true;
            return Ok(counts);
        }
    }
}

/// What went wrong in a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused the operation; nothing was
    /// applied. Safe to retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have been applied and a read could not tell
    /// which. Never reported as success or as failure.
    #[error("store write outcome unknown: {0}")]
    Uncertain(String),
    /// A page token that this backend did not issue.
    #[error("invalid page token")]
    InvalidPageToken,
    /// Stored data could not be decoded.
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    /// A stored response is encrypted and cannot be decrypted with the
    /// configured keyring (missing key id, wrong key material, or a value
    /// moved from another record); see [`crate::crypto`]. The message names
    /// the key id and never carries key material or plaintext.
    #[error("stored response cannot be decrypted: {0}")]
    Undecryptable(String),
    /// The store is shutting down.
    #[error("store is closed")]
    Closed,
}

/// What a backup holds, as written in its manifest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct BackupSummary {
    /// Manifest format.
    pub format: u32,
    /// When the backup began (Unix ms): every key acknowledged before it
    /// is in the backup.
    pub started_at_ms: i64,
    /// When it was complete (Unix ms).
    pub finished_at_ms: i64,
    /// Records copied (live or expired but not yet swept: the store drops
    /// expired records on read, as it would have).
    pub records: u64,
    /// Size of the backup's database file.
    pub bytes: u64,
    /// The idemd version that wrote it.
    pub idemd_version: String,
}

/// Result type of store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// The storage contract. Every method is atomic on one record; `now_ms` is
/// the caller's clock, used for expiry so that every backend agrees with the
/// engine on what "expired" means.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Short backend name for logs and metrics (`embedded`, `cql`).
    fn backend_name(&self) -> &'static str;

    /// Whether Claim looks a key up before trying to create it. `true` (the
    /// default) reads first. `false` lets the engine go straight to the
    /// conditional insert, which reports the existing record anyway: for a
    /// backend whose read is a network round trip (CQL: a QUORUM read,
    /// where `INSERT … IF NOT EXISTS` returns the row it did not replace)
    /// that saves the round trip per fresh key; a key the engine has seen
    /// exist is still read first (`engine::existing`). The engine's tests
    /// cover the `false` path (`MemoryStore::inserting_first`).
    fn read_before_insert(&self) -> bool {
        true
    }

    /// The live record for `id`, or `None` if absent or expired.
    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>>;

    /// Writes `record` if no live record exists for `record.id` (an expired
    /// one is replaced). Atomic: of N concurrent inserts of one key exactly
    /// one gets [`InsertOutcome::Inserted`]; the others get the winner's
    /// record. Durable before it returns.
    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome>;

    /// Writes `record`, copied from another store, as it is (the TTL left
    /// until its `expires_at`, its index entries as an insert makes them)
    /// if no live record holds its key; reports the live record otherwise.
    /// For [`transfer`]. Durable before it returns; writing the same record
    /// again is harmless. Every backend uses [`Store::insert_if_absent`]
    /// (the default): the CQL store's LWT rows must not get a plain write,
    /// whose timestamp could shadow a later LWT's update (docs/scylla.md).
    async fn import(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        self.insert_if_absent(record, now_ms).await
    }

    /// Replaces the live record for `record.id` with `record` if it meets
    /// `expected`. The replacement must keep `expires_at_ms` (the engine
    /// guarantees it; backends write the remaining TTL). Durable before it
    /// returns [`CasOutcome::Applied`].
    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome>;

    /// Deletes the live record for `id` if it meets `expected`. Durable
    /// before it returns [`CasOutcome::Applied`].
    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome>;

    /// The tenant's records that need a decision at `now_ms`, oldest
    /// `pending_since` first, from an index (never a scan of all records).
    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage>;

    /// How often [`Store::maintain`] should run; `None` (the default) when
    /// the backend has no upkeep.
    fn maintenance_interval(&self) -> Option<Duration> {
        None
    }

    /// Background upkeep that must not wait for a request, run every
    /// [`Store::maintenance_interval`] on every replica with the engine's
    /// clock. Must be safe to run concurrently on many replicas. CQL: seals
    /// the pending index (`store::cql::pending::seal`).
    async fn maintain(&self, _now_ms: i64) -> StoreResult<()> {
        Ok(())
    }

    /// Counts of the tenant's pending records that the backend keeps up to
    /// date itself, so that the gauges of every replica need not walk the
    /// index; `None` (the default) when it keeps none and the caller
    /// should use [`count_pending`]. May lag by the backend's maintenance
    /// interval.
    async fn pending_summary(
        &self,
        _tenant: &str,
        _now_ms: i64,
    ) -> StoreResult<Option<PendingCounts>> {
        Ok(None)
    }

    /// The store's own clock, in ms since the epoch, read from the store
    /// itself: a common reference against which each replica measures its
    /// clock's offset (`engine::skew`). CQL: the coordinator's clock.
    /// `None` (the default) for a backend only one process uses, which has
    /// no other clock to disagree with.
    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        Ok(None)
    }

    /// Whether [`Store::cluster_time_ms`] answers with a clock: then a
    /// replica takes no lease over until it has measured its offset
    /// (`engine::skew`). Must agree with `cluster_time_ms`.
    fn has_cluster_clock(&self) -> bool {
        false
    }

    /// Physically removes up to `max_records` records expired at `now_ms`
    /// in one step (one write; the caller loops, see
    /// [`crate::engine::SWEEP_STEP`]); returns how many were removed.
    /// Backends with native TTL return 0.
    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize>;

    /// Writes a consistent copy of the store into the new directory `to`
    /// while it serves: every key acknowledged before the call is in it
    /// (see [`embedded::backup`]); `progress` is told the records copied.
    /// Stores whose data lives in a database of its own answer
    /// `Unavailable`, naming that database's tools.
    async fn backup(
        &self,
        _to: &std::path::Path,
        _progress: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    ) -> StoreResult<BackupSummary> {
        Err(StoreError::Unavailable(format!(
            "the {} store keeps its data in a database of its own: back that up with its tools (ScyllaDB: Scylla Manager or `nodetool snapshot`; docs/operations.md)",
            self.backend_name()
        )))
    }

    /// Damage found in the store's own files, if any: the server turns its
    /// health NOT_SERVING while there is some (every answer of the store is
    /// then `Corrupt`). Stores that cannot find damage have none.
    fn damage(&self) -> Option<String> {
        None
    }

    /// Finishes every accepted write and releases the store. Later calls
    /// fail with [`StoreError::Closed`].
    async fn close(&self) -> StoreResult<()>;
}
