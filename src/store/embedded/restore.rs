//! Offline restore of a backup of the embedded store (what a backup holds:
//! [`super::backup`]).
//!
//! Offline: the restore takes the data directory's owner lock
//! ([`super::owner`]) first, so it is refused while idemd (or anything else)
//! has the directory. The backup is copied beside the data directory's
//! files, opened with every page and block checked, its records counted
//! against its manifest, and only then moved into place by a journaled
//! swap ([`super::swap`]: a kill at any step leaves the old store or the
//! restored one); the files it replaces (and the old write-ahead log,
//! whose frames belong to the old file) are moved into a `replaced-<time>`
//! directory, never deleted.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::backup::{copy_synced, read_manifest, unix_ms};
use super::blocks::SUMS_FILE;
use super::failure::storage_error;
use super::options::{DATABASE_FILE, EmbeddedOptions};
use super::owner::DirOwner;
use super::store::EmbeddedStore;
use super::swap::{self, STAGING_DIR, Swap, is_store_file, list, sync_dir};
use crate::crash::crash_point;
use crate::store::{BackupSummary, Store, StoreError, StoreResult};

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreSummary {
    /// The backup's manifest.
    pub backup: BackupSummary,
    /// Records found in the restored file (equal to the manifest's).
    pub records: u64,
    /// Where the files it replaced went, if there were any.
    pub replaced: Option<PathBuf>,
    /// Seconds the copy and the check took.
    pub seconds: f64,
}

/// Restores the backup in `from` into `options.data_dir` (see the module
/// docs); refuses a data directory that holds a store unless `replace`,
/// and one another process owns (a serving idemd) whatever `replace` says.
pub async fn restore(
    from: &Path,
    options: &EmbeddedOptions,
    replace: bool,
) -> StoreResult<RestoreSummary> {
    let started = Instant::now();
    let manifest = read_manifest(from)?;
    let data_dir = &options.data_dir;
    // Before anything in the directory is read or moved, and held to the
    // end: a serving idemd, a copy-to-cql or another restore is refused.
    let _owner = DirOwner::acquire(data_dir, "idemd restore")?;
    // A restore killed during its swap is finished before this one looks at
    // what the directory holds.
    swap::finish_interrupted(data_dir)?;
    let existing = list(data_dir)?.into_iter().any(|path| is_store_file(&path));
    if existing && !replace {
        return Err(StoreError::Unavailable(format!(
            "{} already holds a store; pass --replace to move its files aside (they are kept in a replaced-<time> directory)",
            data_dir.display()
        )));
    }
    // Checked where it will be served from: a copy in the data directory's
    // file system, opened with every page and block read.
    let staging = data_dir.join(STAGING_DIR);
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .map_err(|e| storage_error("cannot clear an earlier unfinished restore", e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| storage_error("cannot stage the restore", e))?;
    for name in [DATABASE_FILE, SUMS_FILE] {
        copy_synced(&from.join(name), &staging.join(name))?;
    }
    crash_point("restore-staged");
    let mut check = EmbeddedOptions::new(&staging);
    check.keyring = options.keyring.clone();
    check.scrub.rate = 0;
    check.role = "idemd restore (checking the copy)";
    let records = verify(check).await?;
    if records != manifest.records {
        return Err(StoreError::Corrupt(format!(
            "the backup in {} holds {records} records, its manifest says {}: not restored",
            from.display(),
            manifest.records
        )));
    }
    sync_dir(&staging)?;
    crash_point("restore-checked");
    // The old files, the old log included, are moved aside: a restore
    // never deletes what it replaces. The swap is journaled: a kill at any
    // step leaves the old store or the restored one (`swap`).
    let replaced = Swap::run(data_dir, &format!("replaced-{}", unix_ms()))?;
    Ok(RestoreSummary {
        backup: manifest,
        records,
        replaced,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Opens the store in `options.data_dir` checking every page (redb) and
/// every block (checksums), counts its records, and closes it.
async fn verify(options: EmbeddedOptions) -> StoreResult<u64> {
    let store = tokio::task::spawn_blocking(move || EmbeddedStore::open_checked(&options))
        .await
        .map_err(|e| storage_error("the check stopped", e))??;
    let records = store.record_count()?;
    store.close().await?;
    Ok(records)
}
