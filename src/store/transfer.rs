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

//! # The short cut-over: changes since a backup
//!
//! A copy of a whole store stops idemd for as long as the store takes to
//! copy (~17 min per 10^6 records on one node). So the bulk is copied from
//! a backup while idemd still serves, and during the stop only what changed
//! since that backup: [`Change::Put`] with the record the bulk wrote for
//! the key (`before`), [`Change::Remove`] for a key the bulk wrote that the
//! store no longer holds, [`Change::Same`] for a record unchanged since the
//! backup (nothing to write, but an IN_PROGRESS one still has its lease
//! credited). A `Put` over a `before` is a conditional replace (or a
//! conditional delete and an insert when the key was claimed anew, with
//! another dedup window); a `Remove` a conditional delete: each finds the
//! target as the bulk left it, or as an earlier run of the same step left
//! it (present), or it is a conflict. [`Change::Unchanged`] stands for
//! keys a merge only counted.
//!
//! The same changes between two backups, written while idemd still serves
//! (a catch-up, `--from-backup LATER --since-backup EARLIER`), bring the
//! keyspace from the earlier backup to the later one, so the stop carries
//! only what changed since the last catch-up. What the stop cannot shed is
//! the merge itself (both stores read whole, ~1.5 s per 10^6 keys here,
//! `export::Changes`) and the leases to credit.
//!
//! # Leases across the move
//!
//! A holder cannot Complete or ExtendLease while nothing serves its key,
//! so the time idemd is stopped must not count against its lease (the
//! rule of docs/design.md, "Leases across a stop"). With a
//! [`LeaseCredit`], every IN_PROGRESS record whose lease was live when
//! idemd stopped serving gets, after everything else is written, the time
//! since that instant plus a grace for the start on the cluster, capped at
//! the record's expiry. The credit is written last, by a conditional
//! replace of what the copy wrote, so it is measured as late as possible.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use super::contract::{CasOutcome, Expected, InsertOutcome, Store, StoreResult};
use super::error::StoreError;
use super::record::{Record, RecordState};
use crate::clock::Clock;

/// Records written at once by default: enough to keep a cluster's LWT
/// pipeline busy (each write is two round trips, the index entry and the
/// Paxos insert), few enough for one client connection pool.
pub const DEFAULT_IN_FLIGHT: usize = 128;

/// How many conflicting keys a report names.
pub const CONFLICT_KEYS_SHOWN: usize = 5;

/// How often one record's write is tried before the copy stops; the
/// backoff doubles from [`RETRY_BACKOFF`] (about 25 s in all: a copy is a
/// batch job beside live traffic, and a cluster busy for seconds must not
/// stop it).
const WRITE_ATTEMPTS: u32 = 8;

/// Wait before a record's second attempt.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// `--lease-grace` of `idemd copy-to-cql` by default: the wait from the
/// end of the copy to the first replica serving on the cluster that a
/// lease is credited with, on top of the time idemd was stopped. Longer
/// than a rollout's start of a replica; too long only delays the takeover
/// of a holder that really died, never grants a key twice.
pub const DEFAULT_LEASE_GRACE: &str = "60s";

/// One key's difference between what an earlier copy wrote into the target
/// and what the source holds now.
// Moved through the copy once each, never held in bulk (see InsertOutcome).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The source holds `after`; `before` is what the earlier copy wrote
    /// for the key (`None`: nothing, or a record that has expired since).
    Put {
        /// The record the target holds from the earlier copy, if any.
        before: Option<Record>,
        /// The source's record.
        after: Record,
    },
    /// The earlier copy wrote `before`; the source no longer holds the key
    /// (released by a Fail, or deleted).
    Remove {
        /// The record the target holds from the earlier copy.
        before: Record,
    },
    /// Unchanged since the earlier copy: nothing to write, except the
    /// lease credit of an IN_PROGRESS record.
    Same(Record),
    /// `keys` unchanged since the earlier copy and not IN_PROGRESS: nothing
    /// to write, only counted (a merge names nearly every key of a store
    /// this way, without decoding them: `export::Changes`).
    Unchanged {
        /// How many.
        keys: u64,
    },
}

impl Change {
    /// Keys the change stands for.
    fn keys(&self) -> u64 {
        match self {
            Change::Unchanged { keys } => *keys,
            Change::Put { .. } | Change::Remove { .. } | Change::Same(_) => 1,
        }
    }
}

/// Credits the leases live when the source stopped serving with the time
/// it has been stopped (see the module's "Leases across the move").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCredit {
    /// The source's last heartbeat (`idemd.alive`): when it stopped serving.
    pub stopped_at_ms: i64,
    /// Added beyond the time since `stopped_at_ms`.
    pub grace: Duration,
}

impl LeaseCredit {
    /// `record` with its lease credited at `now_ms`, if it is IN_PROGRESS
    /// with a lease that was live when the source stopped.
    pub fn credited(&self, record: &Record, now_ms: i64) -> Option<Record> {
        if record.state != RecordState::InProgress
            || record.lease_expires_at_ms <= self.stopped_at_ms
        {
            return None;
        }
        let grace = i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX);
        let credit = now_ms
            .saturating_sub(self.stopped_at_ms)
            .saturating_add(grace);
        let lease = record
            .lease_expires_at_ms
            .saturating_add(credit.max(0))
            .min(record.expires_at_ms);
        (lease > record.lease_expires_at_ms).then(|| Record {
            lease_expires_at_ms: lease,
            ..record.clone()
        })
    }
}

/// How the copy runs.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Records written at once.
    pub in_flight: usize,
    /// How often the progress callback is called.
    pub progress_every: Duration,
    /// Credit the leases of IN_PROGRESS records with the source's stop.
    pub lease_credit: Option<LeaseCredit>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            in_flight: DEFAULT_IN_FLIGHT,
            progress_every: Duration::from_secs(2),
            lease_credit: None,
        }
    }
}

/// What a copy did so far (the progress callback) or in all (the result).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CopyReport {
    /// Records the source yielded.
    pub read: u64,
    /// Records this run wrote (inserted, or replaced the earlier copy's).
    pub copied: u64,
    /// Keys this run removed: the earlier copy wrote them, the source no
    /// longer holds them.
    pub removed: u64,
    /// Records unchanged since the earlier copy (not written).
    pub unchanged: u64,
    /// Leases credited with the source's stop.
    pub leases_credited: u64,
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
        self.settled() as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// Records settled so far.
    pub fn settled(&self) -> u64 {
        self.copied + self.removed + self.unchanged + self.present + self.expired + self.conflicts
    }

    fn count(&mut self, copied: Copied) {
        match copied {
            Copied::Written => self.copied += 1,
            Copied::Removed => self.removed += 1,
            Copied::Unchanged(keys) => self.unchanged += keys,
            Copied::Present => self.present += 1,
            Copied::Expired => self.expired += 1,
            Copied::Conflict(described) => {
                self.conflicts += 1;
                if self.conflict_keys.len() < CONFLICT_KEYS_SHOWN {
                    self.conflict_keys.push(described);
                }
            }
        }
    }
}

/// How one record's copy ended.
enum Copied {
    /// Written by this run.
    Written,
    /// Removed by this run.
    Removed,
    /// Unchanged since the earlier copy (how many keys).
    Unchanged(u64),
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
    progress: impl FnMut(&CopyReport),
) -> StoreResult<CopyReport>
where
    S: Stream<Item = StoreResult<Record>> + Unpin,
{
    let changes = source.map(|record| {
        record.map(|after| Change::Put {
            before: None,
            after,
        })
    });
    copy_changes(changes, target, clock, options, progress).await
}

/// [`copy_records`] for [`Change`]s: writes each into `target` as the
/// module's "The short cut-over" says, then credits the leases held
/// (`options.lease_credit`).
pub async fn copy_changes<S>(
    source: S,
    target: &dyn Store,
    clock: &dyn Clock,
    options: CopyOptions,
    mut progress: impl FnMut(&CopyReport),
) -> StoreResult<CopyReport>
where
    S: Stream<Item = StoreResult<Change>> + Unpin,
{
    let started = Instant::now();
    let mut report = CopyReport::default();
    let read = AtomicU64::new(0);
    let credit = options.lease_credit;
    // The leases credited, as (the source's record, what was written,
    // when): a long copy credits them again at its end.
    let credited = std::sync::Mutex::new(Vec::new());
    let mut writes = source
        .map(|change| {
            let keys = change.as_ref().map_or(1, Change::keys);
            read.fetch_add(keys, Ordering::Relaxed);
            let credited = &credited;
            async move {
                let (change, source) = with_credit(change?, credit.as_ref(), clock.now_ms());
                let copied = copy_change(&change, target, clock).await?;
                if let (Some(source), Change::Put { after, .. }) = (source, &change)
                    && matches!(copied, Copied::Written | Copied::Present)
                {
                    let entry = (source, after.clone(), Instant::now());
                    credited
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(entry);
                }
                Ok::<_, StoreError>(copied)
            }
        })
        .buffer_unordered(options.in_flight.max(1));
    let mut ticker = tokio::time::interval(options.progress_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            next = writes.next() => {
                let Some(copied) = next else { break };
                report.count(copied?);
            }
            _ = ticker.tick() => {
                report.read = read.load(Ordering::Relaxed);
                report.elapsed = started.elapsed();
                progress(&report);
            }
        }
    }
    drop(writes);
    let credited = credited.into_inner().unwrap_or_else(|e| e.into_inner());
    report.leases_credited = credited.len() as u64;
    if let Some(credit) = credit {
        recredit(credited, &credit, target, clock, options.in_flight).await?;
    }
    report.read = read.load(Ordering::Relaxed);
    report.elapsed = started.elapsed();
    Ok(report)
}

/// `change` with the lease of its record credited (an unchanged record
/// whose lease is credited becomes a `Put` over itself), and the source's
/// record when it was.
fn with_credit(
    change: Change,
    credit: Option<&LeaseCredit>,
    now_ms: i64,
) -> (Change, Option<Record>) {
    let Some(credit) = credit else {
        return (change, None);
    };
    match change {
        Change::Put { before, after } => match credit.credited(&after, now_ms) {
            Some(credited) => (
                Change::Put {
                    before,
                    after: credited,
                },
                Some(after),
            ),
            None => (Change::Put { before, after }, None),
        },
        Change::Same(same) => match credit.credited(&same, now_ms) {
            Some(credited) => (
                Change::Put {
                    before: Some(same.clone()),
                    after: credited,
                },
                Some(same),
            ),
            None => (Change::Same(same), None),
        },
        other @ (Change::Remove { .. } | Change::Unchanged { .. }) => (other, None),
    }
}

/// Credits again, at the end of a copy, the leases credited more than half
/// the grace before it: a whole store's copy takes minutes, and a lease
/// credited at its start would lose them. The short step of a cut-over
/// takes seconds and credits nothing twice.
async fn recredit(
    credited: Vec<(Record, Record, Instant)>,
    credit: &LeaseCredit,
    target: &dyn Store,
    clock: &dyn Clock,
    in_flight: usize,
) -> StoreResult<()> {
    let stale = credited
        .into_iter()
        .filter(|(_, _, at)| at.elapsed() > credit.grace / 2);
    let mut writes = futures::stream::iter(stale)
        .map(|(source, written, _)| async move {
            retried(&source, || async {
                let now_ms = clock.now_ms();
                let Some(again) = credit.credited(&source, now_ms) else {
                    return Ok(());
                };
                // A target that holds something else by now (an idemd
                // serving on it already) keeps it.
                target
                    .replace_if(&again, &Expected::matching(&written), now_ms)
                    .await?;
                Ok(())
            })
            .await
        })
        .buffer_unordered(in_flight.max(1));
    while let Some(done) = writes.next().await {
        done?;
    }
    Ok(())
}

/// Writes one change, retrying what may not have been applied.
async fn copy_change(
    change: &Change,
    target: &dyn Store,
    clock: &dyn Clock,
) -> StoreResult<Copied> {
    match change {
        Change::Put {
            before: None,
            after,
        } => copy_one(after, target, clock).await,
        Change::Put {
            before: Some(before),
            after,
        } => replace_one(before, after, target, clock).await,
        Change::Remove { before } => remove_one(before, target, clock).await,
        Change::Same(_) => Ok(Copied::Unchanged(1)),
        Change::Unchanged { keys } => Ok(Copied::Unchanged(*keys)),
    }
}

/// Runs `write` until it settles, retrying `Unavailable` and `Uncertain`
/// up to [`WRITE_ATTEMPTS`] times: every write here is conditional on what
/// the target held, so a retry of one that landed finds its own result.
async fn retried<T, F, Fut>(record: &Record, mut write: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let mut backoff = RETRY_BACKOFF;
    let mut attempt = 1;
    loop {
        match write().await {
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
            other => return other,
        }
    }
}

/// Replaces the earlier copy's `before` with `after`: conditionally in
/// place when the dedup window is the same, else a conditional delete and
/// an insert (the key was released and claimed anew since).
async fn replace_one(
    before: &Record,
    after: &Record,
    target: &dyn Store,
    clock: &dyn Clock,
) -> StoreResult<Copied> {
    if before.expires_at_ms != after.expires_at_ms {
        return match remove(before, Some(after), target, clock).await? {
            Copied::Removed => copy_one(after, target, clock).await,
            settled => Ok(settled),
        };
    }
    // `None`: the key is free in the target (the earlier copy's record
    // expired there, or was never written): an insert follows.
    let replaced = retried(after, || async {
        let now_ms = clock.now_ms();
        if !after.is_live(now_ms) {
            return Ok(Some(Copied::Expired));
        }
        Ok(
            match target
                .replace_if(after, &Expected::matching(before), now_ms)
                .await?
            {
                CasOutcome::Applied => Some(Copied::Written),
                CasOutcome::Conflict { current: None } => None,
                CasOutcome::Conflict {
                    current: Some(current),
                } if is_copy_of(&current, after) => Some(Copied::Present),
                CasOutcome::Conflict {
                    current: Some(current),
                } => Some(Copied::Conflict(describe_conflict(after, &current))),
            },
        )
    })
    .await?;
    match replaced {
        Some(copied) => Ok(copied),
        None => copy_one(after, target, clock).await,
    }
}

/// Removes the earlier copy's `before`, if the target still holds it.
async fn remove_one(before: &Record, target: &dyn Store, clock: &dyn Clock) -> StoreResult<Copied> {
    remove(before, None, target, clock).await
}

/// Removes `before` if the target holds it: [`Copied::Removed`] once the
/// key is free, [`Copied::Present`] when the target already holds `after`
/// (an earlier run of the same step), else a conflict.
async fn remove(
    before: &Record,
    after: Option<&Record>,
    target: &dyn Store,
    clock: &dyn Clock,
) -> StoreResult<Copied> {
    retried(before, || async {
        let now_ms = clock.now_ms();
        Ok(
            match target
                .delete_if(&before.id, &Expected::matching(before), now_ms)
                .await?
            {
                CasOutcome::Applied | CasOutcome::Conflict { current: None } => Copied::Removed,
                CasOutcome::Conflict {
                    current: Some(current),
                } if after.is_some_and(|after| is_copy_of(&current, after)) => Copied::Present,
                CasOutcome::Conflict {
                    current: Some(current),
                } => Copied::Conflict(describe_conflict(after.unwrap_or(before), &current)),
            },
        )
    })
    .await
}

/// Writes one record if the target does not hold its key, retrying what
/// may not have been applied.
async fn copy_one(record: &Record, target: &dyn Store, clock: &dyn Clock) -> StoreResult<Copied> {
    retried(record, || async {
        let now_ms = clock.now_ms();
        if !record.is_live(now_ms) {
            return Ok(Copied::Expired);
        }
        // Nothing applied, or unknown, is retried: an insert tried again
        // finds its own record if the first one landed.
        Ok(match target.import(record, now_ms).await? {
            InsertOutcome::Inserted => Copied::Written,
            InsertOutcome::Exists(existing)
                if is_copy_of(&existing, record)
                    && existing.lease_expires_at_ms < record.lease_expires_at_ms =>
            {
                // An earlier run's copy, its lease credited less than now.
                match target
                    .replace_if(record, &Expected::matching(&existing), now_ms)
                    .await?
                {
                    CasOutcome::Applied => Copied::Written,
                    CasOutcome::Conflict { current } => Copied::Conflict(describe_conflict(
                        record,
                        current.as_ref().unwrap_or(&existing),
                    )),
                }
            }
            InsertOutcome::Exists(existing) if is_copy_of(&existing, record) => Copied::Present,
            InsertOutcome::Exists(existing) => {
                Copied::Conflict(describe_conflict(record, &existing))
            }
        })
    })
    .await
}

/// Whether the target's `held` is what a copy of `source` left: equal, or
/// the same IN_PROGRESS record with another lease (credited by an earlier
/// run of the copy, at another time).
fn is_copy_of(held: &Record, source: &Record) -> bool {
    held == source
        || (source.state == RecordState::InProgress
            && Record {
                lease_expires_at_ms: source.lease_expires_at_ms,
                ..held.clone()
            } == *source)
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
