//! Checkpoints: durable redb commits, after which the log segments they
//! cover may be reused. Every checkpoint, the periodic ones and the last
//! one at close, runs on the checkpoint thread, one at a time, while the
//! writer goes on logging and acknowledging into the overlay
//! ([`super::overlay`]). Between checkpoints the same thread writes the
//! database file back every [`WRITE_BACK_INTERVAL`] while it is written, so
//! the next checkpoint's sync has little left to flush (see
//! `blocks::writeback`).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use redb::Database;

use super::blocks::{Blocks, WRITE_BACK_INTERVAL};
use super::failure::Failure;
use super::group::Waker;

/// Log bytes after which the writer checkpoints (durable redb commit, then
/// the log segment is reused). Bounds the log file, the replay time on open
/// (a few hundred ms at most) and the pages redb holds back from reuse
/// until a durable commit (the file would otherwise grow between
/// checkpoints).
pub(super) const CHECKPOINT_BYTES: u64 = 8 * 1024 * 1024;

/// Longest time between checkpoints while writes arrive: bounds replay and
/// held-back pages under a light load. A checkpoint does not stall the
/// writer, but it competes with the log's fsyncs for the disk, so not much
/// more often than this.
pub(super) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Runs on the checkpoint thread before each durable commit. The store
/// passes none; unit tests pass one that blocks, to keep a checkpoint
/// running while writes arrive.
pub(super) type BeforeCheckpoint = Option<Arc<dyn Fn() + Send + Sync>>;

/// The checkpoint thread, and where its checkpoints are.
pub(super) struct Checkpointer {
    /// Asks for a checkpoint; dropped to stop the thread.
    requests: Option<Sender<()>>,
    /// Its outcome, one per request.
    done: Receiver<Result<(), Failure>>,
    /// Joined on drop: the thread holds the database, whose file lock a
    /// reopen after `close` needs.
    thread: Option<std::thread::JoinHandle<()>>,
    /// When the running checkpoint started; `None` while none runs (the
    /// writer's batches then go straight into redb).
    running: Option<Instant>,
    /// When the redb file was last made durable: paces [`Self::is_due`].
    last: Instant,
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
    /// checkpoint, so that the writer folds the overlay into redb even when
    /// no write follows, and writes `blocks` (the database's file) back
    /// between checkpoints.
    pub(super) fn start<T: Send + 'static>(
        database: Arc<Database>,
        blocks: Arc<Blocks>,
        waker: Waker<T>,
        before: BeforeCheckpoint,
    ) -> std::io::Result<Self> {
        let (requests, requested) = std::sync::mpsc::channel::<()>();
        let (finished, done) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("idemd-store-checkpoint".to_string())
            .spawn(move || {
                loop {
                    match requested.recv_timeout(WRITE_BACK_INTERVAL) {
                        Ok(()) => {}
                        Err(RecvTimeoutError::Timeout) => {
                            blocks.write_back();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    if let Some(before) = &before {
                        before();
                    }
                    if finished.send(durable_commit(&database)).is_err() {
                        return;
                    }
                    waker.wake();
                }
            })?;
        Ok(Self {
            requests: Some(requests),
            done,
            thread: Some(thread),
            running: None,
            last: Instant::now(),
        })
    }

    /// Whether a checkpoint runs.
    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Whether a checkpoint is due, with `pending_bytes` of log written
    /// since the last one: none runs, and the log is long or old enough.
    pub(super) fn is_due(&self, pending_bytes: u64) -> bool {
        self.running.is_none()
            && (pending_bytes >= CHECKPOINT_BYTES
                || (pending_bytes > 0 && self.last.elapsed() >= CHECKPOINT_INTERVAL))
    }

    /// Starts a checkpoint of everything redb holds now. The caller makes
    /// sure that none runs, and switches the log to its other segment.
    pub(super) fn begin(&mut self) -> Result<(), Failure> {
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|requests| requests.send(()).is_ok());
        if !sent {
            return Err(Failure::other("the checkpoint thread stopped"));
        }
        self.running = Some(Instant::now());
        Ok(())
    }

    /// The outcome of the running checkpoint once it has one (waiting for
    /// it when `wait`); `None` while none runs or it is not done.
    pub(super) fn finished(&mut self, wait: bool) -> Option<Result<(), Failure>> {
        let started = self.running?;
        let stopped = || Failure::other("the checkpoint thread stopped");
        let outcome = if wait {
            self.done.recv().unwrap_or_else(|_| Err(stopped()))
        } else {
            match self.done.try_recv() {
                Ok(outcome) => outcome,
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => Err(stopped()),
            }
        };
        self.running = None;
        if outcome.is_ok() {
            self.last = Instant::now();
            metrics::histogram!(crate::metrics::EMBEDDED_CHECKPOINT, "backend" => "embedded")
                .record((self.last - started).as_secs_f64());
        }
        Some(outcome)
    }
}

/// Makes every earlier non-durable commit durable: an empty transaction
/// with `Durability::Immediate` (the default) flushes them all.
///
/// Quick repair: the commit records redb's allocator state, so an open
/// after a crash loads it instead of walking every page of the file (which
/// would make a restart as slow as reading the whole file).
fn durable_commit(database: &Database) -> Result<(), Failure> {
    let mut txn = database.begin_write().map_err(|e| Failure::of(&e))?;
    txn.set_quick_repair(true);
    txn.commit().map_err(|e| Failure::of(&e))
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::{Duration, Instant};

    use redb::StorageBackend;

    use super::*;
    use crate::store::embedded::blocks::{BLOCK, VerifiedFile};

    /// A database on a fresh file in `dir`, and the file's blocks.
    fn database(dir: &std::path::Path) -> (Arc<Database>, Arc<Blocks>) {
        let (blocks, _) = Blocks::open(&dir.join("db")).expect("blocks");
        let database = Database::builder()
            .create_with_backend(VerifiedFile(Arc::clone(&blocks)))
            .expect("create");
        (Arc::new(database), blocks)
    }

    #[test]
    fn the_file_is_written_back_between_checkpoints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (database, blocks) = database(dir.path());
        let _checkpointer =
            Checkpointer::start(database, Arc::clone(&blocks), Waker::<()>::detached(), None)
                .expect("checkpointer");
        // A write past redb's end of file, as an evicted page reaches the
        // file between checkpoints; no checkpoint is asked for.
        let file = VerifiedFile(Arc::clone(&blocks));
        let end = file.len().expect("len");
        file.write(end, &[7u8; BLOCK]).expect("write");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !blocks.is_written_back() {
            assert!(
                Instant::now() < deadline,
                "no write-back within 10 s (every {WRITE_BACK_INTERVAL:?} expected)"
            );
            std::thread::sleep(WRITE_BACK_INTERVAL / 5);
        }
    }

    #[test]
    fn a_failed_write_back_fails_the_next_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (database, blocks) = database(dir.path());
        durable_commit(&database).expect("a checkpoint before the failure");
        blocks.fail_write_back(io::ErrorKind::StorageFull);
        let failure = durable_commit(&database).expect_err("a checkpoint after it");
        assert_eq!(
            failure.cause,
            crate::store::embedded::failure::Cause::Full,
            "the failure keeps its kind, so the writer tells a full disk apart: {}",
            failure.reason
        );
    }
}
