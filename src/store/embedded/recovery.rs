//! Opening the embedded store after any stop: replaying the write-ahead
//! log into redb (see [`super::wal`] for the format and the rules).

use redb::{Database, ReadableTable};

use super::failure::storage_error;
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
