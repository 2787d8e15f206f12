//! Wake-ups for Claims that wait on an in-flight duplicate.
//!
//! A Claim with `wait` registers interest in its key and sleeps; Complete,
//! Fail and Reconcile on this replica wake every waiter of that key at once.
//! Waiting holds no store connection, transaction or lock. Because another
//! replica may finish the record (shared CQL store), waiters also re-read the
//! record on a backoff (50 ms doubling to 1 s), which bounds the cost of a
//! waiter to a handful of reads per wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::store::RecordKey;

/// Registry of keys with waiting Claims.
#[derive(Debug, Default)]
pub struct Waiters {
    /// One `Notify` per key that has at least one registered waiter; removed
    /// when the last waiter goes away so the map does not grow with traffic.
    by_key: Mutex<HashMap<RecordKey, Arc<Notify>>>,
}

/// A registration; dropping it unregisters.
pub struct WaitRegistration<'a> {
    waiters: &'a Waiters,
    key: RecordKey,
    /// The shared wake-up for this key.
    pub notify: Arc<Notify>,
}

impl Waiters {
    /// Registers interest in `key`. Create the `notified()` future from the
    /// returned registration *before* re-reading the record, so that a
    /// wake-up between the read and the wait is not lost.
    pub fn register(&self, key: &RecordKey) -> WaitRegistration<'_> {
        let notify = {
            let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(map.entry(key.clone()).or_default())
        };
        WaitRegistration {
            waiters: self,
            key: key.clone(),
            notify,
        }
    }

    /// Wakes every waiter of `key` (no-op when there are none).
    pub fn wake(&self, key: &RecordKey) {
        let notify = {
            let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
            map.get(key).cloned()
        };
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }
}

impl Drop for WaitRegistration<'_> {
    fn drop(&mut self) {
        let mut map = self
            .waiters
            .by_key
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Two references remain when this is the last waiter: the map's and
        // ours.
        if Arc::strong_count(&self.notify) <= 2 {
            map.remove(&self.key);
        }
    }
}
