//! A bounded cache of completed records.
//!
//! A completed record never changes until it expires, so a replica may keep
//! it in memory without any coordination: replays of hot keys skip the
//! store. Entries are checked against their own expiry on every hit and the
//! cache is bounded by the bytes of the responses it holds.

use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::store::{Record, RecordKey, RecordState};

/// Fixed per-entry overhead charged against the budget besides the response.
const ENTRY_OVERHEAD_BYTES: usize = 256;

/// LRU of completed records, bounded in bytes.
pub struct CompletedCache {
    /// Entries plus the bytes they are charged.
    inner: Mutex<CacheInner>,
    /// Byte budget; 0 disables the cache.
    budget_bytes: usize,
}

struct CacheInner {
    entries: LruCache<RecordKey, (Arc<Record>, usize)>,
    used_bytes: usize,
}

impl std::fmt::Debug for CompletedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletedCache")
            .field("budget_bytes", &self.budget_bytes)
            .finish_non_exhaustive()
    }
}

impl CompletedCache {
    /// A cache holding at most `budget_bytes` of records.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(CacheInner {
                entries: LruCache::unbounded(),
                used_bytes: 0,
            }),
            budget_bytes,
        }
    }

    /// The cached completed record for `key`, if present and live.
    pub fn get(&self, key: &RecordKey, now_ms: i64) -> Option<Arc<Record>> {
        if self.budget_bytes == 0 {
            return None;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (record, _) = inner.entries.get(key)?;
        if record.is_live(now_ms) {
            return Some(Arc::clone(record));
        }
        if let Some((_, size)) = inner.entries.pop(key) {
            inner.used_bytes -= size;
        }
        None
    }

    /// Caches `record` if it is completed and fits the budget.
    pub fn insert(&self, record: &Record) {
        if record.state != RecordState::Completed {
            return;
        }
        let size = ENTRY_OVERHEAD_BYTES
            + record.id.key.len()
            + record.id.endpoint.len()
            + record.response.as_ref().map_or(0, |r| r.stored_size());
        if size > self.budget_bytes / 8 {
            // One huge response must not flush the whole cache.
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, old)) = inner
            .entries
            .put(record.id.clone(), (Arc::new(record.clone()), size))
        {
            inner.used_bytes -= old;
        }
        inner.used_bytes += size;
        while inner.used_bytes > self.budget_bytes {
            match inner.entries.pop_lru() {
                Some((_, (_, evicted))) => inner.used_bytes -= evicted,
                None => break,
            }
        }
    }
}
