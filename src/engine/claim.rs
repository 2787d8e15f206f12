//! Claim: validation, fingerprinting, the decision on an existing record,
//! takeover of an expired lease, and waiting for an in-flight duplicate.

use std::time::{Duration, Instant};

use super::core::{Core, MAX_CAS_ROUNDS, lease_of, ms, new_lease_token};
use super::transitions::{Trail, Transition};
use super::{
    ClaimInput, ClaimOutcome, ClaimResult, EngineError, EngineResult, ExpiredLeasePolicy,
    FingerprintInput, Policy, validate,
};
use crate::fingerprint::{self, FingerprintError, RequestParts};
use crate::store::{CasOutcome, Expected, InsertOutcome, Record, RecordKey, RecordState};

/// The engine seen by Claim and what it waits on (takeover, a duplicate in flight): a view of its [`Core`] for one family of
/// operations, so that each family is a type with its `impl` here while
/// [`super::Engine`] keeps the public API in one place.
pub(super) struct Claims<'a>(pub(super) &'a Core);

impl std::ops::Deref for Claims<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

/// The `retry_after` hint given with `in_progress` (bounded by the holder's
/// remaining lease).
const RETRY_AFTER_HINT: Duration = Duration::from_secs(1);

/// Re-read interval bounds while waiting for an in-flight duplicate.
const WAIT_POLL_MIN: Duration = Duration::from_millis(50);
const WAIT_POLL_MAX: Duration = Duration::from_secs(1);

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

impl Claims<'_> {
    /// The work of [`super::Engine::claim`].
    pub(super) async fn claim(&self, tenant: &str, input: ClaimInput) -> EngineResult<ClaimResult> {
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
            // changes then, after the skew margin under takeover), at the
            // next poll, or at the deadline.
            let lease_left = Duration::from_millis(
                lease_expires_at_ms
                    .saturating_add(request.skew_margin_ms())
                    .saturating_sub(self.now())
                    .max(1)
                    .unsigned_abs(),
            );
            // A lease already past (a takeover this replica refused, see
            // `skew`) wakes at the poll, not in a loop of 1 ms reads.
            let wake_in = if lease_left > Duration::from_millis(1) {
                poll.min(lease_left)
            } else {
                poll
            };
            let sleep_until = deadline.min(now + wake_in);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(sleep_until) => {}
            }
            poll = (poll * 2).min(WAIT_POLL_MAX);
        }
    }

    /// One decision round of Claim (no waiting).
    async fn claim_once(&self, request: &ClaimRequest<'_>) -> EngineResult<ClaimOutcome> {
        let now = self.now();
        let mut current = if self.store.read_before_insert() {
            self.read(&request.id, now).await?
        } else if self.existing.contains(&request.id, now) {
            // A duplicate: a read answers it without a conditional write
            // (see `existing`); a key gone since is created below.
            let found = self.read(&request.id, now).await?;
            if found.is_none() {
                self.existing.forget(&request.id);
            }
            found
        } else {
            // The insert below reports the existing record if there is one.
            self.cached(&request.id, now)
        };
        for _ in 0..MAX_CAS_ROUNDS {
            let now = self.now();
            let Some(existing) = current.take() else {
                // A lease granted on a clock far off the cluster's ends
                // early or late for every other replica.
                if let Some(why) = self.skew.distrusts_clock(request.policy.max_clock_skew) {
                    // An existing key is answered from its record (a replay
                    // needs no clock); only a new lease is refused.
                    if let Some(found) = self.read(&request.id, now).await? {
                        current = Some(found);
                        continue;
                    }
                    return Err(EngineError::ClockOffset(why));
                }
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
                        self.granted.remember(&record, now);
                        self.existing.remember(&record.id, record.expires_at_ms);
                        Trail(self.0)
                            .transition(Transition::routine(
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
                        self.cache.insert(&winner);
                        self.existing.remember(&winner.id, winner.expires_at_ms);
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
                        Trail(self.0).transition(replay).await;
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
                            self.granted.remember(&record, now);
                            Trail(self.0)
                                .transition(Transition::new(
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
            RecordState::InProgress if now < request.takeover_at(existing) => {
                if !request.attempt_id.is_empty() && existing.attempt_id == request.attempt_id {
                    // The same Claim call, retried after a lost response.
                    return Decision::Answer(ClaimOutcome::Claimed(lease_of(existing)));
                }
                let remaining = Duration::from_millis(
                    (request.takeover_at(existing) - now).max(1).unsigned_abs(),
                );
                Decision::Answer(ClaimOutcome::InProgress {
                    retry_after: RETRY_AFTER_HINT.min(remaining),
                    lease_expires_at_ms: existing.lease_expires_at_ms,
                })
            }
            RecordState::InProgress => {
                if let Some(why) = self.skew.distrusts_clock(request.policy.max_clock_skew) {
                    // Not this replica's call: its clock may be far enough
                    // off that the lease is still running. Neither taken
                    // over nor reported pending (which invites an operator
                    // to release it): in progress, as another replica sees
                    // it.
                    metrics::counter!(crate::metrics::TAKEOVERS_REFUSED).increment(1);
                    tracing::warn!(reason = %why, "expired lease left alone: clock offset");
                    return Decision::Answer(ClaimOutcome::InProgress {
                        retry_after: RETRY_AFTER_HINT,
                        lease_expires_at_ms: existing.lease_expires_at_ms,
                    });
                }
                self.on_expired_lease(request, existing, now)
            }
        }
    }

    /// What an expired lease gets under the endpoint's policy.
    fn on_expired_lease(
        &self,
        request: &ClaimRequest<'_>,
        existing: &Record,
        now: i64,
    ) -> Decision {
        match request.policy.on_expired_lease {
            ExpiredLeasePolicy::Takeover => Decision::TakeOver,
            ExpiredLeasePolicy::Reconcile => Decision::Answer(ClaimOutcome::Pending {
                state: RecordState::InProgress,
                reason: format!(
                    "lease expired {} ms ago without Complete or Fail (attempt {}); the outcome must be reconciled",
                    now - existing.lease_expires_at_ms,
                    existing.attempt
                ),
            }),
        }
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
    /// How long past a lease's expiry, by this replica's clock, the lease
    /// still counts as held: the policy's `max_clock_skew` under takeover
    /// (the holder's replica may be that far behind), nothing under
    /// reconcile (reporting a key pending takes nothing from its holder).
    fn skew_margin_ms(&self) -> i64 {
        match self.policy.on_expired_lease {
            ExpiredLeasePolicy::Takeover => ms(self.policy.max_clock_skew),
            ExpiredLeasePolicy::Reconcile => 0,
        }
    }

    /// When this replica may act on `existing`'s lease as expired.
    fn takeover_at(&self, existing: &Record) -> i64 {
        existing
            .lease_expires_at_ms
            .saturating_add(self.skew_margin_ms())
    }

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
