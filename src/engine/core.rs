//! The [`Engine`] itself: its parts, construction, the reads every
//! operation shares (identity, the completed cache, Lookup), the sweeps,
//! and the small helpers each operation's file uses. The operations are in
//! the sibling files named in the type's docs.

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;

use crate::audit::AuditLog;
use crate::clock::SharedClock;
use crate::fingerprint;
use crate::store::{Record, RecordKey, Store};

use super::cache::CompletedCache;
use super::existing::ExistingKeys;
use super::granted::Granted;
use super::skew::{self, Skew};
use super::waiters::Waiters;
use super::{
    ClaimLimiter, EngineError, EngineResult, Lease, PolicySet, PreconditionReason, validate,
};

/// How often a conditional write may lose a race before the operation gives
/// up with [`EngineError::Contention`]. Each loss means another caller made
/// progress on the same key, so a handful is plenty.
pub(super) const MAX_CAS_ROUNDS: usize = 8;

/// Expired records (or audit events) one sweep step asks a store to remove.
/// One step is one write of the embedded store's single writer, which every
/// Claim and Complete queue behind: at ~6 µs a record, 100 hold it ~0.6 ms,
/// where 1,000 held it ~6 ms and set the tail latency of the writes behind
/// it (docs/benchmarks.md, "The expiry path"). Backends with native TTL
/// remove nothing and return at once.
pub const SWEEP_STEP: usize = 100;

/// Default and maximum ListPending page sizes.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest ListPending page.
pub const MAX_PAGE_SIZE: usize = 1000;

/// What every operation works on: the store, the clock, the policies,
/// the caches and the waiters, with the reads they share (identity, the
/// completed cache, Lookup) and the sweeps. One per process, inside the
/// [`super::Engine`]; each family of operations is a view of it
/// (`Claims`, `LeaseHolder`, `Reconciler`, `Trail`), so none holds a copy
/// of these handles.
pub struct Core {
    /// Where records live.
    pub(super) store: Arc<dyn Store>,
    /// What "now" is; injectable for tests.
    pub(super) clock: SharedClock,
    /// Per-endpoint knobs.
    pub(super) policies: Arc<PolicySet>,
    /// Claims waiting on in-flight duplicates.
    pub(super) waiters: Waiters,
    /// Completed records, for cheap replays.
    pub(super) cache: CompletedCache,
    /// Keys seen to exist: their next Claim reads before it inserts, so a
    /// duplicate costs no conditional write (see [`super::existing`]).
    pub(super) existing: ExistingKeys,
    /// Claims granted here and not finished yet: a holder's Complete, Fail
    /// or ExtendLease skips its read (see [`super::granted`]).
    pub(super) granted: Granted,
    /// Where transitions of audited endpoints are appended; `None` when no
    /// endpoint is audited.
    pub(super) audit: Option<Arc<dyn AuditLog>>,
    /// Per-tenant limit on creating keys; `None` = unlimited.
    pub(super) claim_limiter: Option<ClaimLimiter>,
    /// This replica's clock against the cluster's: a replica that may be
    /// too far off takes no lease over (see [`super::skew`]).
    pub(super) skew: Skew,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("store", &self.store.backend_name())
            .finish_non_exhaustive()
    }
}

pub(super) fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A fresh fencing token: 128 bits from the thread-local CSPRNG (ChaCha,
/// seeded from the OS), hex-encoded.
pub(super) fn new_lease_token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

pub(super) fn key_hash(id: &RecordKey) -> String {
    fingerprint::short_hash(id.key.as_bytes())
}

impl Core {
    /// An engine over `store`.
    pub(super) fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        policies: Arc<PolicySet>,
        cache_bytes: usize,
    ) -> Self {
        // A test's manual clock is as far off any cluster as the test moves
        // it: nothing to measure.
        let skew = Skew::new(store.has_cluster_clock() && clock.follows_real_time());
        let existing = ExistingKeys::new(!store.read_before_insert());
        Self {
            granted: Granted::default(),
            store,
            clock,
            policies,
            waiters: Waiters::default(),
            cache: CompletedCache::new(cache_bytes),
            existing,
            audit: None,
            claim_limiter: None,
            skew,
        }
    }

    /// Limits each tenant to `rate` new keys per second (bursts of `burst`);
    /// a rate of 0 leaves key creation unlimited.
    #[must_use]
    pub(super) fn with_claim_limit(mut self, rate: f64, burst: u32) -> Self {
        self.claim_limiter = (rate > 0.0).then(|| ClaimLimiter::new(rate, burst));
        self
    }

    /// Appends the transitions of audited endpoints to `audit`.
    #[must_use]
    pub(super) fn with_audit(mut self, audit: Arc<dyn AuditLog>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The audit log, when one is open.
    pub(super) fn audit(&self) -> Option<&Arc<dyn AuditLog>> {
        self.audit.as_ref()
    }

    /// The store this engine writes to.
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(super) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    pub(super) fn record_key(tenant: &str, endpoint: &str, key: &str) -> RecordKey {
        RecordKey {
            tenant: tenant.to_string(),
            endpoint: endpoint.to_string(),
            key: key.to_string(),
        }
    }

    /// Validates the identity fields common to every keyed RPC.
    pub(super) fn identity(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
    ) -> EngineResult<RecordKey> {
        validate::tenant("tenant", tenant)?;
        validate::endpoint(endpoint)?;
        validate::key(key)?;
        Ok(Self::record_key(tenant, endpoint, key))
    }

    /// The completed record for `id` from this replica's cache, if any.
    pub(super) fn cached(&self, id: &RecordKey, now_ms: i64) -> Option<Record> {
        self.cache.get(id, now_ms).map(|cached| (*cached).clone())
    }

    /// The live record: from the cache when it holds it completed, else
    /// from the store (a completed record read is cached).
    pub(super) async fn read(&self, id: &RecordKey, now_ms: i64) -> EngineResult<Option<Record>> {
        if let Some(cached) = self.cached(id, now_ms) {
            return Ok(Some(cached));
        }
        let record = self.store.get(id, now_ms).await?;
        if let Some(record) = &record {
            self.cache.insert(record);
        }
        Ok(record)
    }

    /// Reads the live record and checks the caller's fence.
    pub(super) async fn fenced(
        &self,
        id: &RecordKey,
        lease_token: &str,
        now: i64,
    ) -> EngineResult<Option<Record>> {
        let record = self.store.get(id, now).await?;
        match record {
            Some(record) if record.lease_token != lease_token => Err(EngineError::precondition(
                PreconditionReason::LeaseLost,
                "the lease token is not the current holder's (never issued, or fenced out by a takeover)",
            )),
            other => Ok(other),
        }
    }

    /// Lookup: the live record.
    pub(super) async fn lookup(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
    ) -> EngineResult<Record> {
        let id = self.identity(tenant, endpoint, key)?;
        self.read(&id, self.now())
            .await?
            .ok_or_else(|| EngineError::NotFound("no record for this key".to_string()))
    }

    /// How often [`Core::maintain_store`] should run (`None`: never).
    pub(super) fn store_maintenance_interval(&self) -> Option<std::time::Duration> {
        self.store.maintenance_interval()
    }

    /// The store's background upkeep, at the engine's clock (see
    /// [`Store::maintain`]).
    /// Also measures this replica's clock against the cluster's first
    /// (see [`super::skew`]); a failed measurement keeps the last one.
    pub(super) async fn maintain_store(&self) -> EngineResult<()> {
        if let Err(error) = self.measure_clock().await {
            tracing::debug!(%error, "clock offset not measured");
        }
        Ok(self.store.maintain(self.now()).await?)
    }

    /// Measures this replica's clock against the cluster's, when the store
    /// has one and the engine's clock follows real time (see [`super::skew`]).
    pub(super) async fn measure_clock(&self) -> EngineResult<()> {
        if self.skew.required() {
            self.skew.measure(self.store.as_ref(), &self.clock).await?;
        }
        Ok(())
    }

    /// This replica's last measured clock offset against the cluster's.
    pub(super) fn clock_offset(&self) -> Option<skew::Offset> {
        self.skew.last()
    }

    /// Removes expired records, then audit events past their retention, in
    /// steps of [`SWEEP_STEP`] until a step finds fewer due; returns how
    /// many. The only sweep loop: stores and the audit log remove at most
    /// what one call asks for.
    pub(super) async fn sweep_expired(&self) -> EngineResult<usize> {
        let mut total = 0;
        loop {
            let removed = self.store.sweep_expired(self.now(), SWEEP_STEP).await?;
            total += removed;
            if removed < SWEEP_STEP {
                break;
            }
        }
        if let Some(audit) = &self.audit {
            loop {
                let removed = audit.sweep(self.now(), SWEEP_STEP).await?;
                total += removed;
                if removed < SWEEP_STEP {
                    break;
                }
            }
        }
        Ok(total)
    }
}

pub(super) fn lease_of(record: &Record) -> Lease {
    Lease {
        lease_token: record.lease_token.clone(),
        lease_expires_at_ms: record.lease_expires_at_ms,
        attempt: record.attempt,
        expires_at_ms: record.expires_at_ms,
    }
}

pub(super) fn not_in_progress(record: &Record) -> EngineError {
    EngineError::precondition(
        PreconditionReason::NotInProgress,
        format!(
            "the record is {}; only Reconcile can decide it now",
            record.state.as_str()
        ),
    )
}

/// A fenced call on a key with no live claim.
pub(super) fn no_live_claim() -> EngineError {
    EngineError::NotFound("no live claim for this key (it expired or was released)".to_string())
}

pub(super) fn contention() -> EngineError {
    EngineError::Contention("the key changed concurrently too many times; retry".to_string())
}
