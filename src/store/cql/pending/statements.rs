//! The pending index's prepared statements: its two tables of entries and
//! the per-tenant cursor (migration 3).

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::super::statements::{Preparer, idempotent, paged};
use crate::store::StoreResult;

/// The columns of a `pending_cursor` row every read returns.
const CURSOR_COLUMNS: &str = "tenant, watermark, summary_at, summary_in_progress, \
     summary_unknown, summary_failed, summary_oldest_due, summary_truncated";

/// The prepared statements of the index.
pub(super) struct Statements {
    /// An IN_PROGRESS record's entry in its bucket, written before the
    /// claim it indexes.
    pub(super) bucket_put: PreparedStatement,
    /// A stale bucket entry.
    pub(super) bucket_delete: PreparedStatement,
    /// One shard of one bucket, from a cursor up to a due instant (paged).
    pub(super) bucket_scan: PreparedStatement,
    /// A sealed bucket's partition, whole.
    pub(super) bucket_drop: PreparedStatement,
    /// An entry in a tenant's overdue partition.
    pub(super) overdue_put: PreparedStatement,
    /// A stale overdue entry.
    pub(super) overdue_delete: PreparedStatement,
    /// One overdue partition from a cursor up to now (paged).
    pub(super) overdue_scan: PreparedStatement,
    /// A tenant's cursor row, created once (`IF NOT EXISTS`).
    pub(super) cursor_create: PreparedStatement,
    /// A tenant's cursor row.
    pub(super) cursor_read: PreparedStatement,
    /// Every tenant's cursor row (the sealer's list of tenants).
    pub(super) cursor_all: PreparedStatement,
    /// The sealer's LWT: `watermark` from old to new.
    pub(super) cursor_advance: PreparedStatement,
    /// The same, storing a fresh pending summary.
    pub(super) cursor_advance_with_summary: PreparedStatement,
}

impl Statements {
    /// Prepares every statement of the index on `keyspace`. The cursor's
    /// LWTs keep the request timeout (unlike the record LWTs, nothing
    /// resolves them: a failed one is simply tried again, the claim failing
    /// as unavailable or the sealer retrying at its next step); every other
    /// statement is a read or a plain write, marked idempotent.
    pub(super) async fn prepare(session: &Session, keyspace: &str) -> StoreResult<Self> {
        let preparer = Preparer::new(session, keyspace);
        let ks = keyspace;
        let mut statements = Self {
            bucket_put: preparer
                .prepare(format!(
                    "INSERT INTO {ks}.pending_buckets (tenant, bucket, shard, due_at, endpoint, key) \
                     VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
                ))
                .await?,
            bucket_delete: preparer
                .prepare(format!(
                    "DELETE FROM {ks}.pending_buckets WHERE tenant = ? AND bucket = ? AND shard = ? \
                     AND due_at = ? AND endpoint = ? AND key = ?"
                ))
                .await?,
            bucket_scan: paged(
                preparer
                    .prepare(format!(
                        "SELECT due_at, endpoint, key FROM {ks}.pending_buckets \
                         WHERE tenant = ? AND bucket = ? AND shard = ? \
                         AND (due_at, endpoint, key) > (?, ?, ?) AND (due_at) <= (?)"
                    ))
                    .await?,
            ),
            bucket_drop: preparer
                .prepare(format!(
                    "DELETE FROM {ks}.pending_buckets WHERE tenant = ? AND bucket = ? AND shard = ?"
                ))
                .await?,
            overdue_put: preparer
                .prepare(format!(
                    "INSERT INTO {ks}.pending_overdue (tenant, shard, due_at, endpoint, key) \
                     VALUES (?, ?, ?, ?, ?) USING TTL ?"
                ))
                .await?,
            overdue_delete: preparer
                .prepare(format!(
                    "DELETE FROM {ks}.pending_overdue WHERE tenant = ? AND shard = ? \
                     AND due_at = ? AND endpoint = ? AND key = ?"
                ))
                .await?,
            overdue_scan: paged(
                preparer
                    .prepare(format!(
                        "SELECT due_at, endpoint, key FROM {ks}.pending_overdue \
                         WHERE tenant = ? AND shard = ? \
                         AND (due_at, endpoint, key) > (?, ?, ?) AND (due_at) <= (?)"
                    ))
                    .await?,
            ),
            cursor_create: preparer
                .prepare(format!(
                    "INSERT INTO {ks}.pending_cursor (tenant, watermark, sealed_at) \
                     VALUES (?, ?, ?) IF NOT EXISTS"
                ))
                .await?,
            cursor_read: preparer
                .prepare(format!(
                    "SELECT {CURSOR_COLUMNS} FROM {ks}.pending_cursor WHERE tenant = ?"
                ))
                .await?,
            cursor_all: paged(
                preparer
                    .prepare(format!("SELECT {CURSOR_COLUMNS} FROM {ks}.pending_cursor"))
                    .await?,
            ),
            cursor_advance: preparer
                .prepare(format!(
                    "UPDATE {ks}.pending_cursor SET watermark = ?, sealed_at = ?, sealed_by = ? \
                     WHERE tenant = ? IF watermark = ?"
                ))
                .await?,
            cursor_advance_with_summary: preparer
                .prepare(format!(
                    "UPDATE {ks}.pending_cursor SET watermark = ?, sealed_at = ?, sealed_by = ?, \
                     summary_at = ?, summary_in_progress = ?, summary_unknown = ?, \
                     summary_failed = ?, summary_oldest_due = ?, summary_truncated = ? \
                     WHERE tenant = ? IF watermark = ?"
                ))
                .await?,
        };
        idempotent([
            &mut statements.bucket_put,
            &mut statements.bucket_delete,
            &mut statements.bucket_scan,
            &mut statements.bucket_drop,
            &mut statements.overdue_put,
            &mut statements.overdue_delete,
            &mut statements.overdue_scan,
            &mut statements.cursor_read,
            &mut statements.cursor_all,
        ]);
        Ok(statements)
    }
}
