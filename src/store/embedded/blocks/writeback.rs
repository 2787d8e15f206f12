//! Write-back: the database file's dirty pages pushed to the disk a little
//! at a time between checkpoints, instead of all at once by the
//! checkpoint's sync.
//!
//! # Why
//!
//! Every fresh key dirties a random leaf of redb's tree (the keys are
//! hashes), and redb writes the pages its write buffer evicts into the page
//! cache, where they wait for the checkpoint's `fdatasync`. At ~13,000
//! fresh Claims/s that is ~45 MB flushed in one burst per second, and the
//! log's own `fdatasync` (which every acknowledgement waits for) queued
//! behind it: the slowest 0.1% of Claims waited 20-58 ms at 64 in flight
//! (six side-by-side runs with svix/diom, an LSM that writes sequentially,
//! which stayed at 15-28 ms). The checkpoint thread, idle between
//! checkpoints, now syncs the file every [`WRITE_BACK_INTERVAL`] while it
//! is written, so each burst is small: p999 14-26 ms in the same runs, with
//! the same throughput.
//!
//! # Why it is safe
//!
//! A sync of the data file makes no promise redb relies on: the kernel may
//! write any dirty page back at any moment anyway (memory pressure, the
//! 30 s dirty expiry), and redb's commit protocol holds whatever subset of
//! its writes reached the disk. The one hazard is the error: a failed
//! `fdatasync` reports a lost write once, and on some kernels only to the
//! first caller, so the checkpoint's own sync could then succeed over a
//! lost page. A failed write-back is therefore kept and returned by every
//! later sync of the file ([`WriteBack::check`]): the checkpoint fails and
//! the writer stops as after any failed sync (see [`super::super::failure`]).

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the checkpoint thread writes the file back while it is being
/// written. Measured with `idemd-bench peers`-style runs (fresh Claims, 64
/// in flight, server and client pinned to one core each, three runs each):
/// p999 20-58 ms with no write-back, 16-17 ms at 50 ms, 18-20 ms at
/// 100 ms, 15-25 ms at 250 ms. An idle store is never synced (see
/// [`WriteBack::wrote`]).
pub(in crate::store::embedded) const WRITE_BACK_INTERVAL: Duration = Duration::from_millis(50);

/// Whether the file has pages to write back, and the first write-back that
/// failed.
#[derive(Debug, Default)]
pub(super) struct WriteBack {
    /// Written since the last sync: a write-back has something to do (an
    /// `fdatasync` with nothing dirty still flushes the device's cache).
    unsynced: AtomicBool,
    /// The first failed write-back, kind and text: every later sync of the
    /// file fails with it.
    failed: OnceLock<(io::ErrorKind, String)>,
}

impl WriteBack {
    /// Notes a write to the file.
    pub(super) fn wrote(&self) {
        self.unsynced.store(true, Ordering::Release);
    }

    /// Notes a sync of the whole file: nothing is left to write back.
    pub(super) fn synced(&self) {
        self.unsynced.store(false, Ordering::Release);
    }

    /// Whether the file was written since it was last synced.
    #[cfg(test)]
    pub(super) fn is_pending(&self) -> bool {
        self.unsynced.load(Ordering::Acquire)
    }

    /// Runs `sync` if the file was written since the last sync, and keeps
    /// its error for [`Self::check`].
    pub(super) fn run(&self, sync: impl FnOnce() -> io::Result<()>) {
        if !self.unsynced.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Err(error) = sync() {
            tracing::error!(%error, "embedded store: writing the database file back failed");
            let _ = self.failed.set((error.kind(), error.to_string()));
        }
    }

    /// The failed write-back, if one failed: a sync must not report
    /// success after it.
    pub(super) fn check(&self) -> io::Result<()> {
        match self.failed.get() {
            Some((kind, text)) => Err(io::Error::new(
                *kind,
                format!("an earlier write-back of the database file failed: {text}"),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_back_runs_only_after_a_write() {
        let write_back = WriteBack::default();
        let mut syncs = 0;
        write_back.run(|| {
            syncs += 1;
            Ok(())
        });
        assert_eq!(syncs, 0, "nothing written: no sync");
        write_back.wrote();
        write_back.run(|| {
            syncs += 1;
            Ok(())
        });
        write_back.run(|| {
            syncs += 1;
            Ok(())
        });
        assert_eq!(syncs, 1, "one write: one sync");
        write_back.wrote();
        write_back.synced();
        write_back.run(|| {
            syncs += 1;
            Ok(())
        });
        assert_eq!(syncs, 1, "a full sync leaves nothing to write back");
    }

    #[test]
    fn a_failed_write_back_fails_every_later_sync() {
        let write_back = WriteBack::default();
        write_back.check().expect("no write-back failed yet");
        write_back.wrote();
        write_back.run(|| Err(io::Error::from(io::ErrorKind::StorageFull)));
        for _ in 0..2 {
            let error = write_back.check().expect_err("the failure is kept");
            assert_eq!(error.kind(), io::ErrorKind::StorageFull);
            assert!(error.to_string().contains("write-back"), "{error}");
        }
        write_back.wrote();
        write_back.run(|| Ok(()));
        assert!(
            write_back.check().is_err(),
            "a later success does not clear it"
        );
    }
}
