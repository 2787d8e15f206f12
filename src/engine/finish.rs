//! What the holder of a lease does with it: Complete (store the response),
//! Fail (release, unknown, failed) and ExtendLease. Every one is fenced by
//! the lease token.

use std::time::Instant;

use super::core::{Core, MAX_CAS_ROUNDS, contention, ms, no_live_claim, not_in_progress};
use super::transitions::{Trail, Transition};
use super::{Disposition, EngineError, EngineResult, PreconditionReason, validate};
use crate::store::{CasOutcome, Expected, Record, RecordKey, RecordState, StoredResponse};

/// The engine seen by what the holder of a lease does with it: Complete, Fail, ExtendLease: a view of its [`Core`] for one family of
/// operations, so that each family is a type with its `impl` here while
/// [`super::Engine`] keeps the public API in one place.
pub(super) struct LeaseHolder<'a>(pub(super) &'a Core);

impl std::ops::Deref for LeaseHolder<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

impl LeaseHolder<'_> {
    /// The work of [`super::Engine::complete`].
    pub(super) async fn complete(
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
        let mut rounds = HeldRounds::new(self, &id, lease_token);
        while let Some((now, held)) = rounds.next().await? {
            let Some(record) = held else {
                return Err(no_live_claim());
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
                        Trail(self.0)
                            .transition(Transition::routine(
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

    /// The work of [`super::Engine::fail`].
    pub(super) async fn fail(
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
        let mut rounds = HeldRounds::new(self, &id, lease_token);
        while let Some((now, held)) = rounds.next().await? {
            let record = match held {
                Some(record) => record,
                // Releasing is idempotent: the claim being gone is the goal.
                None if disposition == Disposition::Release => return Ok(()),
                None => {
                    return Err(no_live_claim());
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
                let change = match target {
                    None => Transition::routine(&record, "in_progress", "released", started),
                    Some(state) => Transition::new(&record, "in_progress", state.as_str(), started),
                };
                Trail(self.0).transition(change).await;
                self.waiters.wake(&id);
                return Ok(());
            }
        }
        Err(contention())
    }

    /// The work of [`super::Engine::extend_lease`].
    pub(super) async fn extend_lease(
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
        // The new lease end is computed on this replica's clock.
        if let Some(why) = self.skew.distrusts_clock(policy.max_clock_skew) {
            return Err(EngineError::ClockOffset(why));
        }
        let mut rounds = HeldRounds::new(self, &id, lease_token);
        while let Some((now, held)) = rounds.next().await? {
            let Some(record) = held else {
                return Err(no_live_claim());
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
                self.granted.remember(&extended, now);
                return Ok(extended.lease_expires_at_ms);
            }
        }
        Err(contention())
    }
}

/// The rounds of a holder's conditional write (Complete, Fail,
/// ExtendLease): each gives the time and the record to start from, at most
/// [`MAX_CAS_ROUNDS`] times (each lost race means another caller made
/// progress on the key; then [`contention`]).
struct HeldRounds<'a> {
    /// The engine whose store and clock the rounds use.
    engine: &'a Core,
    /// The key held.
    id: &'a RecordKey,
    /// The holder's token: what fences every read.
    lease_token: &'a str,
    /// The claim as this engine granted it, for the first round only (see
    /// [`super::granted`]): a later round reads the store.
    granted: Option<Record>,
    /// Rounds left.
    left: usize,
}

impl<'a> HeldRounds<'a> {
    fn new(engine: &'a Core, id: &'a RecordKey, lease_token: &'a str) -> Self {
        Self {
            engine,
            id,
            lease_token,
            granted: engine.granted.take(id, lease_token),
            left: MAX_CAS_ROUNDS,
        }
    }

    /// The next round's time and record (the live record fenced by the
    /// token, `None` when the holder has no live claim); `None` once the
    /// rounds are spent.
    async fn next(&mut self) -> EngineResult<Option<(i64, Option<Record>)>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let now = self.engine.now();
        let held = match self.granted.take() {
            Some(record) => Some(record),
            None => self.engine.fenced(self.id, self.lease_token, now).await?,
        };
        Ok(Some((now, held)))
    }
}
