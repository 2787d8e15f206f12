//! The [`Index`]: what one store holds to keep its pending
//! index (statements, this replica's view of each tenant, the sealer's
//! timing), construction, and what a record write adds to the index. The
//! module docs of [`super`] describe the tables and why a crash never hides
//! a pending record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use scylla::client::session::Session;
use scylla::value::CqlValue;

use super::super::session::{CqlOptions, rows, ttl_seconds, unavailable};
use super::cleaner::Cleaner;
use super::entry::{Slot, shard_of, slot_for_put};
use super::legacy;
use super::statements::Statements;
use crate::store::{Record, StoreResult};

/// What this replica knows of a tenant's index, to avoid a read per write.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TenantState {
    /// The tenant's `pending_cursor` row exists (created once per process).
    pub(super) cursor_ready: bool,
    /// The highest watermark this replica has seen (`i64::MIN`: none yet).
    pub(super) watermark: i64,
    /// When this replica last wrote an entry for the tenant: a busy tenant
    /// is sealed every step, an idle one less often.
    pub(super) last_put_ms: i64,
}

/// Per-tenant state of this replica, shared by writers, readers and the
/// sealer.
#[derive(Debug, Default)]
pub(super) struct Tenants {
    /// Tenant → state. One entry per tenant seen; tenants are few.
    pub(super) by_name: Mutex<HashMap<String, TenantState>>,
}

impl Tenants {
    pub(super) fn get(&self, tenant: &str) -> TenantState {
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

    pub(super) fn update(&self, tenant: &str, change: impl FnOnce(&mut TenantState)) {
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

/// What every pass over the pending index works on: the session, the
/// prepared statements, this replica's view of each tenant, the sealer's
/// timing; with its construction and what a record write adds to the
/// index. [`super::PendingIndex`] owns one; each pass is a view of it
/// (`Scan`, `Sealer`, `Cleanup`), so none holds a copy of these handles.
pub(super) struct Index {
    /// The store's session.
    pub(super) session: Arc<Session>,
    /// Prepared once at start.
    pub(super) statements: Statements,
    /// What this replica knows of each tenant's index.
    pub(super) tenants: Tenants,
    /// The sealer's grace and steps.
    pub(super) timing: SealTiming,
    /// This replica's name in `pending_cursor.sealed_by` (host and pid).
    pub(super) replica: String,
    /// The longest ttl a policy allows, in seconds: the TTL of an entry the
    /// sealer copies for a record whose expiry it cannot read.
    pub(super) max_ttl_seconds: i32,
    /// Deletes stale entries, on the reply path or after it.
    pub(super) cleaner: Cleaner,
    /// Held while a tenant's cursor row is created, so that the first
    /// claims of a tenant arriving together send one `IF NOT EXISTS` LWT
    /// and wait for it, instead of each sending its own to the same
    /// partition: N Paxos rounds contending on one row time out under load
    /// (64 in flight on a busy node did), and each timeout failed a Claim.
    /// One lock for every tenant: creation happens once per tenant and
    /// process, and tenants are few.
    pub(super) cursor_creation: tokio::sync::Mutex<()>,
    /// Cursor rows this replica asked to create: one per tenant and
    /// process when the creation is single-flight (tests check it).
    pub(super) cursors_created: std::sync::atomic::AtomicU64,
    /// Migration 1's index, which the sealer keeps copying from while
    /// replicas of an older release may write it (`None`: the keyspace no
    /// longer has it).
    pub(super) legacy: Option<legacy::LegacyIndex>,
    /// Every tenant's stored summary as this replica's sealer last scanned
    /// the cursors (it scans them every step), so that the gauges, which
    /// ask for each tenant every 15 s, cost no read of their own.
    pub(super) summaries: Mutex<Option<ScannedSummaries>>,
}

/// The summaries of one scan of `pending_cursor`.
pub(super) struct ScannedSummaries {
    /// When the scan was made.
    pub(super) at: std::time::Instant,
    /// Tenant → its stored summary (`None`: none computed yet). A tenant
    /// missing here had no cursor.
    pub(super) by_tenant: HashMap<String, Option<crate::store::PendingCounts>>,
}

/// This process's name in the rows it writes for other replicas to read.
fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}

impl Index {
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
