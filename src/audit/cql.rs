//! CQL audit log: the `audit_events` and `audit_by_key` tables of
//! `migrations/0002_audit.cql`.
//!
//! It opens its own session (same options as the record store): audit
//! traffic is opt-in and small, and a separate pool keeps it from queueing
//! behind Paxos rounds on the record path. Rows expire by TTL (the
//! retention), so [`AuditLog::sweep`] has nothing to do.

use std::time::Duration;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::log::{AuditCursor, AuditEvent, AuditLog, AuditQuery, retention_ms};
use crate::store::StoreError;
use crate::store::cql::session::{CqlOptions, connect, day_of, rows};

/// The CQL audit log.
pub struct CqlAuditLog {
    /// Its own connection pool (see the module docs).
    session: Session,
    /// Writes to both tables, as one logged batch.
    append_batch: Batch,
    /// One day-partition of a tenant's timeline.
    scan_day: PreparedStatement,
    /// One key's history.
    scan_key: PreparedStatement,
    /// Row TTL in seconds: the retention.
    ttl_seconds: i32,
    /// Events older than this are never returned (TTL may lag).
    retention: Duration,
}

impl std::fmt::Debug for CqlAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqlAuditLog")
            .field("ttl_seconds", &self.ttl_seconds)
            .finish_non_exhaustive()
    }
}

fn unavailable(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("audit log: {context}: {error}"))
}

impl CqlAuditLog {
    /// Connects and prepares the statements; the tables must exist
    /// (`idemd migrate`).
    pub async fn open(options: &CqlOptions, retention: Duration) -> Result<Self, StoreError> {
        let session = connect(options).await?;
        let ks = &options.keyspace;
        let prepare = |cql: String| {
            let session = &session;
            async move {
                session.prepare(cql).await.map_err(|e| {
                    unavailable(
                        "prepare (run `idemd migrate` to create the audit tables)",
                        e,
                    )
                })
            }
        };
        let insert_event = prepare(format!(
            "INSERT INTO {ks}.audit_events (tenant, day, at_ms, event_id, endpoint, event) \
             VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
        ))
        .await?;
        let insert_by_key = prepare(format!(
            "INSERT INTO {ks}.audit_by_key (tenant, endpoint, key_sha256, at_ms, event_id, event) \
             VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
        ))
        .await?;
        let scan_day = prepare(format!(
            "SELECT event FROM {ks}.audit_events \
             WHERE tenant = ? AND day = ? AND (at_ms, event_id) > (?, ?) LIMIT ?"
        ))
        .await?;
        let scan_key = prepare(format!(
            "SELECT event FROM {ks}.audit_by_key \
             WHERE tenant = ? AND endpoint = ? AND key_sha256 = ? AND (at_ms, event_id) > (?, ?) \
             LIMIT ?"
        ))
        .await?;
        let mut append_batch = Batch::new(BatchType::Logged);
        append_batch.append_statement(insert_event);
        append_batch.append_statement(insert_by_key);
        let ttl_seconds = i32::try_from(retention.as_secs().max(1)).unwrap_or(i32::MAX);
        Ok(Self {
            session,
            append_batch,
            scan_day,
            scan_key,
            ttl_seconds,
            retention,
        })
    }
}

fn events_of(
    result: scylla::response::query_result::QueryResult,
) -> Result<Vec<AuditEvent>, StoreError> {
    rows::named_rows(result)?
        .into_iter()
        .map(|row| match row.get("event") {
            Some(Some(CqlValue::Text(json))) => serde_json::from_str(json)
                .map_err(|e| StoreError::Corrupt(format!("audit event: {e}"))),
            _ => Err(StoreError::Corrupt("audit row without event".to_string())),
        })
        .collect()
}

#[async_trait]
impl AuditLog for CqlAuditLog {
    fn backend_name(&self) -> &'static str {
        "cql"
    }

    async fn append(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        // One logged batch per event: a batch spanning many partitions costs
        // the coordinator more than it saves, and events arrive one by one.
        for event in events {
            let json = serde_json::to_string(event).map_err(|e| unavailable("encode", e))?;
            let values = (
                (
                    &event.tenant,
                    day_of(event.at_ms),
                    event.at_ms,
                    event.event_id,
                    &event.endpoint,
                    &json,
                    self.ttl_seconds,
                ),
                (
                    &event.tenant,
                    &event.endpoint,
                    &event.key_sha256,
                    event.at_ms,
                    event.event_id,
                    &json,
                    self.ttl_seconds,
                ),
            );
            self.session
                .batch(&self.append_batch, values)
                .await
                .map_err(|e| unavailable("append", e))?;
        }
        Ok(())
    }

    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditEvent>, StoreError> {
        let oldest = AuditCursor::before(query.now_ms.saturating_sub(retention_ms(self.retention)));
        let after = query.after.max(oldest);
        let limit = i32::try_from(query.limit).unwrap_or(i32::MAX);
        if let (Some(endpoint), Some(key)) = (&query.endpoint, &query.key_sha256) {
            let result = self
                .session
                .execute_unpaged(
                    &self.scan_key,
                    (
                        &query.tenant,
                        endpoint,
                        key,
                        after.at_ms,
                        after.event_id,
                        limit,
                    ),
                )
                .await
                .map_err(|e| unavailable("read key history", e))?;
            return events_of(result);
        }
        let mut found = Vec::new();
        let mut cursor = after;
        for day in day_of(after.at_ms.max(0))..=day_of(query.now_ms) {
            // Reads the day in slices until it is exhausted or the page is
            // full; the endpoint filter can discard a whole slice.
            loop {
                let result = self
                    .session
                    .execute_unpaged(
                        &self.scan_day,
                        (&query.tenant, day, cursor.at_ms, cursor.event_id, limit),
                    )
                    .await
                    .map_err(|e| unavailable("read timeline", e))?;
                let slice = events_of(result)?;
                let exhausted = slice.len() < query.limit;
                for event in slice {
                    cursor = event.cursor();
                    if query
                        .endpoint
                        .as_ref()
                        .is_none_or(|endpoint| *endpoint == event.endpoint)
                    {
                        found.push(event);
                        if found.len() >= query.limit {
                            return Ok(found);
                        }
                    }
                }
                if exhausted {
                    break;
                }
            }
        }
        Ok(found)
    }

    async fn sweep(&self, _now_ms: i64, _batch: usize) -> Result<usize, StoreError> {
        Ok(0)
    }

    async fn close(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
