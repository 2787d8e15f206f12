//! The writer thread: group commit. See the module docs of
//! [`super`] for why one thread, a write-ahead log and batches.
//!
//! Every write is an [`Operation`] whose output type is its own (an insert
//! answers [`InsertReply`](super::tables::InsertReply), a sweep a count),
//! queued with its reply channel behind one trait object, so one queue
//! carries every kind and a reply can never reach the wrong kind of caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redb::{Database, Durability};
use tokio::sync::{mpsc, oneshot};

use super::tables::{META, META_WAL_SEQ, Operation, Tables, open_tables};
use super::{CHECKPOINT_BYTES, CHECKPOINT_INTERVAL, MAX_BATCH, storage_error, wal};
use crate::crypto::Keyring;
use crate::store::{StoreError, StoreResult};

/// A queued operation with its reply channel.
pub(super) type WriteOp = Box<dyn Queued>;

/// The writer's view of a queued operation, whatever its output type.
pub(super) trait Queued: Send {
    /// Applies the operation (once), keeping its output for [`Queued::reply`].
    fn apply(&mut self, tables: &mut Tables<'_, '_>) -> StoreResult<()>;
    /// Answers the caller: the kept output, or `error` when the batch
    /// failed. A dropped receiver means the caller went away (e.g. its RPC
    /// was cancelled); the write stands regardless, which is what the
    /// caller's retry will find.
    fn reply(self: Box<Self>, error: Option<StoreError>);
}

/// An operation, then its output, and where the output goes.
struct Pending<O: Operation> {
    /// Taken when applied.
    op: Option<O>,
    /// Set when applied.
    output: Option<O::Output>,
    /// The caller.
    reply: oneshot::Sender<StoreResult<O::Output>>,
}

impl<O: Operation> Queued for Pending<O> {
    fn apply(&mut self, tables: &mut Tables<'_, '_>) -> StoreResult<()> {
        if let Some(op) = self.op.take() {
            self.output = Some(op.apply(tables)?);
        }
        Ok(())
    }

    fn reply(self: Box<Self>, error: Option<StoreError>) {
        let result = match (error, self.output) {
            (Some(error), _) => Err(error),
            (None, Some(output)) => Ok(output),
            // A batch that is not answered with an error applied every one
            // of its operations; kept total rather than trusted.
            (None, None) => Err(StoreError::Uncertain(
                "the store writer answered an operation it did not apply".to_string(),
            )),
        };
        drop(self.reply.send(result));
    }
}

/// Queues `op`: the item for the writer's channel and the receiver of its
/// answer.
pub(super) fn queue<O: Operation>(op: O) -> (WriteOp, oneshot::Receiver<StoreResult<O::Output>>) {
    let (reply, answer) = oneshot::channel();
    let pending = Pending {
        op: Some(op),
        output: None,
        reply,
    };
    (Box::new(pending), answer)
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

/// The writer thread's state: the only place that writes redb and the log.
pub(super) struct Writer {
    /// The database (write transactions are this thread's alone).
    pub(super) database: Arc<Database>,
    /// The log every batch is appended to before it is acknowledged.
    pub(super) wal: wal::Wal,
    /// Reused between batches (no allocation per batch on the hot path).
    pub(super) frame: wal::FrameBuilder,
    /// Sequence number of the last frame whose changes redb holds.
    pub(super) seq: u64,
    /// When the redb file was last made durable.
    pub(super) last_checkpoint: Instant,
    /// Set after a storage error in the write path; see the module docs.
    pub(super) poisoned: Option<String>,
    /// Batches refused for want of space since the last report, and when
    /// that report was logged: a full disk is reported at most every
    /// [`OUT_OF_SPACE_REPORT`], not per batch (the log may share the disk,
    /// and appends alternate between failing and fitting in the last page).
    pub(super) out_of_space: (u64, Option<Instant>),
    /// Some write of this process failed for want of space: redb latches
    /// its first I/O error and later reports only "Previous I/O error
    /// occurred", so this is what tells a full disk from a broken one then.
    pub(super) disk_was_full: bool,
    /// The data directory, named in what operators are told to free.
    pub(super) data_dir: std::path::PathBuf,
    /// Counters shared with the store.
    pub(super) stats: Arc<WriterStats>,
    /// Seals responses as records are encoded.
    pub(super) keyring: Option<Arc<Keyring>>,
}

impl Writer {
    /// Applies batches until every sender is dropped, then checkpoints.
    pub(super) fn run(mut self, mut receiver: mpsc::Receiver<WriteOp>) {
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
            data_dir = %self.data_dir.display(),
            "embedded store: write path failed; refusing writes until restart (acknowledged writes are safe in the write-ahead log)"
        );
        if let Some(exit) = EXIT_ON_POISON.get() {
            // redb latches its I/O errors (every later read and write fails
            // until the file is reopened) and a failed sync leaves the log
            // untrustworthy: only a restart's replay is a way back, so a
            // process that can be restarted says what to do and goes.
            exit(&format!(
                "the embedded store in {} cannot write ({reason}); every acknowledged write is in its write-ahead log. {} then start idemd again: it replays the log on start",
                self.data_dir.display(),
                // The reason is text by now (redb's errors carry the OS's);
                // ENOSPC and EDQUOT read the same on every Linux libc. redb
                // latches its first I/O error and later reports only
                // "Previous I/O error occurred": after an out-of-space
                // refusal that earlier error was the full disk.
                if reason.contains("No space left")
                    || reason.contains("quota exceeded")
                    || (reason.contains("Previous I/O error") && self.disk_was_full)
                {
                    "Free space on that file system (it is full),"
                } else {
                    "Check the disk (kernel log, file system),"
                }
            ));
        }
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
                op.reply(Some(error.clone()));
            }
            return;
        }
        let size = batch.len() as u64;
        let seq = self.seq + 1;
        self.frame.begin(seq);
        let applied = apply_ops(
            &self.database,
            self.keyring.as_deref(),
            &mut self.frame,
            seq,
            batch,
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
        // The transaction was dropped (aborted), or its durability is
        // unknown: every operation of the batch shares that fate.
        let error = match outcome {
            Ok(committed) => {
                if committed {
                    self.seq = seq;
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.operations.fetch_add(size, Ordering::Relaxed);
                None
            }
            Err(error) => {
                let text = error.to_string();
                self.disk_was_full |=
                    text.contains("No space left") || text.contains("quota exceeded");
                Some(error)
            }
        };
        for op in batch.drain(..) {
            op.reply(error.clone());
        }
    }

    /// Logs and syncs the batch's frame, then commits the transaction
    /// (without fsync: the log holds it) so that readers see it.
    fn make_durable(&mut self, txn: redb::WriteTransaction) -> StoreResult<()> {
        let frame = match self.frame.finish() {
            Ok(frame) => frame,
            Err(error) => {
                drop(txn);
                return Err(StoreError::Unavailable(format!(
                    "nothing was applied: {error}"
                )));
            }
        };
        match self.wal.append(frame) {
            Ok(()) => {}
            // The frame is not in the log and the transaction is dropped:
            // nothing of the batch happened, and nothing else is at risk
            // (no sync failed). Refuse the batch and keep going, so writes
            // resume by themselves once space is freed.
            Err(error) if error.is_out_of_space() => {
                drop(txn);
                let (refused, reported) = &mut self.out_of_space;
                *refused += 1;
                if reported.is_none_or(|at| at.elapsed() >= OUT_OF_SPACE_REPORT) {
                    tracing::error!(
                        %error,
                        refused_batches = *refused,
                        data_dir = %self.data_dir.display(),
                        "embedded store: the disk is full; writes are refused (UNAVAILABLE, nothing applied) until space is freed in the data directory"
                    );
                    *refused = 0;
                    *reported = Some(Instant::now());
                }
                return Err(StoreError::Unavailable(format!(
                    "the disk holding {} is full, nothing was applied; retry once space is freed: {error}",
                    self.data_dir.display()
                )));
            }
            Err(error) => {
                // The frame may have reached the disk partially or wholly.
                drop(txn);
                return Err(self.uncertain(error.to_string()));
            }
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

/// Shortest interval between two reports of a full disk.
const OUT_OF_SPACE_REPORT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a process that can be restarted does when the writer is poisoned:
/// see [`exit_on_storage_failure`].
static EXIT_ON_POISON: std::sync::OnceLock<fn(&str) -> !> = std::sync::OnceLock::new();

/// Makes a storage failure of the write path end the process through
/// `exit` (which prints the message it is given and exits non-zero), for
/// the `idemd` binary: its supervisor restarts it and the restart's replay
/// recovers. Embedders and tests keep a store that refuses writes instead.
pub fn exit_on_storage_failure(exit: fn(&str) -> !) {
    let _ = EXIT_ON_POISON.set(exit);
}

/// Applies operations in one non-durable write transaction, logging every
/// change into `frame`; returns the open transaction for the caller to make
/// durable. On error the transaction is dropped (nothing applied) and the
/// caller answers the whole batch with the error.
fn apply_ops(
    database: &Database,
    keyring: Option<&Keyring>,
    frame: &mut wal::FrameBuilder,
    seq: u64,
    ops: &mut [WriteOp],
) -> StoreResult<redb::WriteTransaction> {
    let mut txn = database
        .begin_write()
        .map_err(|e| storage_error("begin write", e))?;
    // Durability comes from the write-ahead log, synced before this
    // transaction commits; see the module docs.
    txn.set_durability(Durability::None)
        .map_err(|e| storage_error("begin write", e))?;
    {
        let (mut records, mut expiry, mut pending) = open_tables(&txn)?;
        let mut tables = Tables {
            records: &mut records,
            expiry: &mut expiry,
            pending: &mut pending,
            frame,
            keyring,
        };
        for op in ops.iter_mut() {
            op.apply(&mut tables)?;
        }
    }
    {
        let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
        meta.insert(META_WAL_SEQ, seq)
            .map_err(|e| storage_error("write", e))?;
    }
    Ok(txn)
}
