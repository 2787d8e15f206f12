//! The pending index: what ListPending reads instead of scanning
//! `records`. [`PendingIndex`] owns its statements, what this replica knows
//! of each tenant's index, and the sealer's timing; it writes an entry
//! before the record write that makes a record due (here), deletes the
//! entries a write made stale ([`cleanup`]), serves ListPending ([`scan`])
//! and keeps every tenant's watermark behind the clock ([`seal`]). What an
//! entry is and says is in [`entry`]; migration 1's `pending_index`, which
//! replicas of older releases still write during a rollout, in [`legacy`]. Entries are verified against the record
//! table (`records::Records`) wherever they are read, so the index may hold
//! extra entries, never miss one.
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

mod cleanup;
mod entry;
pub(super) mod legacy;
mod scan;
mod seal;
mod statements;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use scylla::client::session::Session;
use scylla::value::CqlValue;

use super::session::{CqlOptions, rows, ttl_seconds, unavailable};
use crate::store::{Record, StoreResult};
use cleanup::Cleaner;
pub(super) use entry::Slot;
use entry::{shard_of, slot_for_put};
pub use seal::SealReport;
use statements::Statements;

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

/// What this replica knows of a tenant's index, to avoid a read per write.
#[derive(Debug, Default, Clone, Copy)]
struct TenantState {
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
struct Tenants {
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
    fn watermark(&self, tenant: &str) -> Option<i64> {
        Some(self.get(tenant).watermark).filter(|w| *w != i64::MIN)
    }

    /// Records a watermark read or written (never moves it back).
    fn saw_watermark(&self, tenant: &str, watermark: i64) {
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

/// The pending index of one store (see the module docs).
///
/// # Where its methods live
///
/// `impl PendingIndex` is split by pass, as CODE_STYLE.md allows for a
/// service's front type: this file (construction, what a write adds to the
/// index), `scan.rs` (ListPending's read of the buckets), `seal.rs` (the
/// sealer that moves watermarks and overdue entries), `cleanup.rs` (the
/// removal of entries whose record moved on). The passes share the
/// prepared statements and the session this type holds.
pub(super) struct PendingIndex {
    /// The store's session.
    session: Arc<Session>,
    /// Prepared once at start.
    statements: Statements,
    /// What this replica knows of each tenant's index.
    tenants: Tenants,
    /// The sealer's grace and steps.
    timing: SealTiming,
    /// This replica's name in `pending_cursor.sealed_by` (host and pid).
    replica: String,
    /// The longest ttl a policy allows, in seconds: the TTL of an entry the
    /// sealer copies for a record whose expiry it cannot read.
    max_ttl_seconds: i32,
    /// Deletes stale entries, on the reply path or after it.
    cleaner: Cleaner,
    /// Held while a tenant's cursor row is created, so that the first
    /// claims of a tenant arriving together send one `IF NOT EXISTS` LWT
    /// and wait for it, instead of each sending its own to the same
    /// partition: N Paxos rounds contending on one row time out under load
    /// (64 in flight on a busy node did), and each timeout failed a Claim.
    /// One lock for every tenant: creation happens once per tenant and
    /// process, and tenants are few.
    cursor_creation: tokio::sync::Mutex<()>,
    /// Cursor rows this replica asked to create: one per tenant and
    /// process when the creation is single-flight (tests check it).
    cursors_created: std::sync::atomic::AtomicU64,
    /// Migration 1's index, which the sealer keeps copying from while
    /// replicas of an older release may write it (`None`: the keyspace no
    /// longer has it).
    legacy: Option<legacy::LegacyIndex>,
    /// Every tenant's stored summary as this replica's sealer last scanned
    /// the cursors (it scans them every step), so that the gauges, which
    /// ask for each tenant every 15 s, cost no read of their own.
    summaries: Mutex<Option<ScannedSummaries>>,
}

/// The summaries of one scan of `pending_cursor`.
struct ScannedSummaries {
    /// When the scan was made.
    at: std::time::Instant,
    /// Tenant → its stored summary (`None`: none computed yet). A tenant
    /// missing here had no cursor.
    by_tenant: HashMap<String, Option<crate::store::PendingCounts>>,
}

/// This process's name in the rows it writes for other replicas to read.
fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}

impl PendingIndex {
    /// Prepares the index's statements on `session`.
    pub(super) async fn open(session: Arc<Session>, options: &CqlOptions) -> StoreResult<Self> {
        let statements = Statements::prepare(&session, &options.keyspace).await?;
        let cleaner = Cleaner::new(
            Arc::clone(&session),
            statements.bucket_delete.clone(),
            statements.overdue_delete.clone(),
        );
        let legacy = match legacy::LegacyIndex::prepare(&session, &options.keyspace).await {
            Ok(legacy) => Some(legacy),
            Err(error) => {
                tracing::info!(%error, "no pending_index of migration 1 to follow");
                None
            }
        };
        Ok(Self {
            session,
            statements,
            tenants: Tenants::default(),
            timing: SealTiming::for_grace(options.seal_grace),
            replica: replica_name(),
            max_ttl_seconds: i32::try_from(options.max_ttl.as_secs()).unwrap_or(i32::MAX),
            cleaner,
            cursor_creation: tokio::sync::Mutex::new(()),
            cursors_created: std::sync::atomic::AtomicU64::new(0),
            legacy,
            summaries: Mutex::new(None),
        })
    }

    /// How many cursor rows this replica asked to create.
    pub(super) fn cursors_created(&self) -> u64 {
        self.cursors_created
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How often the sealer should run: its step.
    pub(super) fn step(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.timing.step_ms).unwrap_or(5_000))
    }

    /// Writes the index entry of `record` (if it is due at some point)
    /// before the conditional write that makes it so; returns where.
    pub(super) async fn put(&self, record: &Record, now_ms: i64) -> StoreResult<Option<Slot>> {
        let Some(due) = record.pending_since_ms() else {
            return Ok(None);
        };
        let id = &record.id;
        let mut known = self.tenants.get(&id.tenant);
        if !known.cursor_ready {
            let _creating = self.cursor_creation.lock().await;
            // Another claim may have created it while this one waited.
            if !self.tenants.get(&id.tenant).cursor_ready {
                self.create_cursor(&id.tenant, now_ms).await?;
            }
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
        self.cursors_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let initial = now_ms - self.timing.grace_ms;
        let result = self
            .session
            .execute_unpaged(&self.statements.cursor_create, (tenant, initial, now_ms))
            .await
            .map_err(|e| unavailable("pending cursor write", e))?;
        // Applied, or the row was there: either way it exists. Its current
        // watermark comes back with a failed `IF NOT EXISTS`.
        let rows = rows::named_rows(result)?;
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
}
