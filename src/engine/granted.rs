//! The claims this engine granted and whose holder has not finished yet:
//! lets Complete, Fail and ExtendLease skip the read before their
//! conditional write.
//!
//! Without it every holder call read the record first (to build the record
//! it writes), then wrote it conditionally: two store round trips, where the
//! conditional write alone already decides. A holder almost always calls the
//! replica that granted its claim (the SDKs keep one channel), and that
//! replica wrote the record itself, so it can build the next version from
//! what it wrote.
//!
//! Correctness never rests on this memory: the store's condition (state
//! IN_PROGRESS and this lease token) is still the fence. What the memory can
//! miss, it misses safely:
//! * a record changed under the same token by another replica (only its
//!   holder's ExtendLease can do that) differs from ours only in the lease's
//!   end, which the next version either replaces (ExtendLease) or no longer
//!   uses (a completed or failed record); a CQL pending-index entry it leaves
//!   behind is verified and dropped by ListPending (see `store::cql`);
//! * a taken-over or finished record fails the condition, and the caller
//!   falls back to reading it (the same path as a claim granted elsewhere);
//! * a full table, an entry dropped by a failed write or a restart: the read
//!   path again.
//!
//! Bounded: at most [`CAPACITY`] entries (a few MiB); when full, entries whose
//! lease has run out are dropped, and if none has, nothing more is kept until
//! some are taken.
//!
//! Every store's conditional write fences a stale copy (the `Store`
//! contract: `replace_if`/`delete_if` decide on the stored record), so the
//! memory is always on; a backend that could not keep that contract would
//! not be a `Store`.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::{Record, RecordKey, RecordState};

/// Claims remembered at most: far above the requests in flight of one
/// replica (each holds one), small enough to stay a few MiB.
pub const CAPACITY: usize = 10_000;

/// Granted, unfinished claims by lease token.
#[derive(Debug, Default)]
pub struct Granted {
    /// Lease token → the IN_PROGRESS record as this engine wrote it.
    by_token: Mutex<HashMap<String, Record>>,
}

impl Granted {
    /// Remembers a claim this engine just granted (an IN_PROGRESS record it
    /// wrote).
    pub fn remember(&self, record: &Record, now_ms: i64) {
        if record.state != RecordState::InProgress {
            return;
        }
        let mut map = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAPACITY {
            // Holders that never came back (crashed callers): their lease
            // is over, so their next call, if any, reads.
            map.retain(|_, held| now_ms < held.lease_expires_at_ms);
            if map.len() >= CAPACITY {
                return;
            }
        }
        map.insert(record.lease_token.clone(), record.clone());
    }

    /// Takes the record granted with `lease_token` for `id`, if remembered.
    /// Taken, not copied: whatever the holder does next either finishes the
    /// claim or is remembered again (ExtendLease).
    pub fn take(&self, id: &RecordKey, lease_token: &str) -> Option<Record> {
        let mut map = self.by_token.lock().unwrap_or_else(|e| e.into_inner());
        // A token presented for another key is not this claim's: leave it.
        if map.get(lease_token)?.id != *id {
            return None;
        }
        map.remove(lease_token)
    }

    /// Claims remembered now (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, token: &str, lease_expires_at_ms: i64) -> Record {
        Record {
            id: RecordKey {
                tenant: "t".to_string(),
                endpoint: "e".to_string(),
                key: key.to_string(),
            },
            state: RecordState::InProgress,
            fingerprint: vec![1; 32],
            attempt: 1,
            lease_token: token.to_string(),
            attempt_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: 0,
            lease_expires_at_ms,
            completed_at_ms: None,
            expires_at_ms: 1_000_000,
            response: None,
            reason: String::new(),
        }
    }

    #[test]
    fn a_token_is_taken_once_and_only_for_its_key() {
        let granted = Granted::default();
        let held = record("k", "tok", 100);
        granted.remember(&held, 0);
        let other = record("other", "tok", 100).id;
        assert_eq!(granted.take(&other, "tok"), None, "another key's token");
        assert_eq!(granted.take(&held.id, "tok"), Some(held.clone()));
        assert_eq!(granted.take(&held.id, "tok"), None, "taken once");
    }

    #[test]
    fn only_in_progress_records_are_remembered() {
        let granted = Granted::default();
        let mut done = record("k", "tok", 100);
        done.state = RecordState::Completed;
        granted.remember(&done, 0);
        assert_eq!(granted.len(), 0);
    }

    #[test]
    fn a_full_table_drops_expired_leases_then_stops_growing() {
        let granted = Granted::default();
        for i in 0..CAPACITY {
            // Half of them with a lease that ends at 50.
            let lease_end = if i % 2 == 0 { 50 } else { 500 };
            granted.remember(&record(&format!("k{i}"), &format!("t{i}"), lease_end), 0);
        }
        assert_eq!(granted.len(), CAPACITY);
        // Full, nothing expired yet: not kept.
        granted.remember(&record("late", "late", 500), 10);
        assert_eq!(granted.len(), CAPACITY);
        assert_eq!(granted.take(&record("late", "", 0).id, "late"), None);
        // Full, half expired: they go, the new one stays.
        granted.remember(&record("later", "later", 500), 100);
        assert_eq!(granted.len(), CAPACITY / 2 + 1);
        assert!(granted.take(&record("later", "", 0).id, "later").is_some());
    }
}
