//! The storage contract: the [`Store`] trait, the conditions of its
//! conditional writes and their outcomes, the pending-index queries, and
//! what a backup holds. Every backend (embedded, CQL, memory) implements
//! exactly this; the conformance suites in `tests/` run on each.

use std::time::Duration;

use async_trait::async_trait;

use super::error::StoreError;
use super::record::{Record, RecordKey, RecordState};

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
    /// For [`crate::store::transfer`]. Durable before it returns; writing the same record
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
    /// (see [`crate::store::embedded::backup`]); `progress` is told the records copied.
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
