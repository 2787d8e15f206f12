//! The embedded store: one durable redb file, for a single idemd node.
//!
//! # Envelope
//!
//! * One process owns the file: redb takes an exclusive lock when it opens
//!   it, and a second idemd pointed at the same `--data-dir` refuses to start.
//!   This backend is for a single replica; use the CQL backend to scale out.
//! * An acknowledged write survives `kill -9` and power loss: before any
//!   reply, the batch's changes are appended to a write-ahead log and
//!   `fdatasync`ed (see [`wal`]); the redb file itself is made durable by
//!   periodic checkpoints, and on open the log's frames newer than the last
//!   checkpoint are replayed into it.
//!
//! # Group commit
//!
//! All writes go through one writer thread. It takes the first waiting
//! operation, then everything else already queued (up to [`MAX_BATCH`]),
//! applies them in order inside one redb write transaction while logging
//! each change, appends the log frame and syncs it (one fsync per batch),
//! commits the transaction without durability (the log has it) and only then
//! replies to each. Under load many requests share one fsync; with one
//! request in flight the latency is one log append. Operations in a batch see
//! each other's effects, so the order of application is the linearization
//! order. A batch that changed nothing (every condition failed) needs no
//! fsync and is answered at once.
//!
//! Why not a durable redb commit per batch: it copies and rewrites every
//! B-tree page the batch touched (tens of scattered 4 KiB pages) and fsyncs
//! them, several times the cost of a sequential log append; that, not CPU,
//! bounded throughput. Checkpoints write each page once for many batches.
//!
//! Reads use redb's MVCC read transactions and never wait for the writer.
//! They cannot see a write before it is durable: the redb transaction is
//! committed (made visible) only after its log frame is synced.
//!
//! After a storage error in the write path (log append or sync, redb commit,
//! checkpoint) the writer stops accepting writes until a restart: after a
//! failed fsync the kernel may have dropped unwritten pages, so neither the
//! log nor the in-memory state can be trusted to match the disk, and the
//! restart's replay is the one consistent way back.
//!
//! # Tables
//!
//! * `records`: record key → record (see [`codec`]).
//! * `expiry`: (expires_at, record key) → (): what the sweeper deletes.
//! * `pending`: (tenant, pending_since, endpoint, key) → (): what ListPending
//!   reads; maintained in the same transaction as the record, so it can only
//!   be stale for records that expired (filtered on read, swept later).
//!
//! # Encryption at rest
//!
//! With a keyring ([`EmbeddedOptions::keyring`]) the writer seals each
//! record's response as it encodes the record (see [`codec`]), so the
//! records table and the write-ahead log only ever hold sealed responses.
//! The writer never decrypts: conditions need only the clear fields, and a
//! value it could not decrypt must not fail the other operations of its
//! batch. Records it returns (an existing record, a conflict) carry their
//! sealed response out of the writer thread and are opened by the caller.

pub mod codec;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use super::{
    CasOutcome, Expected, InsertOutcome, PendingPage, PendingQuery, Record, RecordKey, Store,
    StoreError, StoreResult,
};
use crate::crypto::{self, Keyring};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
const PENDING: TableDefinition<&[u8], ()> = TableDefinition::new("pending");
/// Store metadata: [`META_WAL_SEQ`] is the sequence number of the last log
/// frame whose changes the tables hold (see [`wal`]).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_WAL_SEQ: &str = "wal_seq";

/// Most operations applied in one write transaction: bounds the latency a
/// batch adds to its first operation.
pub const MAX_BATCH: usize = 1024;

/// Log bytes after which the writer checkpoints (durable redb commit, then
/// the log restarts). Bounds the log file, the replay time on open (a few
/// hundred ms at most) and the pages redb holds back from reuse until a
/// durable commit (the file would otherwise grow between checkpoints).
const CHECKPOINT_BYTES: u64 = 8 * 1024 * 1024;

/// Longest time between checkpoints while writes arrive: bounds replay and
/// held-back pages under a light load. Each checkpoint stalls the writer for
/// one redb durable commit (a few ms), so not much more often than this.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Depth of the queue in front of the writer: beyond it callers wait
/// (backpressure instead of unbounded memory).
const QUEUE_DEPTH: usize = 8192;

/// Index entries examined per ListPending page beyond the page size before a
/// page is returned short (with a token): bounds the work of one request when
/// filters reject most entries.
const MAX_PENDING_SCAN_EXTRA: usize = 10_000;

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "idemd.redb";

/// Tunables of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Directory holding the database file; created if missing.
    pub data_dir: PathBuf,
    /// Page cache size in bytes (redb's cache; bounds memory use).
    pub cache_bytes: usize,
    /// Encryption at rest of stored responses; `None` stores them in clear
    /// (values sealed earlier then fail to read, naming their key id).
    pub keyring: Option<Arc<Keyring>>,
}

impl EmbeddedOptions {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            cache_bytes: crate::config::DEFAULT_STORE_CACHE_BYTES,
            keyring: None,
        }
    }
}

enum WriteOp {
    Insert {
        record: Record,
        now_ms: i64,
        reply: oneshot::Sender<StoreResult<InsertReply>>,
    },
    Replace {
        record: Record,
        expected: Expected,
        now_ms: i64,
        reply: oneshot::Sender<StoreResult<CasReply>>,
    },
    Delete {
        id: RecordKey,
        expected: Expected,
        now_ms: i64,
        reply: oneshot::Sender<StoreResult<CasReply>>,
    },
    Sweep {
        now_ms: i64,
        max_records: usize,
        reply: oneshot::Sender<StoreResult<usize>>,
    },
}

/// Where the result of one operation goes, once the batch is committed.
enum ReplySlot {
    Insert(oneshot::Sender<StoreResult<InsertReply>>),
    Cas(oneshot::Sender<StoreResult<CasReply>>),
    Sweep(oneshot::Sender<StoreResult<usize>>),
}

/// The result of one operation, computed inside the transaction.
enum Applied {
    Insert(InsertReply),
    Cas(CasReply),
    Sweep(usize),
}

/// A record as the writer read it: a sealed response stays sealed until
/// the caller opens it, off the writer thread (see the module docs).
struct Loaded {
    /// The record, with `response: None` when the response is sealed.
    record: Record,
    /// The sealed response, for [`crypto::open_response`].
    sealed_response: Option<Vec<u8>>,
}

/// [`InsertOutcome`] with the existing record still sealed.
#[allow(clippy::large_enum_variant)] // moved once, like InsertOutcome
enum InsertReply {
    Inserted,
    Exists(Loaded),
}

/// [`CasOutcome`] with the current record still sealed.
#[allow(clippy::large_enum_variant)] // moved once, like CasOutcome
enum CasReply {
    Applied,
    Conflict(Option<Loaded>),
}

/// The part of an operation that the transaction needs.
enum OpBody {
    Insert {
        record: Record,
        now_ms: i64,
    },
    Replace {
        record: Record,
        expected: Expected,
        now_ms: i64,
    },
    Delete {
        id: RecordKey,
        expected: Expected,
        now_ms: i64,
    },
    Sweep {
        now_ms: i64,
        max_records: usize,
    },
}

impl WriteOp {
    fn split(self) -> (ReplySlot, OpBody) {
        match self {
            WriteOp::Insert {
                record,
                now_ms,
                reply,
            } => (ReplySlot::Insert(reply), OpBody::Insert { record, now_ms }),
            WriteOp::Replace {
                record,
                expected,
                now_ms,
                reply,
            } => (
                ReplySlot::Cas(reply),
                OpBody::Replace {
                    record,
                    expected,
                    now_ms,
                },
            ),
            WriteOp::Delete {
                id,
                expected,
                now_ms,
                reply,
            } => (
                ReplySlot::Cas(reply),
                OpBody::Delete {
                    id,
                    expected,
                    now_ms,
                },
            ),
            WriteOp::Sweep {
                now_ms,
                max_records,
                reply,
            } => (
                ReplySlot::Sweep(reply),
                OpBody::Sweep {
                    now_ms,
                    max_records,
                },
            ),
        }
    }
}

impl ReplySlot {
    // A dropped receiver means the caller went away (e.g. its RPC was
    // cancelled); the write is committed regardless, which is what the
    // caller's retry will find. Hence the ignored send results.
    fn send(self, applied: Applied) {
        match (self, applied) {
            (ReplySlot::Insert(reply), Applied::Insert(outcome)) => drop(reply.send(Ok(outcome))),
            (ReplySlot::Cas(reply), Applied::Cas(outcome)) => drop(reply.send(Ok(outcome))),
            (ReplySlot::Sweep(reply), Applied::Sweep(count)) => drop(reply.send(Ok(count))),
            (slot, _) => slot.send_err(StoreError::Unavailable(
                "internal error: mismatched store reply".to_string(),
            )),
        }
    }

    fn send_err(self, error: StoreError) {
        match self {
            ReplySlot::Insert(reply) => drop(reply.send(Err(error))),
            ReplySlot::Cas(reply) => drop(reply.send(Err(error))),
            ReplySlot::Sweep(reply) => drop(reply.send(Err(error))),
        }
    }
}

/// Counters of the writer, for tests and metrics.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches made durable (one log append and fsync each).
    pub commits: AtomicU64,
    /// Operations answered from committed batches (including batches that
    /// changed nothing and so needed no fsync).
    pub operations: AtomicU64,
    /// Checkpoints (durable redb commits).
    pub checkpoints: AtomicU64,
}

/// The embedded backend. Cheap to share behind an `Arc`.
pub struct EmbeddedStore {
    /// Group-commit counters shared with the writer thread.
    stats: Arc<WriterStats>,
    /// Read side: MVCC snapshots, concurrent with the writer.
    database: Arc<Database>,
    /// Queue to the writer thread; `None` once closed.
    writer: Mutex<Option<mpsc::Sender<WriteOp>>>,
    /// The writer thread, joined on close so that every accepted write is
    /// committed before `close` returns.
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    /// Opens sealed responses on the read side.
    keyring: Option<Arc<Keyring>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

fn storage_error(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

impl EmbeddedStore {
    /// Opens (creating if needed) the database in `options.data_dir`.
    ///
    /// Fails if another process holds the file.
    pub fn open(options: &EmbeddedOptions) -> Result<Self, StoreError> {
        std::fs::create_dir_all(&options.data_dir).map_err(|e| {
            storage_error(
                &format!("cannot create data dir {}", options.data_dir.display()),
                e,
            )
        })?;
        let path = options.data_dir.join(DATABASE_FILE);
        let database = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                    "{} is already open in another process (the embedded store allows one owner)",
                    path.display()
                )),
                other => storage_error(&format!("cannot open {}", path.display()), other),
            })?;
        let database = Arc::new(database);
        // Create the tables up front so that read transactions never see a
        // missing table.
        let txn = database
            .begin_write()
            .map_err(|e| storage_error("begin", e))?;
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
        let seq = recover(&database, &wal)?;
        // Everything replayed is durable in redb now: the log starts over.
        wal.reset();

        let (sender, receiver) = mpsc::channel(QUEUE_DEPTH);
        let stats = Arc::new(WriterStats::default());
        let writer = Writer {
            database: Arc::clone(&database),
            wal,
            frame: wal::FrameBuilder::default(),
            seq,
            last_checkpoint: Instant::now(),
            poisoned: None,
            stats: Arc::clone(&stats),
            keyring: options.keyring.clone(),
        };
        let writer_thread = std::thread::Builder::new()
            .name("idemd-store-writer".to_string())
            .spawn(move || writer.run(receiver))
            .map_err(|e| storage_error("cannot start writer thread", e))?;
        Ok(Self {
            stats,
            database,
            writer: Mutex::new(Some(sender)),
            writer_thread: Mutex::new(Some(writer_thread)),
            keyring: options.keyring.clone(),
        })
    }

    /// Group-commit counters: `operations / commits` is the average batch.
    pub fn writer_stats(&self) -> (u64, u64) {
        (
            self.stats.commits.load(Ordering::Relaxed),
            self.stats.operations.load(Ordering::Relaxed),
        )
    }

    /// Path of the database file for a data directory.
    pub fn database_path(data_dir: &Path) -> PathBuf {
        data_dir.join(DATABASE_FILE)
    }

    fn sender(&self) -> StoreResult<mpsc::Sender<WriteOp>> {
        self.writer
            .lock()
            .map_err(|_| StoreError::Closed)?
            .clone()
            .ok_or(StoreError::Closed)
    }

    async fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> WriteOp,
    ) -> StoreResult<T> {
        let (reply, response) = oneshot::channel();
        self.sender()?
            .send(make(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        // The writer replies to every operation it accepted; a dropped reply
        // means it died mid-transaction, and a commit may or may not have
        // happened.
        response.await.unwrap_or_else(|_| {
            Err(StoreError::Uncertain(
                "the store writer stopped before confirming the write".to_string(),
            ))
        })
    }

    fn read_record(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
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
    fn read_live(
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
    fn cas_outcome(&self, reply: CasReply) -> StoreResult<CasOutcome> {
        Ok(match reply {
            CasReply::Applied => CasOutcome::Applied,
            CasReply::Conflict(current) => CasOutcome::Conflict {
                current: current.map(|loaded| self.unseal(loaded)).transpose()?,
            },
        })
    }

    /// Decrypts a record's sealed response, if it has one.
    fn unseal(&self, loaded: Loaded) -> StoreResult<Record> {
        let Loaded {
            mut record,
            sealed_response,
        } = loaded;
        if let Some(sealed) = sealed_response {
            record.response = Some(crypto::open_response(
                self.keyring.as_deref(),
                &record.id,
                &sealed,
            )?);
        }
        Ok(record)
    }
}

/// The live record for `id`, its response still sealed if it is.
fn read_loaded(
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

/// Replays the log frames newer than the durable redb state (see [`wal`])
/// and commits the result durably; returns the last frame's sequence.
fn recover(database: &Database, wal: &wal::Wal) -> StoreResult<u64> {
    let txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    let last = {
        let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
        let durable = meta
            .get(META_WAL_SEQ)
            .map_err(|e| storage_error("read", e))?
            .map_or(0, |seq| seq.value());
        let mut records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        let mut expiry = txn
            .open_table(EXPIRY)
            .map_err(|e| storage_error("open", e))?;
        let mut pending = txn
            .open_table(PENDING)
            .map_err(|e| storage_error("open", e))?;
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

/// The writer thread's state: the only place that writes redb and the log.
struct Writer {
    database: Arc<Database>,
    wal: wal::Wal,
    /// Reused between batches (no allocation per batch on the hot path).
    frame: wal::FrameBuilder,
    /// Sequence number of the last frame whose changes redb holds.
    seq: u64,
    last_checkpoint: Instant,
    /// Set after a storage error in the write path; see the module docs.
    poisoned: Option<String>,
    stats: Arc<WriterStats>,
    /// Seals responses as records are encoded.
    keyring: Option<Arc<Keyring>>,
}

impl Writer {
    fn run(mut self, mut receiver: mpsc::Receiver<WriteOp>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = receiver.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.apply_batch(&mut batch);
            if self.poisoned.is_none()
                && (self.wal.pending_bytes() >= CHECKPOINT_BYTES
                    || (self.wal.pending_bytes() > 0
                        && self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL))
            {
                self.checkpoint();
            }
        }
        // Closing: leave a durable redb file and an empty log behind, so
        // that the next open has nothing to replay.
        if self.poisoned.is_none() && self.wal.pending_bytes() > 0 {
            self.checkpoint();
        }
    }

    fn poison(&mut self, reason: String) {
        tracing::error!(
            error = %reason,
            "embedded store: write path failed; refusing writes until restart (acknowledged writes are safe in the write-ahead log)"
        );
        self.poisoned = Some(reason);
    }

    /// Makes the redb file durable up to the last batch, then restarts the
    /// log. Runs after the batch's replies, so it delays only later batches.
    fn checkpoint(&mut self) {
        let result = self
            .database
            .begin_write()
            .map_err(|e| e.to_string())
            .and_then(|txn| {
                // An empty transaction with Durability::Immediate (the
                // default) flushes every earlier non-durable commit.
                txn.commit().map_err(|e| e.to_string())
            });
        match result {
            Ok(()) => {
                self.wal.reset();
                self.last_checkpoint = Instant::now();
                self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.poison(format!("checkpoint failed: {error}")),
        }
    }

    /// Applies a batch, makes it durable and replies to every operation.
    fn apply_batch(&mut self, batch: &mut Vec<WriteOp>) {
        if let Some(reason) = &self.poisoned {
            let error = StoreError::Unavailable(format!(
                "the embedded store stopped accepting writes after a storage error ({reason}); restart idemd"
            ));
            for op in batch.drain(..) {
                op.split().0.send_err(error.clone());
            }
            return;
        }
        let size = batch.len() as u64;
        let mut done: Vec<(ReplySlot, Applied)> = Vec::with_capacity(batch.len());
        let mut failed: Vec<ReplySlot> = Vec::new();
        let mut ops = batch.drain(..);
        let seq = self.seq + 1;
        self.frame.begin(seq);
        let applied = apply_ops(
            &self.database,
            self.keyring.as_deref(),
            &mut self.frame,
            seq,
            &mut ops,
            &mut done,
            &mut failed,
        );
        let outcome = match applied {
            Err(error) => Err(error),
            // Nothing changed (every condition failed): the answers rest on
            // state that is already durable, so no fsync is needed.
            Ok(txn) if self.frame.is_empty() => {
                drop(txn);
                Ok(false)
            }
            Ok(txn) => self.make_durable(txn).map(|()| true),
        };
        match outcome {
            Ok(committed) => {
                if committed {
                    self.seq = seq;
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.operations.fetch_add(size, Ordering::Relaxed);
                for (slot, applied) in done {
                    slot.send(applied);
                }
            }
            Err(error) => {
                // The transaction was dropped (aborted), or its durability is
                // unknown: every operation of the batch shares that fate.
                failed.extend(ops.map(|op| op.split().0));
                for slot in done.into_iter().map(|(slot, _)| slot).chain(failed) {
                    slot.send_err(error.clone());
                }
            }
        }
    }

    /// Logs and syncs the batch's frame, then commits the transaction
    /// (without fsync: the log holds it) so that readers see it.
    fn make_durable(&mut self, txn: redb::WriteTransaction) -> StoreResult<()> {
        let appended = self.frame.finish().and_then(|frame| self.wal.append(frame));
        if let Err(error) = appended {
            // The frame may have reached the disk partially or wholly.
            drop(txn);
            return Err(self.uncertain(format!("write-ahead log append failed: {error}")));
        }
        if let Err(error) = txn.commit() {
            // The log has a frame that redb does not: later batches would
            // diverge from what a replay rebuilds.
            return Err(self.uncertain(format!("commit failed: {error}")));
        }
        Ok(())
    }

    fn uncertain(&mut self, reason: String) -> StoreError {
        metrics::counter!(crate::metrics::STORE_UNCERTAIN, "backend" => "embedded").increment(1);
        self.poison(reason.clone());
        StoreError::Uncertain(reason)
    }
}

/// Applies operations in one non-durable write transaction, logging every
/// change into `frame`; returns the open transaction for the caller to make
/// durable. On error the transaction is dropped (nothing applied), and the
/// failed operation's reply goes to `failed` for the caller to answer with
/// the rest of the batch.
fn apply_ops(
    database: &Database,
    keyring: Option<&Keyring>,
    frame: &mut wal::FrameBuilder,
    seq: u64,
    ops: &mut std::vec::Drain<'_, WriteOp>,
    done: &mut Vec<(ReplySlot, Applied)>,
    failed: &mut Vec<ReplySlot>,
) -> StoreResult<redb::WriteTransaction> {
    let mut txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    // Durability comes from the write-ahead log, synced before this
    // transaction commits; see the module docs.
    txn.set_durability(Durability::None)
        .map_err(|e| storage_error("begin write", e))?;
    {
        let mut records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        let mut expiry = txn
            .open_table(EXPIRY)
            .map_err(|e| storage_error("open", e))?;
        let mut pending = txn
            .open_table(PENDING)
            .map_err(|e| storage_error("open", e))?;
        let mut tables = Tables {
            records: &mut records,
            expiry: &mut expiry,
            pending: &mut pending,
            frame,
            keyring,
        };
        for op in ops.by_ref() {
            let (slot, body) = op.split();
            match tables.apply(body) {
                Ok(applied) => done.push((slot, applied)),
                Err(error) => {
                    failed.push(slot);
                    return Err(error);
                }
            }
        }
    }
    {
        let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
        meta.insert(META_WAL_SEQ, seq)
            .map_err(|e| storage_error("write", e))?;
    }
    Ok(txn)
}

/// The three tables of one write transaction, kept consistent together, and
/// the log frame that records every change made to them.
struct Tables<'a, 'txn> {
    records: &'a mut redb::Table<'txn, &'static [u8], &'static [u8]>,
    expiry: &'a mut redb::Table<'txn, &'static [u8], ()>,
    pending: &'a mut redb::Table<'txn, &'static [u8], ()>,
    frame: &'a mut wal::FrameBuilder,
    keyring: Option<&'a Keyring>,
}
impl Tables<'_, '_> {
    /// Applies one operation. An error aborts the whole batch (nothing of
    /// it is committed).
    fn apply(&mut self, body: OpBody) -> StoreResult<Applied> {
        Ok(match body {
            OpBody::Insert { record, now_ms } => {
                Applied::Insert(match self.read_any(&record.id)? {
                    Some(existing) if existing.record.is_live(now_ms) => {
                        InsertReply::Exists(existing)
                    }
                    stale => {
                        if let Some(stale) = stale {
                            self.remove(&stale.record)?;
                        }
                        self.put(&record)?;
                        InsertReply::Inserted
                    }
                })
            }
            OpBody::Replace {
                record,
                expected,
                now_ms,
            } => Applied::Cas(match self.read_live_at(&record.id, now_ms)? {
                Some(current) if expected.is_met_by(&current.record) => {
                    self.remove(&current.record)?;
                    self.put(&record)?;
                    CasReply::Applied
                }
                current => CasReply::Conflict(current),
            }),
            OpBody::Delete {
                id,
                expected,
                now_ms,
            } => Applied::Cas(match self.read_live_at(&id, now_ms)? {
                Some(current) if expected.is_met_by(&current.record) => {
                    self.remove(&current.record)?;
                    CasReply::Applied
                }
                current => CasReply::Conflict(current),
            }),
            OpBody::Sweep {
                now_ms,
                max_records,
            } => Applied::Sweep(self.sweep(now_ms, max_records)?),
        })
    }

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

    /// Inserts an index entry, and logs it.
    fn insert_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        let index = match table {
            wal::LogTable::Expiry => &mut *self.expiry,
            wal::LogTable::Pending => &mut *self.pending,
            wal::LogTable::Records => {
                return Err(StoreError::Unavailable(
                    "internal error: records is not an index".to_string(),
                ));
            }
        };
        index
            .insert(key, ())
            .map_err(|e| storage_error("write", e))?;
        self.frame.put(table, key, &[]);
        Ok(())
    }

    /// Removes an index entry, and logs it.
    fn remove_index(&mut self, table: wal::LogTable, key: &[u8]) -> StoreResult<()> {
        let index = match table {
            wal::LogTable::Expiry => &mut *self.expiry,
            wal::LogTable::Pending => &mut *self.pending,
            wal::LogTable::Records => {
                return Err(StoreError::Unavailable(
                    "internal error: records is not an index".to_string(),
                ));
            }
        };
        index.remove(key).map_err(|e| storage_error("write", e))?;
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
        let reply = self
            .submit(|reply| WriteOp::Insert {
                record,
                now_ms,
                reply,
            })
            .await?;
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
            .submit(|reply| WriteOp::Replace {
                record,
                expected,
                now_ms,
                reply,
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
            .submit(|reply| WriteOp::Delete {
                id,
                expected,
                now_ms,
                reply,
            })
            .await?;
        self.cas_outcome(reply)
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
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

        let txn = self
            .database
            .begin_read()
            .map_err(|e| storage_error("begin read", e))?;
        let index = txn
            .open_table(PENDING)
            .map_err(|e| storage_error("open", e))?;
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| storage_error("open", e))?;
        let mut page = PendingPage::default();
        let scan_limit = query.page_size.saturating_add(MAX_PENDING_SCAN_EXTRA);
        let mut last_position: Option<Vec<u8>> = None;
        for (scanned, entry) in index
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| storage_error("read", e))?
            .enumerate()
        {
            if page.records.len() >= query.page_size || scanned >= scan_limit {
                page.next_page_token = last_position.take();
                break;
            }
            let (key, _) = entry.map_err(|e| storage_error("read", e))?;
            let position = &key.value()[prefix.len()..];
            last_position = Some(position.to_vec());
            let (since, id) = codec::decode_pending_position(&query.tenant, position)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if query.endpoint.as_ref().is_some_and(|e| *e != id.endpoint) {
                continue;
            }
            let Some(record) = self.read_live(&records, &id, now_ms)? else {
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

    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        self.submit(|reply| WriteOp::Sweep {
            now_ms,
            max_records,
            reply,
        })
        .await
    }

    async fn close(&self) -> StoreResult<()> {
        // Dropping the only sender lets the writer drain the queue, commit
        // and exit.
        let sender = self.writer.lock().map_err(|_| StoreError::Closed)?.take();
        drop(sender);
        let thread = self
            .writer_thread
            .lock()
            .map_err(|_| StoreError::Closed)?
            .take();
        if let Some(thread) = thread {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|e| storage_error("join writer", e))?
                .map_err(|_| StoreError::Unavailable("store writer panicked".to_string()))?;
        }
        Ok(())
    }
}
