//! Records that need a decision: ListPending, the pending gauges' summary
//! and Reconcile's verdicts (committed, released, failed, takeover).

use std::time::{Duration, Instant};

use super::core::{
    Core, DEFAULT_PAGE_SIZE, MAX_CAS_ROUNDS, MAX_PAGE_SIZE, contention, lease_of, ms,
    new_lease_token,
};
use super::transitions::{Trail, Transition};
use super::{
    EngineError, EngineResult, PendingInput, PendingSummary, PreconditionReason, ReconcileResult,
    Verdict, validate,
};
use crate::store::{CasOutcome, Expected, PendingQuery, RecordState, count_pending};

/// The engine seen by ListPending, Reconcile and the pending summary: a view of its [`Core`] for one family of
/// operations, so that each family is a type with its `impl` here while
/// [`super::Engine`] keeps the public API in one place.
pub(super) struct Reconciler<'a>(pub(super) &'a Core);

impl std::ops::Deref for Reconciler<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

impl Reconciler<'_> {
    /// The work of [`super::Engine::list_pending`].
    pub(super) async fn list_pending(
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

    /// The work of [`super::Engine::reconcile`].
    pub(super) async fn reconcile(
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
                        Trail(self.0)
                            .transition(Transition::new(
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
                Trail(self.0)
                    .transition(Transition::new(
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

    /// The work of [`super::Engine::pending_summary`].
    pub(super) async fn pending_summary(
        &self,
        tenant: &str,
        max_records: usize,
    ) -> EngineResult<PendingSummary> {
        let now = self.now();
        let counts = match self.store.pending_summary(tenant, now).await? {
            Some(counts) => counts,
            None => count_pending(self.store.as_ref(), tenant, now, max_records).await?,
        };
        let summary = PendingSummary {
            counts: vec![
                ("in_progress", as_count(counts.in_progress)),
                ("unknown", as_count(counts.unknown)),
                ("failed", as_count(counts.failed)),
            ],
            oldest_age: counts.oldest_since_ms.map_or(Duration::ZERO, |oldest| {
                Duration::from_millis((now - oldest).max(0).unsigned_abs())
            }),
        };
        Ok(summary)
    }
}

fn as_count(count: u64) -> usize {
    usize::try_from(count).unwrap_or(usize::MAX)
}
