//! The idempotency engine: the state machine of a key, independent of both
//! the wire protocol and the storage backend.
//!
//! ```text
//!             Claim (absent)                Complete (token)
//!   (none) ─────────────────▶ IN_PROGRESS ─────────────────▶ COMPLETED ──▶ expired
//!     ▲                        │   │  │ lease expires:                        (gone)
//!     │ Fail RELEASE /         │   │  │ Claim → pending (reconcile policy)
//!     │ Reconcile released     │   │  │       → takeover (attempt+1)
//!     └────────────────────────┘   │  └──────────────────┐
//!                 Fail UNKNOWN ────┘   Fail FAILED ──────▶ UNKNOWN / FAILED
//!                                                         │ Reconcile: committed →
//!                                                         │ COMPLETED, released →
//!                                                         │ (none), failed → FAILED,
//!                                                         │ takeover → IN_PROGRESS
//! ```
//!
//! Every write is a conditional write against the state and lease token the
//! engine read (see [`crate::store::Store`]); a lost race re-reads and
//! re-decides, so the same code is correct on a single-node store and on a
//! replicated one. The full diagram is in `docs/design.md`.

pub mod cache;
pub mod error;
pub mod limits;
pub mod policy;
pub mod validate;
pub mod waiters;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;

use crate::audit::{AuditCursor, AuditEvent, AuditLog, AuditQuery};
use crate::clock::SharedClock;
use crate::fingerprint::{self, FingerprintError, RequestParts};
use crate::store::{
    CasOutcome, Expected, InsertOutcome, PendingQuery, Record, RecordKey, RecordState, Store,
    StoredResponse,
};

pub use error::{EngineError, EngineResult, PreconditionReason};
pub use limits::ClaimLimiter;
pub use policy::{ExpiredLeasePolicy, Policy, PolicySet};

use cache::CompletedCache;
use waiters::Waiters;

/// How often a conditional write may lose a race before the operation gives
/// up with [`EngineError::Contention`]. Each loss means another caller made
/// progress on the same key, so a handful is plenty.
const MAX_CAS_ROUNDS: usize = 8;

/// The `retry_after` hint given with `in_progress` (bounded by the holder's
/// remaining lease).
const RETRY_AFTER_HINT: Duration = Duration::from_secs(1);

/// Re-read interval bounds while waiting for an in-flight duplicate.
const WAIT_POLL_MIN: Duration = Duration::from_millis(50);
const WAIT_POLL_MAX: Duration = Duration::from_secs(1);

/// Default and maximum ListPending page sizes.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest ListPending page.
pub const MAX_PAGE_SIZE: usize = 1000;

/// What identifies a request's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintInput {
    /// The server computes fingerprint v1.
    Request {
        /// HTTP method.
        method: String,
        /// Path.
        path: String,
        /// Body bytes.
        body: Vec<u8>,
        /// Media type.
        content_type: String,
        /// Request-specific volatile fields.
        ignore_fields: Vec<String>,
    },
    /// A digest computed by the caller (must be 32 bytes).
    Sha256(Vec<u8>),
    /// The caller sent neither (an error).
    Missing,
}

/// A Claim call. Durations are signed milliseconds as sent (`None` when
/// absent) so that validation sees negative values.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    /// Logical endpoint.
    pub endpoint: String,
    /// Idempotency key.
    pub key: String,
    /// Request fingerprint source.
    pub fingerprint: FingerprintInput,
    /// Requested lease.
    pub lease_ms: Option<i64>,
    /// Requested dedup window.
    pub ttl_ms: Option<i64>,
    /// How long to wait for an in-flight duplicate.
    pub wait_ms: Option<i64>,
    /// Identifies this Claim call across transport retries.
    pub attempt_id: String,
}

/// A lease handed to a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Fencing token.
    pub lease_token: String,
    /// When the lease runs out.
    pub lease_expires_at_ms: i64,
    /// Execution attempt number.
    pub attempt: u32,
    /// When the record expires.
    pub expires_at_ms: i64,
}

/// What a Claim tells the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Run the side effect.
    Claimed(Lease),
    /// Return the stored response.
    Replayed {
        /// As stored.
        response: StoredResponse,
        /// When it was stored.
        completed_at_ms: i64,
    },
    /// Someone else is running it.
    InProgress {
        /// Hint for the retry.
        retry_after: Duration,
        /// When the holder's lease runs out.
        lease_expires_at_ms: i64,
    },
    /// Different request under the same key.
    Mismatch,
    /// Needs reconciliation.
    Pending {
        /// Stored state.
        state: RecordState,
        /// Why.
        reason: String,
    },
}

impl ClaimOutcome {
    /// Stable lowercase name (logs, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            ClaimOutcome::Claimed(_) => "claimed",
            ClaimOutcome::Replayed { .. } => "replayed",
            ClaimOutcome::InProgress { .. } => "in_progress",
            ClaimOutcome::Mismatch => "mismatch",
            ClaimOutcome::Pending { .. } => "pending",
        }
    }
}

/// Result of a Claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimResult {
    /// What to do.
    pub outcome: ClaimOutcome,
    /// The digest compared.
    pub fingerprint: Vec<u8>,
}

/// How a holder ends a claim without a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Nothing happened: delete the claim.
    Release,
    /// It may have happened: UNKNOWN.
    Unknown,
    /// It failed definitively: FAILED.
    Failed,
}

/// A reconciler's decision on a pending record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The side effect happened; store this response.
    Committed(StoredResponse),
    /// It did not happen; delete the record.
    Released,
    /// It failed; record the reason.
    Failed(String),
    /// Give a new lease to the reconciler.
    Takeover {
        /// Requested lease in signed milliseconds.
        lease_ms: Option<i64>,
    },
}

impl Verdict {
    /// Stable lowercase name (logs, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Committed(_) => "committed",
            Verdict::Released => "released",
            Verdict::Failed(_) => "failed",
            Verdict::Takeover { .. } => "takeover",
        }
    }
}

/// Result of a Reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileResult {
    /// The record after the decision (`None` after `released`).
    pub record: Option<Record>,
    /// The new lease after `takeover`.
    pub takeover: Option<Lease>,
}

/// A ListPending call.
#[derive(Debug, Clone, Default)]
pub struct PendingInput {
    /// Only this endpoint (empty: all).
    pub endpoint: String,
    /// Only records at least this old (signed ms).
    pub older_than_ms: Option<i64>,
    /// Requested page size (0: default).
    pub page_size: u32,
    /// Continuation token from the previous page.
    pub page_token: Option<Vec<u8>>,
}

/// Records that need a decision, for the pending gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSummary {
    /// Count per state name (in_progress past lease, unknown, failed).
    pub counts: Vec<(&'static str, usize)>,
    /// How long the oldest has needed a decision.
    pub oldest_age: Duration,
}

/// The engine. One per process, shared by every RPC.
pub struct Engine {
    /// Where records live.
    store: Arc<dyn Store>,
    /// What "now" is; injectable for tests.
    clock: SharedClock,
    /// Per-endpoint knobs.
    policies: Arc<PolicySet>,
    /// Claims waiting on in-flight duplicates.
    waiters: Waiters,
    /// Completed records, for cheap replays.
    cache: CompletedCache,
    /// Where transitions of audited endpoints are appended; `None` when no
    /// endpoint is audited.
    audit: Option<Arc<dyn AuditLog>>,
    /// Per-tenant limit on creating keys; `None` = unlimited.
    claim_limiter: Option<ClaimLimiter>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store.backend_name())
            .finish_non_exhaustive()
    }
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A fresh fencing token: 128 bits from the thread-local CSPRNG (ChaCha,
/// seeded from the OS), hex-encoded.
fn new_lease_token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn key_hash(id: &RecordKey) -> String {
    fingerprint::short_hash(id.key.as_bytes())
}

fn fingerprint_error(error: FingerprintError) -> EngineError {
    match error {
        FingerprintError::BodyTooLarge { .. } => {
            EngineError::too_large("request.body", error.to_string())
        }
        FingerprintError::Json(json) => EngineError::invalid("request.body", json.to_string()),
        FingerprintError::Pointer { index, error } => {
            EngineError::invalid(format!("request.ignore_fields[{index}]"), error.to_string())
        }
        FingerprintError::PointerLimit(description) => {
            EngineError::invalid("request.ignore_fields", description)
        }
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
            store,
            clock,
            policies,
            waiters: Waiters::default(),
            cache: CompletedCache::new(cache_bytes),
            audit: None,
            claim_limiter: None,
        }
    }

    /// Limits each tenant to `rate` new keys per second (bursts of `burst`);
    /// a rate of 0 leaves key creation unlimited.
    #[must_use]
    pub fn with_claim_limit(mut self, rate: f64, burst: u32) -> Self {
        self.claim_limiter = (rate > 0.0).then(|| ClaimLimiter::new(rate, burst));
        self
    }

    /// Appends the transitions of audited endpoints to `audit`.
    #[must_use]
    pub fn with_audit(mut self, audit: Arc<dyn AuditLog>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The audit log, when one is open.
    pub fn audit(&self) -> Option<&Arc<dyn AuditLog>> {
        self.audit.as_ref()
    }

    /// Emits the structured event of one transition (or replay) and, for
    /// audited endpoints, appends it to the audit log. Never the raw key or
    /// body. An audit append that fails is logged and counted, not returned:
    /// the transition is already durable (see [`crate::audit`]).
    async fn transition(&self, change: Transition<'_>) {
        let Transition {
            record,
            from,
            to,
            replayed,
            started,
        } = change;
        let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let fingerprint_prefix = hex::encode(record.fingerprint.get(..6).unwrap_or_default());
        let status = record.response.as_ref().map_or(0, |r| r.status);
        // Replays are not transitions and can be most of the traffic: they
        // are logged at debug level (and audited like transitions).
        macro_rules! event {
            ($level:ident) => {
                tracing::$level!(
                    tenant = %record.id.tenant,
                    endpoint = %record.id.endpoint,
                    key_hash = %key_hash(&record.id),
                    fingerprint = %fingerprint_prefix,
                    from,
                    to,
                    replayed,
                    attempt = record.attempt,
                    status,
                    latency_us,
                    "state transition"
                )
            };
        }
        if replayed {
            event!(debug);
        } else {
            event!(info);
        }
        let Some(audit) = &self.audit else {
            return;
        };
        if !self.policies.for_endpoint(&record.id.endpoint).audit {
            return;
        }
        let event = AuditEvent {
            tenant: record.id.tenant.clone(),
            endpoint: record.id.endpoint.clone(),
            key_sha256: crate::audit::key_sha256(&record.id.key),
            at_ms: self.now(),
            event_id: crate::audit::new_event_id(),
            from_state: from.to_string(),
            to_state: to.to_string(),
            replayed,
            attempt: record.attempt,
            response_status: status,
            fingerprint_prefix,
            latency_us,
        };
        if let Err(error) = audit.append(std::slice::from_ref(&event)).await {
            metrics::counter!(crate::metrics::AUDIT_WRITE_ERRORS, "backend" => audit.backend_name())
                .increment(1);
            tracing::error!(
                tenant = %event.tenant,
                endpoint = %event.endpoint,
                key_hash = %key_hash(&record.id),
                to,
                %error,
                "audit append failed; the transition itself is durable"
            );
        }
    }

    /// The store this engine writes to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn record_key(tenant: &str, endpoint: &str, key: &str) -> RecordKey {
        RecordKey {
            tenant: tenant.to_string(),
            endpoint: endpoint.to_string(),
            key: key.to_string(),
        }
    }

    /// Validates the identity fields common to every keyed RPC.
    fn identity(&self, tenant: &str, endpoint: &str, key: &str) -> EngineResult<RecordKey> {
        validate::tenant("tenant", tenant)?;
        validate::endpoint(endpoint)?;
        validate::key(key)?;
        Ok(Self::record_key(tenant, endpoint, key))
    }

    async fn read(&self, id: &RecordKey, now_ms: i64) -> EngineResult<Option<Record>> {
        if let Some(cached) = self.cache.get(id, now_ms) {
            return Ok(Some((*cached).clone()));
        }
        let record = self.store.get(id, now_ms).await?;
        if let Some(record) = &record {
            self.cache.insert(record);
        }
        Ok(record)
    }

    fn compute_fingerprint(
        &self,
        input: &FingerprintInput,
        policy: &Policy,
    ) -> EngineResult<Vec<u8>> {
        match input {
            FingerprintInput::Missing => Err(EngineError::invalid(
                "fingerprint",
                "one of request or sha256 is required",
            )),
            FingerprintInput::Sha256(digest) => {
                if digest.len() != fingerprint::FINGERPRINT_LEN {
                    return Err(EngineError::invalid(
                        "sha256",
                        format!(
                            "must be exactly {} bytes, got {}",
                            fingerprint::FINGERPRINT_LEN,
                            digest.len()
                        ),
                    ));
                }
                Ok(digest.clone())
            }
            FingerprintInput::Request {
                method,
                path,
                body,
                content_type,
                ignore_fields,
            } => {
                if method.trim().is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(EngineError::invalid(
                        "request.method",
                        "must be a non-empty HTTP method (letters only)",
                    ));
                }
                let ignore: Vec<&str> = ignore_fields
                    .iter()
                    .chain(policy.ignore_fields.iter())
                    .map(String::as_str)
                    .collect();
                let parts = RequestParts {
                    method,
                    path,
                    body,
                    content_type,
                };
                fingerprint::fingerprint_v1(&parts, &ignore)
                    .map(|digest| digest.to_vec())
                    .map_err(fingerprint_error)
            }
        }
    }

    /// Claim: see the module docs and `proto/idemd/v1/idempotency.proto`.
    pub async fn claim(&self, tenant: &str, input: ClaimInput) -> EngineResult<ClaimResult> {
        let started = Instant::now();
        let id = self.identity(tenant, &input.endpoint, &input.key)?;
        validate::attempt_id(&input.attempt_id)?;
        let policy = self.policies.for_endpoint(&input.endpoint);
        let ttl = validate::positive_duration("ttl", input.ttl_ms)?.unwrap_or(policy.ttl);
        if ttl > policy.max_ttl {
            return Err(EngineError::invalid(
                "ttl",
                format!(
                    "{} exceeds the endpoint's maximum of {}",
                    humantime::format_duration(ttl),
                    humantime::format_duration(policy.max_ttl)
                ),
            ));
        }
        let lease = validate::positive_duration("lease", input.lease_ms)?
            .unwrap_or_else(|| policy.lease.min(ttl));
        if lease > ttl {
            return Err(EngineError::invalid(
                "lease",
                format!(
                    "{} exceeds the ttl of {}",
                    humantime::format_duration(lease),
                    humantime::format_duration(ttl)
                ),
            ));
        }
        let wait = validate::non_negative_duration("wait", input.wait_ms)?
            .unwrap_or_default()
            .min(policy.max_wait);
        let fingerprint = self.compute_fingerprint(&input.fingerprint, policy)?;

        let request = ClaimRequest {
            id,
            fingerprint,
            lease,
            ttl,
            attempt_id: input.attempt_id,
            policy,
            started,
        };
        let outcome = if wait.is_zero() {
            self.claim_once(&request).await?
        } else {
            self.claim_waiting(&request, wait).await?
        };
        Ok(ClaimResult {
            outcome,
            fingerprint: request.fingerprint,
        })
    }

    /// Claims, waiting up to `wait` for an in-flight holder to finish.
    async fn claim_waiting(
        &self,
        request: &ClaimRequest<'_>,
        wait: Duration,
    ) -> EngineResult<ClaimOutcome> {
        let deadline = tokio::time::Instant::now() + wait;
        let registration = self.waiters.register(&request.id);
        let mut poll = WAIT_POLL_MIN;
        loop {
            let notified = registration.notify.notified();
            tokio::pin!(notified);
            // Enabled before the read: a wake-up between the read and the
            // sleep is not lost.
            notified.as_mut().enable();
            let outcome = self.claim_once(request).await?;
            let ClaimOutcome::InProgress {
                lease_expires_at_ms,
                ..
            } = &outcome
            else {
                return Ok(outcome);
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(outcome);
            }
            // Wake at the latest when the holder's lease runs out (the answer
            // changes then), at the next poll, or at the deadline.
            let lease_left = Duration::from_millis(
                lease_expires_at_ms
                    .saturating_sub(self.now())
                    .max(1)
                    .unsigned_abs(),
            );
            let sleep_until = deadline.min(now + poll.min(lease_left));
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(sleep_until) => {}
            }
            poll = (poll * 2).min(WAIT_POLL_MAX);
        }
    }

    /// One decision round of Claim (no waiting).
    async fn claim_once(&self, request: &ClaimRequest<'_>) -> EngineResult<ClaimOutcome> {
        let mut current = self.read(&request.id, self.now()).await?;
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let Some(existing) = current.take() else {
                // Only creating a key is rate-limited: replays and answers
                // about existing keys never reach this point.
                if let Some(limiter) = &self.claim_limiter
                    && let Err(retry_after) = limiter.try_acquire(&request.id.tenant, now)
                {
                    // A concurrent Claim of the same key may have created it
                    // since the read: then this one is an answer about an
                    // existing key, which the limit does not apply to.
                    if let Some(created) = self.read(&request.id, now).await? {
                        current = Some(created);
                        continue;
                    }
                    return Err(EngineError::RateLimited {
                        retry_after,
                        description: format!(
                            "the tenant's rate of new keys is exhausted; retry in {} ms",
                            retry_after.as_millis()
                        ),
                    });
                }
                let record = request.new_record(now, 1);
                match self.store.insert_if_absent(&record, now).await? {
                    InsertOutcome::Inserted => {
                        self.transition(Transition::new(
                            &record,
                            "none",
                            "claimed",
                            request.started,
                        ))
                        .await;
                        return Ok(ClaimOutcome::Claimed(lease_of(&record)));
                    }
                    InsertOutcome::Exists(winner) => {
                        // Another Claim created the key first: this one
                        // created nothing and is not charged for it.
                        if let Some(limiter) = &self.claim_limiter {
                            limiter.refund(&request.id.tenant, now);
                        }
                        current = Some(winner);
                        continue;
                    }
                }
            };
            match self.decide_existing(request, &existing, now) {
                Decision::Answer(outcome) => {
                    if let ClaimOutcome::Replayed { .. } = &outcome {
                        let mut replay =
                            Transition::new(&existing, "completed", "completed", request.started);
                        replay.replayed = true;
                        self.transition(replay).await;
                    }
                    return Ok(outcome);
                }
                Decision::TakeOver => {
                    let mut record = request.new_record(now, existing.attempt.saturating_add(1));
                    // The dedup window is the original one; a takeover never
                    // extends it.
                    record.created_at_ms = existing.created_at_ms;
                    record.expires_at_ms = existing.expires_at_ms;
                    record.lease_expires_at_ms =
                        record.lease_expires_at_ms.min(existing.expires_at_ms);
                    match self
                        .store
                        .replace_if(&record, &Expected::matching(&existing), now)
                        .await?
                    {
                        CasOutcome::Applied => {
                            self.transition(Transition::new(
                                &record,
                                "in_progress",
                                "taken_over",
                                request.started,
                            ))
                            .await;
                            return Ok(ClaimOutcome::Claimed(lease_of(&record)));
                        }
                        CasOutcome::Conflict { current: latest } => current = latest,
                    }
                }
            }
        }
        Err(EngineError::Contention(
            "the key changed concurrently too many times; retry".to_string(),
        ))
    }

    fn decide_existing(&self, request: &ClaimRequest<'_>, existing: &Record, now: i64) -> Decision {
        if existing.fingerprint != request.fingerprint {
            return Decision::Answer(ClaimOutcome::Mismatch);
        }
        match existing.state {
            RecordState::Completed => Decision::Answer(ClaimOutcome::Replayed {
                response: existing.response.clone().unwrap_or_default(),
                completed_at_ms: existing.completed_at_ms.unwrap_or(existing.updated_at_ms),
            }),
            RecordState::Failed | RecordState::Unknown => Decision::Answer(ClaimOutcome::Pending {
                state: existing.state,
                reason: existing.reason.clone(),
            }),
            RecordState::InProgress if now < existing.lease_expires_at_ms => {
                if !request.attempt_id.is_empty() && existing.attempt_id == request.attempt_id {
                    // The same Claim call, retried after a lost response.
                    return Decision::Answer(ClaimOutcome::Claimed(lease_of(existing)));
                }
                let remaining = Duration::from_millis(
                    (existing.lease_expires_at_ms - now).max(1).unsigned_abs(),
                );
                Decision::Answer(ClaimOutcome::InProgress {
                    retry_after: RETRY_AFTER_HINT.min(remaining),
                    lease_expires_at_ms: existing.lease_expires_at_ms,
                })
            }
            RecordState::InProgress => match request.policy.on_expired_lease {
                ExpiredLeasePolicy::Takeover => Decision::TakeOver,
                ExpiredLeasePolicy::Reconcile => Decision::Answer(ClaimOutcome::Pending {
                    state: RecordState::InProgress,
                    reason: format!(
                        "lease expired {} ms ago without Complete or Fail (attempt {}); the outcome must be reconciled",
                        now - existing.lease_expires_at_ms,
                        existing.attempt
                    ),
                }),
            },
        }
    }

    /// Reads the live record and checks the caller's fence.
    async fn fenced(
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
        let started = Instant::now();
        let id = self.identity(tenant, endpoint, key)?;
        validate::lease_token(lease_token)?;
        let policy = self.policies.for_endpoint(endpoint);
        validate::response("response", &response, policy.max_response_bytes)?;
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let Some(record) = self.fenced(&id, lease_token, now).await? else {
                return Err(EngineError::NotFound(
                    "no live claim for this key (it expired or was released)".to_string(),
                ));
            };
            match record.state {
                RecordState::Completed if record.response.as_ref() == Some(&response) => {
                    return Ok(record.expires_at_ms);
                }
                RecordState::Completed => {
                    return Err(EngineError::precondition(
                        PreconditionReason::AlreadyCompleted,
                        "the key is already completed with a different response",
                    ));
                }
                RecordState::Failed | RecordState::Unknown => {
                    return Err(not_in_progress(&record));
                }
                RecordState::InProgress => {
                    let mut completed = record.clone();
                    completed.state = RecordState::Completed;
                    completed.response = Some(response.clone());
                    completed.completed_at_ms = Some(now);
                    completed.updated_at_ms = now;
                    if let CasOutcome::Applied = self
                        .store
                        .replace_if(&completed, &Expected::matching(&record), now)
                        .await?
                    {
                        self.transition(Transition::new(
                            &completed,
                            "in_progress",
                            "completed",
                            started,
                        ))
                        .await;
                        self.cache.insert(&completed);
                        self.waiters.wake(&id);
                        return Ok(completed.expires_at_ms);
                    }
                }
            }
        }
        Err(contention())
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
        let started = Instant::now();
        let id = self.identity(tenant, endpoint, key)?;
        validate::lease_token(lease_token)?;
        validate::reason("reason", reason)?;
        let Some(disposition) = disposition else {
            return Err(EngineError::invalid(
                "disposition",
                "must be RELEASE, UNKNOWN or FAILED",
            ));
        };
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let record = match self.fenced(&id, lease_token, now).await? {
                Some(record) => record,
                // Releasing is idempotent: the claim being gone is the goal.
                None if disposition == Disposition::Release => return Ok(()),
                None => {
                    return Err(EngineError::NotFound(
                        "no live claim for this key (it expired or was released)".to_string(),
                    ));
                }
            };
            let target = match disposition {
                Disposition::Release => None,
                Disposition::Unknown => Some(RecordState::Unknown),
                Disposition::Failed => Some(RecordState::Failed),
            };
            match record.state {
                RecordState::InProgress => {}
                state if Some(state) == target => return Ok(()), // a retried Fail
                RecordState::Completed => {
                    return Err(EngineError::precondition(
                        PreconditionReason::AlreadyCompleted,
                        "the key is already completed",
                    ));
                }
                _ => return Err(not_in_progress(&record)),
            }
            let expected = Expected::matching(&record);
            let outcome = match target {
                None => self.store.delete_if(&id, &expected, now).await?,
                Some(state) => {
                    let mut failed = record.clone();
                    failed.state = state;
                    failed.reason = reason.to_string();
                    failed.updated_at_ms = now;
                    self.store.replace_if(&failed, &expected, now).await?
                }
            };
            if let CasOutcome::Applied = outcome {
                let to = target.map_or("released", RecordState::as_str);
                self.transition(Transition::new(&record, "in_progress", to, started))
                    .await;
                self.waiters.wake(&id);
                return Ok(());
            }
        }
        Err(contention())
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
        let id = self.identity(tenant, endpoint, key)?;
        validate::lease_token(lease_token)?;
        let policy = self.policies.for_endpoint(endpoint);
        let lease = validate::positive_duration("lease", lease_ms)?.unwrap_or(policy.lease);
        if lease > policy.max_ttl {
            return Err(EngineError::invalid(
                "lease",
                format!(
                    "exceeds the endpoint's maximum ttl of {}",
                    humantime::format_duration(policy.max_ttl)
                ),
            ));
        }
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let Some(record) = self.fenced(&id, lease_token, now).await? else {
                return Err(EngineError::NotFound(
                    "no live claim for this key (it expired or was released)".to_string(),
                ));
            };
            match record.state {
                RecordState::InProgress => {}
                RecordState::Completed => {
                    return Err(EngineError::precondition(
                        PreconditionReason::AlreadyCompleted,
                        "the key is already completed",
                    ));
                }
                _ => return Err(not_in_progress(&record)),
            }
            let mut extended = record.clone();
            extended.lease_expires_at_ms = now.saturating_add(ms(lease)).min(record.expires_at_ms);
            if let CasOutcome::Applied = self
                .store
                .replace_if(&extended, &Expected::matching(&record), now)
                .await?
            {
                return Ok(extended.lease_expires_at_ms);
            }
        }
        Err(contention())
    }

    /// Lookup: the live record.
    pub async fn lookup(&self, tenant: &str, endpoint: &str, key: &str) -> EngineResult<Record> {
        let id = self.identity(tenant, endpoint, key)?;
        self.read(&id, self.now())
            .await?
            .ok_or_else(|| EngineError::NotFound("no record for this key".to_string()))
    }

    /// ListPending: records that need a decision.
    pub async fn list_pending(
        &self,
        tenant: &str,
        input: PendingInput,
    ) -> EngineResult<crate::store::PendingPage> {
        validate::tenant("tenant", tenant)?;
        if !input.endpoint.is_empty() {
            validate::endpoint(&input.endpoint)?;
        }
        let older_than = validate::non_negative_duration("older_than", input.older_than_ms)?;
        let page_size = match input.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                return Err(EngineError::invalid(
                    "page_size",
                    format!("at most {MAX_PAGE_SIZE}"),
                ));
            }
            n => n,
        };
        let now = self.now();
        let query = PendingQuery {
            tenant: tenant.to_string(),
            endpoint: (!input.endpoint.is_empty()).then_some(input.endpoint),
            created_at_or_before_ms: older_than.map(|age| now.saturating_sub(ms(age))),
            page_size,
            page_token: input.page_token,
        };
        self.store
            .list_pending(&query, now)
            .await
            .map_err(|error| match error {
                crate::store::StoreError::InvalidPageToken => {
                    EngineError::invalid("page_token", "not a token from a previous ListPending")
                }
                other => EngineError::Store(other),
            })
    }

    /// Reconcile: decide a pending record.
    pub async fn reconcile(
        &self,
        tenant: &str,
        endpoint: &str,
        key: &str,
        verdict: Option<Verdict>,
    ) -> EngineResult<ReconcileResult> {
        let started = Instant::now();
        let id = self.identity(tenant, endpoint, key)?;
        let Some(verdict) = verdict else {
            return Err(EngineError::invalid(
                "verdict",
                "one of committed, released, failed or takeover is required",
            ));
        };
        let policy = self.policies.for_endpoint(endpoint);
        let takeover_lease = match &verdict {
            Verdict::Committed(response) => {
                validate::response("committed", response, policy.max_response_bytes)?;
                None
            }
            Verdict::Failed(reason) => {
                validate::reason("failed", reason)?;
                None
            }
            Verdict::Takeover { lease_ms } => Some(
                validate::positive_duration("takeover.lease", *lease_ms)?.unwrap_or(policy.lease),
            ),
            Verdict::Released => None,
        };
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let Some(record) = self.store.get(&id, now).await? else {
                return Err(EngineError::NotFound("no record for this key".to_string()));
            };
            if !record.needs_decision(now) {
                return Err(EngineError::precondition(
                    PreconditionReason::NotPending,
                    format!(
                        "the record is {}{}; only records that need a decision can be reconciled",
                        record.state.as_str(),
                        if record.state == RecordState::InProgress {
                            " within its lease"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            let expected = Expected::matching(&record);
            let mut updated = record.clone();
            updated.updated_at_ms = now;
            let mut takeover = None;
            match &verdict {
                Verdict::Released => {
                    if let CasOutcome::Applied = self.store.delete_if(&id, &expected, now).await? {
                        self.transition(Transition::new(
                            &record,
                            record.state.as_str(),
                            "released",
                            started,
                        ))
                        .await;
                        self.waiters.wake(&id);
                        return Ok(ReconcileResult {
                            record: None,
                            takeover: None,
                        });
                    }
                    continue;
                }
                Verdict::Committed(response) => {
                    updated.state = RecordState::Completed;
                    updated.response = Some(response.clone());
                    updated.completed_at_ms = Some(now);
                }
                Verdict::Failed(reason) => {
                    updated.state = RecordState::Failed;
                    updated.reason = reason.clone();
                }
                Verdict::Takeover { .. } => {
                    let lease = takeover_lease.unwrap_or(policy.lease);
                    updated.state = RecordState::InProgress;
                    updated.attempt = record.attempt.saturating_add(1);
                    updated.lease_token = new_lease_token();
                    updated.attempt_id = String::new();
                    updated.reason = String::new();
                    updated.lease_expires_at_ms =
                        now.saturating_add(ms(lease)).min(record.expires_at_ms);
                    takeover = Some(lease_of(&updated));
                }
            }
            if let CasOutcome::Applied = self.store.replace_if(&updated, &expected, now).await? {
                self.transition(Transition::new(
                    &updated,
                    record.state.as_str(),
                    verdict.as_str(),
                    started,
                ))
                .await;
                self.cache.insert(&updated);
                self.waiters.wake(&id);
                return Ok(ReconcileResult {
                    record: Some(updated),
                    takeover,
                });
            }
        }
        Err(contention())
    }

    /// A page of the tenant's audit events: one key's history when `key` is
    /// set, else the tenant's timeline (optionally one endpoint's), oldest
    /// first, starting after `page_token` or at `since_ms`.
    pub async fn audit_events(
        &self,
        tenant: &str,
        query: AuditRequest,
    ) -> EngineResult<(Vec<AuditEvent>, Option<String>)> {
        let Some(audit) = &self.audit else {
            return Err(EngineError::precondition(
                PreconditionReason::AuditDisabled,
                "no endpoint is audited (set `audit = true` in an endpoint policy)",
            ));
        };
        validate::tenant("tenant", tenant)?;
        let endpoint = if query.endpoint.is_empty() {
            None
        } else {
            validate::endpoint(&query.endpoint)?;
            Some(query.endpoint)
        };
        let key_sha256 = if query.key.is_empty() {
            None
        } else {
            if endpoint.is_none() {
                return Err(EngineError::invalid(
                    "endpoint",
                    "is required when key is set (a key is only unique within its endpoint)",
                ));
            }
            validate::key(&query.key)?;
            Some(crate::audit::key_sha256(&query.key))
        };
        let limit = match query.page_size {
            0 => DEFAULT_AUDIT_PAGE,
            size if size > crate::audit::MAX_PAGE => {
                return Err(EngineError::invalid(
                    "page_size",
                    format!("at most {}", crate::audit::MAX_PAGE),
                ));
            }
            size => size,
        };
        let after = if query.page_token.is_empty() {
            AuditCursor::before(query.since_ms.unwrap_or(0))
        } else {
            AuditCursor::from_token(&query.page_token).ok_or_else(|| {
                EngineError::invalid("page_token", "not a token this server issued")
            })?
        };
        let events = audit
            .list(&AuditQuery {
                tenant: tenant.to_string(),
                endpoint,
                key_sha256,
                after,
                limit,
                now_ms: self.now(),
            })
            .await?;
        let next = (events.len() == limit)
            .then(|| events.last().map(|event| event.cursor().to_token()))
            .flatten();
        Ok((events, next))
    }

    /// Counts the tenant's records that need a decision, by state, and the
    /// age of the oldest, reading at most `max_records` from the index.
    pub async fn pending_summary(
        &self,
        tenant: &str,
        max_records: usize,
    ) -> EngineResult<PendingSummary> {
        let now = self.now();
        let mut summary = PendingSummary {
            counts: vec![("in_progress", 0), ("unknown", 0), ("failed", 0)],
            oldest_age: Duration::ZERO,
        };
        let mut token = None;
        let mut seen = 0;
        let mut oldest: Option<i64> = None;
        loop {
            let query = PendingQuery {
                tenant: tenant.to_string(),
                endpoint: None,
                created_at_or_before_ms: None,
                page_size: MAX_PAGE_SIZE,
                page_token: token,
            };
            let page = self.store.list_pending(&query, now).await?;
            for record in &page.records {
                if let Some(entry) = summary
                    .counts
                    .iter_mut()
                    .find(|(s, _)| *s == record.state.as_str())
                {
                    entry.1 += 1;
                }
                let since = record.pending_since_ms().unwrap_or(now);
                oldest = Some(oldest.map_or(since, |o| o.min(since)));
            }
            seen += page.records.len();
            token = page.next_page_token;
            if token.is_none() || seen >= max_records {
                break;
            }
        }
        if let Some(oldest) = oldest {
            summary.oldest_age = Duration::from_millis((now - oldest).max(0).unsigned_abs());
        }
        Ok(summary)
    }

    /// Removes expired records, then audit events past their retention, in
    /// batches until fewer than `batch` remain due; returns how many.
    pub async fn sweep_expired(&self, batch: usize) -> EngineResult<usize> {
        let mut total = 0;
        loop {
            let removed = self.store.sweep_expired(self.now(), batch).await?;
            total += removed;
            if removed < batch {
                break;
            }
        }
        // Audit events past their retention go the same way.
        if let Some(audit) = &self.audit {
            loop {
                let removed = audit.sweep(self.now(), batch).await?;
                total += removed;
                if removed < batch {
                    break;
                }
            }
        }
        Ok(total)
    }
}

/// A validated Claim.
struct ClaimRequest<'a> {
    id: RecordKey,
    fingerprint: Vec<u8>,
    lease: Duration,
    ttl: Duration,
    attempt_id: String,
    policy: &'a Policy,
    /// When the RPC entered the engine (transition latency).
    started: Instant,
}

impl ClaimRequest<'_> {
    fn new_record(&self, now: i64, attempt: u32) -> Record {
        let expires_at_ms = now.saturating_add(ms(self.ttl));
        Record {
            id: self.id.clone(),
            state: RecordState::InProgress,
            fingerprint: self.fingerprint.clone(),
            attempt,
            lease_token: new_lease_token(),
            attempt_id: self.attempt_id.clone(),
            created_at_ms: now,
            updated_at_ms: now,
            lease_expires_at_ms: now.saturating_add(ms(self.lease)).min(expires_at_ms),
            completed_at_ms: None,
            expires_at_ms,
            response: None,
            reason: String::new(),
        }
    }
}

enum Decision {
    Answer(ClaimOutcome),
    TakeOver,
}

fn lease_of(record: &Record) -> Lease {
    Lease {
        lease_token: record.lease_token.clone(),
        lease_expires_at_ms: record.lease_expires_at_ms,
        attempt: record.attempt,
        expires_at_ms: record.expires_at_ms,
    }
}

fn not_in_progress(record: &Record) -> EngineError {
    EngineError::precondition(
        PreconditionReason::NotInProgress,
        format!(
            "the record is {}; only Reconcile can decide it now",
            record.state.as_str()
        ),
    )
}

fn contention() -> EngineError {
    EngineError::Contention("the key changed concurrently too many times; retry".to_string())
}

/// What [`Engine::transition`] reports.
struct Transition<'a> {
    /// The record after the transition (before it, for deletions).
    record: &'a Record,
    /// State before.
    from: &'a str,
    /// State (or verdict) after.
    to: &'a str,
    /// A Claim answered with the stored response.
    replayed: bool,
    /// When the RPC entered the engine.
    started: Instant,
}

impl<'a> Transition<'a> {
    fn new(record: &'a Record, from: &'a str, to: &'a str, started: Instant) -> Self {
        Self {
            record,
            from,
            to,
            replayed: false,
            started,
        }
    }
}

/// Default page of [`Engine::audit_events`].
const DEFAULT_AUDIT_PAGE: usize = 100;

/// What [`Engine::audit_events`] reads (the RPC's fields, as given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditRequest {
    /// Only this endpoint (required with `key`); empty for all.
    pub endpoint: String,
    /// Only this key's history; empty for the timeline.
    pub key: String,
    /// Events at or after this instant (Unix ms).
    pub since_ms: Option<i64>,
    /// Page size; 0 for the default.
    pub page_size: usize,
    /// Resume token; empty for the first page.
    pub page_token: String,
}
