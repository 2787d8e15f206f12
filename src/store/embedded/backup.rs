//! Online backup and offline restore of the embedded store.
//!
//! # Backup
//!
//! A backup is a data directory of its own (`idemd.redb`, its checksums and
//! `backup.json`), written by the serving process while it goes on serving:
//! idemd can start on it as it is, or `idemd restore` copies it into place
//! after checking it. It is logical, not a copy of the file's bytes: one
//! redb read transaction (MVCC: it never blocks the writer) and the overlay
//! of writes acknowledged during a running checkpoint are read table by
//! table, in key order, into a new file.
//!
//! What it holds: every key acknowledged before the backup began, with its
//! state, lease, fingerprint, (sealed) response and expiry, as of that
//! moment or later. The overlay is taken before the read transaction, so a
//! key either comes from the overlay (everything acknowledged up to the
//! start and not yet folded) or from redb as of a moment after the start;
//! keys are not all of one instant, but none is older than the start. That
//! is what a restore needs: per key, nothing acknowledged before the
//! backup is missing or rolled back.
//!
//! While it runs, the read transaction keeps redb from reusing the pages
//! that writes free, so the live file grows by what the writes of that
//! time rewrite (docs/operations.md has the figures).
//!
//!
//! Restoring one is `super::restore`'s.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::blocks::{Blocks, VerifiedFile};
use super::failure::storage_error;
use super::fold::Overlay;
use super::options::DATABASE_FILE;
use super::swap::{list, sync_dir};
use super::tables::{EXPIRY, PENDING, RECORDS, RedbTables, record_seq};
use super::wal::LogTable;
use crate::store::{BackupSummary, StoreError, StoreResult};

/// The manifest of a backup, beside its files.
pub const MANIFEST: &str = "backup.json";

/// Table entries copied per write transaction of the backup: bounds the
/// memory of one transaction's dirty pages.
const ENTRIES_PER_COMMIT: u64 = 100_000;

/// Writes a backup of `database` (with the writes in `overlay`) into the new
/// directory `out`; `progress` is told the records copied so far.
pub(super) fn write(
    database: &Database,
    overlay: &Overlay,
    out: &Path,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> StoreResult<BackupSummary> {
    let started_at_ms = unix_ms();
    prepare_empty_dir(out)?;
    // Overlay first, then redb: see the module docs.
    let (layer, source) = overlay.read_view(database)?;
    let (blocks, _) = Blocks::open(&out.join(DATABASE_FILE))?;
    let target = Database::builder()
        .create_with_backend(VerifiedFile(blocks))
        .map_err(|e| storage_error("cannot create the backup", e))?;
    let mut records = 0u64;
    for table in [LogTable::Records, LogTable::Expiry, LogTable::Pending] {
        let changes = layer.table(table);
        let mut batch: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let flush = |batch: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>| -> StoreResult<()> {
            let mut txn = target
                .begin_write()
                .map_err(|e| storage_error("begin write", e))?;
            txn.set_durability(redb::Durability::None)
                .map_err(|e| storage_error("begin write", e))?;
            {
                let mut tables = RedbTables::open(&txn)?;
                for (key, value) in batch.drain(..) {
                    tables
                        .set(table, &key, Some(value.as_deref().unwrap_or_default()))
                        .map_err(|e| storage_error("write", e))?;
                }
            }
            txn.commit().map_err(|e| storage_error("commit", e))
        };
        let mut copy = |key: &[u8], value: Option<&[u8]>| -> StoreResult<()> {
            batch.push((key.to_vec(), value.map(<[u8]>::to_vec)));
            if table == LogTable::Records {
                records += 1;
                if records.is_multiple_of(ENTRIES_PER_COMMIT) {
                    progress(records);
                }
            }
            if batch.len() as u64 >= ENTRIES_PER_COMMIT {
                flush(&mut batch)?;
            }
            Ok(())
        };
        // Keys the overlay does not change, from redb, in key order.
        match table {
            LogTable::Records => {
                let source = source
                    .open_table(RECORDS)
                    .map_err(|e| storage_error("open", e))?;
                for entry in source.iter().map_err(|e| storage_error("read", e))? {
                    let (key, value) = entry.map_err(|e| storage_error("read", e))?;
                    if !changes.contains_key(key.value()) {
                        copy(key.value(), Some(value.value()))?;
                    }
                }
            }
            LogTable::Expiry | LogTable::Pending => {
                let definition = if table == LogTable::Expiry {
                    EXPIRY
                } else {
                    PENDING
                };
                let source = source
                    .open_table(definition)
                    .map_err(|e| storage_error("open", e))?;
                for entry in source.iter().map_err(|e| storage_error("read", e))? {
                    let (key, ()) = entry
                        .map(|(key, _)| (key, ()))
                        .map_err(|e| storage_error("read", e))?;
                    if !changes.contains_key(key.value()) {
                        copy(key.value(), None)?;
                    }
                }
            }
        }
        // Then what the overlay holds (its removals are simply not copied).
        for (key, value) in changes {
            if let Some(value) = value {
                copy(key, Some(value))?;
            }
        }
        flush(&mut batch)?;
    }
    drop(source);
    // The backup's own log starts empty: nothing of the source's applies.
    let mut txn = target
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    txn.set_quick_repair(true);
    record_seq(&txn, 0)?;
    txn.commit().map_err(|e| storage_error("commit", e))?;
    drop(target);
    let bytes = std::fs::metadata(out.join(DATABASE_FILE))
        .map_err(|e| storage_error("cannot read the backup's size", e))?
        .len();
    let summary = BackupSummary {
        format: 1,
        started_at_ms,
        finished_at_ms: unix_ms(),
        records,
        bytes,
        idemd_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    write_manifest(out, &summary)?;
    Ok(summary)
}

/// Entries of the records table of `database`.
pub(super) fn record_count(database: &Database) -> StoreResult<u64> {
    let txn = database
        .begin_read()
        .map_err(|e| storage_error("begin read", e))?;
    let records = txn
        .open_table(RECORDS)
        .map_err(|e| storage_error("open", e))?;
    records.len().map_err(|e| storage_error("read", e))
}

/// Creates `out` (and its parents), which must not exist or be empty.
fn prepare_empty_dir(out: &Path) -> StoreResult<()> {
    if out.exists() && !list(out)?.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "{} is not empty: a backup goes into a new directory",
            out.display()
        )));
    }
    std::fs::create_dir_all(out)
        .map_err(|e| storage_error(&format!("cannot create {}", out.display()), e))
}

fn write_manifest(out: &Path, summary: &BackupSummary) -> StoreResult<()> {
    let text = serde_json::to_string_pretty(summary)
        .map_err(|e| storage_error("cannot write the manifest", e))?;
    let path = out.join(MANIFEST);
    std::fs::write(&path, text).map_err(|e| storage_error("cannot write the manifest", e))?;
    std::fs::File::open(&path)
        .and_then(|file| file.sync_all())
        .map_err(|e| storage_error("cannot sync the manifest", e))?;
    sync_dir(out)
}

/// The manifest of the backup in `from`; refuses a directory `idemd
/// backup` did not write.
pub fn read_manifest(from: &Path) -> StoreResult<BackupSummary> {
    let path = from.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        StoreError::Unavailable(format!(
            "{} is not a backup made by `idemd backup` (no {MANIFEST}: {e})",
            from.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))
}

pub(super) fn copy_synced(from: &Path, to: &Path) -> StoreResult<()> {
    let context = || format!("cannot copy {} to {}", from.display(), to.display());
    std::fs::copy(from, to).map_err(|e| storage_error(&context(), e))?;
    std::fs::File::open(to)
        .and_then(|file| file.sync_all())
        .map_err(|e| storage_error(&context(), e))
}

pub(super) fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
