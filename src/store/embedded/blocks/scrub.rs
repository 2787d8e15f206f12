//! The scrub: a background pass over every block of the database file at
//! a bounded rate, so damage in a block no request reads is found (and the
//! store stops serving) within a stated time instead of when a request or
//! a backup first needs it.
//!
//! A pass starts when the store opens (a restart is when damage from the
//! time it was down would otherwise wait longest) and then every
//! [`ScrubOptions::interval`]. Damage in an unread block is found at most
//! `interval + file size / rate` after it happened; a block that is read is
//! checked on that read (see [`super`]).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::layout::{BLOCK, lock};
use super::sums::Blocks;

/// Default scrub rate: 32 MiB/s reads a 6.5 GB store (10^7 records) in
/// about 200 s, a small share of a disk's bandwidth.
pub const DEFAULT_SCRUB_RATE: u64 = 32 * 1024 * 1024;

/// Default pause between the end of a pass and the next one.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(3600);

/// Blocks read per step: large enough for sequential reads, small enough
/// that pacing is smooth.
const STEP_BLOCKS: usize = 64;

/// How the scrub paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubOptions {
    /// Bytes read per second at most; 0 turns the scrub off.
    pub rate: u64,
    /// Pause between passes.
    pub interval: Duration,
}

impl Default for ScrubOptions {
    fn default() -> Self {
        Self {
            rate: DEFAULT_SCRUB_RATE,
            interval: DEFAULT_SCRUB_INTERVAL,
        }
    }
}

/// The scrub thread; stopped (and joined) on drop.
pub(crate) struct Scrubber {
    /// Set to stop; the condvar wakes the thread out of its pauses.
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Joined on drop, so the file is not read after the store closed it.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber").finish_non_exhaustive()
    }
}

impl Scrubber {
    /// Starts scrubbing `blocks` (not at all when `options.rate` is 0).
    pub(crate) fn start(blocks: Arc<Blocks>, options: ScrubOptions) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = if options.rate == 0 {
            None
        } else {
            let stopping = Arc::clone(&stop);
            Some(
                std::thread::Builder::new()
                    .name("idemd-store-scrub".to_string())
                    .spawn(move || scrub(&blocks, options, &stopping))?,
            )
        };
        Ok(Self { stop, thread })
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *lock(stopped) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Passes until stopped or damage is found.
fn scrub(blocks: &Blocks, options: ScrubOptions, stop: &(Mutex<bool>, Condvar)) {
    let mut buffer = vec![0u8; STEP_BLOCKS * BLOCK];
    loop {
        let started = Instant::now();
        let mut read = 0u64;
        let mut stale = 0u64;
        let mut whole = true;
        let mut block = 0u64;
        while block < blocks.block_count() {
            match blocks.scrub(block, &mut buffer) {
                Ok(step) => {
                    read += step.bytes as u64;
                    stale += step.stale;
                    metrics::counter!(crate::metrics::EMBEDDED_SCRUB_BYTES)
                        .increment(step.bytes as u64);
                }
                Err(error) => {
                    if blocks.damage().is_none() {
                        tracing::warn!(%error, block, "embedded store: the scrub cannot read the database file; it tries again next pass");
                    }
                    whole = false;
                    break;
                }
            }
            block += STEP_BLOCKS as u64;
            // Paced: after `read` bytes, not before `read / rate` seconds.
            let due = Duration::from_secs_f64(read as f64 / options.rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed())
                && wait_or_stop(stop, wait)
            {
                return;
            }
            if is_stopped(stop) {
                return;
            }
        }
        if whole && blocks.is_unsettled() {
            if stale == 0 {
                if let Err(error) = blocks.settle() {
                    tracing::warn!(%error, "embedded store: cannot record that the checksums are settled; the next pass tries again");
                }
            } else {
                // See `super`, "When the sums can be trusted": blocks
                // written after the last sync before an unclean stop, which
                // redb writes again before it reads them.
                tracing::info!(
                    blocks = stale,
                    "embedded store: the scrub found blocks outside the last durable commit whose checksums predate an unclean stop; not damage (redb does not read them before writing them again); checked again next pass"
                );
            }
        }
        if blocks.damage().is_some() {
            // Nothing more to find: the store serves no more from this file.
            let _ = wait_or_stop(stop, Duration::MAX);
            return;
        }
        metrics::counter!(crate::metrics::EMBEDDED_SCRUB_PASSES).increment(1);
        metrics::gauge!(crate::metrics::EMBEDDED_SCRUB_LAST_PASS).set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        tracing::debug!(
            mib = read >> 20,
            seconds = started.elapsed().as_secs_f64(),
            "embedded store: scrub pass done"
        );
        if wait_or_stop(stop, options.interval) {
            return;
        }
    }
}

fn is_stopped(stop: &(Mutex<bool>, Condvar)) -> bool {
    *lock(&stop.0)
}

/// Waits `duration` unless stopped first: whether it was stopped.
fn wait_or_stop(stop: &(Mutex<bool>, Condvar), duration: Duration) -> bool {
    let (stopped, wake) = stop;
    let deadline = Instant::now().checked_add(duration);
    let mut guard = lock(stopped);
    while !*guard {
        let left = match deadline {
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => left,
                _ => return false,
            },
            None => Duration::from_secs(3600),
        };
        guard = wake
            .wait_timeout(guard, left)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    true
}
