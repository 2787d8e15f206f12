//! The mark a finished `idemd copy-to-cql` leaves in the embedded store's
//! data directory: this store moved to a CQL keyspace, at this time.
//!
//! Why: after the cut-over the cluster takes the writes. An embedded idemd
//! started on the old volume afterwards (a `helm rollback`, a forgotten
//! replica, the old manifest applied again) would not know the keys the
//! cluster completed since, and would grant them again: a double
//! execution nobody asked for (issue 50). So `idemd serve` refuses a data
//! directory with this mark, naming the keyspace, unless started with
//! `--allow-moved-store` — the rollback the docs describe, for before the
//! cluster took its first write — which logs the mark and removes it (the
//! store is live again; a later copy marks it again).
//!
//! A restore does not remove the mark: a backup restored into a moved
//! directory is as stale as the store it replaces. `idemd copy-to-cql`
//! runs on a marked store (to resume or to check a copy).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::failure::storage_error;
use super::swap::{sync_dir, write_durably};
use crate::store::{StoreError, StoreResult};

/// The mark's file in the data directory.
pub const MOVED_FILE: &str = "moved.json";

/// The same mark in a backup after `idemd copy-to-cql --from-backup`
/// copied it whole: its records are in that keyspace. `--since-backup`
/// refuses a backup without it (or marked for another keyspace): it writes
/// only what changed since the backup, so everything else must be there.
pub const BULK_COPIED_FILE: &str = "copied-to-cql.json";

/// Where the store went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedMarker {
    /// The keyspace the records were copied into.
    pub keyspace: String,
    /// The contact points the copy wrote through, as given.
    pub cql_nodes: Vec<String>,
    /// When the copy finished (RFC 3339, UTC).
    pub moved_at: String,
    /// In a backup's [`BULK_COPIED_FILE`] only: the later backup a
    /// catch-up (`--from-backup LATER --since-backup THIS`) is bringing
    /// the keyspace to, written before its first write. The keyspace then
    /// no longer holds exactly this backup, so `--since-backup THIS`
    /// would miss what the catch-up wrote; it refuses, naming the later
    /// one. Absent in marks of earlier releases (nothing superseded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

impl MovedMarker {
    /// A mark for a copy into `keyspace` through `cql_nodes`, finished now.
    pub fn now(keyspace: &str, cql_nodes: &[String]) -> Self {
        Self {
            keyspace: keyspace.to_string(),
            cql_nodes: cql_nodes.to_vec(),
            moved_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            superseded_by: None,
        }
    }

    /// Writes the mark into `data_dir`, durably (a temporary file renamed
    /// over it, the directory synced).
    pub fn write(&self, data_dir: &Path) -> StoreResult<()> {
        self.write_as(data_dir, MOVED_FILE)
    }

    /// Writes the mark into `dir` as `file` ([`MOVED_FILE`] or
    /// [`BULK_COPIED_FILE`]), durably.
    pub fn write_as(&self, dir: &Path, file: &str) -> StoreResult<()> {
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| storage_error("cannot write the moved mark", e))?;
        write_durably(dir, file, &text).map_err(|e| storage_error("cannot write the moved mark", e))
    }

    /// The mark in `data_dir`, if there is one.
    pub fn read(data_dir: &Path) -> StoreResult<Option<Self>> {
        Self::read_as(data_dir, MOVED_FILE)
    }

    /// The mark `file` in `dir`, if there is one.
    pub fn read_as(dir: &Path, file: &str) -> StoreResult<Option<Self>> {
        let path = dir.join(file);
        match std::fs::read(&path) {
            Ok(text) => serde_json::from_slice(&text).map(Some).map_err(|e| {
                StoreError::Corrupt(format!(
                    "{} cannot be read ({e}); it marks a store moved to a CQL keyspace",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(storage_error("cannot read the moved mark", e)),
        }
    }

    /// What `idemd serve` decides before it opens `data_dir`: refuses a
    /// marked store unless `allow`; with `allow`, removes the mark and
    /// returns it (for the start-up log).
    pub fn before_serving(data_dir: &Path, allow: bool) -> StoreResult<Option<Self>> {
        let Some(mark) = Self::read(data_dir)? else {
            return Ok(None);
        };
        if !allow {
            return Err(StoreError::Unavailable(format!(
                "{} was moved to the CQL keyspace {} (nodes {}) at {} by `idemd copy-to-cql`: serving it again would grant keys the cluster completed since; serve the keyspace (--store cql), or, to roll back before the cluster took its first write, start with --allow-moved-store",
                data_dir.display(),
                mark.keyspace,
                mark.cql_nodes.join(","),
                mark.moved_at
            )));
        }
        std::fs::remove_file(data_dir.join(MOVED_FILE))
            .map_err(|e| storage_error("cannot remove the moved mark", e))?;
        sync_dir(data_dir)?;
        Ok(Some(mark))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marked directory is refused naming the keyspace; allowed once, the
    /// mark is gone. Fails without the check.
    #[test]
    fn a_moved_store_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            MovedMarker::before_serving(dir.path(), false).expect("no mark"),
            None
        );
        let mark = MovedMarker::now("idemd_prod", &["scylla-1:9042".to_string()]);
        mark.write(dir.path()).expect("write");
        let refused = MovedMarker::before_serving(dir.path(), false).expect_err("refused");
        assert!(
            refused.to_string().contains("CQL keyspace idemd_prod"),
            "{refused}"
        );
        let allowed = MovedMarker::before_serving(dir.path(), true).expect("allowed");
        assert_eq!(allowed, Some(mark));
        assert_eq!(MovedMarker::read(dir.path()).expect("read"), None);
    }
}
