//! The store's writer: the [`Batcher`] of its group-commit thread
//! ([`super::group`]), the only place that writes redb and the log. See the
//! module docs of [`super`] for why one thread, a write-ahead log and
//! batches.
//!
//! A batch goes into redb's tables when no checkpoint runs, or into the
//! overlay while one does ([`super::overlay`]); the writer starts the
//! checkpoints ([`super::checkpoint`]) and folds the overlay once one is
//! durable. What a storage failure means is [`super::failure`]'s.
//!
//! Every write is an [`Operation`] whose output type is its own (an insert
//! answers [`InsertReply`](super::tables::InsertReply), a sweep a count),
//! queued with its reply channel behind one trait object, so one queue
//! carries every kind and a reply can never reach the wrong kind of caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redb::{Database, Durability, ReadableDatabase};
use tokio::sync::oneshot;

use super::checkpoint::Checkpointer;
use super::failure::{Classify, Failure, Failures, is_out_of_space, storage_error};
use super::fold::{Folding, Overlay};
use super::group::Batcher;
use super::options::EmbeddedOptions;
use super::overlay::Layer;
use super::stages::{self, BatchTimes};
use super::tables::{Backing, EXPIRY, Operation, RECORDS, RedbTables, Tables, record_seq};
use super::wal;
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
    /// When the caller queued it (the stage timings start there).
    fn queued_at(&self) -> Instant;
}

/// An operation, then its output, and where the output goes.
struct Pending<O: Operation> {
    /// Taken when applied.
    op: Option<O>,
    /// Set when applied.
    output: Option<O::Output>,
    /// The caller.
    reply: oneshot::Sender<StoreResult<O::Output>>,
    /// When it was queued, for [`stages`].
    queued_at: Instant,
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

    fn queued_at(&self) -> Instant {
        self.queued_at
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
        queued_at: Instant::now(),
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
    /// Checkpoints (durable redb commits) completed.
    pub checkpoints: AtomicU64,
    /// Checkpoints started (one more than `checkpoints` while one runs).
    pub checkpoints_started: AtomicU64,
}

/// The writer's state.
pub(super) struct Writer {
    /// The database (write transactions are this thread's alone).
    database: Arc<Database>,
    /// The log every batch is appended to before it is acknowledged.
    wal: wal::Wal,
    /// Reused between batches (no allocation per batch on the hot path).
    frame: wal::FrameBuilder,
    /// Sequence number of the last frame whose changes redb (or the
    /// overlay) holds.
    seq: u64,
    /// When the writer's own part of the last checkpoint (taking its
    /// outcome, folding the overlay) started and ended: the writes queued
    /// meanwhile waited for it ([`stages`]).
    last_checkpoint_span: Option<(Instant, Instant)>,
    /// Whether writes are still accepted, and what was seen of the disk.
    failures: Failures,
    /// Counters shared with the store.
    stats: Arc<WriterStats>,
    /// Seals responses as records are encoded.
    keyring: Option<Arc<Keyring>>,
    /// The changes acknowledged since the running checkpoint began, until
    /// folded into redb; shared with readers.
    overlay: Overlay,
    /// Runs the checkpoints.
    checkpointer: Checkpointer,
    /// The fold of the overlay into redb under way since the last
    /// checkpoint became durable, a slice per batch ([`super::fold`]);
    /// batches go to the overlay until it is done.
    folding: Option<Folding>,
}

/// Changes a fold slice writes at least. With each batch the writer folds
/// the larger of this and [`FOLD_PER_OPERATION`] per operation of the batch:
/// a slice of 512 took 0.1-1.6 ms of B-tree writes here (fresh Claims at 64
/// in flight, logged per step while measuring), and an operation changes
/// at most 3 entries (record, expiry, pending) and removes at most 3, so the
/// fold always outpaces the batches and the overlay drains.
const FOLD_SLICE: usize = 512;
/// See [`FOLD_SLICE`].
const FOLD_PER_OPERATION: usize = 8;

impl Batcher for Writer {
    type Item = WriteOp;

    /// Takes a finished checkpoint's outcome, folds a slice of the overlay,
    /// applies the batch, and starts a checkpoint when one is due.
    fn write(&mut self, batch: &mut Vec<WriteOp>) {
        self.poll_checkpoint(false);
        // An empty batch (a checkpoint's wake-up) keeps nobody waiting:
        // the whole fold at once. Otherwise a slice, and what is left goes
        // on with the next batch (or at close: an idle writer keeps its
        // overlay, as it keeps log frames no checkpoint covers yet).
        self.fold_step(if batch.is_empty() {
            usize::MAX
        } else {
            FOLD_SLICE.max(batch.len() * FOLD_PER_OPERATION)
        });
        if !batch.is_empty() {
            self.apply_batch(batch);
        }
        if self.failures.is_healthy()
            && self.folding.is_none()
            && self.checkpointer.is_due(self.wal.pending_bytes())
        {
            self.start_checkpoint();
        }
    }

    /// Waits for a running checkpoint, then checkpoints what is left, so
    /// that the next open has nothing to replay.
    fn close(&mut self) {
        self.poll_checkpoint(true);
        self.fold_step(usize::MAX);
        if self.failures.is_healthy() && self.wal.pending_bytes() > 0 {
            self.start_checkpoint();
            self.poll_checkpoint(true);
            self.fold_step(usize::MAX);
        }
    }
}

impl Writer {
    /// The writer of `database`, whose changes up to frame `seq` are in
    /// redb, appending to `wal`; it shares `overlay` and `stats` with the
    /// store, and its failure state starts as `failures`. Each argument is
    /// a separate concern the store owns; a struct bundling them would only
    /// be unpacked here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        database: Arc<Database>,
        wal: wal::Wal,
        seq: u64,
        options: &EmbeddedOptions,
        overlay: Overlay,
        stats: Arc<WriterStats>,
        checkpointer: Checkpointer,
        failures: Failures,
    ) -> Self {
        Self {
            database,
            wal,
            frame: wal::FrameBuilder::default(),
            seq,
            last_checkpoint_span: None,
            failures,
            stats,
            keyring: options.keyring.clone(),
            overlay,
            checkpointer,
            folding: None,
        }
    }

    /// Starts a checkpoint. Every frame of the current log segment is in
    /// redb (no checkpoint runs, so batches went there): the checkpoint
    /// covers them all, and the writer goes on in the other segment, whose
    /// frames the previous checkpoint covered.
    fn start_checkpoint(&mut self) {
        match self.checkpointer.begin() {
            Ok(()) => {
                self.wal.switch();
                self.stats
                    .checkpoints_started
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(failure) => self.failures.poison(failure),
        }
    }

    /// Takes the outcome of a running checkpoint (waiting for it when
    /// `wait`); once it is durable, the fold of the overlay into redb
    /// begins ([`Self::fold_step`]).
    fn poll_checkpoint(&mut self, wait: bool) {
        let polled = Instant::now();
        match self.checkpointer.finished(wait) {
            None => return,
            Some(Ok(())) => {
                self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                self.folding = self.overlay.begin_fold();
            }
            Some(Err(failure)) => self.failures.poison(failure.during("checkpoint failed")),
        }
        self.last_checkpoint_span = Some((polled, Instant::now()));
    }

    /// Folds up to `max` changes of the overlay into redb, round after
    /// round: what the batches added during a round is the next one, so the
    /// fold ends (the overlay empty, batches back to redb) in the step where
    /// the budget covers all that is left ([`super::fold`]).
    fn fold_step(&mut self, max: usize) {
        let Some(mut folding) = self.folding.take() else {
            return;
        };
        let started = Instant::now();
        let mut budget = max;
        loop {
            match self
                .overlay
                .fold_slice(&self.database, &mut folding, budget, self.seq)
            {
                Ok((_, false)) => {
                    self.folding = Some(folding);
                    break;
                }
                Ok((written, true)) => {
                    budget -= written;
                    match self.overlay.next_round(folding) {
                        Some(next) if budget > 0 => folding = next,
                        next => {
                            self.folding = next;
                            break;
                        }
                    }
                }
                Err(failure) => {
                    // redb lacks changes the log has: later batches would
                    // diverge from what a replay rebuilds.
                    self.failures
                        .uncertain(failure.during("folding the overlay into redb failed"));
                    break;
                }
            }
        }
        self.last_checkpoint_span = Some((started, Instant::now()));
    }

    /// Applies a batch, makes it durable and replies to every operation.
    fn apply_batch(&mut self, batch: &mut Vec<WriteOp>) {
        if let Some(error) = self.failures.refusal() {
            for op in batch.drain(..) {
                op.reply(Some(error.clone()));
            }
            return;
        }
        let size = batch.len() as u64;
        let seq = self.seq + 1;
        let started = Instant::now();
        let mut times = BatchTimes::default();
        self.frame.begin(seq);
        let outcome = if self.checkpointer.is_running() || self.folding.is_some() {
            self.overlay_batch(batch, started, &mut times)
        } else {
            let applied = self.apply_ops(seq, batch);
            times.apply = started.elapsed();
            match applied {
                Err(error) => Err(error),
                // Nothing changed (every condition failed): the answers rest
                // on state that is already durable, so no fsync is needed.
                Ok(txn) if self.frame.is_empty() => {
                    drop(txn);
                    Ok(false)
                }
                Ok(txn) => self.make_durable(txn, &mut times).map(|()| true),
            }
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
            Err(error) => Some(error),
        };
        if error.is_none() {
            stages::record(
                batch.iter().map(|op| op.queued_at()),
                started,
                self.last_checkpoint_span,
                &times,
            );
        }
        for op in batch.drain(..) {
            op.reply(error.clone());
        }
    }

    /// Applies operations in one non-durable write transaction, logging
    /// every change into the frame; returns the open transaction for the
    /// caller to make durable. On error the transaction is dropped (nothing
    /// applied) and the caller answers the whole batch with the error.
    fn apply_ops(&mut self, seq: u64, ops: &mut [WriteOp]) -> StoreResult<redb::WriteTransaction> {
        let mut txn = self.database.begin_write().map_err(|e| {
            // redb latched an earlier I/O error, or a full disk.
            self.failures.note(e.cause());
            storage_error("begin write", e)
        })?;
        // Durability comes from the write-ahead log, synced before this
        // transaction commits; see the module docs of [`super`].
        txn.set_durability(Durability::None)
            .map_err(|e| storage_error("begin write", e))?;
        {
            let mut redb_tables = RedbTables::open(&txn)?;
            let mut tables = Tables::new(
                Backing::Redb(&mut redb_tables),
                &mut self.frame,
                self.keyring.as_deref(),
            );
            let applied = ops.iter_mut().try_for_each(|op| op.apply(&mut tables));
            if let Some(cause) = tables.failure_cause() {
                self.failures.note(cause);
            }
            applied?;
        }
        record_seq(&txn, seq)?;
        Ok(txn)
    }

    /// Applies a batch while a checkpoint holds redb's write lock: its
    /// changes go to a layer of their own, read through the overlay and a
    /// redb snapshot; once its frame is synced, the layer joins the overlay
    /// (what readers see). True when something changed.
    fn overlay_batch(
        &mut self,
        batch: &mut [WriteOp],
        started: Instant,
        times: &mut BatchTimes,
    ) -> StoreResult<bool> {
        let mut delta = Layer::default();
        {
            let read = self
                .database
                .begin_read()
                .map_err(|e| storage_error("begin read", e))?;
            let records = read
                .open_table(RECORDS)
                .map_err(|e| storage_error("open", e))?;
            let expiry = read
                .open_table(EXPIRY)
                .map_err(|e| storage_error("open", e))?;
            let shared = self.overlay.snapshot();
            let mut tables = Tables::new(
                Backing::Overlay {
                    delta: &mut delta,
                    shared: &shared,
                    records: &records,
                    expiry: &expiry,
                },
                &mut self.frame,
                self.keyring.as_deref(),
            );
            for op in batch.iter_mut() {
                op.apply(&mut tables)?;
            }
        }
        times.apply = started.elapsed();
        if self.frame.is_empty() {
            return Ok(false);
        }
        self.log_frame()?;
        (times.log_write, times.fsync) = self.wal.last_append_times();
        let publishing = Instant::now();
        // Copies the layer only while a ListPending holds a snapshot.
        self.overlay.publish(delta);
        times.commit = publishing.elapsed();
        Ok(true)
    }

    /// Logs and syncs the batch's frame, then commits the transaction
    /// (without fsync: the log holds it) so that readers see it.
    fn make_durable(
        &mut self,
        txn: redb::WriteTransaction,
        times: &mut BatchTimes,
    ) -> StoreResult<()> {
        if let Err(error) = self.log_frame() {
            drop(txn);
            return Err(error);
        }
        (times.log_write, times.fsync) = self.wal.last_append_times();
        let committing = Instant::now();
        if let Err(error) = txn.commit() {
            // The log has a frame that redb does not: later batches would
            // diverge from what a replay rebuilds.
            return Err(self
                .failures
                .uncertain(Failure::of(&error).during("commit failed")));
        }
        times.commit = committing.elapsed();
        Ok(())
    }

    /// Seals the batch's frame, appends it to the log and syncs it. On an
    /// error nothing of the batch may be applied.
    fn log_frame(&mut self) -> StoreResult<()> {
        let frame = match self.frame.finish() {
            Ok(frame) => frame,
            Err(error) => {
                return Err(StoreError::Unavailable(format!(
                    "nothing was applied: {error}"
                )));
            }
        };
        match self.wal.append(frame) {
            Ok(()) => Ok(()),
            // The frame is not in the log and the batch's changes are
            // dropped: nothing of the batch happened, and nothing else is
            // at risk (no sync failed).
            Err(error) if is_out_of_space(&error) => Err(self.failures.refuse_full(&error)),
            // The frame may have reached the disk partially or wholly.
            Err(error) => Err(self.failures.uncertain(Failure::of(&error))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::blocks::{Blocks, VerifiedFile};
    use crate::store::embedded::checkpoint::{BeforeCheckpoint, CHECKPOINT_INTERVAL};
    use crate::store::embedded::group::Waker;
    use crate::store::embedded::tables::Insert;
    use crate::store::embedded::tests::{NOW, completed};

    /// A writer on a fresh store in `dir`, checkpointing in the background
    /// (each checkpoint after `before`).
    fn writer(dir: &std::path::Path, before: BeforeCheckpoint) -> Writer {
        let (blocks, _) = Blocks::open(&dir.join("db")).expect("blocks");
        let database = Arc::new(
            Database::builder()
                .create_with_backend(VerifiedFile(Arc::clone(&blocks)))
                .expect("create"),
        );
        let txn = database.begin_write().expect("begin");
        drop(RedbTables::open(&txn).expect("tables"));
        record_seq(&txn, 0).expect("seq");
        txn.commit().expect("commit");
        let wal = wal::Wal::open(dir).expect("wal");
        let checkpointer = Checkpointer::start(
            Arc::clone(&database),
            Arc::clone(&blocks),
            Waker::<WriteOp>::detached(),
            before,
        )
        .expect("checkpointer");
        let options = EmbeddedOptions::new(dir);
        let stats = Arc::new(WriterStats::default());
        let overlay = Overlay::default();
        let failures = Failures::new(dir.to_path_buf(), blocks);
        Writer::new(
            database,
            wal,
            0,
            &options,
            overlay,
            stats,
            checkpointer,
            failures,
        )
    }

    fn insert(key: &str) -> WriteOp {
        let record = completed(key, b"x", NOW + 1_000_000);
        queue(Insert {
            record,
            now_ms: NOW,
        })
        .0
    }

    /// The writer's part of a background checkpoint (taking its outcome,
    /// folding the overlay) is what `checkpoint_wait` measures: timed in
    /// normal running, not only at close.
    #[test]
    fn background_checkpoints_time_the_writers_part() {
        let dir = tempfile::tempdir().expect("dir");
        let mut writer = writer(dir.path(), None);
        writer.write(&mut vec![insert("a")]);
        std::thread::sleep(CHECKPOINT_INTERVAL);
        writer.write(&mut vec![insert("b")]);
        assert!(writer.checkpointer.is_running(), "a checkpoint was due");
        writer.write(&mut vec![insert("c")]);
        for _ in 0..500 {
            if !writer.checkpointer.is_running() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            writer.write(&mut Vec::new());
        }
        assert!(!writer.checkpointer.is_running(), "the checkpoint ended");
        assert!(writer.last_checkpoint_span.is_some());
        for _ in 0..10 {
            writer.write(&mut Vec::new());
        }
        assert!(writer.folding.is_none(), "the fold ended");
        assert!(writer.overlay.snapshot().is_empty(), "folded");
    }

    /// Under a steady stream of batches (no empty one to fold the rest at
    /// once), the fold in slices still ends: the writer goes back to redb
    /// and the next checkpoint can begin. (A fold that left each step's
    /// last batch in the overlay never ended, and the log grew without
    /// bound.)
    #[test]
    fn the_fold_ends_while_batches_keep_coming() {
        let dir = tempfile::tempdir().expect("dir");
        // A checkpoint long enough for the overlay to outgrow a slice.
        let slow: BeforeCheckpoint = Some(Arc::new(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }));
        let mut writer = writer(dir.path(), slow);
        writer.write(&mut vec![insert("a")]);
        std::thread::sleep(CHECKPOINT_INTERVAL);
        writer.write(&mut vec![insert("b")]);
        assert!(writer.checkpointer.is_running(), "a checkpoint was due");
        let mut n = 0;
        let mut batch = |size: usize| {
            (0..size)
                .map(|_| {
                    n += 1;
                    insert(&format!("k{n}"))
                })
                .collect::<Vec<_>>()
        };
        for _ in 0..4 {
            writer.write(&mut batch(200));
        }
        for _ in 0..500 {
            if !writer.checkpointer.is_running() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            writer.write(&mut batch(2));
        }
        assert!(!writer.checkpointer.is_running(), "the checkpoint ended");
        assert!(
            writer.overlay.snapshot().records.len() > FOLD_SLICE,
            "more than a slice to fold"
        );
        for _ in 0..20 {
            writer.write(&mut batch(2));
        }
        assert!(writer.folding.is_none(), "the fold ended");
        assert!(writer.overlay.snapshot().is_empty(), "folded");
        assert_eq!(writer.stats.checkpoints.load(Ordering::Relaxed), 1);
    }
}
