//! The prepared statements of the CQL store: every query idemd sends, in
//! one place, prepared once at start.

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{CqlOptions, RESOLVE_TIMEOUT};
use crate::store::{StoreError, StoreResult};

/// The record columns every statement reads and writes, in this order
/// (`record_values` binds them in the same order).
pub(super) const RECORD_COLUMNS: &str = "state, fingerprint, attempt, lease_token, attempt_id, created_at, \
     updated_at, lease_expires_at, completed_at, expires_at, response, reason";

/// The columns of a `pending_cursor` row every read returns.
const CURSOR_COLUMNS: &str = "tenant, watermark, summary_at, summary_in_progress, \
     summary_unknown, summary_failed, summary_oldest_due, summary_truncated";

/// Rows per page of the index reads: small enough that a page of live rows
/// is cheap, large enough that a slice rarely needs two.
pub(super) const INDEX_PAGE_ROWS: i32 = 500;

fn paged(mut statement: PreparedStatement) -> PreparedStatement {
    statement.set_page_size(INDEX_PAGE_ROWS);
    statement
}

/// The prepared statements of the store.
pub(super) struct Statements {
    /// The record at the regular consistency.
    pub(super) select: PreparedStatement,
    /// The record at SERIAL: resolves uncertain writes.
    pub(super) select_serial: PreparedStatement,
    /// Claim: `INSERT … IF NOT EXISTS`.
    pub(super) insert: PreparedStatement,
    /// Every transition: `UPDATE … IF state AND lease_token`.
    pub(super) replace: PreparedStatement,
    /// Reuse of an expired row still on disk.
    pub(super) replace_expired: PreparedStatement,
    /// Release: `DELETE … IF`.
    pub(super) delete: PreparedStatement,
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
    /// The coordinator's clock (`Store::cluster_time_ms`).
    pub(super) cluster_time: PreparedStatement,
}

impl Statements {
    /// Prepares every statement on the options' keyspace; fails, naming
    /// the keyspace, when the schema is missing.
    pub(super) async fn prepare(session: &Session, options: &CqlOptions) -> StoreResult<Self> {
        let ks = &options.keyspace;
        let prepare = |cql: String| async move {
            session.prepare(cql).await.map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot prepare statements on keyspace {ks} (has `idemd migrate` run?): {e}"
                ))
            })
        };
        let key_filter = "WHERE tenant = ? AND endpoint = ? AND key = ?";
        let select = prepare(format!(
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
            insert: prepare(format!(
                "INSERT INTO {ks}.records (tenant, endpoint, key, {RECORD_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
            ))
            .await?,
            replace: prepare(format!(
                "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} \
                 IF state = ? AND lease_token = ? AND expires_at > ?"
            ))
            .await?,
            replace_expired: prepare(format!(
                "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} IF expires_at <= ?"
            ))
            .await?,
            delete: prepare(format!(
                "DELETE FROM {ks}.records {key_filter} \
                 IF state = ? AND lease_token = ? AND expires_at > ?"
            ))
            .await?,
            bucket_put: prepare(format!(
                "INSERT INTO {ks}.pending_buckets (tenant, bucket, shard, due_at, endpoint, key) \
                 VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
            ))
            .await?,
            bucket_delete: prepare(format!(
                "DELETE FROM {ks}.pending_buckets WHERE tenant = ? AND bucket = ? AND shard = ? \
                 AND due_at = ? AND endpoint = ? AND key = ?"
            ))
            .await?,
            bucket_scan: paged(
                prepare(format!(
                    "SELECT due_at, endpoint, key FROM {ks}.pending_buckets \
                     WHERE tenant = ? AND bucket = ? AND shard = ? \
                     AND (due_at, endpoint, key) > (?, ?, ?) AND (due_at) <= (?)"
                ))
                .await?,
            ),
            bucket_drop: prepare(format!(
                "DELETE FROM {ks}.pending_buckets WHERE tenant = ? AND bucket = ? AND shard = ?"
            ))
            .await?,
            overdue_put: prepare(format!(
                "INSERT INTO {ks}.pending_overdue (tenant, shard, due_at, endpoint, key) \
                 VALUES (?, ?, ?, ?, ?) USING TTL ?"
            ))
            .await?,
            overdue_delete: prepare(format!(
                "DELETE FROM {ks}.pending_overdue WHERE tenant = ? AND shard = ? \
                 AND due_at = ? AND endpoint = ? AND key = ?"
            ))
            .await?,
            overdue_scan: paged(
                prepare(format!(
                    "SELECT due_at, endpoint, key FROM {ks}.pending_overdue \
                     WHERE tenant = ? AND shard = ? \
                     AND (due_at, endpoint, key) > (?, ?, ?) AND (due_at) <= (?)"
                ))
                .await?,
            ),
            cursor_create: prepare(format!(
                "INSERT INTO {ks}.pending_cursor (tenant, watermark, sealed_at) \
                 VALUES (?, ?, ?) IF NOT EXISTS"
            ))
            .await?,
            cursor_read: prepare(format!(
                "SELECT {CURSOR_COLUMNS} FROM {ks}.pending_cursor WHERE tenant = ?"
            ))
            .await?,
            cursor_all: paged(
                prepare(format!("SELECT {CURSOR_COLUMNS} FROM {ks}.pending_cursor")).await?,
            ),
            cursor_advance: prepare(format!(
                "UPDATE {ks}.pending_cursor SET watermark = ?, sealed_at = ?, sealed_by = ? \
                 WHERE tenant = ? IF watermark = ?"
            ))
            .await?,
            cursor_advance_with_summary: prepare(format!(
                "UPDATE {ks}.pending_cursor SET watermark = ?, sealed_at = ?, sealed_by = ?, \
                 summary_at = ?, summary_in_progress = ?, summary_unknown = ?, \
                 summary_failed = ?, summary_oldest_due = ?, summary_truncated = ? \
                 WHERE tenant = ? IF watermark = ?"
            ))
            .await?,
            cluster_time: prepare(
                "SELECT toUnixTimestamp(now()) AS now_ms FROM system.local".to_string(),
            )
            .await?,
        };
        // The record LWTs only: a timed-out one is resolved by a SERIAL
        // read. The cursor's LWTs keep the request timeout: a failed one is
        // simply tried again (the claim fails as unavailable, the sealer
        // retries at its next step).
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
        // Every statement that is not an LWT may run twice without harm: a
        // read, or a plain write of fixed values (a later write of the same
        // row comes from a later request, after this one returned). Marked
        // idempotent, they get the session's speculative executions (see
        // `connection::SPECULATIVE_AFTER`): a coordinator that stopped
        // answering (a paused node) costs them a few hundred milliseconds,
        // not the request timeout. An LWT is never sent twice: its outcome
        // after a timeout is decided by a SERIAL read.
        for statement in [
            &mut statements.select,
            &mut statements.select_serial,
            &mut statements.bucket_put,
            &mut statements.bucket_delete,
            &mut statements.bucket_scan,
            &mut statements.bucket_drop,
            &mut statements.overdue_put,
            &mut statements.overdue_delete,
            &mut statements.overdue_scan,
            &mut statements.cursor_read,
            &mut statements.cursor_all,
            &mut statements.cluster_time,
        ] {
            statement.set_is_idempotent(true);
        }
        Ok(statements)
    }
}
