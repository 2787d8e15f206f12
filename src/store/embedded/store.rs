//! The [`EmbeddedStore`]: opening a data directory (owner lock, checks,
//! the write-ahead log's replay), the read side, and the [`Store`]
//! contract on top of the writer thread. The module docs of
//! [`crate::store::embedded`] explain the design.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable};

use super::blocks::{Blocks, Scrubber, VerifiedFile};
use super::checkpoint::{BeforeCheckpoint, Checkpointer};
use super::failure::storage_error;
use super::failure::{Failures, damaged_because, without_panics};
use super::fold::Overlay;
use super::group::GroupCommit;
use super::options::{DATABASE_FILE, EmbeddedOptions, SERVE_ROLE};
use super::overlay::{MergedKeys, redb_keys};
use super::owner::DirOwner;
use super::tables::Operation;
use super::tables::{
    CasReply, EXPIRY, InsertReply, Loaded, META, PENDING, RECORDS, decode_loaded, overlay_keys,
    read_loaded,
};
use super::writer::WriterStats;
use super::writer::{WriteOp, Writer};
use super::{alive, backup, codec, recovery, swap, tables, wal, writer};
use crate::crypto::Keyring;
use crate::store::{
    CasOutcome, Expected, InsertOutcome, PendingPage, PendingQuery, Record, RecordKey, Store,
    StoreError, StoreResult, response,
};

/// Most operations applied in one write transaction: bounds the latency a
/// batch adds to its first operation.
pub const MAX_BATCH: usize = 1024;

/// Depth of the queue in front of the writer: beyond it callers wait
/// (backpressure instead of unbounded memory).
const QUEUE_DEPTH: usize = 8192;

/// Index entries examined per ListPending page beyond the page size before a
/// page is returned short (with a token): bounds the work of one request when
/// filters reject most entries.
const MAX_PENDING_SCAN_EXTRA: usize = 10_000;

/// The embedded backend. Cheap to share behind an `Arc`.
pub struct EmbeddedStore {
    /// The background check of every block, stopped on close. First, so
    /// that a store dropped without `close` stops reading the file before
    /// the database closes it (fields drop in order).
    pub(super) scrubber: Mutex<Scrubber>,
    /// Group-commit counters shared with the writer thread.
    pub(super) stats: Arc<WriterStats>,
    /// Read side: MVCC snapshots, concurrent with the writer.
    pub(super) database: Arc<Database>,
    /// Writes acknowledged while a checkpoint runs, not yet in redb: read
    /// before redb ([`overlay`]).
    pub(super) overlay: Overlay,
    /// The writer thread and its queue, closed on close so that every
    /// accepted write is committed before `close` returns.
    pub(super) writer: GroupCommit<WriteOp>,
    /// Opens sealed responses on the read side.
    pub(super) keyring: Option<Arc<Keyring>>,
    /// The file's block checksums: what damage was found.
    pub(super) blocks: Arc<Blocks>,
    /// Why the open checked the whole file, if it did (the growth bench
    /// and the tests tell a start that read the file from one that did not).
    pub(super) full_check: Option<String>,
    /// Writes the instant the store last served ([`alive`]); `None` unless
    /// `idemd serve` opened it.
    pub(super) _heartbeat: Option<alive::Heartbeat>,
    /// The data directory's owner lock, held as long as the store: no
    /// restore, copy or second server touches the directory meanwhile.
    /// Last, so it is released after everything above closed the files.
    pub(super) _owner: DirOwner,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the database in `options.data_dir`.
    ///
    /// Fails if another process holds the file.
    pub fn open(options: &EmbeddedOptions) -> Result<Self, StoreError> {
        let owner = DirOwner::acquire(&options.data_dir, options.role)?;
        Self::open_with(options, owner, None, false)
    }

    /// [`Self::open`], reading and checking every page and every block
    /// first, whatever the checksums say (a restore checks its copy so).
    pub fn open_checked(options: &EmbeddedOptions) -> Result<Self, StoreError> {
        let owner = DirOwner::acquire(&options.data_dir, options.role)?;
        Self::open_with(options, owner, None, true)
    }

    /// [`Self::open`] as `owner` (taken by the caller: `export` tells a
    /// held directory apart), running `before_checkpoint` before each
    /// checkpoint's commit (tests hold them back), checking all if asked.
    pub(super) fn open_with(
        options: &EmbeddedOptions,
        owner: DirOwner,
        before_checkpoint: BeforeCheckpoint,
        check_all: bool,
    ) -> Result<Self, StoreError> {
        // The caller took the directory (it is created if missing); a
        // restore a kill interrupted is finished before any file is read.
        swap::finish_interrupted(&options.data_dir)?;
        let path = options.data_dir.join(DATABASE_FILE);
        // Every read redb makes is checked against the block checksums
        // ([`blocks`]), so an open reads only what it touches; the whole
        // file is checked only when the checksums cannot vouch for it.
        let (blocks, trust) = Blocks::open(&path)?;
        // redb panics on some damaged files (e.g. "Malformed allocator
        // state") instead of returning an error: turned into an error that
        // names the file, so idemd refuses to start with a message an
        // operator can act on rather than a panic and a backtrace.
        let opened = without_panics(&path, || {
            Database::builder()
                .set_cache_size(options.cache_bytes)
                .create_with_backend(VerifiedFile(Arc::clone(&blocks)))
        })?;
        let mut database = opened.map_err(|e| match e {
            // A damaged block met by the open: its report says it all.
            _ if blocks.damage().is_some() => {
                StoreError::Corrupt(blocks.damage().unwrap_or_default().to_string())
            }
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "{} is already open in another process (the embedded store allows one owner)",
                path.display()
            )),
            // A file redb cannot make sense of, or shorter than its own
            // metadata says: damaged, not a passing outage.
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => {
                damaged_because(&path, &what)
            }
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                ) =>
            {
                damaged_because(&path, &io.to_string())
            }
            other => storage_error(&format!("cannot open {}", path.display()), other),
        })?;
        let full_check =
            recovery::check_whole_file(&path, &mut database, &blocks, &trust, check_all)?;
        let database = Arc::new(database);
        // Create the tables up front so that read transactions never see a
        // missing table.
        let mut txn = database
            .begin_write()
            .map_err(|e| storage_error("begin", e))?;
        // Every durable commit records redb's allocator state, so an open
        // after a crash loads it instead of walking every page.
        txn.set_quick_repair(true);
        {
            txn.open_table(RECORDS)
                .map_err(|e| storage_error("open", e))?;
            txn.open_table(EXPIRY)
                .map_err(|e| storage_error("open", e))?;
            txn.open_table(PENDING)
                .map_err(|e| storage_error("open", e))?;
            txn.open_table(META).map_err(|e| storage_error("open", e))?;
        }
        txn.commit().map_err(|e| storage_error("commit", e))?;

        // Opened only now that redb holds the file lock: one owner for both.
        let mut wal = wal::Wal::open(&options.data_dir)
            .map_err(|e| storage_error("cannot open the write-ahead log", e))?;
        let seq = without_panics(&path, || recovery::recover(&database, &wal))??;
        // Everything replayed is durable in redb now: the log starts over.
        wal.reset();
        // Only a server beats: a copy or a backup holding the directory is
        // time nobody could serve from it ([`alive`]).
        let heartbeat = (options.role == SERVE_ROLE)
            .then(|| alive::credit_and_beat(options, &database))
            .transpose()?;

        let stats = Arc::new(WriterStats::default());
        let overlay = Overlay::default();
        let writer = GroupCommit::start(
            "idemd-store-writer",
            "store writer",
            QUEUE_DEPTH,
            MAX_BATCH,
            |waker| {
                let checkpointer = Checkpointer::start(
                    Arc::clone(&database),
                    Arc::clone(&blocks),
                    waker,
                    before_checkpoint,
                )
                .map_err(|e| storage_error("cannot start the checkpoint thread", e))?;
                Ok(Writer::new(
                    Arc::clone(&database),
                    wal,
                    seq,
                    options,
                    overlay.clone(),
                    Arc::clone(&stats),
                    checkpointer,
                    Failures::new(options.data_dir.clone(), Arc::clone(&blocks)),
                ))
            },
        )?;
        let scrubber = Scrubber::start(Arc::clone(&blocks), options.scrub)
            .map_err(|e| storage_error("cannot start the scrub thread", e))?;
        Ok(Self {
            stats,
            database,
            overlay,
            writer,
            keyring: options.keyring.clone(),
            blocks,
            scrubber: Mutex::new(scrubber),
            full_check,
            _heartbeat: heartbeat,
            _owner: owner,
        })
    }

    /// Group-commit counters: `operations / commits` is the average batch.
    pub fn writer_stats(&self) -> (u64, u64) {
        (
            self.stats.commits.load(Ordering::Relaxed),
            self.stats.operations.load(Ordering::Relaxed),
        )
    }

    /// Why the open read and checked the whole file (no checksums yet, the
    /// machine stopped uncleanly, another program changed the file), or
    /// `None` when it read only what it needed.
    pub fn full_check_on_open(&self) -> Option<&str> {
        self.full_check.as_deref()
    }

    /// Records in the store (expired ones not yet swept included).
    pub fn record_count(&self) -> StoreResult<u64> {
        self.refuse_if_damaged()?;
        backup::record_count(&self.database)
    }

    /// Path of the database file for a data directory.
    pub fn database_path(data_dir: &Path) -> PathBuf {
        data_dir.join(DATABASE_FILE)
    }

    /// The damage found in the file, as every answer once there is some:
    /// nothing is served from a file known to be damaged.
    pub(super) fn refuse_if_damaged(&self) -> StoreResult<()> {
        match self.blocks.damage() {
            Some(report) => Err(StoreError::Corrupt(report.to_string())),
            None => Ok(()),
        }
    }

    /// Hands `op` to the writer and waits for its answer (after the batch
    /// it joined is durable).
    pub(super) async fn submit<O: Operation>(&self, op: O) -> StoreResult<O::Output> {
        self.refuse_if_damaged()?;
        let (queued, response) = writer::queue(op);
        self.writer.send(queued).await?;
        // The writer replies to every operation it accepted; a dropped reply
        // means it died mid-transaction, and a commit may or may not have
        // happened.
        response.await.unwrap_or_else(|_| {
            Err(StoreError::Uncertain(
                "the store writer stopped before confirming the write".to_string(),
            ))
        })
    }

    pub(super) fn read_record(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        self.refuse_if_damaged()?;
        // The overlay first, then redb: the writer empties the overlay only
        // after redb has its changes (see [`overlay`]).
        let key = codec::record_key(id);
        let overlay = self.overlay.snapshot();
        match overlay.get(wal::LogTable::Records, &key) {
            Some(Some(value)) => {
                return decode_loaded(id, value, now_ms)?
                    .map(|loaded| self.unseal(loaded))
                    .transpose();
            }
            Some(None) => return Ok(None),
            None => {}
        }
        let txn = self
            .database
            .begin_read()
            .map_err(|e| storage_error("begin read", e))?;
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        self.read_live(&records, id, now_ms)
    }

    /// The live record for `id` with its response opened.
    pub(super) fn read_live(
        &self,
        records: &impl ReadableTable<&'static [u8], &'static [u8]>,
        id: &RecordKey,
        now_ms: i64,
    ) -> StoreResult<Option<Record>> {
        read_loaded(records, id, now_ms)?
            .map(|loaded| self.unseal(loaded))
            .transpose()
    }

    /// The caller's view of a conditional write's reply.
    pub(super) fn cas_outcome(&self, reply: CasReply) -> StoreResult<CasOutcome> {
        Ok(match reply {
            CasReply::Applied => CasOutcome::Applied,
            CasReply::Conflict(current) => CasOutcome::Conflict {
                current: current.map(|loaded| self.unseal(loaded)).transpose()?,
            },
        })
    }

    /// Decrypts a record's sealed response, if it has one.
    pub(super) fn unseal(&self, loaded: Loaded) -> StoreResult<Record> {
        let Loaded {
            mut record,
            sealed_response,
        } = loaded;
        if let Some(sealed) = sealed_response {
            record.response = Some(response::open(
                self.keyring.as_deref(),
                &record.id,
                &sealed,
            )?);
        }
        Ok(record)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend_name(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        // redb reads are served from its page cache or a positioned read of
        // the file; short enough to run inline rather than pay a hop to the
        // blocking pool on the replay hot path.
        self.read_record(id, now_ms)
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        let record = record.clone();
        let reply = self.submit(tables::Insert { record, now_ms }).await?;
        Ok(match reply {
            InsertReply::Inserted => InsertOutcome::Inserted,
            InsertReply::Exists(existing) => InsertOutcome::Exists(self.unseal(existing)?),
        })
    }

    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let record = record.clone();
        let expected = expected.clone();
        let reply = self
            .submit(tables::Replace {
                record,
                expected,
                now_ms,
            })
            .await?;
        self.cas_outcome(reply)
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let id = id.clone();
        let expected = expected.clone();
        let reply = self
            .submit(tables::Delete {
                id,
                expected,
                now_ms,
            })
            .await?;
        self.cas_outcome(reply)
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        self.refuse_if_damaged()?;
        let prefix = codec::pending_tenant_prefix(&query.tenant);
        let start = match &query.page_token {
            Some(token) => {
                codec::decode_pending_position(&query.tenant, token)
                    .map_err(|_| StoreError::InvalidPageToken)?;
                let mut start = prefix.clone();
                start.extend_from_slice(token);
                // Exclusive of the last entry returned.
                start.push(0);
                start
            }
            None => prefix.clone(),
        };
        let mut end = prefix.clone();
        end.extend_from_slice(&codec::encode_instant(now_ms));
        // Entries with pending_since <= now are due: include the whole
        // instant `now_ms` by extending the bound past every suffix.
        end.push(0xff);

        // A snapshot of the overlay, then of redb (see read_record).
        let (overlay, txn) = self.overlay.read_view(&self.database)?;
        let index = txn
            .open_table(PENDING)
            .map_err(|e| storage_error("open", e))?;
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        let mut page = PendingPage::default();
        let scan_limit = query.page_size.saturating_add(MAX_PENDING_SCAN_EXTRA);
        let mut last_position: Option<Vec<u8>> = None;
        let keys = MergedKeys::new(
            redb_keys(&index, &start, &end)?,
            overlay_keys(&[&overlay], wal::LogTable::Pending, &start, &end),
        );
        for (scanned, key) in keys.enumerate() {
            if page.records.len() >= query.page_size || scanned >= scan_limit {
                page.next_page_token = last_position.take();
                break;
            }
            let key = key?;
            let position = &key[prefix.len()..];
            last_position = Some(position.to_vec());
            let (since, id) = codec::decode_pending_position(&query.tenant, position)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if query.endpoint.as_ref().is_some_and(|e| *e != id.endpoint) {
                continue;
            }
            let record = match overlay.get(wal::LogTable::Records, &codec::record_key(&id)) {
                Some(Some(value)) => decode_loaded(&id, value, now_ms)?
                    .map(|loaded| self.unseal(loaded))
                    .transpose()?,
                Some(None) => None,
                None => self.read_live(&records, &id, now_ms)?,
            };
            let Some(record) = record else {
                continue;
            };
            if record.pending_since_ms() != Some(since) || !record.needs_decision(now_ms) {
                continue;
            }
            if query
                .created_at_or_before_ms
                .is_some_and(|limit| record.created_at_ms > limit)
            {
                continue;
            }
            page.records.push(record);
        }
        Ok(page)
    }

    /// One writer operation removing at most `max_records` (see
    /// [`tables::Sweep`]): every write queued behind it waits until it
    /// ends, at ~6 µs a record, so the caller picks a small step (around
    /// 100) and calls again while a call removes its whole step.
    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        self.submit(tables::Sweep {
            now_ms,
            max_records,
        })
        .await
    }

    fn damage(&self) -> Option<String> {
        self.blocks.damage().map(str::to_string)
    }

    async fn backup(
        &self,
        to: &Path,
        progress: Arc<dyn Fn(u64) + Send + Sync>,
    ) -> StoreResult<crate::store::BackupSummary> {
        // Minutes at 10^7 records: off the async workers. The read
        // transaction and the overlay snapshot are the store's own handles.
        let database = Arc::clone(&self.database);
        let overlay = self.overlay.clone();
        let to = to.to_path_buf();
        self.refuse_if_damaged()?;
        tokio::task::spawn_blocking(move || backup::write(&database, &overlay, &to, &*progress))
            .await
            .map_err(|e| StoreError::Unavailable(format!("the backup stopped: {e}")))?
    }

    async fn close(&self) -> StoreResult<()> {
        self.scrubber
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop();
        // The writer drains the queue, checkpoints and exits.
        self.writer.close().await
    }
}
