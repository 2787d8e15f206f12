//! The CQL backend: ScyllaDB (first) or Apache Cassandra, through the
//! `scylla` driver.
//!
//! # Data model
//!
//! One row per (tenant, endpoint, key) partition in `records`, written only
//! with lightweight transactions (Paxos): `INSERT … IF NOT EXISTS USING TTL`
//! for a claim, `UPDATE … USING TTL … IF state = ? AND lease_token = ? AND
//! expires_at > ?` for every transition, `DELETE … IF …` for a release. Every
//! rewrite writes the TTL left until the record's `expires_at`, so a record
//! never outlives its dedup window. See `migrations/` for the schema and the
//! reasons behind its table options.
//!
//! # Consistency
//!
//! One setting ([`CqlConsistency`]) picks QUORUM + SERIAL or LOCAL_QUORUM +
//! LOCAL_SERIAL for every statement: mixing serial levels is the classic way
//! to lose linearizability. Plain reads use the regular level; reads that
//! must see the outcome of in-flight Paxos rounds use the serial level.
//!
//! # Uncertain outcomes
//!
//! A CAS write timeout, a client timeout or a connection lost after sending
//! means the write may or may not have been applied. The store then reads the
//! row at SERIAL (which completes any in-flight Paxos round) and compares it
//! with what it tried to write: the random lease token makes "our write" and
//! "someone else's" distinguishable. Only a read that proves the write counts
//! as applied; if the row cannot be read, the caller gets
//! [`StoreError::Uncertain`], never a guess. The driver's default retry policy
//! never retries a CAS timeout and statements stay non-idempotent (no
//! speculative execution), so nothing retries an LWT blindly.
//!
//! # Encryption at rest
//!
//! With a keyring ([`CqlStore::open_with_keyring`]) the `response` blob is
//! sealed (see [`crate::crypto`]) with associated data binding it to the
//! row's (tenant, endpoint, key): a blob copied into another row fails to
//! decrypt. Blobs written in clear before encryption was turned on stay
//! readable. The other columns stay in clear: the LWT conditions, TTLs and
//! the pending index need them.
//!
//! # Pending index
//!
//! Bucketed by due instant and sharded by key, with a per-tenant watermark
//! that a sealer keeps behind the clock (see [`pending`] and migration 3):
//! no partition receives more than one bucket of one shard of a tenant's
//! claims, and no read walks the tombstones below the watermark. An entry is
//! written before the conditional write that makes a record due (a crash
//! between the two must never hide a claim from ListPending:
//! `a_crash_between_two_writes_never_hides_a_claim_from_list_pending` kills
//! idemd there, and at the sealer's two crash points), deleted eagerly
//! after the write that makes it not due, and verified against `records`
//! on read.
//!
//! # Round trips of a fresh pair
//!
//! Claim: the index entry (a plain write), then `INSERT … IF NOT EXISTS`,
//! which returns the row it did not replace, so no read comes first
//! ([`Store::read_before_insert`] is `false`). Complete: `UPDATE … IF`
//! built from the record the engine granted (`engine::granted`), then the
//! index delete after the reply ([`CqlStore::index_after_completion`]). Two
//! LWTs and one plain write on the reply path, where the raw statements
//! need the two LWTs; the index entry stays before the insert because a
//! crash between the two must not hide a claim (above).
//!
//! Issue 15 measured this path and kept both reads: without them the fault
//! suite's `cql-cluster-restart` (every node SIGKILLed at once) lost
//! acknowledged claims. Issue 27 found the cause in the test cluster:
//! Cassandra's `commitlog_sync: periodic` acknowledges writes (LWTs
//! included) that a SIGKILL of every replica then loses, and the faster
//! path only had more of them in flight. On `commitlog_sync: batch`, the
//! setting docs/scylla.md prescribes, this path lost nothing in the runs
//! recorded in docs/reliability.md.
//!
//! Nothing correctness-critical lives in one replica's memory, so any number
//! of idemd replicas can share a keyspace.

mod connection;
mod failure;
pub mod migrate;
mod pending;
pub mod rows;
mod statements;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::{
    CasOutcome, Expected, InsertOutcome, PendingCounts, PendingPage, PendingQuery, Record,
    RecordKey, RecordState, Store, StoreError, StoreResult,
};
use crate::crypto::Keyring;
use connection::unavailable;
pub use connection::{
    CqlConsistency, CqlOptions, DEFAULT_KEYSPACE, DEFAULT_NODE, DEFAULT_REQUEST_TIMEOUT, connect,
    validate_keyspace,
};
use failure::{Failure, classify};
use pending::Tenants;
pub use pending::legacy::{LegacyReport, copy_legacy_index};
pub use pending::seal::SealReport;
pub use pending::{BUCKET_MS, DEFAULT_SEAL_GRACE, SHARDS, SealTiming};
use rows::{NamedRow, key_values, record_values, text_value, values};
use statements::Statements;

/// Milliseconds in a day: the width of one partition of the audit tables
/// and of migration 1's pending index.
const DAY_MS: i64 = 86_400_000;

/// Lower bound on the timeout of the SERIAL reads that resolve uncertain
/// writes, whatever the statement timeout.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// SERIAL read attempts when resolving one uncertain write.
const RESOLVE_ATTEMPTS: usize = 3;

/// Counters of the backend, for tests and metrics.
#[derive(Debug, Default)]
pub struct CqlStats {
    /// Writes whose outcome was uncertain (then resolved or reported).
    pub uncertain_writes: AtomicU64,
    /// Uncertain writes that could not be resolved.
    pub unresolved_writes: AtomicU64,
}

/// The CQL backend.
pub struct CqlStore {
    /// Shared driver session (connection pools, routing).
    session: Arc<Session>,
    /// Prepared once at start.
    statements: Statements,
    /// What this replica knows of each tenant's pending index.
    tenants: Tenants,
    /// The sealer's grace and steps.
    timing: SealTiming,
    /// This replica's name in `pending_cursor.sealed_by` (host and pid).
    replica: String,
    /// The longest ttl a policy allows, in seconds: the TTL of an index
    /// entry whose record's expiry is unknown.
    max_ttl_seconds: i32,
    /// Counters.
    stats: Arc<CqlStats>,
    /// Seals and opens the `response` column; `None` writes it in clear.
    keyring: Option<Arc<Keyring>>,
    /// Permits of the index cleanups that run after the reply
    /// ([`pending::DETACHED_CLEANUPS`]).
    cleanups: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for CqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqlStore").finish_non_exhaustive()
    }
}

fn ttl_seconds(expires_at_ms: i64, now_ms: i64) -> i32 {
    let remaining_ms = (expires_at_ms - now_ms).max(1);
    // Round up: the row must outlive expires_at; reads hide it from then on.
    i32::try_from((remaining_ms + 999) / 1000).unwrap_or(i32::MAX)
}

/// This process's name in the rows it writes for other replicas to read.
fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}

pub(crate) fn day_of(instant_ms: i64) -> i32 {
    i32::try_from(instant_ms.div_euclid(DAY_MS)).unwrap_or(i32::MAX)
}

/// Crash points for the tests that kill idemd between two writes
/// (`tests/cql/cql_cluster.rs`): with the `cql-tests` feature, the
/// environment variable `IDEMD_CRASH_AT` naming this point aborts the
/// process here, as `kill -9` would. Compiled out of every other build.
fn crash_point(name: &str) {
    #[cfg(feature = "cql-tests")]
    if std::env::var("IDEMD_CRASH_AT").is_ok_and(|at| at == name) {
        std::process::abort();
    }
    #[cfg(not(feature = "cql-tests"))]
    let _ = name;
}

/// [`crash_point`] for work done per tenant (the sealer visits every
/// tenant of the keyspace): with `IDEMD_CRASH_TENANT` set, only that
/// tenant's visit aborts.
fn crash_point_in(name: &str, tenant: &str) {
    #[cfg(feature = "cql-tests")]
    if std::env::var("IDEMD_CRASH_TENANT").is_ok_and(|t| t == tenant) {
        crash_point(name);
    }
    #[cfg(not(feature = "cql-tests"))]
    let _ = (name, tenant);
}

/// Whether `current` is exactly the state `written` put there: the fields a
/// transition changes, with the random lease token telling our write from
/// any other.
fn is_our_write(current: &Record, written: &Record) -> bool {
    current.state == written.state
        && current.lease_token == written.lease_token
        && current.attempt == written.attempt
        && current.updated_at_ms == written.updated_at_ms
        && current.lease_expires_at_ms == written.lease_expires_at_ms
        && current.fingerprint == written.fingerprint
}

impl CqlStore {
    /// Connects and prepares; fails with a clear message when the schema is
    /// missing (run `idemd migrate`).
    pub async fn open(options: &CqlOptions) -> StoreResult<Self> {
        Self::open_with_keyring(options, None).await
    }

    /// Like [`CqlStore::open`], sealing stored responses with `keyring`
    /// (see the module docs).
    pub async fn open_with_keyring(
        options: &CqlOptions,
        keyring: Option<Arc<Keyring>>,
    ) -> StoreResult<Self> {
        validate_keyspace(&options.keyspace).map_err(StoreError::Unavailable)?;
        let session = connect(options).await?;
        let statements = Statements::prepare(&session, options).await?;
        Ok(Self {
            session: Arc::new(session),
            statements,
            tenants: Tenants::default(),
            timing: SealTiming::for_grace(options.seal_grace),
            replica: replica_name(),
            max_ttl_seconds: i32::try_from(options.max_ttl.as_secs()).unwrap_or(i32::MAX),
            stats: Arc::new(CqlStats::default()),
            keyring,
            cleanups: Arc::new(tokio::sync::Semaphore::new(pending::DETACHED_CLEANUPS)),
        })
    }

    /// Counters (uncertain writes).
    pub fn stats(&self) -> &CqlStats {
        &self.stats
    }

    /// One pass of the pending index's sealer over every tenant (what
    /// [`Store::maintain`] runs); public for the tests that drive it with
    /// their own clock.
    pub async fn seal_pending_index(&self, now_ms: i64) -> StoreResult<SealReport> {
        self.seal_all(now_ms).await
    }

    /// The sealer's advance for one tenant at `now_ms` exactly (no wall
    /// clock cap): for tests on a clock of their own, which must not seal
    /// other tests' tenants.
    pub async fn seal_tenant_pending_index(
        &self,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        let mut report = SealReport::default();
        if let Some(cursor) = self.read_cursor(tenant).await? {
            self.seal_tenant(&cursor, now_ms, &mut report).await?;
        }
        Ok(report)
    }

    async fn read(&self, id: &RecordKey, serial: bool) -> StoreResult<Option<Record>> {
        let statement = if serial {
            &self.statements.select_serial
        } else {
            &self.statements.select
        };
        let result = self
            .session
            .execute_unpaged(statement, (&id.tenant, &id.endpoint, &id.key))
            .await
            .map_err(|e| unavailable("read", e))?;
        let rows = rows::named_rows(result)?;
        match rows.first() {
            None => Ok(None),
            Some(row) => rows::record_from_row(id, row, self.keyring.as_deref()),
        }
    }

    /// SERIAL read after an uncertain write, retried a few times.
    async fn resolve_read(&self, id: &RecordKey, why: &str) -> StoreResult<Option<Record>> {
        self.stats.uncertain_writes.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metrics::STORE_UNCERTAIN, "backend" => "cql").increment(1);
        let mut last_error = String::new();
        for attempt in 0..RESOLVE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            match self.read(id, true).await {
                Ok(record) => return Ok(record),
                Err(error) => last_error = error.to_string(),
            }
        }
        self.stats.unresolved_writes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            backend = "cql",
            cause = why,
            "uncertain write could not be resolved"
        );
        Err(StoreError::Uncertain(format!(
            "{why}; the verifying SERIAL read failed too: {last_error}"
        )))
    }

    async fn conditional(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<(bool, Option<NamedRow>), Failure> {
        let result = self
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(classify)?;
        let rows = rows::named_rows(result).map_err(Failure::NotApplied)?;
        let Some(row) = rows.into_iter().next() else {
            return Err(Failure::NotApplied(StoreError::Corrupt(
                "conditional statement returned no row".to_string(),
            )));
        };
        let applied = rows::applied(&row).map_err(Failure::NotApplied)?;
        Ok((applied, Some(row)))
    }

    async fn try_insert(&self, record: &Record, now_ms: i64) -> StoreResult<Option<InsertOutcome>> {
        let id = &record.id;
        let bound = values([
            key_values(id),
            record_values(record, self.keyring.as_deref())?,
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
        ]);
        match self.conditional(&self.statements.insert, bound).await {
            Ok((true, _)) => Ok(Some(InsertOutcome::Inserted)),
            Ok((false, row)) => {
                let existing = match row
                    .as_ref()
                    .map(|row| rows::record_from_row(id, row, self.keyring.as_deref()))
                {
                    Some(Ok(Some(existing))) => Some(existing),
                    _ => self.read(id, true).await?,
                };
                match existing {
                    Some(existing) if existing.is_live(now_ms) => {
                        Ok(Some(InsertOutcome::Exists(existing)))
                    }
                    // The row is logically expired but its TTL has not run
                    // out yet: overwrite it conditionally.
                    Some(expired) => self.replace_expired(record, &expired, now_ms).await,
                    // Gone between the insert and the read: try again.
                    None => Ok(None),
                }
            }
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => {
                    Ok(Some(InsertOutcome::Inserted))
                }
                Some(current) if current.is_live(now_ms) => {
                    Ok(Some(InsertOutcome::Exists(current)))
                }
                // Not applied (a SERIAL read completes in-flight rounds):
                // safe to try again.
                _ => Ok(None),
            },
        }
    }

    async fn replace_expired(
        &self,
        record: &Record,
        expired: &Record,
        now_ms: i64,
    ) -> StoreResult<Option<InsertOutcome>> {
        let id = &record.id;
        let bound = values([
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
            record_values(record, self.keyring.as_deref())?,
            key_values(id),
            vec![Some(CqlValue::BigInt(now_ms))],
        ]);
        match self
            .conditional(&self.statements.replace_expired, bound)
            .await
        {
            Ok((true, _)) => {
                self.index_after_write(
                    id,
                    (expired.state, expired.pending_since_ms()),
                    Some(record),
                    now_ms,
                )
                .await;
                Ok(Some(InsertOutcome::Inserted))
            }
            Ok((false, _)) => Ok(None),
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => {
                    Ok(Some(InsertOutcome::Inserted))
                }
                _ => Ok(None),
            },
        }
    }
}

/// How long [`Store::close`] waits for the index cleanups in flight.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// How many times an insert is retried when the row vanished or expired
/// between statements.
const INSERT_ROUNDS: usize = 5;

#[async_trait]
impl Store for CqlStore {
    fn backend_name(&self) -> &'static str {
        "cql"
    }

    /// `INSERT … IF NOT EXISTS` returns the row it did not replace: no
    /// read before it (see the module docs, "Round trips of a fresh pair").
    fn read_before_insert(&self) -> bool {
        false
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        Ok(self.read(id, false).await?.filter(|r| r.is_live(now_ms)))
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        // Index first: a crash after this leaves an extra entry, never a
        // record that ListPending cannot find.
        let slot = self.index_put(record, now_ms).await?;
        crash_point("claim-after-index");
        for _ in 0..INSERT_ROUNDS {
            if let Some(outcome) = self.try_insert(record, now_ms).await? {
                crash_point("claim-after-insert");
                if let (InsertOutcome::Exists(_), Some(due), Some(slot)) =
                    (&outcome, record.pending_since_ms(), slot)
                {
                    self.index_delete(&record.id, due, &[slot]).await;
                }
                return Ok(outcome);
            }
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
        let id = &record.id;
        self.index_put(record, now_ms).await?;
        let bound = values([
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
            record_values(record, self.keyring.as_deref())?,
            key_values(id),
            vec![
                text_value(expected.state.as_str()),
                text_value(&expected.lease_token),
                Some(CqlValue::BigInt(now_ms)),
            ],
        ]);
        let applied = match self.conditional(&self.statements.replace, bound).await {
            Ok((applied, _)) => applied,
            Err(Failure::NotApplied(error)) => return Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => true,
                current => {
                    return Ok(CasOutcome::Conflict {
                        current: current.filter(|r| r.is_live(now_ms)),
                    });
                }
            },
        };
        if applied {
            let old = (expected.state, expected.pending_since_ms);
            if record.state == RecordState::Completed {
                self.index_after_completion(id, old, record, now_ms).await;
            } else {
                self.index_after_write(id, old, Some(record), now_ms).await;
            }
            return Ok(CasOutcome::Applied);
        }
        // Not applied: the result may not carry the row (Cassandra returns
        // only the condition columns), so read it at SERIAL.
        let current = self.read(id, true).await?;
        Ok(CasOutcome::Conflict {
            current: current.filter(|r| r.is_live(now_ms)),
        })
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let values = (
            &id.tenant,
            &id.endpoint,
            &id.key,
            expected.state.as_str(),
            &expected.lease_token,
            now_ms,
        );
        let applied = match self.conditional(&self.statements.delete, values).await {
            Ok((applied, _)) => applied,
            Err(Failure::NotApplied(error)) => return Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                // Gone: our delete (only the token holder may delete).
                None => true,
                Some(current) if current.is_live(now_ms) && expected.is_met_by(&current) => {
                    // Provably not applied; the caller may retry.
                    return Ok(CasOutcome::Conflict {
                        current: Some(current),
                    });
                }
                current => {
                    return Ok(CasOutcome::Conflict {
                        current: current.filter(|r| r.is_live(now_ms)),
                    });
                }
            },
        };
        if applied {
            self.index_after_write(
                id,
                (expected.state, expected.pending_since_ms),
                None,
                now_ms,
            )
            .await;
            return Ok(CasOutcome::Applied);
        }
        let current = self.read(id, true).await?;
        Ok(CasOutcome::Conflict {
            current: current.filter(|r| r.is_live(now_ms)),
        })
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        self.scan_pending(query, now_ms).await
    }

    fn maintenance_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(
            u64::try_from(self.timing.step_ms).unwrap_or(5_000),
        ))
    }

    /// Seals the pending index (see [`pending::seal`]).
    async fn maintain(&self, now_ms: i64) -> StoreResult<()> {
        let report = self.seal_all(now_ms).await?;
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
        self.stored_summary(tenant).await
    }

    fn has_cluster_clock(&self) -> bool {
        true
    }

    /// The coordinator's clock: `toUnixTimestamp(now())` on `system.local`.
    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        let result = self
            .session
            .execute_unpaged(&self.statements.cluster_time, ())
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
        self.drain_cleanups(CLOSE_DRAIN).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_covers_the_remaining_window() {
        assert_eq!(ttl_seconds(10_000, 0), 10);
        assert_eq!(ttl_seconds(10_001, 0), 11);
        assert_eq!(ttl_seconds(5, 10), 1, "never zero (zero means no TTL)");
    }
}
