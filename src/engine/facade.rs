//! The [`Engine`]: the public face of the state machine, one method per
//! RPC. It owns the [`Core`] (the parts every operation works on) and
//! hands each call to the view of its family: [`Claims`] (`claim.rs`),
//! [`LeaseHolder`] (`finish.rs`), [`Reconciler`] (`reconcile.rs`) and
//! [`Trail`] (`transitions.rs`). So every type's `impl` is in its own file,
//! and a reader following an RPC finds its entry point here and its work in
//! the file the view names.

use std::sync::Arc;

use super::claim::Claims;
use super::core::Core;
use super::finish::LeaseHolder;
use super::reconcile::Reconciler;
use super::skew;
use super::transitions::Trail;
use super::{
    AuditRequest, ClaimInput, ClaimResult, Disposition, EngineResult, PendingInput, PendingSummary,
    PolicySet, ReconcileResult, Verdict,
};
use crate::audit::{AuditEvent, AuditLog};
use crate::clock::SharedClock;
use crate::store::{Record, Store, StoredResponse};

/// The engine. One per process, shared by every RPC.
///
/// Every method is an entry point that hands the call to [`Core`] or to
/// one of its views (module docs); the work is in the view's file.
pub struct Engine {
    /// The parts every operation works on; the views borrow it per call.
    core: Core,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("core", &self.core).finish()
    }
}

impl Engine {
    /// An engine over `store`.
    pub fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        policies: Arc<PolicySet>,
        cache_bytes: usize,
    ) -> Self {
        Self {
            core: Core::new(store, clock, policies, cache_bytes),
        }
    }

    /// Limits each tenant to `rate` new keys per second (bursts of `burst`);
    /// a rate of 0 leaves key creation unlimited.
    #[must_use]
    pub fn with_claim_limit(self, rate: f64, burst: u32) -> Self {
        Self {
            core: self.core.with_claim_limit(rate, burst),
        }
    }

    /// Appends the transitions of audited endpoints to `audit`.
    #[must_use]
    pub fn with_audit(self, audit: Arc<dyn AuditLog>) -> Self {
        Self {
            core: self.core.with_audit(audit),
        }
    }

    /// The audit log, when one is open.
    pub fn audit(&self) -> Option<&Arc<dyn AuditLog>> {
        self.core.audit()
    }

    /// The store this engine writes to.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.core.store()
    }

    /// Lookup: the live record.
    pub async fn lookup(&self, tenant: &str, endpoint: &str, key: &str) -> EngineResult<Record> {
        self.core.lookup(tenant, endpoint, key).await
    }

    /// How often [`Engine::maintain_store`] should run (`None`: never).
    pub fn store_maintenance_interval(&self) -> Option<std::time::Duration> {
        self.core.store_maintenance_interval()
    }

    /// The store's background upkeep, at the engine's clock (see
    /// [`Store::maintain`]).
    /// Also measures this replica's clock against the cluster's first
    /// (see [`super::skew`]); a failed measurement keeps the last one.
    pub async fn maintain_store(&self) -> EngineResult<()> {
        self.core.maintain_store().await
    }

    /// Measures this replica's clock against the cluster's, when the store
    /// has one and the engine's clock follows real time (see [`super::skew`]).
    pub async fn measure_clock(&self) -> EngineResult<()> {
        self.core.measure_clock().await
    }

    /// This replica's last measured clock offset against the cluster's.
    pub fn clock_offset(&self) -> Option<skew::Offset> {
        self.core.clock_offset()
    }

    /// Removes expired records, then audit events past their retention, in
    /// steps of [`super::SWEEP_STEP`] until a step finds fewer due; returns how
    /// many. The only sweep loop: stores and the audit log remove at most
    /// what one call asks for.
    pub async fn sweep_expired(&self) -> EngineResult<usize> {
        self.core.sweep_expired().await
    }

    /// Claim: see the module docs and `proto/idemd/v1/idempotency.proto`.
    pub async fn claim(&self, tenant: &str, input: ClaimInput) -> EngineResult<ClaimResult> {
        Claims(&self.core).claim(tenant, input).await
    }

    /// Complete: store the response of a claimed execution.
    /// Returns the record's (unchanged) expiry.
    pub async fn complete(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
        lease_token: &str,
        response: StoredResponse,
    ) -> EngineResult<i64> {
        LeaseHolder(&self.core)
            .complete(tenant, endpoint, key, lease_token, response)
            .await
    }

    /// Fail: end a claimed execution without a response.
    pub async fn fail(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
        lease_token: &str,
        disposition: Option<Disposition>,
        reason: &str,
    ) -> EngineResult<()> {
        LeaseHolder(&self.core)
            .fail(tenant, endpoint, key, lease_token, disposition, reason)
            .await
    }

    /// ExtendLease: push the holder's lease out (never past the expiry).
    pub async fn extend_lease(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
        lease_token: &str,
        lease_ms: Option<i64>,
    ) -> EngineResult<i64> {
        LeaseHolder(&self.core)
            .extend_lease(tenant, endpoint, key, lease_token, lease_ms)
            .await
    }

    /// ListPending: records that need a decision.
    pub async fn list_pending(
        &self,
        tenant: &str,
        input: PendingInput,
    ) -> EngineResult<crate::store::PendingPage> {
        Reconciler(&self.core).list_pending(tenant, input).await
    }

    /// Reconcile: decide a pending record.
    pub async fn reconcile(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
        verdict: Option<Verdict>,
    ) -> EngineResult<ReconcileResult> {
        Reconciler(&self.core)
            .reconcile(tenant, endpoint, key, verdict)
            .await
    }

    /// Counts the tenant's records that need a decision, by state, and the
    /// age of the oldest: the backend's own summary when it keeps one (CQL:
    /// one replica counts, every replica reads a row), else read from the
    /// index, at most `max_records` of it.
    pub async fn pending_summary(
        &self,
        tenant: &str,
        max_records: usize,
    ) -> EngineResult<PendingSummary> {
        Reconciler(&self.core)
            .pending_summary(tenant, max_records)
            .await
    }

    /// A page of the tenant's audit events: one key's history when `key` is
    /// set, else the tenant's timeline (optionally one endpoint's), oldest
    /// first, starting after `page_token` or at `since_ms`.
    pub async fn audit_events(
        &self,
        tenant: &str,
        query: AuditRequest,
    ) -> EngineResult<(Vec<AuditEvent>, Option<String>)> {
        Trail(&self.core).audit_events(tenant, query).await
    }
}
