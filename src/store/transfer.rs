//! Copying records from one store into another as they are: what moves a
//! team's dedup window from the embedded store to a CQL cluster (`idemd
//! copy-to-cql`, docs/deploy.md). Here, above the backends, because it
//! needs nothing but the [`Store`] trait on the target: the source is any
//! stream of records (the embedded store's export,
//! [`super::embedded::export`]).
//!
//! # What a copied record keeps
//!
//! Each record is written with [`Store::import`] (an insert-if-absent
//! that may check and write in two steps, since nothing else writes the
//! target during a cut-over), which writes a record whole: state, lease
//! token and deadline, attempt, fingerprint, response, reason, and
//! `expires_at`, from which the backend derives the TTL left (CQL: `USING
//! TTL` of the remaining window), so the dedup window ends when it would
//! have ended on the source. The backend indexes the record as an insert
//! does: a record that needs or will need a decision (IN_PROGRESS, FAILED,
//! UNKNOWN) gets its pending-index entry, a COMPLETED one none. So after
//! the copy a retry of an acknowledged key replays, a lease holder can
//! still Complete with its token, and ListPending lists what it listed
//! before.
//!
//! # Running it again
//!
//! The copy never overwrites: a key the target already holds is compared
//! with the source's record. Equal, it was copied by an earlier run (one
//! that failed half-way, or a write whose answer was lost) and counts as
//! present; different, it is a conflict: the target was written by someone
//! else (an idemd already serving on it, an earlier store). Conflicts are
//! counted and the first few named by tenant, endpoint and key hash (never
//! the raw key, like every log line of idemd); the copy goes on and the
//! caller fails at the end. A write that fails or whose outcome is unknown
//! is retried, which is safe for the same reason: a retry that finds its
//! own record counts it as present.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use super::{InsertOutcome, Record, Store, StoreError, StoreResult};
use crate::clock::Clock;

/// Records written at once by default: enough to keep a cluster's LWT
/// pipeline busy (each write is two round trips, the index entry and the
/// Paxos insert), few enough for one client connection pool.
pub const DEFAULT_IN_FLIGHT: usize = 128;

/// How many conflicting keys a report names.
pub const CONFLICT_KEYS_SHOWN: usize = 5;

/// How often one record's write is tried before the copy stops; the
/// backoff doubles from [`RETRY_BACKOFF`].
const WRITE_ATTEMPTS: u32 = 5;

/// Wait before a record's second attempt.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// How the copy runs.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Records written at once.
    pub in_flight: usize,
    /// How often the progress callback is called.
    pub progress_every: Duration,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            in_flight: DEFAULT_IN_FLIGHT,
            progress_every: Duration::from_secs(2),
        }
    }
}

/// What a copy did so far (the progress callback) or in all (the result).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CopyReport {
    /// Records the source yielded.
    pub read: u64,
    /// Records this run wrote.
    pub copied: u64,
    /// Records the target already held, equal to the source's: copied by an
    /// earlier run.
    pub present: u64,
    /// Records that expired between being read and being written: absent
    /// on the source too by then, so not written.
    pub expired: u64,
    /// Keys the target holds with a different record; not overwritten.
    pub conflicts: u64,
    /// The first [`CONFLICT_KEYS_SHOWN`] conflicts as `tenant endpoint
    /// key_hash=…` (never the raw key).
    pub conflict_keys: Vec<String>,
    /// Time since the copy started.
    pub elapsed: Duration,
}

impl CopyReport {
    /// Records settled (written, present, expired or conflicting) per
    /// second of the copy.
    pub fn records_per_second(&self) -> f64 {
        let settled = self.copied + self.present + self.expired + self.conflicts;
        settled as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// Records settled so far.
    pub fn settled(&self) -> u64 {
        self.copied + self.present + self.expired + self.conflicts
    }
}

/// How one record's copy ended.
enum Copied {
    /// Written by this run.
    Written,
    /// The target held an equal record.
    Present,
    /// Expired before it was written.
    Expired,
    /// The target held a different record; its description.
    Conflict(String),
}

/// Copies every record of `source` into `target` as it is, `in_flight` at
/// a time, calling `progress` every `progress_every` and returning the
/// report once the source is exhausted. Stops at the first error of the
/// source, and at the first record the target still refuses after
/// [`WRITE_ATTEMPTS`]; what was written stays written (running the copy
/// again resumes it). Conflicts do not stop it: they are in the report.
pub async fn copy_records<S>(
    source: S,
    target: &dyn Store,
    clock: &dyn Clock,
    options: CopyOptions,
    mut progress: impl FnMut(&CopyReport),
) -> StoreResult<CopyReport>
where
    S: Stream<Item = StoreResult<Record>> + Unpin,
{
    let started = Instant::now();
    let mut report = CopyReport::default();
    let read = AtomicU64::new(0);
    let mut writes = source
        .map(|record| {
            read.fetch_add(1, Ordering::Relaxed);
            async move { copy_one(record?, target, clock).await }
        })
        .buffer_unordered(options.in_flight.max(1));
    let mut ticker = tokio::time::interval(options.progress_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            next = writes.next() => {
                let Some(copied) = next else { break };
                match copied? {
                    Copied::Written => report.copied += 1,
                    Copied::Present => report.present += 1,
                    Copied::Expired => report.expired += 1,
                    Copied::Conflict(described) => {
                        report.conflicts += 1;
                        if report.conflict_keys.len() < CONFLICT_KEYS_SHOWN {
                            report.conflict_keys.push(described);
                        }
                    }
                }
            }
            _ = ticker.tick() => {
                report.read = read.load(Ordering::Relaxed);
                report.elapsed = started.elapsed();
                progress(&report);
            }
        }
    }
    report.read = read.load(Ordering::Relaxed);
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Writes one record if the target does not hold its key, retrying what
/// may not have been applied.
async fn copy_one(record: Record, target: &dyn Store, clock: &dyn Clock) -> StoreResult<Copied> {
    let mut backoff = RETRY_BACKOFF;
    let mut attempt = 1;
    loop {
        let now_ms = clock.now_ms();
        if !record.is_live(now_ms) {
            return Ok(Copied::Expired);
        }
        match target.import(&record, now_ms).await {
            Ok(InsertOutcome::Inserted) => return Ok(Copied::Written),
            Ok(InsertOutcome::Exists(existing)) if existing == record => {
                return Ok(Copied::Present);
            }
            Ok(InsertOutcome::Exists(existing)) => {
                return Ok(Copied::Conflict(describe_conflict(&record, &existing)));
            }
            // Nothing applied, or unknown: an insert tried again finds its
            // own record if the first one landed.
            Err(error @ (StoreError::Unavailable(_) | StoreError::Uncertain(_)))
                if attempt < WRITE_ATTEMPTS =>
            {
                tracing::warn!(
                    key_hash = %crate::fingerprint::short_hash(record.id.key.as_bytes()),
                    attempt,
                    %error,
                    "copy write failed; retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// A conflict as a report names it: where, the key hashed, and which state
/// each side holds.
fn describe_conflict(source: &Record, target: &Record) -> String {
    format!(
        "tenant={} endpoint={:?} key_hash={} source={} target={}",
        source.id.tenant,
        source.id.endpoint,
        crate::fingerprint::short_hash(source.id.key.as_bytes()),
        source.state.as_str(),
        target.state.as_str(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::memory::MemoryStore;
    use crate::store::{RecordKey, RecordState, StoredResponse};

    fn record(key: &str, state: RecordState, now: i64) -> Record {
        Record {
            id: RecordKey {
                tenant: "t".into(),
                endpoint: "POST /v1/payments".into(),
                key: key.into(),
            },
            state,
            fingerprint: vec![1; 32],
            attempt: 1,
            lease_token: format!("lease-{key}"),
            attempt_id: String::new(),
            created_at_ms: now - 1_000,
            updated_at_ms: now - 500,
            lease_expires_at_ms: now + 60_000,
            completed_at_ms: (state == RecordState::Completed).then_some(now - 500),
            expires_at_ms: now + 3_600_000,
            response: (state == RecordState::Completed).then(|| StoredResponse {
                status: 201,
                body: b"ok".to_vec(),
                ..StoredResponse::default()
            }),
            reason: String::new(),
        }
    }

    async fn copy(records: &[Record], target: &MemoryStore, clock: &ManualClock) -> CopyReport {
        let source = futures::stream::iter(records.iter().cloned().map(Ok));
        copy_records(source, target, clock, CopyOptions::default(), |_| {})
            .await
            .expect("copy")
    }

    #[tokio::test]
    async fn a_second_run_finds_every_record_present_and_names_conflicts_by_hash() {
        let clock = ManualClock::starting_now();
        let now = clock.now_ms();
        let target = MemoryStore::new();
        let records: Vec<Record> = [
            RecordState::InProgress,
            RecordState::Completed,
            RecordState::Failed,
            RecordState::Unknown,
        ]
        .into_iter()
        .enumerate()
        .map(|(i, state)| record(&format!("secret-key-{i}"), state, now))
        .collect();

        let first = copy(&records, &target, &clock).await;
        assert_eq!((first.read, first.copied, first.present), (4, 4, 0));
        for source in &records {
            let copied = target.get(&source.id, now).await.expect("get");
            assert_eq!(copied.as_ref(), Some(source), "copied as it is");
        }

        let second = copy(&records, &target, &clock).await;
        assert_eq!((second.copied, second.present, second.conflicts), (0, 4, 0));

        let mut changed = records[1].clone();
        changed.fingerprint = vec![2; 32];
        let third = copy(&[changed], &target, &clock).await;
        assert_eq!((third.copied, third.conflicts), (0, 1));
        let named = &third.conflict_keys[0];
        assert!(!named.contains("secret-key"), "never the raw key: {named}");
        assert!(
            named.contains(&crate::fingerprint::short_hash(b"secret-key-1")),
            "{named}"
        );
    }

    #[tokio::test]
    async fn a_record_expired_before_its_write_is_not_written() {
        let clock = ManualClock::starting_now();
        let now = clock.now_ms();
        let mut expired = record("gone", RecordState::Completed, now);
        expired.expires_at_ms = now;
        let target = MemoryStore::new();
        let report = copy(&[expired.clone()], &target, &clock).await;
        assert_eq!((report.copied, report.expired), (0, 1));
        assert_eq!(target.get(&expired.id, now - 1).await.expect("get"), None);
    }
}
