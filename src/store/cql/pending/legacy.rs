//! The upgrade from migration 1's `pending_index` ((tenant, day)
//! partitions) to the bucketed index of migration 3: `idemd migrate` copies
//! every entry a release before it wrote, whose record still exists, into
//! `pending_overdue` (where readers find it whatever its due instant, and
//! drop it once its record is decided), and creates the tenant's cursor.
//!
//! It runs on every `idemd migrate`, not once: replicas of the previous
//! release keep writing `pending_index` until the rollout ends, so the
//! upgrade is "migrate, roll out, migrate again" (docs/scylla.md). Copies are
//! idempotent (same primary key). The old table is left to expire with its
//! entries' TTLs; nothing reads it after the copy.
//!
//! A busy tenant's old partitions hold up to a day of tombstones, more than
//! Cassandra lets one read walk (100,000), so each partition is read in
//! one-minute slices of its clustering range, and a slice that still fails
//! is split into one-second slices.

use futures::StreamExt;
use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;
use std::ops::ControlFlow;

use super::super::session::{DAY_MS, rows, ttl_seconds, unavailable};
use super::super::statements::INDEX_PAGE_ROWS;
use super::entry::shard_of;
use crate::store::{StoreError, StoreResult};

/// Concurrent slice reads while copying.
const CONCURRENCY: usize = 16;

/// What the copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LegacyReport {
    /// (tenant, day) partitions of `pending_index` read.
    pub partitions: usize,
    /// Live entries found there.
    pub entries: usize,
    /// Entries whose record exists, copied to `pending_overdue`.
    pub copied: usize,
}

/// The statements of the copy, prepared once per run.
struct Copy<'a> {
    session: &'a Session,
    slice: PreparedStatement,
    record: PreparedStatement,
    put: PreparedStatement,
    cursor: PreparedStatement,
}

async fn prepare(session: &Session, cql: String) -> StoreResult<PreparedStatement> {
    let mut statement = session
        .prepare(cql)
        .await
        .map_err(|e| unavailable("prepare (pending index upgrade)", e))?;
    statement.set_page_size(INDEX_PAGE_ROWS);
    Ok(statement)
}

async fn all_pages(
    session: &Session,
    statement: &PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow,
) -> Result<Vec<rows::NamedRow>, String> {
    let mut out = Vec::new();
    let mut paging = PagingState::start();
    loop {
        let (result, next) = session
            .execute_single_page(statement, &values, paging)
            .await
            .map_err(|e| e.to_string())?;
        out.extend(rows::named_rows(result).map_err(|e| e.to_string())?);
        match next.into_paging_control_flow() {
            ControlFlow::Break(()) => return Ok(out),
            ControlFlow::Continue(state) => paging = state,
        }
    }
}

/// Copies `pending_index` into the new tables (see the module docs).
/// `grace_ms` sets a new cursor's watermark (`now - grace`).
pub async fn copy_legacy_index(
    session: &Session,
    keyspace: &str,
    grace_ms: i64,
    now_ms: i64,
) -> StoreResult<LegacyReport> {
    let copy = Copy {
        session,
        slice: prepare(
            session,
            format!(
                "SELECT due_at, endpoint, key FROM {keyspace}.pending_index \
                 WHERE tenant = ? AND day = ? AND due_at >= ? AND due_at < ?"
            ),
        )
        .await?,
        record: prepare(
            session,
            format!(
                "SELECT expires_at FROM {keyspace}.records \
                 WHERE tenant = ? AND endpoint = ? AND key = ?"
            ),
        )
        .await?,
        put: prepare(
            session,
            format!(
                "INSERT INTO {keyspace}.pending_overdue (tenant, shard, due_at, endpoint, key) \
                 VALUES (?, ?, ?, ?, ?) USING TTL ?"
            ),
        )
        .await?,
        cursor: prepare(
            session,
            format!(
                "INSERT INTO {keyspace}.pending_cursor (tenant, watermark, sealed_at) \
                 VALUES (?, ?, ?) IF NOT EXISTS"
            ),
        )
        .await?,
    };
    let partitions_statement = prepare(
        session,
        format!("SELECT DISTINCT tenant, day FROM {keyspace}.pending_index"),
    )
    .await?;
    let partitions = all_pages(session, &partitions_statement, ())
        .await
        .map_err(|e| unavailable("pending index upgrade: list partitions", e))?;
    let mut report = LegacyReport::default();
    for row in &partitions {
        let (Some(tenant), Some(CqlValue::Int(day))) = (
            rows::text_or_none(row, "tenant"),
            row.get("day").cloned().flatten(),
        ) else {
            return Err(StoreError::Corrupt(
                "pending_index partition without tenant or day".into(),
            ));
        };
        report.partitions += 1;
        copy.session
            .execute_unpaged(&copy.cursor, (&tenant, now_ms - grace_ms, now_ms))
            .await
            .map_err(|e| unavailable("pending index upgrade: cursor", e))?;
        let start = i64::from(day) * DAY_MS;
        let minutes = (0..DAY_MS / 60_000).map(|minute| {
            let copy = &copy;
            let tenant = &tenant;
            async move {
                let from = start + minute * 60_000;
                copy.slice_with_retry(tenant, day, from, from + 60_000, now_ms)
                    .await
            }
        });
        let mut results = futures::stream::iter(minutes).buffer_unordered(CONCURRENCY);
        while let Some(result) = results.next().await {
            let (entries, copied) = result?;
            report.entries += entries;
            report.copied += copied;
        }
    }
    Ok(report)
}

impl Copy<'_> {
    /// One minute of one partition; split into seconds if the read fails
    /// (too many tombstones in one slice).
    async fn slice_with_retry(
        &self,
        tenant: &str,
        day: i32,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> StoreResult<(usize, usize)> {
        match self.slice(tenant, day, from, to, now_ms).await {
            Ok(counts) => Ok(counts),
            Err(first) => {
                tracing::debug!(error = %first, "pending index upgrade: splitting a slice");
                let mut total = (0, 0);
                for second in (from..to).step_by(1000) {
                    let (entries, copied) = self
                        .slice(tenant, day, second, second + 1000, now_ms)
                        .await
                        .map_err(|e| {
                            unavailable(
                                "pending index upgrade: a one-second slice of pending_index \
                                 cannot be read (too many tombstones? wait for compaction \
                                 past gc_grace and run `idemd migrate` again)",
                                e,
                            )
                        })?;
                    total.0 += entries;
                    total.1 += copied;
                }
                Ok(total)
            }
        }
    }

    async fn slice(
        &self,
        tenant: &str,
        day: i32,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> Result<(usize, usize), String> {
        let entries = all_pages(self.session, &self.slice, (tenant, day, from, to)).await?;
        let mut copied = 0;
        for entry in &entries {
            let (Some(due), Some(endpoint), Some(key)) = (
                rows::big_int_or_none(entry, "due_at"),
                rows::text_or_none(entry, "endpoint"),
                rows::text_or_none(entry, "key"),
            ) else {
                return Err("malformed pending_index entry".into());
            };
            let record = self
                .session
                .execute_unpaged(&self.record, (tenant, &endpoint, &key))
                .await
                .map_err(|e| e.to_string())?;
            let expires = rows::named_rows(record)
                .map_err(|e| e.to_string())?
                .first()
                .and_then(|row| rows::big_int_or_none(row, "expires_at"));
            // No record (released, expired, never written): nothing to find.
            let Some(expires) = expires.filter(|at| *at > now_ms) else {
                continue;
            };
            self.session
                .execute_unpaged(
                    &self.put,
                    (
                        tenant,
                        shard_of(&endpoint, &key),
                        due,
                        &endpoint,
                        &key,
                        ttl_seconds(expires, now_ms),
                    ),
                )
                .await
                .map_err(|e| e.to_string())?;
            copied += 1;
        }
        Ok((entries.len(), copied))
    }
}
