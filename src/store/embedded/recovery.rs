//! Opening the embedded store after any stop: replaying the write-ahead
//! log into redb (see [`super::wal`] for the format and the rules).

use redb::{Database, ReadableTable};

use super::storage_error;
use super::tables::{META, META_WAL_SEQ, open_tables};
use super::wal;
use crate::store::{StoreError, StoreResult};

/// Replays the log frames newer than the durable redb state (see [`wal`])
/// and commits the result durably; returns the last frame's sequence.
pub(super) fn recover(database: &Database, wal: &wal::Wal) -> StoreResult<u64> {
    let txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    let last = {
        let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
        let durable = meta
            .get(META_WAL_SEQ)
            .map_err(|e| storage_error("read", e))?
            .map_or(0, |seq| seq.value());
        let (mut records, mut expiry, mut pending) = open_tables(&txn)?;
        let last = wal
            .replay(durable, |_, payload| {
                let changes = wal::decode_changes(payload).map_err(StoreError::Corrupt)?;
                for change in changes {
                    let result = match (change.table, change.value) {
                        (wal::LogTable::Records, Some(value)) => {
                            records.insert(change.key, value).map(drop)
                        }
                        (wal::LogTable::Records, None) => records.remove(change.key).map(drop),
                        (wal::LogTable::Expiry, Some(_)) => expiry.insert(change.key, ()).map(drop),
                        (wal::LogTable::Expiry, None) => expiry.remove(change.key).map(drop),
                        (wal::LogTable::Pending, Some(_)) => {
                            pending.insert(change.key, ()).map(drop)
                        }
                        (wal::LogTable::Pending, None) => pending.remove(change.key).map(drop),
                    };
                    result.map_err(|e| storage_error("replay", e))?;
                }
                Ok::<(), StoreError>(())
            })
            .map_err(|e| storage_error("cannot read the write-ahead log", e))??;
        if last != durable {
            meta.insert(META_WAL_SEQ, last)
                .map_err(|e| storage_error("write", e))?;
        }
        last
    };
    // Durability::Immediate (the default): the log is reused from its start
    // after this, so the replayed state must be on disk first.
    txn.commit().map_err(|e| storage_error("commit", e))?;
    Ok(last)
}
