//! Opening the embedded store after any stop: the whole file checked when
//! its block checksums cannot vouch for it, and the write-ahead log
//! replayed into redb (see [`super::wal`] for the format and the rules).

use std::path::Path;

use redb::{Database, ReadableTable};

use super::blocks::{Blocks, Trust};
use super::failure::{damaged_because, storage_error, without_panics};
use super::tables::{META, META_WAL_SEQ, RedbTables, record_seq};
use super::wal;
use crate::store::{StoreError, StoreResult};

/// Replays the log frames newer than the durable redb state (see [`wal`])
/// and commits the result durably; returns the last frame's sequence.
pub(super) fn recover(database: &Database, wal: &wal::Wal) -> StoreResult<u64> {
    let mut txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    // Like every durable commit: see `checkpoint::durable_commit`.
    txn.set_quick_repair(true);
    let durable = txn
        .open_table(META)
        .map_err(|e| storage_error("open", e))?
        .get(META_WAL_SEQ)
        .map_err(|e| storage_error("read", e))?
        .map_or(0, |seq| seq.value());
    let last = {
        let mut tables = RedbTables::open(&txn)?;
        wal.replay(durable, |_, payload| {
            let changes = wal::decode_changes(payload).map_err(StoreError::Corrupt)?;
            for change in changes {
                tables
                    .set(change.table, change.key, change.value)
                    .map_err(|e| storage_error("replay", e))?;
            }
            Ok::<(), StoreError>(())
        })
        .map_err(|e| storage_error("cannot read the write-ahead log", e))??
    };
    if last != durable {
        record_seq(&txn, last)?;
    }
    // Durability::Immediate (the default): the log is reused from its start
    // after this, so the replayed state must be on disk first.
    txn.commit().map_err(|e| storage_error("commit", e))?;
    Ok(last)
}

/// Checks the whole file before serving when the block checksums cannot
/// vouch for it (`trust`), or when asked (`check_all`: a restore's copy):
/// redb checks every page (and a file that fails is refused, even one redb
/// could "repair": its repair drops what it cannot read, which may be
/// acknowledged records), then the file is summed (or, with sums that hold,
/// every block checked against them). One read of the file, once
/// (docs/reliability.md). Returns why it checked, if it did.
pub(super) fn check_whole_file(
    path: &Path,
    database: &mut Database,
    blocks: &Blocks,
    trust: &Trust,
    check_all: bool,
) -> StoreResult<Option<String>> {
    let reason = match trust {
        Trust::Rebuild(reason) => reason.clone(),
        Trust::Verified if check_all => "asked to check the whole file".to_string(),
        Trust::Verified => return Ok(None),
    };
    tracing::warn!(
        path = %path.display(),
        %reason,
        "embedded store: checking the whole database file before serving"
    );
    match without_panics(path, || database.check_integrity())? {
        Ok(true) => {}
        Ok(false) => {
            return Err(damaged_because(
                path,
                "it failed redb's integrity check (redb repaired it, possibly dropping records)",
            ));
        }
        Err(error) => return Err(damaged_because(path, &error.to_string())),
    }
    if matches!(trust, Trust::Rebuild(_)) || blocks.is_unsettled() {
        // redb has just checked every page it can reach; a block whose sum
        // may be stale (unsettled) is one it cannot reach, so summing the
        // file as it is settles the sums.
        blocks
            .rebuild()
            .map_err(|e| storage_error("cannot compute the block checksums", e))?;
    } else {
        blocks.verify_all()?;
    }
    Ok(Some(reason))
}
