//! The time source.
//!
//! Leases and TTLs are decided by comparing stored instants with "now". The
//! engine never calls `SystemTime::now()` directly: it asks a [`Clock`], so
//! tests can move time forward by hours without sleeping.
//!
//! Instants are milliseconds since the Unix epoch (`i64`): the precision of
//! every timestamp idemd stores and returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// The current instant in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Whether this clock follows real time, so that comparing it with a
    /// cluster's clock means something (`engine::skew`). A test's manual
    /// clock answers `false`: it is as far off as the test moves it.
    fn follows_real_time(&self) -> bool {
        true
    }
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
            // A clock set before 1970 is a broken host; treat it as the epoch
            // rather than panicking on the request path.
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to: for tests of leases and TTLs.
#[derive(Debug, Clone)]
pub struct ManualClock {
    /// Shared so that the test and the server see the same instant.
    now_ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock frozen at `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        Self {
            now_ms: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    /// A clock frozen at the current real time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_ms())
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: std::time::Duration) {
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn follows_real_time(&self) -> bool {
        false
    }
}

/// A clock shared between the engine, the store and background tasks.
pub type SharedClock = Arc<dyn Clock>;
