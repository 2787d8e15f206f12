//! The mark of a cut-over in progress: `idemd copy-to-cql` is filling the
//! keyspace from an embedded store (migration 4, `migrations/0004_cutover.cql`).
//!
//! # Why
//!
//! The records of the old node reach the keyspace over minutes (the bulk,
//! while the old node serves) and then seconds (what changed since, while
//! it is stopped). A replica serving the keyspace in between would answer
//! a retry of a key the old node completed with `claimed`, because the
//! copy has not written that key yet: the key runs twice. The runbook used
//! to say "no idemd may serve the keyspace while the copy runs"; the
//! binary checks it instead (issue 50): the copy writes this mark before
//! its first record and removes it after its last step, and `idemd --store
//! cql` refuses to start while it is there, naming the copy. A forgotten
//! last step (the bulk copied, `--since-backup` never run) is refused the
//! same way.
//!
//! # Limits
//!
//! The check is made when a replica starts. A replica already serving the
//! keyspace when a copy begins is not stopped by it; the copy then reports
//! every key that replica wrote as a conflict and exits 3 (docs/deploy.md).
//! A keyspace migrated by a release without migration 4 has no table: the
//! start logs that it cannot check (run `idemd migrate` of this release),
//! and the copy, which needs the table, fails naming `idemd migrate`.

use scylla::client::session::Session;
use scylla::value::CqlValue;

use super::session::rows;
use crate::store::{StoreError, StoreResult};

/// The key of the table's one row.
const ROW: &str = "cutover";

/// A copy filling the keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutoverMark {
    /// What is copied: the data directory or backup, as the copy named it.
    pub source: String,
    /// When the copy that wrote the mark started (ms since the epoch).
    pub started_at_ms: i64,
}

impl CutoverMark {
    /// The mark in `keyspace`, if a copy left one. `Ok(None)` also when the
    /// keyspace has no such table (see "Limits"), after a warning.
    pub async fn read(session: &Session, keyspace: &str) -> StoreResult<Option<Self>> {
        let result = session
            .query_unpaged(
                format!("SELECT source, started_at FROM {keyspace}.cutover WHERE id = ?"),
                (ROW,),
            )
            .await;
        let result = match result {
            Ok(result) => result,
            Err(error) if error.to_string().contains("unconfigured table") => {
                tracing::warn!(
                    keyspace,
                    "the keyspace has no cutover table (migration 4): a cut-over in progress cannot be detected; run `idemd migrate` of this release"
                );
                return Ok(None);
            }
            Err(error) => {
                return Err(StoreError::Unavailable(format!(
                    "cannot read the cut-over mark of keyspace {keyspace}: {error}"
                )));
            }
        };
        let rows = rows::named_rows(result)?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let source = match row.get("source") {
            Some(Some(CqlValue::Text(source))) => source.clone(),
            _ => String::new(),
        };
        let started_at_ms = match row.get("started_at") {
            Some(Some(CqlValue::BigInt(at))) => *at,
            _ => 0,
        };
        Ok(Some(Self {
            source,
            started_at_ms,
        }))
    }

    /// Writes the mark into `keyspace` (over any earlier one).
    pub async fn write(&self, session: &Session, keyspace: &str) -> StoreResult<()> {
        session
            .query_unpaged(
                format!("INSERT INTO {keyspace}.cutover (id, source, started_at) VALUES (?, ?, ?)"),
                (ROW, self.source.as_str(), self.started_at_ms),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot mark keyspace {keyspace} as being copied into (has `idemd migrate` of this release run?): {e}"
                ))
            })
    }

    /// Removes the mark from `keyspace`: the copy is complete.
    pub async fn clear(session: &Session, keyspace: &str) -> StoreResult<()> {
        session
            .query_unpaged(
                format!("DELETE FROM {keyspace}.cutover WHERE id = ?"),
                (ROW,),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot clear the cut-over mark of keyspace {keyspace}: {e}"
                ))
            })
    }

    /// Why `idemd --store cql` does not start on `keyspace` while this mark
    /// is there.
    pub fn refusal(&self, keyspace: &str) -> String {
        let since = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(self.started_at_ms).unwrap_or(0));
        format!(
            "keyspace {keyspace} is being filled by `idemd copy-to-cql` from {} (since {}): a replica serving it now would grant keys the old node acknowledged and the copy has not written yet. Start once the copy's last step (--since-backup, or a copy of the whole store) has finished; an interrupted copy is finished by running it again",
            self.source,
            humantime::format_rfc3339_seconds(since)
        )
    }
}
