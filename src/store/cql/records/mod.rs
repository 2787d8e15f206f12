//! The `records` table: one row per (tenant, endpoint, key), written only
//! with lightweight transactions (Paxos), and the resolution of their
//! uncertain outcomes. Records copied in from another store (`idemd
//! copy-to-cql`) go through the same `INSERT … IF NOT EXISTS`: a plain write
//! beside the LWTs that follow on the same row could lose their updates to
//! a coordinator clock ahead of theirs (CASSANDRA-13767).
//!
//! # Statements
//!
//! `INSERT … IF NOT EXISTS USING TTL` for a claim, `UPDATE … USING TTL … IF
//! state = ? AND lease_token = ? AND expires_at > ?` for every transition,
//! `UPDATE … IF expires_at <= ?` to reuse a row that expired logically but
//! not yet by TTL, `DELETE … IF …` for a release. Every rewrite writes the
//! TTL left until the record's `expires_at`, so a record never outlives its
//! dedup window. A failed `INSERT … IF NOT EXISTS` returns the row it did
//! not replace, so a claim needs no read first. A failed `UPDATE` or
//! `DELETE` may return the condition columns only (Cassandra), so the
//! current record is then read at SERIAL.
//!
//! # Uncertain outcomes
//!
//! A CAS write timeout, a client timeout or a connection lost after sending
//! means the write may or may not have been applied ([`failure`] tells
//! which failures are). [`Records`] then reads the row at SERIAL (which
//! completes any in-flight Paxos round) and compares it with what it tried
//! to write: the random lease token makes "our write" and "someone else's"
//! distinguishable. Only a read that proves the write counts as applied; if
//! the row cannot be read, the caller gets [`StoreError::Uncertain`], never
//! a guess. The driver's default retry policy never retries a CAS timeout
//! and the LWTs stay non-idempotent (no speculative execution), so nothing
//! retries an LWT blindly. The price: an uncertain write costs up to
//! [`RESOLVE_ATTEMPTS`] SERIAL reads before its caller hears anything.
//!
//! # Encryption at rest
//!
//! With a keyring the `response` blob is sealed (see [`crate::crypto`] and
//! [`codec`]) with associated data binding it to the row's (tenant,
//! endpoint, key): a blob copied into another row fails to decrypt. Blobs
//! written in clear before encryption was turned on stay readable. The
//! other columns stay in clear: the LWT conditions, TTLs and the pending
//! index need them.

mod codec;
mod failure;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::session::rows::{self, NamedRow};
use super::session::{CqlOptions, ttl_seconds, unavailable};
use super::statements::{Preparer, idempotent};
use crate::crypto::Keyring;
use crate::store::{CasOutcome, Expected, Record, RecordKey, StoreError, StoreResult};
use codec::{RECORD_COLUMNS, Values, key_values, record_values, text_value, values};
use failure::{Failure, classify};

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

/// The prepared statements on `records`.
struct Statements {
    /// The record at the regular consistency.
    select: PreparedStatement,
    /// The record at SERIAL: resolves uncertain writes.
    select_serial: PreparedStatement,
    /// Claim: `INSERT … IF NOT EXISTS`.
    insert: PreparedStatement,
    /// Every transition: `UPDATE … IF state AND lease_token`.
    replace: PreparedStatement,
    /// Reuse of an expired row still on disk.
    replace_expired: PreparedStatement,
    /// Release: `DELETE … IF`.
    delete: PreparedStatement,
}

impl Statements {
    async fn prepare(session: &Session, options: &CqlOptions) -> StoreResult<Self> {
        let preparer = Preparer::new(session, &options.keyspace);
        let ks = preparer.keyspace;
        let key_filter = "WHERE tenant = ? AND endpoint = ? AND key = ?";
        let select = preparer
            .prepare(format!(
                "SELECT {RECORD_COLUMNS} FROM {ks}.records {key_filter}"
            ))
            .await?;
        let mut select_serial = select.clone();
        select_serial.set_consistency(options.consistency.serial_read());
        select_serial.set_request_timeout(Some(options.request_timeout.max(RESOLVE_TIMEOUT)));
        let set_all = "state = ?, fingerprint = ?, attempt = ?, lease_token = ?, attempt_id = ?, \
             created_at = ?, updated_at = ?, lease_expires_at = ?, completed_at = ?, \
             expires_at = ?, response = ?, reason = ?";
        let mut statements = Self {
            select,
            select_serial,
            insert: preparer
                .prepare(format!(
                    "INSERT INTO {ks}.records (tenant, endpoint, key, {RECORD_COLUMNS}) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
                ))
                .await?,
            replace: preparer
                .prepare(format!(
                    "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} \
                     IF state = ? AND lease_token = ? AND expires_at > ?"
                ))
                .await?,
            replace_expired: preparer
                .prepare(format!(
                    "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} IF expires_at <= ?"
                ))
                .await?,
            delete: preparer
                .prepare(format!(
                    "DELETE FROM {ks}.records {key_filter} \
                     IF state = ? AND lease_token = ? AND expires_at > ?"
                ))
                .await?,
        };
        // A timed-out record LWT is resolved by a SERIAL read, so it may
        // have a timeout of its own (`--cql-lwt-timeout`).
        if let Some(timeout) = options.lwt_timeout {
            for statement in [
                &mut statements.insert,
                &mut statements.replace,
                &mut statements.replace_expired,
                &mut statements.delete,
            ] {
                statement.set_request_timeout(Some(timeout));
            }
        }
        idempotent([&mut statements.select, &mut statements.select_serial]);
        Ok(statements)
    }
}

/// What one `INSERT … IF NOT EXISTS` round came to.
pub(super) enum Insert {
    /// The record is in: the key was free.
    Inserted,
    /// The record is in, over this record that had expired but was still on
    /// disk: its pending-index entry is now stale.
    Replaced(Record),
    /// A live record holds the key.
    Exists(Record),
    /// The key changed between two statements (a row vanished or expired,
    /// or another writer got there first): nothing was written, try again.
    Retry,
}

/// The record table's LWTs (see the module docs).
pub(super) struct Records {
    /// The store's session.
    session: Arc<Session>,
    /// Prepared once at start.
    statements: Statements,
    /// Seals and opens the `response` column; `None` writes it in clear.
    keyring: Option<Arc<Keyring>>,
    /// Counters of uncertain writes.
    stats: CqlStats,
}

/// The `USING TTL` value of a write of `record`: what is left of its dedup
/// window.
fn ttl_value(record: &Record, now_ms: i64) -> Values {
    vec![Some(CqlValue::Int(ttl_seconds(
        record.expires_at_ms,
        now_ms,
    )))]
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

impl Records {
    /// Prepares the record statements on `session`.
    pub(super) async fn open(
        session: Arc<Session>,
        options: &CqlOptions,
        keyring: Option<Arc<Keyring>>,
    ) -> StoreResult<Self> {
        let statements = Statements::prepare(&session, options).await?;
        Ok(Self {
            session,
            statements,
            keyring,
            stats: CqlStats::default(),
        })
    }

    /// Counters (uncertain writes).
    pub(super) fn stats(&self) -> &CqlStats {
        &self.stats
    }

    /// The record of `id` as stored, expired or not; at SERIAL when
    /// `serial` (sees the outcome of in-flight Paxos rounds).
    pub(super) async fn read(&self, id: &RecordKey, serial: bool) -> StoreResult<Option<Record>> {
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
            Some(row) => codec::record_from_row(id, row, self.keyring.as_deref()),
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

    /// The values of an `UPDATE … USING TTL ? SET … WHERE <key> IF …` that
    /// writes `record`: its TTL, its columns, its key, then `condition`.
    fn update_values(
        &self,
        record: &Record,
        now_ms: i64,
        condition: Values,
    ) -> StoreResult<Values> {
        Ok(values([
            ttl_value(record, now_ms),
            record_values(record, self.keyring.as_deref())?,
            key_values(&record.id),
            condition,
        ]))
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

    /// One round of a claim: `INSERT … IF NOT EXISTS`, or the conditional
    /// reuse of a row that expired but is still on disk.
    pub(super) async fn insert(&self, record: &Record, now_ms: i64) -> StoreResult<Insert> {
        let id = &record.id;
        let bound = values([
            key_values(id),
            record_values(record, self.keyring.as_deref())?,
            ttl_value(record, now_ms),
        ]);
        match self.conditional(&self.statements.insert, bound).await {
            Ok((true, _)) => Ok(Insert::Inserted),
            Ok((false, row)) => {
                let existing = match row
                    .as_ref()
                    .map(|row| codec::record_from_row(id, row, self.keyring.as_deref()))
                {
                    Some(Ok(Some(existing))) => Some(existing),
                    _ => self.read(id, true).await?,
                };
                match existing {
                    Some(existing) if existing.is_live(now_ms) => Ok(Insert::Exists(existing)),
                    // The row is logically expired but its TTL has not run
                    // out yet: overwrite it conditionally.
                    Some(expired) => self.replace_expired(record, expired, now_ms).await,
                    // Gone between the insert and the read: try again.
                    None => Ok(Insert::Retry),
                }
            }
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => Ok(Insert::Inserted),
                Some(current) if current.is_live(now_ms) => Ok(Insert::Exists(current)),
                // Not applied (a SERIAL read completes in-flight rounds):
                // safe to try again.
                _ => Ok(Insert::Retry),
            },
        }
    }

    async fn replace_expired(
        &self,
        record: &Record,
        expired: Record,
        now_ms: i64,
    ) -> StoreResult<Insert> {
        let id = &record.id;
        let bound = self.update_values(record, now_ms, vec![Some(CqlValue::BigInt(now_ms))])?;
        match self
            .conditional(&self.statements.replace_expired, bound)
            .await
        {
            Ok((true, _)) => Ok(Insert::Replaced(expired)),
            Ok((false, _)) => Ok(Insert::Retry),
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => Ok(Insert::Inserted),
                _ => Ok(Insert::Retry),
            },
        }
    }

    /// `UPDATE … IF state = ? AND lease_token = ? AND expires_at > ?`: the
    /// transition to `record` from `expected`.
    pub(super) async fn replace(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let id = &record.id;
        let condition = vec![
            text_value(expected.state.as_str()),
            text_value(&expected.lease_token),
            Some(CqlValue::BigInt(now_ms)),
        ];
        let bound = self.update_values(record, now_ms, condition)?;
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
        self.outcome(id, applied, now_ms).await
    }

    /// `DELETE … IF state = ? AND lease_token = ? AND expires_at > ?`.
    pub(super) async fn delete(
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
        self.outcome(id, applied, now_ms).await
    }

    /// A conditional write's answer: applied, or the current record. A
    /// result that was not applied may not carry the row (Cassandra returns
    /// only the condition columns), so it is read at SERIAL.
    async fn outcome(&self, id: &RecordKey, applied: bool, now_ms: i64) -> StoreResult<CasOutcome> {
        if applied {
            return Ok(CasOutcome::Applied);
        }
        let current = self.read(id, true).await?;
        Ok(CasOutcome::Conflict {
            current: current.filter(|r| r.is_live(now_ms)),
        })
    }
}
