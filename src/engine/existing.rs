//! Keys this replica has seen exist: where a Claim reads before it tries
//! to create.
//!
//! On a store whose Claim goes straight to the conditional insert
//! ([`crate::store::Store::read_before_insert`] is `false`: CQL, where
//! `INSERT … IF NOT EXISTS` returns the row it did not replace), every
//! Claim of an existing key paid for that insert: on CQL a Paxos round on
//! the key's partition plus a pending-index write and its delete. Those
//! Claims are exactly the duplicates idemd exists for: a client polling
//! an in-flight key (409 + `Retry-After`), a server-side `wait` polling it,
//! the retries of a queue. Those Paxos rounds compete with the holder's
//! own Complete on the same partition and cost the cluster several times
//! a read (docs/scylla.md, "A duplicate costs a read, not an LWT").
//!
//! So a key seen to exist (created here, or reported by a failed insert)
//! is remembered, and the next Claim of it reads first: a plain read at the
//! store's regular consistency, which answers an in-flight key ("in
//! progress", nothing granted), a completed one (a replay; the value a
//! quorum read returns was committed by a Paxos round and stays chosen) and
//! a mismatch (the fingerprint never changes in a key's life) without any
//! conditional write. Anything that grants (a takeover, a key gone since)
//! still goes through the conditional write, which decides on the stored
//! record: a stale hint or a stale read costs one extra read, never a wrong
//! grant. The embedded store reads first anyway and keeps no hints.
//!
//! Bounded: an LRU of [`CAPACITY`] keys. Duplicates come within seconds of
//! the first request, so a table that holds the last tens of seconds of
//! new keys is enough; a key that fell out just pays the insert again.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;

use crate::store::RecordKey;

/// Keys remembered at most (~1-2 MiB): tens of seconds of new keys at the
/// CQL store's rates, far more than the window in which duplicates arrive.
pub const CAPACITY: usize = 16_384;

/// Keys seen to exist, each until its record's dedup window ends.
#[derive(Debug)]
pub struct ExistingKeys {
    /// Key → the end of its record's dedup window (ms): past it the key may
    /// be created afresh, and a read first would be wasted.
    keys: Mutex<LruCache<RecordKey, i64>>,
    /// Whether hints are kept at all: only for stores that insert first.
    enabled: bool,
}

impl ExistingKeys {
    /// Hints for a store that inserts before reading (`enabled`); a store
    /// that reads first gets an empty table that remembers nothing.
    pub fn new(enabled: bool) -> Self {
        let capacity =
            NonZeroUsize::new(if enabled { CAPACITY } else { 1 }).unwrap_or(NonZeroUsize::MIN);
        Self {
            keys: Mutex::new(LruCache::new(capacity)),
            enabled,
        }
    }

    /// Notes that `id` exists, with a dedup window ending at `expires_at_ms`.
    pub fn remember(&self, id: &RecordKey, expires_at_ms: i64) {
        if self.enabled {
            self.lock().put(id.clone(), expires_at_ms);
        }
    }

    /// Whether `id` was seen to exist and its window has not ended.
    pub fn contains(&self, id: &RecordKey, now_ms: i64) -> bool {
        if !self.enabled {
            return false;
        }
        let mut keys = self.lock();
        match keys.get(id) {
            Some(&expires_at_ms) if now_ms < expires_at_ms => true,
            Some(_) => {
                keys.pop(id);
                false
            }
            None => false,
        }
    }

    /// Drops the hint for `id` (a read found it gone).
    pub fn forget(&self, id: &RecordKey) {
        if self.enabled {
            self.lock().pop(id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<RecordKey, i64>> {
        // Every step is one LRU call that leaves the table consistent.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RecordKey {
        RecordKey {
            tenant: "t".into(),
            endpoint: "e".into(),
            key: name.into(),
        }
    }

    #[test]
    fn a_hint_lasts_until_the_window_ends_or_it_is_forgotten() {
        let hints = ExistingKeys::new(true);
        hints.remember(&key("a"), 1_000);
        hints.remember(&key("b"), 1_000);
        assert!(hints.contains(&key("a"), 999));
        assert!(!hints.contains(&key("a"), 1_000), "the window has ended");
        assert!(!hints.contains(&key("a"), 0), "an ended hint is dropped");
        hints.forget(&key("b"));
        assert!(!hints.contains(&key("b"), 0));
        assert!(!hints.contains(&key("c"), 0));
    }

    #[test]
    fn a_store_that_reads_first_keeps_no_hints() {
        let hints = ExistingKeys::new(false);
        hints.remember(&key("a"), i64::MAX);
        assert!(!hints.contains(&key("a"), 0));
    }

    #[test]
    fn the_table_is_bounded() {
        let hints = ExistingKeys::new(true);
        for i in 0..=CAPACITY {
            hints.remember(&key(&i.to_string()), i64::MAX);
        }
        assert!(!hints.contains(&key("0"), 0), "the oldest key made room");
        assert!(hints.contains(&key(&CAPACITY.to_string()), 0));
    }
}
