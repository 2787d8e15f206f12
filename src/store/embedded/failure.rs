//! What a storage failure of the write path means, and what the writer does
//! and says about it: the one place that classifies errors (by kind, never
//! by their text) and words the messages operators act on (the `full-disk`
//! fault scenario reads them).
//!
//! The policy is the store's (see "Checkpoints beside the writer" in
//! [`super`]): after a storage error in the write path the writer refuses
//! writes until a restart ([`Failures::poison`]), and the `idemd` binary
//! exits saying whether to free space or to check the disk
//! ([`exit_on_storage_failure`]); a log frame that did not fit on a full
//! disk is refused and the writer goes on ([`Failures::refuse_full`]).

use std::fmt::Display;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::blocks::Blocks;
use super::wal::AppendError;
use crate::store::{StoreError, StoreResult};

/// The error of a storage call the caller may retry: `context` names the
/// call. Shared by the store and the embedded audit log (which prefixes its
/// own name to `context`).
pub(crate) fn storage_error(context: &str, error: impl Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

/// What a storage failure says about the disk: decides whether the writer
/// outlives it and what the operator is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// The file system or the owner's quota has no room left.
    Full,
    /// redb's latched error: some earlier I/O error of this process, which
    /// redb no longer describes (see [`Failures::disk_was_full`]).
    Latched,
    /// Anything else (EIO, a broken file system, a stopped thread).
    Other,
}

/// Classifies an error by its kind.
pub(super) trait Classify {
    /// What the error says about the disk.
    fn cause(&self) -> Cause;
}

impl Classify for io::Error {
    fn cause(&self) -> Cause {
        match self.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Cause::Full,
            _ => Cause::Other,
        }
    }
}

impl Classify for redb::StorageError {
    fn cause(&self) -> Cause {
        match self {
            redb::StorageError::Io(error) => error.cause(),
            redb::StorageError::PreviousIo => Cause::Latched,
            _ => Cause::Other,
        }
    }
}

impl Classify for redb::TransactionError {
    fn cause(&self) -> Cause {
        match self {
            redb::TransactionError::Storage(error) => error.cause(),
            _ => Cause::Other,
        }
    }
}

impl Classify for redb::CommitError {
    fn cause(&self) -> Cause {
        match self {
            redb::CommitError::Storage(error) => error.cause(),
            _ => Cause::Other,
        }
    }
}

impl Classify for redb::TableError {
    fn cause(&self) -> Cause {
        match self {
            redb::TableError::Storage(error) => error.cause(),
            _ => Cause::Other,
        }
    }
}

impl Classify for AppendError {
    fn cause(&self) -> Cause {
        match self {
            AppendError::NotWritten(error) | AppendError::NotDurable(error) => error.cause(),
        }
    }
}

/// Whether the writer outlives a failed log append: the frame was not
/// written because the file system (or the owner's quota) is full. Freeing
/// space makes the same append succeed, and no sync failed; after a failed
/// sync the frame may or may not be durable, so that is never outlived.
pub(super) fn is_out_of_space(error: &AppendError) -> bool {
    matches!(error, AppendError::NotWritten(io) if io.cause() == Cause::Full)
}

/// A failed storage step of the writer or the checkpoint thread: the text
/// operators read, with the cause the writer decides on.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// The error's text, as logged and as callers are told.
    pub(super) reason: String,
    /// What it says about the disk.
    pub(super) cause: Cause,
}

impl Failure {
    /// The failure of a step that ended in `error`.
    pub(super) fn of(error: &(impl Classify + Display)) -> Self {
        Self {
            reason: error.to_string(),
            cause: error.cause(),
        }
    }

    /// The failure of the storage call `context`, worded as
    /// [`storage_error`] words it for callers.
    pub(super) fn storage(context: &str, error: &(impl Classify + Display)) -> Self {
        Self {
            reason: storage_error(context, error).to_string(),
            cause: error.cause(),
        }
    }

    /// A failure whose text is `reason` and which says nothing about the
    /// disk (e.g. a thread that stopped).
    pub(super) fn other(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            cause: Cause::Other,
        }
    }

    /// The same failure, its text prefixed with what failed.
    pub(super) fn during(self, what: &str) -> Self {
        Self {
            reason: format!("{what}: {}", self.reason),
            cause: self.cause,
        }
    }
}

/// Shortest interval between two reports of a full disk.
const OUT_OF_SPACE_REPORT: Duration = Duration::from_secs(10);

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

/// The writer's failure state: whether it still accepts writes, and what
/// it has seen of a full disk.
#[derive(Debug)]
pub(super) struct Failures {
    /// Set after a storage error in the write path: every later batch is
    /// refused with it (see the module docs).
    poisoned: Option<String>,
    /// Batches refused for want of space since the last report, and when
    /// that report was logged: a full disk is reported at most every
    /// [`OUT_OF_SPACE_REPORT`], not per batch (the log may share the disk,
    /// and appends alternate between failing and fitting in the last page).
    out_of_space: (u64, Option<Instant>),
    /// Some write of this process failed for want of space: redb latches
    /// its first I/O error and later reports only
    /// [`redb::StorageError::PreviousIo`], so this is what tells a full disk
    /// from a broken one then.
    disk_was_full: bool,
    /// The data directory, named in what operators are told to free.
    data_dir: PathBuf,
    /// The file's checksums: a failure caused by damage they found is
    /// answered as damage, and does not end the process (its health turns
    /// NOT_SERVING and its metrics say why; a restart would refuse the file
    /// anyway).
    blocks: Arc<Blocks>,
}

impl Failures {
    /// No failure yet, for the store in `data_dir`.
    pub(super) fn new(data_dir: PathBuf, blocks: Arc<Blocks>) -> Self {
        Self {
            poisoned: None,
            out_of_space: (0, None),
            disk_was_full: false,
            data_dir,
            blocks,
        }
    }

    /// Whether writes are still accepted.
    pub(super) fn is_healthy(&self) -> bool {
        self.poisoned.is_none()
    }

    /// The answer to every batch once poisoned.
    pub(super) fn refusal(&self) -> Option<StoreError> {
        if let Some(report) = self.blocks.damage() {
            return Some(StoreError::Corrupt(report.to_string()));
        }
        self.poisoned.as_ref().map(|reason| {
            StoreError::Unavailable(format!(
                "the embedded store stopped accepting writes after a storage error ({reason}); restart idemd"
            ))
        })
    }

    /// Remembers what a failed batch said about the disk.
    pub(super) fn note(&mut self, cause: Cause) {
        self.disk_was_full |= cause == Cause::Full;
    }

    /// Refuses a batch whose log frame did not fit on the disk (nothing of
    /// it applied); the writer goes on, so writes resume by themselves once
    /// space is freed.
    pub(super) fn refuse_full(&mut self, error: &AppendError) -> StoreError {
        self.note(Cause::Full);
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
        StoreError::Unavailable(format!(
            "the disk holding {} is full, nothing was applied; retry once space is freed: {error}",
            self.data_dir.display()
        ))
    }

    /// Poisons the writer over a write whose outcome is unknown (the log
    /// and redb may disagree): counted, and answered as uncertain.
    pub(super) fn uncertain(&mut self, failure: Failure) -> StoreError {
        metrics::counter!(crate::metrics::STORE_UNCERTAIN, "backend" => "embedded").increment(1);
        let reason = failure.reason.clone();
        self.poison(failure);
        StoreError::Uncertain(reason)
    }

    /// Refuses every later write (see the module docs); a process that can
    /// be restarted exits, saying what to do.
    pub(super) fn poison(&mut self, failure: Failure) {
        let Failure { reason, cause } = failure;
        if let Some(report) = self.blocks.damage() {
            // Already logged, counted and recorded where it was found.
            self.poisoned = Some(report.to_string());
            return;
        }
        self.note(cause);
        tracing::error!(
            error = %reason,
            data_dir = %self.data_dir.display(),
            "embedded store: write path failed; refusing writes until restart (acknowledged writes are safe in the write-ahead log)"
        );
        if let Some(exit) = EXIT_ON_POISON.get() {
            // redb latches its I/O errors (every later read and write fails
            // until the file is reopened) and a failed sync leaves the log
            // untrustworthy: only a restart's replay is a way back, so a
            // process that can be restarted says what to do and goes. After
            // an out-of-space failure, redb's latched error was the full
            // disk.
            let full = cause == Cause::Full || (cause == Cause::Latched && self.disk_was_full);
            exit(&format!(
                "the embedded store in {} cannot write ({reason}); every acknowledged write is in its write-ahead log. {} then start idemd again: it replays the log on start",
                self.data_dir.display(),
                if full {
                    "Free space on that file system (it is full),"
                } else {
                    "Check the disk (kernel log, file system),"
                }
            ));
        }
        self.poisoned = Some(reason);
    }
}

/// Runs `read` (redb opening or checking the file at start-up) and turns a
/// panic into the error of a damaged file. redb panics on some damaged files
/// (e.g. "Malformed allocator state") instead of returning an error; without
/// this idemd would die with a backtrace instead of a message an operator
/// can act on. Meanwhile the panic hook stays quiet for this thread only
/// (the panic is logged instead); panics of other threads are reported as
/// before.
pub(super) fn without_panics<T>(path: &Path, read: impl FnOnce() -> T) -> StoreResult<T> {
    type Hook = dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync;
    // One swap at a time: two opens interleaving their swaps would restore
    // each other's quiet hook.
    static SWAP: Mutex<()> = Mutex::new(());
    let _swap = SWAP.lock().unwrap_or_else(|e| e.into_inner());
    let previous: Arc<Hook> = Arc::from(std::panic::take_hook());
    let opener = std::thread::current().id();
    let others = Arc::clone(&previous);
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != opener {
            others(info);
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
    result.map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unreadable".to_string());
        tracing::error!(path = %path.display(), panic = %what, "redb panicked reading the database file");
        damaged_because(path, &what)
    })
}

/// The error of a damaged database file: names it and says what to do.
pub(super) fn damaged_because(path: &Path, what: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "the database file {} is damaged ({what}); idemd will not serve from it: restore the data directory from a backup",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_by_its_kind() {
        assert_eq!(
            io::Error::from(io::ErrorKind::StorageFull).cause(),
            Cause::Full
        );
        assert_eq!(
            io::Error::from(io::ErrorKind::QuotaExceeded).cause(),
            Cause::Full
        );
        // ENOSPC from the OS, as redb and the log see it.
        assert_eq!(io::Error::from_raw_os_error(28).cause(), Cause::Full);
        assert_eq!(io::Error::from_raw_os_error(5).cause(), Cause::Other);
        let latched = redb::CommitError::Storage(redb::StorageError::PreviousIo);
        assert_eq!(latched.cause(), Cause::Latched);
        let sync = AppendError::NotDurable(io::Error::from(io::ErrorKind::StorageFull));
        assert_eq!(sync.cause(), Cause::Full, "said, though never outlived");
    }

    #[test]
    fn only_a_frame_not_written_for_want_of_space_is_outlived() {
        let full = AppendError::NotWritten(io::Error::from(io::ErrorKind::StorageFull));
        assert!(is_out_of_space(&full));
        let quota = AppendError::NotWritten(io::Error::from(io::ErrorKind::QuotaExceeded));
        assert!(is_out_of_space(&quota));
        let sync = AppendError::NotDurable(io::Error::from(io::ErrorKind::StorageFull));
        assert!(!is_out_of_space(&sync), "a failed sync is never outlived");
        let eio = AppendError::NotWritten(io::Error::other("EIO"));
        assert!(!is_out_of_space(&eio));
    }
}
