//! The pending index: where an entry lives, its writes, and what an entry
//! says about its record. ListPending's read is in [`scan`], the sealer
//! (watermark, overdue moves, the gauges' summary) in [`seal`], the upgrade
//! from migration 1's `pending_index` in [`legacy`].
//!
//! # Layout (migration 3)
//!
//! An entry is `(due_at, endpoint, key)`: the instant its record starts to
//! need a decision. It lives in one of two tables:
//!
//! * `pending_buckets`, partition `(tenant, bucket, shard)`: entries of
//!   IN_PROGRESS records, `bucket = due_at / BUCKET_MS`, `shard` a stable
//!   hash of (endpoint, key) modulo [`SHARDS`]. A partition receives one
//!   bucket of one shard of a tenant's claims: at `r` claims/s,
//!   `r × BUCKET_MS / SHARDS` rows, live or dead, whatever the day's total.
//! * `pending_overdue`, partition `(tenant, shard)`: what is still pending
//!   when its bucket is sealed, and FAILED/UNKNOWN records (due at once, and
//!   rare: a handler that reported an uncertain outcome).
//!
//! Every tenant has a watermark (`pending_cursor`, LWT only). The sealer
//! ([`seal`]) keeps it `grace` behind the clock: it copies the entries
//! below the new watermark that may still be pending into
//! `pending_overdue`, advances the watermark with an LWT, and drops the
//! buckets wholly below it with one partition delete each. Readers read the
//! overdue partitions and the buckets from the watermark up, each slice
//! starting at the watermark, so no read walks the tombstones of the claims
//! completed before it: a reader walks at most the tombstones of the claims
//! due in the last `grace + step` (about 20 s at the defaults).
//!
//! # Why a crash never hides a pending record
//!
//! An entry is written before the record's conditional write that makes it
//! due, and deleted after the write that ends that: a crash between the two
//! leaves an extra entry (verified against `records` and dropped by readers),
//! never a missing one. The sealer copies before it advances and advances
//! before it drops: a crash between two of its writes leaves a duplicate
//! (same primary key in both tables, merged by readers) or a bucket below
//! the watermark that nobody reads and whose entries expire with their TTL.
//!
//! What the grace buys: an entry must never land in a bucket after that
//! bucket was sealed. Claims index `now + lease`, in the future; FAILED and
//! UNKNOWN entries go straight to `pending_overdue`, which is never sealed;
//! and a writer whose due instant is near the watermark it last saw writes to
//! `pending_overdue` too. So the grace must exceed a replica's clock skew
//! plus the latency of one index write (bounded by the request timeout).

pub(super) mod legacy;
pub(super) mod scan;
pub(super) mod seal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::rows::NamedRow;
use super::{CqlStore, ttl_seconds, unavailable};
use crate::store::{Record, RecordKey, RecordState, StoreError, StoreResult};

/// Width of one bucket of due instants. With [`SHARDS`] it sets the rows a
/// partition receives: `claims/s × 20 s / 8` (2.5 rows per claim/s; 25,000
/// at the default claim-rate ceiling of 10,000/s, an eighth of ScyllaDB's
/// 200,000-row write guardrail and a quarter of Cassandra's tombstone
/// failure threshold even if one read walked a whole partition, which none
/// does). Never change it on a live keyspace: bucket numbers are stored.
pub const BUCKET_MS: i64 = 20_000;

/// Partitions per bucket (and overdue partitions per tenant). Spreads one
/// tenant's index writes over 8 partitions, so on ScyllaDB over up to 8
/// shards per replica; a read fans out to 8 partitions per bucket. Stored:
/// never change it on a live keyspace.
pub const SHARDS: i32 = 8;

/// Default of `--cql-seal-grace`: how far behind the clock the watermark is
/// kept. Must exceed the worst clock skew between replicas plus the latency
/// of one index write (at most the request timeout, 5 s by default).
pub const DEFAULT_SEAL_GRACE: Duration = Duration::from_secs(15);

/// How long an index entry may disagree with its record before it counts as
/// stale: longer than any statement can stay in flight (driver timeouts are
/// seconds), so an entry written just before a conditional write that has
/// not landed yet is never deleted under it.
pub(super) const INDEX_GRACE_MS: i64 = 60_000;

/// The stable shard of a key: FNV-1a over `endpoint \0 key`. Stored in the
/// partition key, so it must never change.
pub(super) fn shard_of(endpoint: &str, key: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in endpoint.bytes().chain([0]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i32::try_from(hash % SHARDS.unsigned_abs() as u64).unwrap_or(0)
}

/// The bucket holding due instant `due`.
pub(super) fn bucket_of(due: i64) -> i64 {
    due.div_euclid(BUCKET_MS)
}

/// Where one index entry is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// `pending_buckets`, in this bucket.
    Bucket(i64),
    /// `pending_overdue`.
    Overdue,
}

/// What this replica knows of a tenant's index, to avoid a read per write.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TenantState {
    /// The tenant's `pending_cursor` row exists (created once per process).
    cursor_ready: bool,
    /// The highest watermark this replica has seen (`i64::MIN`: none yet).
    watermark: i64,
    /// When this replica last wrote an entry for the tenant: a busy tenant
    /// is sealed every step, an idle one less often.
    last_put_ms: i64,
}

/// Per-tenant state of this replica, shared by writers, readers and the
/// sealer.
#[derive(Debug, Default)]
pub(super) struct Tenants {
    /// Tenant → state. One entry per tenant seen; tenants are few.
    by_name: Mutex<HashMap<String, TenantState>>,
}

impl Tenants {
    fn get(&self, tenant: &str) -> TenantState {
        self.by_name
            .lock()
            .map(|map| {
                map.get(tenant).copied().unwrap_or(TenantState {
                    watermark: i64::MIN,
                    ..TenantState::default()
                })
            })
            .unwrap_or_default()
    }

    fn update(&self, tenant: &str, change: impl FnOnce(&mut TenantState)) {
        if let Ok(mut map) = self.by_name.lock() {
            let state = map.entry(tenant.to_string()).or_insert(TenantState {
                watermark: i64::MIN,
                ..TenantState::default()
            });
            change(state);
        }
    }

    /// The highest watermark seen for `tenant`, if any.
    pub(super) fn watermark(&self, tenant: &str) -> Option<i64> {
        Some(self.get(tenant).watermark).filter(|w| *w != i64::MIN)
    }

    /// Records a watermark read or written (never moves it back).
    pub(super) fn saw_watermark(&self, tenant: &str, watermark: i64) {
        self.update(tenant, |state| {
            state.cursor_ready = true;
            state.watermark = state.watermark.max(watermark);
        });
    }
}

/// The sealer's timing, derived from the grace so that tests can shrink
/// every interval at once.
#[derive(Debug, Clone, Copy)]
pub struct SealTiming {
    /// How far behind the clock the watermark stays.
    pub grace_ms: i64,
    /// Smallest advance of a busy tenant's watermark; also how often the
    /// maintenance task runs.
    pub step_ms: i64,
    /// Smallest advance of an idle tenant's watermark (one LWT per tenant
    /// per this long, whatever the number of tenants).
    pub idle_step_ms: i64,
}

impl SealTiming {
    /// The timing for a grace: steps of a third of it, between 250 ms and 5 s.
    pub fn for_grace(grace: Duration) -> Self {
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let step_ms = (grace_ms / 3).clamp(250, 5_000);
        Self {
            grace_ms,
            step_ms,
            idle_step_ms: step_ms * 12,
        }
    }
}

impl CqlStore {
    /// Writes the index entry of `record` (if it is due at some point)
    /// before the conditional write that makes it so; returns where.
    pub(super) async fn index_put(
        &self,
        record: &Record,
        now_ms: i64,
    ) -> StoreResult<Option<Slot>> {
        let Some(due) = record.pending_since_ms() else {
            return Ok(None);
        };
        let id = &record.id;
        let mut known = self.tenants.get(&id.tenant);
        if !known.cursor_ready {
            self.create_cursor(&id.tenant, now_ms).await?;
            known = self.tenants.get(&id.tenant);
        }
        let watermark = known.watermark;
        let slot = slot_for_put(record.state, due, watermark, self.timing.step_ms);
        let ttl = ttl_seconds(record.expires_at_ms, now_ms);
        let shard = shard_of(&id.endpoint, &id.key);
        let result = match slot {
            Slot::Bucket(bucket) => {
                self.session
                    .execute_unpaged(
                        &self.statements.bucket_put,
                        (&id.tenant, bucket, shard, due, &id.endpoint, &id.key, ttl),
                    )
                    .await
            }
            Slot::Overdue => {
                self.session
                    .execute_unpaged(
                        &self.statements.overdue_put,
                        (&id.tenant, shard, due, &id.endpoint, &id.key, ttl),
                    )
                    .await
            }
        };
        result.map_err(|e| unavailable("pending index write", e))?;
        self.tenants
            .update(&id.tenant, |state| state.last_put_ms = now_ms);
        Ok(Some(slot))
    }

    /// Creates the tenant's cursor row (once per tenant and process) with a
    /// watermark `grace` behind `now_ms`: below every due instant a claim
    /// can index (claims index `now + lease`).
    async fn create_cursor(&self, tenant: &str, now_ms: i64) -> StoreResult<()> {
        let initial = now_ms - self.timing.grace_ms;
        let result = self
            .session
            .execute_unpaged(&self.statements.cursor_create, (tenant, initial, now_ms))
            .await
            .map_err(|e| unavailable("pending cursor write", e))?;
        // Applied, or the row was there: either way it exists. Its current
        // watermark comes back with a failed `IF NOT EXISTS`.
        let rows = super::rows::named_rows(result)?;
        let watermark = rows
            .first()
            .and_then(|row| match row.get("watermark") {
                Some(Some(CqlValue::BigInt(value))) => Some(*value),
                _ => None,
            })
            .unwrap_or(initial);
        self.tenants.saw_watermark(tenant, watermark);
        Ok(())
    }

    /// Where the entry of a record in `state`, due at `due`, may be. An
    /// IN_PROGRESS entry due long enough ago may have been moved to
    /// `pending_overdue` by the sealer, so it is looked for there too.
    fn slots_of(&self, state: RecordState, due: i64, now_ms: i64) -> Vec<Slot> {
        let mut slots = Vec::with_capacity(2);
        if state == RecordState::InProgress {
            slots.push(Slot::Bucket(bucket_of(due)));
            if due <= now_ms - self.timing.grace_ms / 2 {
                slots.push(Slot::Overdue);
            }
        } else {
            slots.push(Slot::Overdue);
        }
        slots
    }

    /// Best effort: deletes one entry from `slots`; failures are logged at
    /// debug and left for readers.
    pub(super) async fn index_delete(&self, id: &RecordKey, due: i64, slots: &[Slot]) {
        self.cleaner().delete(id, due, slots).await;
    }

    /// What deletes index entries, detached from this store's lifetime.
    fn cleaner(&self) -> Cleaner {
        Cleaner {
            session: Arc::clone(&self.session),
            bucket_delete: self.statements.bucket_delete.clone(),
            overdue_delete: self.statements.overdue_delete.clone(),
        }
    }

    /// After a write that replaced a record in `old_state`, due at
    /// `old_due`, by `new` (or deleted it): drop the entry that no longer
    /// describes the record. An entry at the same due instant may be the
    /// new record's own (same clustering key), so then only the other
    /// table's copy is dropped.
    pub(super) async fn index_after_write(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: Option<&Record>,
        now_ms: i64,
    ) {
        if let Some((due, slots)) = self.stale_after_write(old, new, now_ms) {
            self.index_delete(id, due, &slots).await;
        }
    }

    /// [`CqlStore::index_after_write`] off the reply path, for a write
    /// that made the record COMPLETED: the caller's answer does not wait
    /// for a cleanup that only saves readers a verification. Only then,
    /// because a completed record never enters the index again under the
    /// entry it leaves (it can be claimed again only once expired, with a
    /// later due instant), so the late delete can never remove a newer
    /// entry with the same primary key (writes here carry server
    /// timestamps: the later arrival wins). A crash before the delete lands
    /// leaves a stale entry, as any failed cleanup does. At most
    /// [`DETACHED_CLEANUPS`] run at once; past that the caller waits, so an
    /// overloaded cluster slows the replies instead of growing a queue.
    pub(super) async fn index_after_completion(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: &Record,
        now_ms: i64,
    ) {
        debug_assert_eq!(new.state, RecordState::Completed);
        let Some((due, slots)) = self.stale_after_write(old, Some(new), now_ms) else {
            return;
        };
        let Ok(permit) = Arc::clone(&self.cleanups).try_acquire_owned() else {
            self.index_delete(id, due, &slots).await;
            return;
        };
        let cleaner = self.cleaner();
        let id = id.clone();
        tokio::spawn(async move {
            cleaner.delete(&id, due, &slots).await;
            drop(permit);
        });
    }

    /// Waits (at most `limit`) for the detached cleanups in flight, so a
    /// graceful stop leaves no stale entry behind.
    pub(super) async fn drain_cleanups(&self, limit: Duration) {
        let all = u32::try_from(DETACHED_CLEANUPS).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(limit, self.cleanups.acquire_many(all)).await;
        if drained.is_err() {
            tracing::debug!("pending index cleanups still in flight at close; readers drop them");
        }
    }

    /// The entries made stale by a write (see
    /// [`CqlStore::index_after_write`]): the old due instant and its slots.
    fn stale_after_write(
        &self,
        (old_state, old_due): (RecordState, Option<i64>),
        new: Option<&Record>,
        now_ms: i64,
    ) -> Option<(i64, Vec<Slot>)> {
        let old_due = old_due?;
        match new.filter(|new| new.pending_since_ms() == Some(old_due)) {
            None => Some((old_due, self.slots_of(old_state, old_due, now_ms))),
            Some(new)
                if old_state == RecordState::InProgress && new.state != RecordState::InProgress =>
            {
                Some((old_due, vec![Slot::Bucket(bucket_of(old_due))]))
            }
            // Same table, same row: the new entry is the old one.
            Some(_) => None,
        }
    }
}

/// Detached index cleanups in flight at most (see
/// [`CqlStore::index_after_completion`]): far above what one replica's
/// completions keep in flight while the cluster answers in milliseconds.
pub(super) const DETACHED_CLEANUPS: usize = 1024;

/// What an index delete needs, owned, so it can outlive the request that
/// started it.
pub(super) struct Cleaner {
    /// The store's session.
    session: Arc<Session>,
    /// `pending_buckets` delete.
    bucket_delete: PreparedStatement,
    /// `pending_overdue` delete.
    overdue_delete: PreparedStatement,
}

impl Cleaner {
    /// Best effort: deletes the entry (`due`, endpoint, key) from each of
    /// `slots`; failures are logged at debug and left for readers.
    async fn delete(&self, id: &RecordKey, due: i64, slots: &[Slot]) {
        let shard = shard_of(&id.endpoint, &id.key);
        for slot in slots {
            let result = match slot {
                Slot::Bucket(bucket) => {
                    self.session
                        .execute_unpaged(
                            &self.bucket_delete,
                            (&id.tenant, *bucket, shard, due, &id.endpoint, &id.key),
                        )
                        .await
                }
                Slot::Overdue => {
                    self.session
                        .execute_unpaged(
                            &self.overdue_delete,
                            (&id.tenant, shard, due, &id.endpoint, &id.key),
                        )
                        .await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "pending index cleanup failed; left for lazy removal");
            }
        }
    }
}

/// Where a new entry goes: FAILED/UNKNOWN entries (due at once) to the
/// overdue partition; IN_PROGRESS ones to their bucket, unless their due
/// instant is within a step of the last watermark seen (a writer whose clock
/// lags the sealer's), where the bucket may be sealed before they land.
fn slot_for_put(state: RecordState, due: i64, watermark: i64, step_ms: i64) -> Slot {
    if state != RecordState::InProgress || due < watermark.saturating_add(step_ms) {
        Slot::Overdue
    } else {
        Slot::Bucket(bucket_of(due))
    }
}

/// What an index entry says about its record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EntryVerdict {
    /// The record is due and this is its entry.
    Pending,
    /// The entry no longer describes the record: delete it.
    Stale,
    /// Not due, but a write may be in flight: leave it.
    Keep,
}

pub(super) fn classify_entry(due: i64, record: Option<&Record>, now_ms: i64) -> EntryVerdict {
    let old_enough = due < now_ms - INDEX_GRACE_MS;
    match record {
        Some(record) if record.state == RecordState::Completed => EntryVerdict::Stale,
        Some(record) => match record.pending_since_ms() {
            Some(since) if since == due && record.needs_decision(now_ms) => EntryVerdict::Pending,
            // The record moved past this entry (a later due instant, written
            // before the write that set it).
            Some(since) if since > due => EntryVerdict::Stale,
            _ if old_enough => EntryVerdict::Stale,
            _ => EntryVerdict::Keep,
        },
        // Absent: released, expired, or a claim still in flight.
        None if old_enough => EntryVerdict::Stale,
        None => EntryVerdict::Keep,
    }
}

pub(super) fn index_entry(row: &NamedRow) -> StoreResult<(i64, String, String)> {
    let bad = || StoreError::Corrupt("malformed pending index entry".to_string());
    let due = match row.get("due_at") {
        Some(Some(CqlValue::BigInt(due))) => *due,
        _ => return Err(bad()),
    };
    let text = |name: &str| match row.get(name) {
        Some(Some(CqlValue::Text(value))) => Ok(value.clone()),
        _ => Err(bad()),
    };
    Ok((due, text("endpoint")?, text("key")?))
}

/// A ListPending page token of this backend: `day (i32) | due_at (i64,
/// sign bit flipped) | endpoint | key`, big-endian, strings as a u16 length
/// and their bytes. Opaque to callers and owned here: no other backend
/// reads it. (Byte-identical to the tokens of 0.1.0, which borrowed the
/// embedded store's pending-key encoding, so pages in flight across an
/// upgrade keep working.)
pub(super) fn encode_token(day: i32, cursor: &(i64, String, String)) -> Vec<u8> {
    let (due, endpoint, key) = cursor;
    let mut out = Vec::with_capacity(16 + endpoint.len() + key.len());
    out.extend_from_slice(&day.to_be_bytes());
    out.extend_from_slice(&((*due as u64) ^ (1 << 63)).to_be_bytes());
    for part in [endpoint, key] {
        // Endpoints and keys are validated far below 64 KiB.
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&part.as_bytes()[..usize::from(len)]);
    }
    out
}

/// Inverse of [`encode_token`]; `None` for anything it did not make.
pub(super) fn decode_token(token: &[u8]) -> Option<(i32, (i64, String, String))> {
    fn take_text(input: &mut &[u8]) -> Option<String> {
        let (len, rest) = input.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        if rest.len() < len {
            return None;
        }
        let (text, rest) = rest.split_at(len);
        *input = rest;
        String::from_utf8(text.to_vec()).ok()
    }
    let (day, rest) = token.split_first_chunk::<4>()?;
    let (due, mut rest) = rest.split_first_chunk::<8>()?;
    let due = (u64::from_be_bytes(*due) ^ (1 << 63)) as i64;
    let endpoint = take_text(&mut rest)?;
    let key = take_text(&mut rest)?;
    rest.is_empty()
        .then(|| (i32::from_be_bytes(*day), (due, endpoint, key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordKey;

    fn record(state: RecordState, lease: i64, updated: i64) -> Record {
        Record {
            id: RecordKey {
                tenant: "t".into(),
                endpoint: "e".into(),
                key: "k".into(),
            },
            state,
            fingerprint: vec![],
            attempt: 1,
            lease_token: "tok".into(),
            attempt_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: updated,
            lease_expires_at_ms: lease,
            completed_at_ms: None,
            expires_at_ms: i64::MAX,
            response: None,
            reason: String::new(),
        }
    }

    #[test]
    fn index_entries_are_verified_against_records() {
        let now = 1_000_000;
        let expired_lease = record(RecordState::InProgress, 900_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&expired_lease), now),
            EntryVerdict::Pending
        );
        // An older lease entry after ExtendLease moved it.
        let extended = record(RecordState::InProgress, 990_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&extended), now),
            EntryVerdict::Stale
        );
        // An entry written for an extension whose write has not landed yet.
        let not_yet = record(RecordState::InProgress, 800_000, 0);
        assert_eq!(
            classify_entry(999_000, Some(&not_yet), now),
            EntryVerdict::Keep
        );
        assert_eq!(
            classify_entry(999_000 - INDEX_GRACE_MS - 1, Some(&not_yet), now + 200_000),
            EntryVerdict::Stale
        );
        let done = record(RecordState::Completed, 900_000, 950_000);
        assert_eq!(
            classify_entry(900_000, Some(&done), now),
            EntryVerdict::Stale
        );
        let unknown = record(RecordState::Unknown, 900_000, 950_000);
        assert_eq!(
            classify_entry(950_000, Some(&unknown), now),
            EntryVerdict::Pending
        );
        assert_eq!(
            classify_entry(900_000, Some(&unknown), now),
            EntryVerdict::Stale
        );
        // Absent record: a claim may be in flight, unless the entry is old.
        assert_eq!(classify_entry(999_000, None, now), EntryVerdict::Keep);
        assert_eq!(
            classify_entry(now - INDEX_GRACE_MS - 1, None, now),
            EntryVerdict::Stale
        );
    }

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let cursor = (123_456, "POST /x".to_string(), "k-1".to_string());
        assert_eq!(
            decode_token(&encode_token(20_000, &cursor)),
            Some((20_000, cursor))
        );
        assert_eq!(decode_token(&[1, 2]), None);
        assert_eq!(decode_token(&[0, 0, 0, 1, 9]), None);
        // A token as 0.1.0 wrote it still decodes: day 1, due 2, "e", "k".
        let v010 = [
            0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 1, b'e', 0, 1, b'k',
        ];
        assert_eq!(
            decode_token(&v010),
            Some((1, (2, "e".to_string(), "k".to_string())))
        );
        assert_eq!(encode_token(1, &(2, "e".into(), "k".into())), v010);
        let mut trailing = v010.to_vec();
        trailing.push(0);
        assert_eq!(decode_token(&trailing), None);
    }
}
