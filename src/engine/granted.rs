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
//! Bounded: at most [`CAPACITY`] entries (a few MiB). Entries whose lease has
//! run out are dropped as new ones come; when still full, the entry whose
//! lease ends first makes room for the new one (its holder is the likeliest
//! to have gone, and the newest claims the likeliest to finish). Every step
//! is O(log n): an earlier version scanned the whole table on each Claim once
//! it was full of claims nobody finished, which put a 10,000-entry scan under
//! this lock on the request path (a fifth of the request threads' CPU and the
//! worst of the fresh-Claim tail in the peer comparison, docs/benchmarks.md).
//!
//! Every store's conditional write fences a stale copy (the `Store`
//! contract: `replace_if`/`delete_if` decide on the stored record), so the
//! memory is always on; a backend that could not keep that contract would
//! not be a `Store`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::store::{Record, RecordKey, RecordState};

/// Claims remembered at most: far above the requests in flight of one
/// replica (each holds one), small enough to stay a few MiB.
pub const CAPACITY: usize = 10_000;

/// Granted, unfinished claims by lease token.
#[derive(Debug, Default)]
pub struct Granted {
    /// The table; one lock, held for O(log n) steps only.
    held: Mutex<Held>,
}

/// The table and its order of eviction, always holding the same tokens.
#[derive(Debug, Default)]
struct Held {
    /// Lease token → the IN_PROGRESS record as this engine wrote it.
    by_token: HashMap<String, Record>,
    /// (lease end, token) of every entry: which to drop first, without a
    /// scan.
    by_lease_end: BTreeSet<(i64, String)>,
}

impl Held {
    fn remove(&mut self, lease_token: &str) -> Option<Record> {
        let record = self.by_token.remove(lease_token)?;
        self.by_lease_end
            .remove(&(record.lease_expires_at_ms, lease_token.to_string()));
        Some(record)
    }

    /// Drops the entry whose lease ends first; false when empty.
    fn drop_first_to_end(&mut self) -> bool {
        match self.by_lease_end.pop_first() {
            Some((_, token)) => {
                self.by_token.remove(&token);
                true
            }
            None => false,
        }
    }

    /// The lease end of the entry that ends first.
    fn first_lease_end(&self) -> Option<i64> {
        self.by_lease_end.first().map(|(end, _)| *end)
    }
}

impl Granted {
    /// Remembers a claim this engine just granted (an IN_PROGRESS record it
    /// wrote), or its extended lease.
    pub fn remember(&self, record: &Record, now_ms: i64) {
        if record.state != RecordState::InProgress {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        // Holders that never came back (crashed callers): their lease is
        // over, so their next call, if any, reads.
        while held.first_lease_end().is_some_and(|end| end <= now_ms) {
            held.drop_first_to_end();
        }
        held.remove(&record.lease_token);
        while held.by_token.len() >= CAPACITY && held.drop_first_to_end() {}
        held.by_lease_end
            .insert((record.lease_expires_at_ms, record.lease_token.clone()));
        held.by_token
            .insert(record.lease_token.clone(), record.clone());
    }

    /// Takes the record granted with `lease_token` for `id`, if remembered.
    /// Taken, not copied: whatever the holder does next either finishes the
    /// claim or is remembered again (ExtendLease).
    pub fn take(&self, id: &RecordKey, lease_token: &str) -> Option<Record> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        // A token presented for another key is not this claim's: leave it.
        if held.by_token.get(lease_token)?.id != *id {
            return None;
        }
        held.remove(lease_token)
    }

    /// Claims remembered now (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(held.by_token.len(), held.by_lease_end.len());
        held.by_token.len()
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
    fn a_full_table_drops_expired_leases_then_the_lease_that_ends_first() {
        let granted = Granted::default();
        for i in 0..CAPACITY {
            // Half of them with a lease that ends at 50, the others later,
            // the earliest of those at 500.
            let lease_end = if i % 2 == 0 { 50 } else { 500 + i as i64 };
            granted.remember(&record(&format!("k{i}"), &format!("t{i}"), lease_end), 0);
        }
        assert_eq!(granted.len(), CAPACITY);
        // Full, nothing expired yet: the new claim stays, the one whose
        // lease ends first goes.
        granted.remember(&record("late", "late", 900_000), 10);
        assert_eq!(granted.len(), CAPACITY);
        assert!(granted.take(&record("late", "", 0).id, "late").is_some());
        let firsts = (0..CAPACITY)
            .step_by(2)
            .filter(|i| {
                granted
                    .take(&record(&format!("k{i}"), "", 0).id, &format!("t{i}"))
                    .is_none()
            })
            .count();
        assert_eq!(firsts, 1, "exactly one of the earliest leases made room");
        // Half expired by 100: they go as the next claim comes.
        let granted = Granted::default();
        for i in 0..CAPACITY {
            let lease_end = if i % 2 == 0 { 50 } else { 500 };
            granted.remember(&record(&format!("k{i}"), &format!("t{i}"), lease_end), 0);
        }
        granted.remember(&record("later", "later", 500), 100);
        assert_eq!(granted.len(), CAPACITY / 2 + 1);
        assert!(granted.take(&record("later", "", 0).id, "later").is_some());
    }

    #[test]
    fn an_extended_lease_replaces_its_entry() {
        let granted = Granted::default();
        let held = record("k", "tok", 100);
        granted.remember(&held, 0);
        granted.remember(&record("k", "tok", 900), 50);
        assert_eq!(granted.len(), 1);
        // Past the first lease end, the extended entry is still there.
        granted.remember(&record("other", "o", 1_000), 200);
        assert_eq!(
            granted.take(&held.id, "tok").map(|r| r.lease_expires_at_ms),
            Some(900)
        );
    }

    #[test]
    fn remembering_stays_cheap_when_full_of_unfinished_claims() {
        // Claims nobody finishes (the fresh-Claim bench): each new one
        // must cost O(log n), not a scan of the table. 20 × CAPACITY
        // inserts into a full table take milliseconds; a scan per insert
        // took seconds (2 × 10^9 entry visits).
        //
        // Timed against the same process filling the empty table (a
        // ratio, not a wall-clock bound: a loaded machine slows both): an
        // insert into the full table may cost a few times one into the
        // empty table, never the table's size.
        let granted = Granted::default();
        let insert = |i: usize| {
            granted.remember(&record(&format!("k{i}"), &format!("t{i}"), 60_000), 0);
        };
        let started = std::time::Instant::now();
        (0..CAPACITY).for_each(insert);
        let filling = started.elapsed();
        let started = std::time::Instant::now();
        (CAPACITY..20 * CAPACITY).for_each(insert);
        let full = started.elapsed();
        assert_eq!(granted.len(), CAPACITY);
        let per_full = full.as_secs_f64() / (19 * CAPACITY) as f64;
        let per_empty = filling.as_secs_f64() / CAPACITY as f64;
        assert!(
            per_full < per_empty * 10.0,
            "an insert into the full table cost {:.1} µs, into the empty one {:.1} µs",
            per_full * 1e6,
            per_empty * 1e6
        );
    }
}
