//! A bounded cache of completed records.
//!
//! A completed record never changes until it expires, so a replica may keep
//! it in memory without any coordination: replays of hot keys skip the
//! store. Entries are checked against their own expiry on every hit and the
//! cache is bounded by the memory its entries take, estimated from their
//! allocations (see [`charged_bytes`]), not only the response bytes: with
//! small responses the bookkeeping around them is most of the memory, and a
//! budget that ignored it let a 16 MiB cache hold ~50 MiB (docs/benchmarks.md,
//! P5).

use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::store::{Record, RecordKey, RecordState};

/// What the allocator adds to each allocation (size-class rounding and
/// header), on average, for the small allocations an entry is made of.
const ALLOCATION_OVERHEAD_BYTES: usize = 16;

/// The LRU's own node and hash-table slot for one entry: two links, the key
/// and value inline, and about one table slot per entry.
const LRU_NODE_BYTES: usize =
    2 * size_of::<usize>() + size_of::<RecordKey>() + size_of::<(Arc<Record>, usize)>() + 16;

/// Heap bytes of one owned buffer of `len` bytes, or nothing if empty. The
/// cache holds clones, and a clone allocates exactly the length, so lengths
/// measured on the original are the clone's allocations.
fn buffer_bytes(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        len + ALLOCATION_OVERHEAD_BYTES
    }
}

fn record_key_bytes(id: &RecordKey) -> usize {
    buffer_bytes(id.tenant.len()) + buffer_bytes(id.endpoint.len()) + buffer_bytes(id.key.len())
}

/// Memory one cached entry takes: the LRU node (with its copy of the key),
/// the `Arc`'d record and every buffer the record owns.
pub fn charged_bytes(record: &Record) -> usize {
    let response = record.response.as_ref().map_or(0, |response| {
        buffer_bytes(response.headers.len() * size_of::<(String, String)>())
            + response
                .headers
                .iter()
                .map(|(name, value)| buffer_bytes(name.len()) + buffer_bytes(value.len()))
                .sum::<usize>()
            + buffer_bytes(response.body.len())
            + buffer_bytes(response.body_ref.len())
    });
    LRU_NODE_BYTES
        // The key twice: the LRU's copy and the record's own.
        + 2 * record_key_bytes(&record.id)
        + buffer_bytes(2 * size_of::<usize>() + size_of::<Record>())
        + buffer_bytes(record.fingerprint.len())
        + buffer_bytes(record.lease_token.len())
        + buffer_bytes(record.attempt_id.len())
        + buffer_bytes(record.reason.len())
        + response
}

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
        let size = charged_bytes(record);
        if size > self.budget_bytes / 8 {
            // One huge response must not flush the whole cache.
            return;
        }
        let cached = Arc::new(record.clone());
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, old)) = inner.entries.put(cached.id.clone(), (cached, size)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredResponse;

    fn completed(key: &str, body_len: usize) -> Record {
        Record {
            id: RecordKey {
                tenant: "tenant-a".to_string(),
                endpoint: "POST /v1/payments".to_string(),
                key: key.to_string(),
            },
            state: RecordState::Completed,
            fingerprint: vec![7; 32],
            attempt: 1,
            lease_token: "0123456789abcdef0123456789abcdef".to_string(),
            attempt_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: 0,
            lease_expires_at_ms: 0,
            completed_at_ms: Some(0),
            expires_at_ms: i64::MAX,
            response: Some(StoredResponse {
                status: 201,
                headers: vec![("content-type".to_string(), "application/json".to_string())],
                body: vec![b'x'; body_len],
                body_ref: String::new(),
            }),
            reason: String::new(),
        }
    }

    #[test]
    fn charge_counts_the_bookkeeping_not_only_the_response() {
        let record = completed("order-1", 100);
        let response_bytes = record
            .response
            .as_ref()
            .map_or(0, StoredResponse::stored_size);
        let charge = charged_bytes(&record);
        // The record, its key twice (the LRU keeps its own copy), eight
        // small buffers and the node: several times a 100-byte response.
        assert!(
            charge >= size_of::<Record>() + 2 * size_of::<RecordKey>() + response_bytes + 8 * 16,
            "charge {charge}"
        );
        // A bigger body costs exactly its extra bytes.
        assert_eq!(charged_bytes(&completed("order-1", 1100)), charge + 1000);
    }

    #[test]
    fn stays_within_its_budget_and_keeps_the_most_recent() {
        let budget = 64 * 1024;
        let cache = CompletedCache::new(budget);
        let per_entry = charged_bytes(&completed("order-00000", 100));
        let fit = budget / per_entry;
        for i in 0..fit * 3 {
            cache.insert(&completed(&format!("order-{i:05}"), 100));
        }
        let inner = cache.inner.lock().expect("lock");
        assert!(
            inner.used_bytes <= budget,
            "{} > {budget}",
            inner.used_bytes
        );
        assert_eq!(inner.entries.len(), fit);
        drop(inner);
        let newest = completed(&format!("order-{:05}", fit * 3 - 1), 100);
        assert!(cache.get(&newest.id, 0).is_some());
        let oldest = completed("order-00000", 100);
        assert!(cache.get(&oldest.id, 0).is_none());
    }

    #[test]
    fn zero_budget_disables_and_non_completed_records_are_not_cached() {
        let disabled = CompletedCache::new(0);
        let record = completed("order-1", 10);
        disabled.insert(&record);
        assert!(disabled.get(&record.id, 0).is_none());

        let cache = CompletedCache::new(1024 * 1024);
        let mut in_progress = completed("order-2", 10);
        in_progress.state = RecordState::InProgress;
        cache.insert(&in_progress);
        assert!(cache.get(&in_progress.id, 0).is_none());
        cache.insert(&record);
        assert!(cache.get(&record.id, 0).is_some());
    }
}
