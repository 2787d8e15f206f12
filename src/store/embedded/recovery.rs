//! Opening the embedded store after any stop: the whole file checked when
//! its block checksums cannot vouch for it, and the write-ahead log
//! replayed into redb (see [`super::wal`] for the format and the rules).

use std::path::Path;

use redb::{Database, ReadableTable};

use super::blocks::{Blocks, Trust};
use super::codec;
use super::failure::{damaged_because, storage_error, without_panics};
use super::tables::{META, META_WAL_SEQ, PENDING, RECORDS, RedbTables, record_seq};
use super::wal;
use crate::store::{RecordState, StoreError, StoreResult};

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

/// Adds `now_ms - last_alive_ms` (the time the store could not serve) to
/// every lease that was live at `last_alive_ms`, up to its record's expiry
/// (see [`super::alive`]). Found through the pending index, whose entries
/// of IN_PROGRESS records are keyed by their lease's end: only keys in
/// flight are read, never every record. One durable commit; returns how
/// many leases were credited.
pub(super) fn credit_leases(
    database: &Database,
    keyring: Option<&crate::crypto::Keyring>,
    last_alive_ms: i64,
    now_ms: i64,
) -> StoreResult<usize> {
    let credit = now_ms.saturating_sub(last_alive_ms);
    if credit <= 0 {
        return Ok(0);
    }
    let mut txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    txn.set_quick_repair(true);
    let mut credited = 0;
    {
        let mut records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        let mut pending = txn
            .open_table(PENDING)
            .map_err(|e| storage_error("open", e))?;
        let corrupt = |e: codec::CodecError| StoreError::Corrupt(e.to_string());
        let mut live = Vec::new();
        for entry in pending.iter().map_err(|e| storage_error("read", e))? {
            let (key, _) = entry.map_err(|e| storage_error("read", e))?;
            let (since, id) = codec::decode_pending_key(key.value()).map_err(corrupt)?;
            if since > last_alive_ms {
                live.push((key.value().to_vec(), id));
            }
        }
        for (old_entry, id) in live {
            let record_key = codec::record_key(&id);
            let record = match records
                .get(record_key.as_slice())
                .map_err(|e| storage_error("read", e))?
            {
                Some(value) => {
                    codec::decode_record_value(id.clone(), value.value())
                        .map_err(corrupt)?
                        .0
                }
                None => continue,
            };
            // In progress: no response yet, so nothing sealed to carry over.
            if record.state != RecordState::InProgress || record.response.is_some() {
                continue;
            }
            let mut extended = record.clone();
            extended.lease_expires_at_ms = record
                .lease_expires_at_ms
                .saturating_add(credit)
                .min(record.expires_at_ms);
            if extended.lease_expires_at_ms == record.lease_expires_at_ms {
                continue;
            }
            let value = codec::encode_record_sealed(&extended, keyring)
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            records
                .insert(record_key.as_slice(), value.as_slice())
                .map_err(|e| storage_error("write", e))?;
            pending
                .remove(old_entry.as_slice())
                .map_err(|e| storage_error("write", e))?;
            let entry = codec::pending_key(extended.lease_expires_at_ms, &id);
            pending
                .insert(entry.as_slice(), ())
                .map_err(|e| storage_error("write", e))?;
            credited += 1;
        }
    }
    txn.commit().map_err(|e| storage_error("commit", e))?;
    Ok(credited)
}
