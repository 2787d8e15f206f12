//! The CQL backend: ScyllaDB (first) or Apache Cassandra, through the
//! `scylla` driver.
//!
//! [`CqlStore`] composes two parts on one driver session and implements
//! [`Store`] by delegating to them, in the order below:
//!
//! * `records`: the `records` table, one row per (tenant, endpoint, key),
//!   written only with lightweight transactions (records copied in by
//!   `idemd copy-to-cql` too: a plain write beside LWTs on the same rows
//!   may lose a later LWT's update to a clock ahead; cql-facts, "never mix
//!   LWT and plain writes"), and the resolution of their uncertain
//!   outcomes (never a guess: [`StoreError::Uncertain`]). It also seals
//!   stored responses with the keyring, if any.
//! * `pending`: the pending index ListPending reads, bucketed by due
//!   instant and sharded by key, with a per-tenant watermark its sealer
//!   keeps behind the clock ([`Store::maintain`]).
//!
//! Shared below both: [`session`] (connecting, options, rows read by column
//! name; public, the audit log uses it too) and `statements` (how a part
//! prepares its statements). `migrate` applies `migrations/`; see there for
//! the schema and the reasons behind its table options.
//!
//! # Consistency
//!
//! One setting ([`CqlConsistency`]) picks QUORUM + SERIAL or LOCAL_QUORUM +
//! LOCAL_SERIAL for every statement: mixing serial levels is the classic way
//! to lose linearizability. Plain reads use the regular level; reads that
//! must see the outcome of in-flight Paxos rounds use the serial level.
//!
//! # Order of writes per request
//!
//! An index entry is written before the record write that makes a record
//! due, and deleted after the write that ends that, so a crash between the
//! two leaves an extra entry (verified against `records` and dropped by
//! readers), never a missing one
//! (`a_crash_between_two_writes_never_hides_a_claim_from_list_pending` kills
//! idemd at each [`crate::crash`] point). So:
//!
//! * Claim: the index entry (a plain write), then `INSERT … IF NOT EXISTS`,
//!   which returns the row it did not replace, so no read comes first
//!   ([`Store::read_before_insert`] is `false`). When a live record held
//!   the key, the entry just written is deleted before the reply. A key
//!   the engine has seen exist is read first instead (`engine::existing`):
//!   a duplicate then writes nothing.
//! * Complete: `UPDATE … IF` built from the record the engine granted
//!   (`engine::granted`), then the index delete after the reply
//!   (`PendingIndex::after_completion`).
//! * Every other transition: the new entry (if any), the LWT, then the old
//!   entry's delete before the reply.
//! * Import (a record copied from another store by `idemd copy-to-cql`):
//!   an insert like a Claim's, with the record as it is.
//!
//! A fresh pair thus costs two LWTs and one plain write on the reply path.
//! It is only as durable as the replicas' commit log: an acknowledged LWT
//! survives a crash of every replica at once only on `commitlog_sync:
//! batch` (docs/scylla.md, "Durability: the engine settings it depends
//! on").
//!
//! Nothing correctness-critical lives in one replica's memory, so any number
//! of idemd replicas can share a keyspace.

pub mod cutover;
pub mod migrate;
mod pending;
mod records;
pub mod session;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::{
    CasOutcome, Expected, InsertOutcome, PendingCounts, PendingPage, PendingQuery, Record,
    RecordKey, RecordState, Store, StoreError, StoreResult,
};
use crate::crash::crash_point;
use crate::crypto::Keyring;
use pending::PendingIndex;
pub use pending::legacy::LegacyReport;
pub use pending::{BUCKET_MS, SHARDS, SealReport, SealTiming};
pub use records::CqlStats;
use records::{Insert, Records};
pub use session::{
    CqlConsistency, CqlOptions, DEFAULT_KEYSPACE, DEFAULT_NODE, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEAL_GRACE, connect, validate_keyspace,
};
use session::{rows, unavailable};
use statements::Preparer;

/// How long [`Store::close`] waits for the index cleanups in flight.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// How many times an insert is retried when the row vanished or expired
/// between statements.
const INSERT_ROUNDS: usize = 5;

/// The CQL backend.
pub struct CqlStore {
    /// The record table's LWTs.
    records: Records,
    /// The pending index, verified against `records` wherever it is read.
    index: PendingIndex,
    /// Shared driver session (connection pools, routing), for the
    /// statements that belong to neither part.
    session: Arc<Session>,
    /// The coordinator's clock (`Store::cluster_time_ms`).
    cluster_time: PreparedStatement,
}

impl std::fmt::Debug for CqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqlStore").finish_non_exhaustive()
    }
}

impl CqlStore {
    /// Connects and prepares; fails with a clear message when the schema is
    /// missing (run `idemd migrate`).
    pub async fn open(options: &CqlOptions) -> StoreResult<Self> {
        Self::open_with_keyring(options, None).await
    }

    /// Like [`CqlStore::open`], sealing stored responses with `keyring`
    /// (see `records`, "Encryption at rest").
    pub async fn open_with_keyring(
        options: &CqlOptions,
        keyring: Option<Arc<Keyring>>,
    ) -> StoreResult<Self> {
        validate_keyspace(&options.keyspace).map_err(StoreError::Unavailable)?;
        let session = Arc::new(connect(options).await?);
        let records = Records::open(Arc::clone(&session), options, keyring).await?;
        let index = PendingIndex::open(Arc::clone(&session), options).await?;
        let mut cluster_time = Preparer::new(&session, &options.keyspace)
            .prepare("SELECT toUnixTimestamp(now()) AS now_ms FROM system.local".to_string())
            .await?;
        statements::idempotent([&mut cluster_time]);
        Ok(Self {
            records,
            index,
            session,
            cluster_time,
        })
    }

    /// The driver session the store runs on (the cut-over mark,
    /// [`cutover`], is read and written through it).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Counters (uncertain writes).
    pub fn stats(&self) -> &CqlStats {
        self.records.stats()
    }

    /// How many `pending_cursor` rows this replica asked to create: one per
    /// tenant it wrote for, however many of its first claims came at once.
    pub fn cursors_created(&self) -> u64 {
        self.index.cursors_created()
    }

    /// One pass of the pending index's sealer over every tenant (what
    /// [`Store::maintain`] runs); public for the tests that drive it with
    /// their own clock.
    pub async fn seal_pending_index(&self, now_ms: i64) -> StoreResult<SealReport> {
        self.index.seal_all(&self.records, self, now_ms).await
    }

    /// The sealer's advance for one tenant at `now_ms` exactly (no wall
    /// clock cap): for tests on a clock of their own, which must not seal
    /// other tests' tenants.
    pub async fn seal_tenant_pending_index(
        &self,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        self.index
            .seal_one(&self.records, self, tenant, now_ms)
            .await
    }
}

#[async_trait]
impl Store for CqlStore {
    fn backend_name(&self) -> &'static str {
        "cql"
    }

    /// `INSERT … IF NOT EXISTS` returns the row it did not replace: no
    /// read before it (see the module docs, "Order of writes per request").
    fn read_before_insert(&self) -> bool {
        false
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        Ok(self
            .records
            .read(id, false)
            .await?
            .filter(|r| r.is_live(now_ms)))
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        // Index first: a crash after this leaves an extra entry, never a
        // record that ListPending cannot find.
        let slot = self.index.put(record, now_ms).await?;
        crash_point("claim-after-index");
        for _ in 0..INSERT_ROUNDS {
            let outcome = match self.records.insert(record, now_ms).await? {
                Insert::Retry => continue,
                Insert::Inserted => InsertOutcome::Inserted,
                Insert::Replaced(expired) => {
                    let old = (expired.state, expired.pending_since_ms());
                    self.index
                        .after_write(&record.id, old, Some(record), now_ms)
                        .await;
                    InsertOutcome::Inserted
                }
                Insert::Exists(existing) => InsertOutcome::Exists(existing),
            };
            crash_point("claim-after-insert");
            // The entry just written is this insert's own, unless the
            // existing record is due at the same instant: then it is
            // (also) that record's entry, same primary key, and deleting
            // it would hide the record from ListPending. Two claims of a
            // key in one millisecond with the same lease, or the same
            // record inserted twice, meet that case.
            if let (InsertOutcome::Exists(existing), Some(due), Some(slot)) =
                (&outcome, record.pending_since_ms(), slot)
                && existing.pending_since_ms() != Some(due)
            {
                self.index.delete(&record.id, due, &[slot]).await;
            }
            return Ok(outcome);
        }
        Err(StoreError::Unavailable(
            "the key kept changing between statements; nothing was claimed".to_string(),
        ))
    }

    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        self.index.put(record, now_ms).await?;
        let outcome = self.records.replace(record, expected, now_ms).await?;
        if let CasOutcome::Applied = outcome {
            let old = (expected.state, expected.pending_since_ms);
            if record.state == RecordState::Completed {
                self.index
                    .after_completion(&record.id, old, record, now_ms)
                    .await;
            } else {
                self.index
                    .after_write(&record.id, old, Some(record), now_ms)
                    .await;
            }
        }
        Ok(outcome)
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let outcome = self.records.delete(id, expected, now_ms).await?;
        if let CasOutcome::Applied = outcome {
            let old = (expected.state, expected.pending_since_ms);
            self.index.after_write(id, old, None, now_ms).await;
        }
        Ok(outcome)
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        self.index.list(&self.records, query, now_ms).await
    }

    fn maintenance_interval(&self) -> Option<Duration> {
        Some(self.index.step())
    }

    /// Seals the pending index (see `pending::seal`).
    async fn maintain(&self, now_ms: i64) -> StoreResult<()> {
        let report = self.index.seal_all(&self.records, self, now_ms).await?;
        if report.advanced > 0 {
            tracing::debug!(
                advanced = report.advanced,
                moved = report.moved,
                dropped = report.dropped,
                "pending index sealed"
            );
        }
        Ok(())
    }

    /// The counts the sealer stored with the watermark: one point read,
    /// whatever the tenant's volume.
    async fn pending_summary(
        &self,
        tenant: &str,
        _now_ms: i64,
    ) -> StoreResult<Option<PendingCounts>> {
        self.index.stored_summary(tenant).await
    }

    fn has_cluster_clock(&self) -> bool {
        true
    }

    /// The coordinator's clock: `toUnixTimestamp(now())` on `system.local`.
    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        let result = self
            .session
            .execute_unpaged(&self.cluster_time, ())
            .await
            .map_err(|e| unavailable("cluster clock read", e))?;
        let rows = rows::named_rows(result)?;
        match rows.first().and_then(|row| row.get("now_ms")) {
            Some(Some(CqlValue::BigInt(ms))) => Ok(Some(*ms)),
            other => Err(StoreError::Corrupt(format!(
                "the cluster clock read returned {other:?}"
            ))),
        }
    }

    async fn sweep_expired(&self, _now_ms: i64, _max_records: usize) -> StoreResult<usize> {
        // Native TTL removes expired rows; reads already hide them.
        Ok(0)
    }

    async fn close(&self) -> StoreResult<()> {
        // Every record write is acknowledged by the cluster before it
        // returns; only index cleanups may still be in flight.
        self.index.drain(CLOSE_DRAIN).await;
        Ok(())
    }
}
