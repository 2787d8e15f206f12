//! The embedded store's tables and the four writes the writer applies to
//! them (insert, replace, delete, sweep), each keeping the record, its
//! expiry entry and its pending entry consistent and logging every change.
//!
//! The one home of the table layout: batches, the overlay's fold and the
//! replay on open all write the tables through [`RedbTables`], by the
//! log's table names.

use redb::{ReadableTable, TableDefinition};

use super::codec;
use super::failure::{Cause, Classify, storage_error};
use super::overlay::{Layer, MergedKeys, redb_keys};
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

/// The three tables every write changes together, in one write
/// transaction, addressed by the log's table names.
pub(super) struct RedbTables<'txn> {
    /// `records`.
    records: RecordsTable<'txn>,
    /// `expiry`.
    expiry: IndexTable<'txn>,
    /// `pending`.
    pending: IndexTable<'txn>,
}

impl<'txn> RedbTables<'txn> {
    /// Opens the three tables in `txn`.
    pub(super) fn open(txn: &'txn redb::WriteTransaction) -> StoreResult<Self> {
        let open = |e| storage_error("open", e);
        Ok(Self {
            records: txn.open_table(RECORDS).map_err(open)?,
            expiry: txn.open_table(EXPIRY).map_err(open)?,
            pending: txn.open_table(PENDING).map_err(open)?,
        })
    }

    /// Writes (`Some`) or removes (`None`) `key` in `table` (index tables
    /// keep keys only: their value is ignored).
    pub(super) fn set(
        &mut self,
        table: wal::LogTable,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), redb::StorageError> {
        let index = match (table, value) {
            (wal::LogTable::Records, Some(value)) => {
                return self.records.insert(key, value).map(drop);
            }
            (wal::LogTable::Records, None) => return self.records.remove(key).map(drop),
            (wal::LogTable::Expiry, _) => &mut self.expiry,
            (wal::LogTable::Pending, _) => &mut self.pending,
        };
        match value {
            Some(_) => index.insert(key, ()).map(drop),
            None => index.remove(key).map(drop),
        }
    }
}

/// Stores `seq` as the last log frame whose changes `txn` holds (see
/// [`wal`]).
pub(super) fn record_seq(txn: &redb::WriteTransaction, seq: u64) -> StoreResult<()> {
    let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
    meta.insert(META_WAL_SEQ, seq)
        .map(drop)
        .map_err(|e| storage_error("write", e))
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
    decode_loaded(id, value.value(), now_ms)
}

/// Decodes the stored `value` of `id`; `None` when it is not live at
/// `now_ms`.
pub(super) fn decode_loaded(
    id: &RecordKey,
    value: &[u8],
    now_ms: i64,
) -> StoreResult<Option<Loaded>> {
    let (record, sealed_response) = codec::decode_record_value(id.clone(), value)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(record.is_live(now_ms).then_some(Loaded {
        record,
        sealed_response,
    }))
}

/// The changes of `table` in `[start, end)` across `layers` (oldest
/// first; a newer layer's change of a key wins), in key order.
pub(super) fn overlay_keys(
    layers: &[&Layer],
    table: wal::LogTable,
    start: &[u8],
    end: &[u8],
) -> Vec<(Vec<u8>, bool)> {
    match layers {
        [] => Vec::new(),
        [only] => only.keys_in(table, start, end),
        _ => {
            let mut merged = std::collections::BTreeMap::new();
            for layer in layers {
                merged.extend(layer.keys_in(table, start, end));
            }
            merged.into_iter().collect()
        }
    }
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
            Some(stale) => {
                tables.overwrite(&stale.record, &self.record)?;
                Ok(InsertReply::Inserted)
            }
            None => {
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
                tables.overwrite(&current.record, &self.record)?;
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

/// Removes up to `max_records` records expired at `now_ms`, in one writer
/// operation: every write queued behind it waits until it ends, at ~6 µs a
/// record (1,000 records held the writer for ~6 ms and set the tail of the
/// writes queued meanwhile). So the caller picks a small step and calls
/// again for more, letting the writes that arrive meanwhile in between.
pub(super) struct Sweep {
    /// The caller's clock.
    pub(super) now_ms: i64,
    /// Most records removed: the operation's length (see above).
    pub(super) max_records: usize,
}

impl Operation for Sweep {
    type Output = usize;

    fn apply(self, tables: &mut Tables<'_, '_>) -> StoreResult<usize> {
        tables.sweep(self.now_ms, self.max_records)
    }
}

/// Where a batch's changes go and what its reads see.
pub(super) enum Backing<'a, 'txn> {
    /// The batch's redb write transaction (no checkpoint is running).
    Redb(&'a mut RedbTables<'txn>),
    /// While a checkpoint holds redb's write lock: changes go to `delta`
    /// (published to the overlay once the batch is durable), reads see
    /// `delta`, then the overlay, then a redb snapshot ([`super::overlay`]).
    Overlay {
        /// This batch's changes.
        delta: &'a mut Layer,
        /// The changes of earlier batches since the checkpoint began.
        shared: &'a Layer,
        /// `records` as of the checkpoint's start (or later).
        records: &'a redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
        /// `expiry`, same snapshot.
        expiry: &'a redb::ReadOnlyTable<&'static [u8], ()>,
    },
}

/// The three tables of one batch, kept consistent together, and the log
/// frame that records every change made to them.
pub(super) struct Tables<'a, 'txn> {
    /// Where changes go, what reads see.
    backing: Backing<'a, 'txn>,
    /// Every change, for the write-ahead log.
    frame: &'a mut wal::FrameBuilder,
    /// Seals responses as records are encoded.
    keyring: Option<&'a Keyring>,
    /// What the first failed redb write said about the disk: the writer
    /// remembers a full disk (see [`super::failure`]).
    failed: Option<Cause>,
}

impl<'a, 'txn> Tables<'a, 'txn> {
    /// A batch's tables on `backing`, logging into `frame`.
    pub(super) fn new(
        backing: Backing<'a, 'txn>,
        frame: &'a mut wal::FrameBuilder,
        keyring: Option<&'a Keyring>,
    ) -> Self {
        Self {
            backing,
            frame,
            keyring,
            failed: None,
        }
    }

    /// What a failed redb write of this batch said about the disk.
    pub(super) fn failure_cause(&self) -> Option<Cause> {
        self.failed
    }

    fn read_live_at(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Loaded>> {
        match &self.backing {
            Backing::Redb(tables) => read_loaded(&tables.records, id, now_ms),
            Backing::Overlay {
                delta,
                shared,
                records,
                ..
            } => {
                let key = codec::record_key(id);
                let table = wal::LogTable::Records;
                match delta.get(table, &key).or_else(|| shared.get(table, &key)) {
                    Some(Some(value)) => decode_loaded(id, value, now_ms),
                    Some(None) => Ok(None),
                    None => read_loaded(*records, id, now_ms),
                }
            }
        }
    }

    /// The stored record, live or expired.
    fn read_any(&self, id: &RecordKey) -> StoreResult<Option<Loaded>> {
        self.read_live_at(id, i64::MIN)
    }

    /// Writes (`Some`) or removes (`None`) `key` in `table`, and logs it.
    fn write(&mut self, table: wal::LogTable, key: &[u8], value: Option<&[u8]>) -> StoreResult<()> {
        match &mut self.backing {
            Backing::Redb(tables) => {
                if let Err(error) = tables.set(table, key, value) {
                    self.failed.get_or_insert(error.cause());
                    return Err(storage_error("write", error));
                }
            }
            Backing::Overlay { delta, .. } => {
                delta
                    .table_mut(table)
                    .insert(key.to_vec(), value.map(<[u8]>::to_vec));
            }
        }
        match value {
            Some(value) => self.frame.put(table, key, value),
            None => self.frame.remove(table, key),
        }
        Ok(())
    }

    /// Up to `max` expiry entries before `upper`, in order.
    fn due(&self, upper: &[u8], max: usize) -> StoreResult<Vec<Vec<u8>>> {
        match &self.backing {
            Backing::Redb(tables) => redb_keys(&tables.expiry, &[], upper)?.take(max).collect(),
            Backing::Overlay {
                delta,
                shared,
                expiry,
                ..
            } => {
                let changes = overlay_keys(&[shared, delta], wal::LogTable::Expiry, &[], upper);
                MergedKeys::new(redb_keys(*expiry, &[], upper)?, changes)
                    .take(max)
                    .collect()
            }
        }
    }

    /// Writes a record and its index entries.
    fn put(&mut self, record: &Record) -> StoreResult<()> {
        self.write_record(record)?;
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

    /// Writes `new` over `old`, the record stored under the same key, with
    /// the end state of `remove(old)` then `put(new)` (the log replays to the
    /// same tables) but fewer writes: the record's value once, and only the
    /// index entries that change. A Complete keeps its `expires_at` and only
    /// leaves the pending index: two B-tree writes and two log entries instead
    /// of five (issue 52: the writer thread spent 14.7% of idemd's CPU in
    /// Replace under a consumer's batches).
    fn overwrite(&mut self, old: &Record, new: &Record) -> StoreResult<()> {
        debug_assert_eq!(old.id, new.id, "overwrite keeps the record's key");
        self.write_record(new)?;
        if old.expires_at_ms != new.expires_at_ms {
            self.remove_index(
                wal::LogTable::Expiry,
                &codec::expiry_key(old.expires_at_ms, &old.id),
            )?;
            self.insert_index(
                wal::LogTable::Expiry,
                &codec::expiry_key(new.expires_at_ms, &new.id),
            )?;
        }
        let (was, is) = (old.pending_since_ms(), new.pending_since_ms());
        if was != is {
            if let Some(since) = was {
                self.remove_index(wal::LogTable::Pending, &codec::pending_key(since, &old.id))?;
            }
            if let Some(since) = is {
                self.insert_index(wal::LogTable::Pending, &codec::pending_key(since, &new.id))?;
            }
        }
        Ok(())
    }

    /// Writes the record's value (not its index entries), sealed.
    fn write_record(&mut self, record: &Record) -> StoreResult<()> {
        let key = codec::record_key(&record.id);
        // Sealed before the bytes reach the table or the log frame.
        let value = codec::encode_record_sealed(record, self.keyring)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        self.write(wal::LogTable::Records, &key, Some(&value))
    }

    /// Removes a record (as currently stored) and its index entries.
    fn remove(&mut self, record: &Record) -> StoreResult<()> {
        let key = codec::record_key(&record.id);
        self.write(wal::LogTable::Records, &key, None)?;
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

    /// Inserts an index entry, and logs it.
    fn insert_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        self.write(table, key, Some(&[]))
    }

    /// Removes an index entry, and logs it.
    fn remove_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        self.write(table, key, None)
    }

    /// Removes up to `max_records` records expired at `now_ms`.
    fn sweep(&mut self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        let upper = codec::encode_instant(now_ms);
        let mut due: Vec<(i64, RecordKey)> = Vec::new();
        for key in self.due(&upper, max_records)? {
            due.push(
                codec::decode_expiry_key(&key).map_err(|e| StoreError::Corrupt(e.to_string()))?,
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
