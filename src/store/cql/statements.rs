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
    /// Pending-index entry, written before the claim it indexes.
    pub(super) index_put: PreparedStatement,
    /// Stale pending-index entry.
    pub(super) index_delete: PreparedStatement,
    /// ListPending's read of one day of the index.
    pub(super) index_scan: PreparedStatement,
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
            index_put: prepare(format!(
                "INSERT INTO {ks}.pending_index (tenant, day, due_at, endpoint, key) \
                 VALUES (?, ?, ?, ?, ?) USING TTL ?"
            ))
            .await?,
            index_delete: prepare(format!(
                "DELETE FROM {ks}.pending_index \
                 WHERE tenant = ? AND day = ? AND due_at = ? AND endpoint = ? AND key = ?"
            ))
            .await?,
            index_scan: prepare(format!(
                "SELECT due_at, endpoint, key FROM {ks}.pending_index \
                 WHERE tenant = ? AND day = ? AND (due_at, endpoint, key) > (?, ?, ?) \
                 AND (due_at) <= (?) LIMIT ?"
            ))
            .await?,
        };
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
        Ok(statements)
    }
}
