//! The last instant the store was open to serve, so that the time nobody
//! could reach it does not count against the leases it held.
//!
//! # Why
//!
//! A holder cannot Complete or ExtendLease while idemd is down. Before this,
//! every IN_PROGRESS lease kept its absolute deadline across a restart: any
//! lease shorter than the stop expired, so its key became pending, or, under
//! `on_expired_lease = takeover`, was granted to a retry while the first
//! holder was still running its side effect: a double execution caused by
//! idemd being unavailable, not by the holder (issue 50). The rule
//! (docs/design.md, "Leases across a stop of the embedded store"): a lease
//! that was live when the store stopped serving gets the stop's length
//! added when it serves again.
//!
//! # How
//!
//! While `idemd serve` has the store open, a thread writes the wall clock
//! into [`ALIVE_FILE`] every [`BEAT`]. It does not sync: after a `kill -9`
//! the page cache holds the last beat; after a power loss (or on a disk
//! image) the file may hold an older one, so the credit is larger than the
//! stop, never smaller. A lease is never shortened by this, only credited
//! up to [`BEAT`] (or the page cache's write-back delay) too much.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::Database;

use super::failure::storage_error;
use super::options::EmbeddedOptions;
use super::wal::crc32c;
use crate::store::StoreError;

/// The heartbeat's file in the data directory.
pub const ALIVE_FILE: &str = "idemd.alive";

/// How often the heartbeat is written.
pub(super) const BEAT: Duration = Duration::from_secs(1);

/// The heartbeat thread; stopped (and the last beat written) on drop.
pub(super) struct Heartbeat {
    /// Set to stop; the condvar wakes the thread out of its pause.
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Joined on drop, after which the file holds the instant of the drop.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// The last beat written in `dir`, if a heartbeat ever ran there (and
    /// the file is whole).
    pub(super) fn last(dir: &Path) -> Option<i64> {
        let bytes = std::fs::read(dir.join(ALIVE_FILE)).ok()?;
        let (instant, crc) = (bytes.get(0..8)?, bytes.get(8..12)?);
        (crc32c(instant).to_le_bytes() == crc)
            .then(|| i64::from_le_bytes(instant.try_into().unwrap_or_default()))
    }

    /// Starts beating in `dir` (the first beat is written before this
    /// returns).
    pub(super) fn start(dir: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(ALIVE_FILE))?;
        beat(&file)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("idemd-store-alive".to_string())
            .spawn(move || {
                let (stopped, wake) = &*stopping;
                let mut guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
                while !*guard {
                    guard = wake
                        .wait_timeout(guard, BEAT)
                        .map(|(guard, _)| guard)
                        .unwrap_or_else(|e| e.into_inner().0);
                    if let Err(error) = beat(&file) {
                        tracing::warn!(%error, "embedded store: cannot write the heartbeat");
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// Credits the leases live at the last heartbeat with the time since
/// , then starts beating.
pub(super) fn credit_and_beat(
    options: &EmbeddedOptions,
    database: &Database,
) -> Result<Heartbeat, StoreError> {
    if let Some(last) = Heartbeat::last(&options.data_dir) {
        let now = now_ms();
        let credited =
            super::recovery::credit_leases(database, options.keyring.as_deref(), last, now)?;
        if credited > 0 {
            tracing::info!(
                leases = credited,
                seconds = (now - last) as f64 / 1000.0,
                "embedded store: leases live when it stopped serving get the time it was down"
            );
        }
    }
    Heartbeat::start(&options.data_dir).map_err(|e| storage_error("cannot write the heartbeat", e))
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}

/// The wall clock in ms since the epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Writes the current instant and its CRC (one write of 12 bytes: whole or
/// torn, and a torn one fails its CRC).
fn beat(file: &std::fs::File) -> io::Result<()> {
    let instant = now_ms().to_le_bytes();
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&instant);
    bytes[8..].copy_from_slice(&crc32c(&instant).to_le_bytes());
    file.write_all_at(&bytes, 0)
}
