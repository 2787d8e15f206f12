//! The embedded store's tables and the four writes the writer applies to
//! them (insert, replace, delete, sweep), each keeping the record, its
//! expiry entry and its pending entry consistent and logging every change.

use redb::{ReadableTable, TableDefinition};

use super::codec;
use super::storage_error;
use super::wal;
use crate::crypto::Keyring;
use crate::store::{Expected, Record, RecordKey, StoreError, StoreResult};

/// `records`: record key → record (see [`codec`]).
pub(super) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// `expiry`: (expires_at, record key) → (): what the sweeper deletes.
pub(super) const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
/// `pending`: (tenant, pending_since, endpoint, key) → (): what ListPending
/// reads.
pub(super) const PENDING: TableDefinition<&[u8], ()> = TableDefinition::new("pending");
/// Store metadata: [`META_WAL_SEQ`] is the sequence number of the last log
/// frame whose changes the tables hold (see [`wal`]).
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Key of the last applied log sequence in [`META`].
pub(super) const META_WAL_SEQ: &str = "wal_seq";

/// A table of records, keyed and valued by bytes.
pub(super) type RecordsTable<'txn> = redb::Table<'txn, &'static [u8], &'static [u8]>;
/// An index table: keys only.
pub(super) type IndexTable<'txn> = redb::Table<'txn, &'static [u8], ()>;

/// The three tables every write changes together, opened in `txn`.
pub(super) fn open_tables(
    txn: &redb::WriteTransaction,
) -> StoreResult<(RecordsTable<'_>, IndexTable<'_>, IndexTable<'_>)> {
    let open = |e| storage_error("open", e);
    Ok((
        txn.open_table(RECORDS).map_err(open)?,
        txn.open_table(EXPIRY).map_err(open)?,
        txn.open_table(PENDING).map_err(open)?,
    ))
}

/// A write the writer applies inside a batch's transaction.
pub(super) trait Operation: Send + 'static {
    /// What the caller gets once the batch is durable.
    type Output: Send + 'static;
    /// Applies the write; an error aborts the whole batch.
    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<Self::Output>;
}

/// A record as the writer read it: a sealed response stays sealed until
/// the caller opens it, off the writer thread (see "Encryption at rest" in
/// [`super`]).
pub(super) struct Loaded {
    /// The record, with `response: None` when the response is sealed.
    pub(super) record: Record,
    /// The sealed response, for [`crate::store::response::open`].
    pub(super) sealed_response: Option<Vec<u8>>,
}

/// The live record for `id`, its response still sealed if it is.
pub(super) fn read_loaded(
    records: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: &RecordKey,
    now_ms: i64,
) -> StoreResult<Option<Loaded>> {
    let key = codec::record_key(id);
    let Some(value) = records
        .get(key.as_slice())
        .map_err(|e| storage_error("read", e))?
    else {
        return Ok(None);
    };
    let (record, sealed_response) = codec::decode_record_value(id.clone(), value.value())
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(record.is_live(now_ms).then_some(Loaded {
        record,
        sealed_response,
    }))
}

/// Writes `record` unless a live record holds its key.
pub(super) struct Insert {
    /// The new record.
    pub(super) record: Record,
    /// The caller's clock (expiry).
    pub(super) now_ms: i64,
}

/// [`crate::store::InsertOutcome`] with the existing record still sealed.
#[allow(clippy::large_enum_variant)] // moved once, like InsertOutcome
pub(super) enum InsertReply {
    /// Written.
    Inserted,
    /// A live record holds the key.
    Exists(Loaded),
}

impl Operation for Insert {
    type Output = InsertReply;

    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<InsertReply> {
        match tables.read_any(&self.record.id)? {
            Some(existing) if existing.record.is_live(self.now_ms) => {
                Ok(InsertReply::Exists(existing))
            }
            stale => {
                if let Some(stale) = stale {
                    tables.remove(&stale.record)?;
                }
                tables.put(&self.record)?;
                Ok(InsertReply::Inserted)
            }
        }
    }
}

/// Replaces the live record if it meets `expected`.
pub(super) struct Replace {
    /// The replacement.
    pub(super) record: Record,
    /// The condition.
    pub(super) expected: Expected,
    /// The caller's clock (expiry).
    pub(super) now_ms: i64,
}

/// Deletes the live record if it meets `expected`.
pub(super) struct Delete {
    /// The record's key.
    pub(super) id: RecordKey,
    /// The condition.
    pub(super) expected: Expected,
    /// The caller's clock (expiry).
    pub(super) now_ms: i64,
}

/// [`crate::store::CasOutcome`] with the current record still sealed.
#[allow(clippy::large_enum_variant)] // moved once, like CasOutcome
pub(super) enum CasReply {
    /// The condition held; written.
    Applied,
    /// It did not; the live record, if any.
    Conflict(Option<Loaded>),
}

impl Operation for Replace {
    type Output = CasReply;

    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<CasReply> {
        match tables.read_live_at(&self.record.id, self.now_ms)? {
            Some(current) if self.expected.is_met_by(&current.record) => {
                tables.remove(&current.record)?;
                tables.put(&self.record)?;
                Ok(CasReply::Applied)
            }
            current => Ok(CasReply::Conflict(current)),
        }
    }
}

impl Operation for Delete {
    type Output = CasReply;

    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<CasReply> {
        match tables.read_live_at(&self.id, self.now_ms)? {
            Some(current) if self.expected.is_met_by(&current.record) => {
                tables.remove(&current.record)?;
                Ok(CasReply::Applied)
            }
            current => Ok(CasReply::Conflict(current)),
        }
    }
}

/// Removes up to `max_records` records expired at `now_ms`.
pub(super) struct Sweep {
    /// The caller's clock.
    pub(super) now_ms: i64,
    /// Batch bound.
    pub(super) max_records: usize,
}

impl Operation for Sweep {
    type Output = usize;

    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<usize> {
        tables.sweep(self.now_ms, self.max_records)
    }
}

/// The three tables of one write transaction, kept consistent together, and
/// the log frame that records every change made to them.
pub(super) struct Tables<'a, 'txn> {
    /// `records`.
    pub(super) records: &'a mut redb::Table<'txn, &'static [u8], &'static [u8]>,
    /// `expiry`.
    pub(super) expiry: &'a mut redb::Table<'txn, &'static [u8], ()>,
    /// `pending`.
    pub(super) pending: &'a mut redb::Table<'txn, &'static [u8], ()>,
    /// Every change, for the write-ahead log.
    pub(super) frame: &'a mut wal::FrameBuilder,
    /// Seals responses as records are encoded.
    pub(super) keyring: Option<&'a Keyring>,
}

impl<'txn> Tables<'_, 'txn> {
    fn read_live_at(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Loaded>> {
        read_loaded(&*self.records, id, now_ms)
    }

    /// The stored record, live or expired.
    fn read_any(&self, id: &RecordKey) -> StoreResult<Option<Loaded>> {
        read_loaded(&*self.records, id, i64::MIN)
    }

    /// Writes a record and its index entries.
    fn put(&mut self, record: &Record) -> StoreResult<()> {
        let key = codec::record_key(&record.id);
        // Sealed before the bytes reach the table or the log frame.
        let value = codec::encode_record_sealed(record, self.keyring)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        self.records
            .insert(key.as_slice(), value.as_slice())
            .map_err(|e| storage_error("write", e))?;
        self.frame.put(wal::LogTable::Records, &key, &value);
        self.insert_index(
            wal::LogTable::Expiry,
            &codec::expiry_key(record.expires_at_ms, &record.id),
        )?;
        if let Some(since) = record.pending_since_ms() {
            self.insert_index(
                wal::LogTable::Pending,
                &codec::pending_key(since, &record.id),
            )?;
        }
        Ok(())
    }

    /// Removes a record (as currently stored) and its index entries.
    fn remove(&mut self, record: &Record) -> StoreResult<()> {
        let key = codec::record_key(&record.id);
        self.records
            .remove(key.as_slice())
            .map_err(|e| storage_error("write", e))?;
        self.frame.remove(wal::LogTable::Records, &key);
        self.remove_index(
            wal::LogTable::Expiry,
            &codec::expiry_key(record.expires_at_ms, &record.id),
        )?;
        if let Some(since) = record.pending_since_ms() {
            self.remove_index(
                wal::LogTable::Pending,
                &codec::pending_key(since, &record.id),
            )?;
        }
        Ok(())
    }

    /// The index table behind `table` (`Expiry` or `Pending`).
    fn index(&mut self, table: wal::LogTable) -> StoreResult<&mut IndexTable<'txn>> {
        match table {
            wal::LogTable::Expiry => Ok(&mut *self.expiry),
            wal::LogTable::Pending => Ok(&mut *self.pending),
            wal::LogTable::Records => Err(StoreError::Unavailable(
                "internal error: records is not an index".to_string(),
            )),
        }
    }

    /// Inserts an index entry, and logs it.
    fn insert_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        self.index(table)?
            .insert(key, ())
            .map_err(|e| storage_error("write", e))?;
        self.frame.put(table, key, &[]);
        Ok(())
    }

    /// Removes an index entry, and logs it.
    fn remove_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        self.index(table)?
            .remove(key)
            .map_err(|e| storage_error("write", e))?;
        self.frame.remove(table, key);
        Ok(())
    }

    /// Removes up to `max_records` records expired at `now_ms`.
    fn sweep(&mut self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        let upper = codec::encode_instant(now_ms);
        let mut due: Vec<(i64, RecordKey)> = Vec::new();
        for entry in self
            .expiry
            .range::<&[u8]>(..upper.as_slice())
            .map_err(|e| storage_error("read", e))?
            .take(max_records)
        {
            let (key, _) = entry.map_err(|e| storage_error("read", e))?;
            due.push(
                codec::decode_expiry_key(key.value())
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            );
        }
        let mut removed = 0;
        for (expires_at_ms, id) in due {
            match self.read_any(&id)?.map(|loaded| loaded.record) {
                // Only the record this entry was written for; a record
                // re-created under the same key has its own entry.
                Some(record)
                    if record.expires_at_ms == expires_at_ms && !record.is_live(now_ms) =>
                {
                    self.remove(&record)?;
                    removed += 1;
                }
                _ => {
                    self.remove_index(
                        wal::LogTable::Expiry,
                        &codec::expiry_key(expires_at_ms, &id),
                    )?;
                }
            }
        }
        Ok(removed)
    }
}
