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

use redb::{Database, Durability, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use super::overlay::Layer;
use super::stages::{self, BatchTimes};
use super::tables::{Backing, EXPIRY, META, META_WAL_SEQ, Operation, RECORDS, Tables, open_tables};
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
    /// When the caller queued it (the stage timings start there).
    fn queued_at(&self) -> Instant;
    /// Whether this is the checkpoint thread's wake-up call (see
    /// [`Checkpointer`]) rather than a write.
    fn is_wakeup(&self) -> bool {
        false
    }
}

/// Wakes the writer when a checkpoint ends, so that it folds the overlay
/// into redb even when no write follows.
struct Wakeup;

impl Queued for Wakeup {
    fn apply(&mut self, _: &mut Tables<'_, '_>) -> StoreResult<()> {
        Ok(())
    }

    fn reply(self: Box<Self>, _: Option<StoreError>) {}

    fn queued_at(&self) -> Instant {
        Instant::now()
    }

    fn is_wakeup(&self) -> bool {
        true
    }
}

/// The checkpoint thread: runs the durable redb commits, one at a time,
/// while the writer goes on logging and acknowledging into the overlay
/// (see [`super::overlay`]).
pub(super) struct Checkpointer {
    /// Asks for a checkpoint; dropped to stop the thread.
    requests: Option<std::sync::mpsc::Sender<()>>,
    /// Its outcome (the error's text), one per request.
    done: std::sync::mpsc::Receiver<Result<(), String>>,
    /// Joined on drop: the thread holds the database, whose file lock a
    /// reopen after `close` needs.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}

impl Checkpointer {
    /// Starts the thread; it wakes the writer through `waker` after each
    /// checkpoint (a weak sender, so that it does not keep the queue open
    /// when the store closes).
    pub(super) fn start(
        database: Arc<Database>,
        waker: mpsc::WeakSender<WriteOp>,
    ) -> std::io::Result<Self> {
        let (requests, requested) = std::sync::mpsc::channel::<()>();
        let (finished, done) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("idemd-store-checkpoint".to_string())
            .spawn(move || {
                while requested.recv().is_ok() {
                    #[cfg(test)]
                    let gate = CHECKPOINT_GATE.lock().unwrap_or_else(|e| e.into_inner());
                    #[cfg(test)]
                    drop(gate);
                    let result = database
                        .begin_write()
                        .map_err(|e| e.to_string())
                        // An empty transaction with Durability::Immediate
                        // (the default) flushes every earlier non-durable
                        // commit.
                        .and_then(|txn| txn.commit().map_err(|e| e.to_string()));
                    if finished.send(result).is_err() {
                        return;
                    }
                    if let Some(writer) = waker.upgrade() {
                        // A full queue wakes the writer anyway.
                        drop(writer.try_send(Box::new(Wakeup)));
                    }
                }
            })?;
        Ok(Self {
            requests: Some(requests),
            done,
            thread: Some(thread),
        })
    }
}

/// Unit tests hold it to keep a checkpoint from beginning (the checkpoint
/// thread takes it first), so that writes meet a running checkpoint.
#[cfg(test)]
pub(super) static CHECKPOINT_GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Where the checkpoints are.
#[derive(Debug, Clone, Copy)]
pub(super) enum CheckpointState {
    /// None running: batches go straight into redb.
    Idle,
    /// One running since then: batches go to the overlay.
    Running(Instant),
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
    /// When the last checkpoint started and ended: the writes queued
    /// meanwhile waited for it ([`stages`]).
    pub(super) last_checkpoint_span: Option<(Instant, Instant)>,
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
    /// The changes acknowledged since the running checkpoint began, until
    /// folded into redb; shared with readers ([`super::overlay`]).
    pub(super) overlay: Arc<std::sync::RwLock<Arc<Layer>>>,
    /// The checkpoint thread.
    pub(super) checkpointer: Checkpointer,
    /// Whether a checkpoint runs.
    pub(super) checkpoint_state: CheckpointState,
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
            batch.retain(|op| !op.is_wakeup());
            self.poll_checkpoint(false);
            if !batch.is_empty() {
                self.apply_batch(&mut batch);
            }
            if self.poisoned.is_none()
                && matches!(self.checkpoint_state, CheckpointState::Idle)
                && (self.wal.pending_bytes() >= CHECKPOINT_BYTES
                    || (self.wal.pending_bytes() > 0
                        && self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL))
            {
                self.start_checkpoint();
            }
        }
        // Closing: wait for a running checkpoint, then leave a durable redb
        // file and an empty log behind, so that the next open has nothing
        // to replay.
        self.poll_checkpoint(true);
        if self.poisoned.is_none() && self.wal.pending_bytes() > 0 {
            self.checkpoint();
        }
    }

    /// Starts a checkpoint on the checkpoint thread. Every frame of the
    /// current log segment is in redb (no checkpoint runs, so batches went
    /// there): the checkpoint covers them all, and the writer goes on in
    /// the other segment, whose frames the previous checkpoint covered.
    fn start_checkpoint(&mut self) {
        let sent = self
            .checkpointer
            .requests
            .as_ref()
            .is_some_and(|requests| requests.send(()).is_ok());
        if !sent {
            self.poison("the checkpoint thread stopped".to_string());
            return;
        }
        self.wal.switch();
        self.checkpoint_state = CheckpointState::Running(Instant::now());
        self.stats
            .checkpoints_started
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the outcome of a running checkpoint (waiting for it when
    /// `wait`); once it is durable, folds the overlay into redb.
    fn poll_checkpoint(&mut self, wait: bool) {
        let CheckpointState::Running(started) = self.checkpoint_state else {
            return;
        };
        let outcome = if wait {
            self.checkpointer
                .done
                .recv()
                .map_err(|_| "the checkpoint thread stopped".to_string())
        } else {
            match self.checkpointer.done.try_recv() {
                Ok(outcome) => Ok(outcome),
                Err(std::sync::mpsc::TryRecvError::Empty) => return,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    Err("the checkpoint thread stopped".to_string())
                }
            }
        };
        self.checkpoint_state = CheckpointState::Idle;
        match outcome.and_then(|result| result) {
            Ok(()) => {
                self.last_checkpoint = Instant::now();
                metrics::histogram!(crate::metrics::EMBEDDED_CHECKPOINT, "backend" => "embedded")
                    .record((self.last_checkpoint - started).as_secs_f64());
                self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.fold_overlay() {
                    // redb lacks changes the log has: later batches would
                    // diverge from what a replay rebuilds.
                    self.uncertain(format!("folding the overlay into redb failed: {error}"));
                }
            }
            Err(error) => self.poison(format!("checkpoint failed: {error}")),
        }
    }

    /// Writes the overlay's changes into redb (one non-durable commit, as a
    /// batch's), then empties it: in that order, so that a reader that no
    /// longer finds a change in the overlay finds it in redb.
    fn fold_overlay(&mut self) -> StoreResult<()> {
        let layer = Arc::clone(&*self.overlay.read().unwrap_or_else(|e| e.into_inner()));
        if layer.is_empty() {
            return Ok(());
        }
        let mut txn = self
            .database
            .begin_write()
            .map_err(|e| storage_error("begin write", e))?;
        txn.set_durability(Durability::None)
            .map_err(|e| storage_error("begin write", e))?;
        {
            let (mut records, mut expiry, mut pending) = open_tables(&txn)?;
            let failed = |e| storage_error("write", e);
            for (key, value) in &layer.records {
                match value {
                    Some(value) => drop(
                        records
                            .insert(key.as_slice(), value.as_slice())
                            .map_err(failed)?,
                    ),
                    None => drop(records.remove(key.as_slice()).map_err(failed)?),
                }
            }
            for (index, changes) in [(&mut expiry, &layer.expiry), (&mut pending, &layer.pending)] {
                for (key, value) in changes {
                    match value {
                        Some(_) => drop(index.insert(key.as_slice(), ()).map_err(failed)?),
                        None => drop(index.remove(key.as_slice()).map_err(failed)?),
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| storage_error("open", e))?;
            meta.insert(META_WAL_SEQ, self.seq)
                .map_err(|e| storage_error("write", e))?;
        }
        txn.commit().map_err(|e| storage_error("commit", e))?;
        *self.overlay.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Layer::default());
        Ok(())
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
        let started = Instant::now();
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
                self.last_checkpoint_span = Some((started, self.last_checkpoint));
                metrics::histogram!(crate::metrics::EMBEDDED_CHECKPOINT, "backend" => "embedded")
                    .record((self.last_checkpoint - started).as_secs_f64());
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
        let started = Instant::now();
        let mut times = BatchTimes::default();
        self.frame.begin(seq);
        let outcome = if matches!(self.checkpoint_state, CheckpointState::Running(_)) {
            self.overlay_batch(batch, started, &mut times)
        } else {
            let applied = apply_ops(
                &self.database,
                self.keyring.as_deref(),
                &mut self.frame,
                seq,
                batch,
            );
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
            Err(error) => {
                let text = error.to_string();
                self.disk_was_full |=
                    text.contains("No space left") || text.contains("quota exceeded");
                Some(error)
            }
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
            let shared = Arc::clone(&*self.overlay.read().unwrap_or_else(|e| e.into_inner()));
            let mut tables = Tables {
                backing: Backing::Overlay {
                    delta: &mut delta,
                    shared: &shared,
                    records: &records,
                    expiry: &expiry,
                },
                frame: &mut self.frame,
                keyring: self.keyring.as_deref(),
            };
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
        {
            let mut overlay = self.overlay.write().unwrap_or_else(|e| e.into_inner());
            // Copies the layer only while a ListPending holds a snapshot.
            Arc::make_mut(&mut overlay).absorb(delta);
        }
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
            return Err(self.uncertain(format!("commit failed: {error}")));
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
            Ok(()) => {}
            // The frame is not in the log and the batch's changes are
            // dropped: nothing of the batch happened, and nothing else is
            // at risk (no sync failed). Refuse the batch and keep going, so
            // writes resume by themselves once space is freed.
            Err(error) if error.is_out_of_space() => {
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
                return Err(self.uncertain(error.to_string()));
            }
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
            backing: Backing::Redb {
                records: &mut records,
                expiry: &mut expiry,
                pending: &mut pending,
            },
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
