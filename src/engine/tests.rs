//! The state machine, driven directly: an [`Engine`] over a [`MemoryStore`]
//! with a [`ManualClock`]. No network, no disk, no sleeping; each test runs
//! in microseconds. The gRPC suites (`tests/grpc_suite`) check the same
//! behaviour end to end on the real backends.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::store::memory::{MemoryStore, WriteFault};
use crate::store::{RecordState, StoreError, StoredResponse};

pub(super) const TENANT: &str = "acme";
pub(super) const PAY: &str = "POST /v1/payments";
pub(super) const TAKEOVER: &str = "POST /v1/takeover";

struct Harness {
    engine: Engine,
    clock: ManualClock,
    store: Arc<MemoryStore>,
}

/// The default policies, and takeover on [`TAKEOVER`].
pub(super) fn policies() -> PolicySet {
    let mut policies = PolicySet::default();
    policies.endpoints.insert(
        TAKEOVER.to_string(),
        Policy {
            on_expired_lease: ExpiredLeasePolicy::Takeover,
            ..Policy::default()
        },
    );
    policies
}

fn harness() -> Harness {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(
        store.clone(),
        Arc::new(clock.clone()),
        Arc::new(policies()),
        1024 * 1024,
    );
    Harness {
        engine,
        clock,
        store,
    }
}

/// Another engine (replica) over `store`, with default policies.
pub(super) fn replica(store: Arc<MemoryStore>, clock: &ManualClock, cache_bytes: usize) -> Engine {
    Engine::new(
        store,
        Arc::new(clock.clone()),
        Arc::new(PolicySet::default()),
        cache_bytes,
    )
}

pub(super) fn input(endpoint: &str, key: &str, body: &str) -> ClaimInput {
    ClaimInput {
        endpoint: endpoint.to_string(),
        key: key.to_string(),
        fingerprint: FingerprintInput::Request {
            method: "POST".to_string(),
            path: "/v1/payments".to_string(),
            body: body.as_bytes().to_vec(),
            content_type: "application/json".to_string(),
            ignore_fields: Vec::new(),
        },
        lease_ms: Some(10_000),
        ttl_ms: None,
        wait_ms: None,
        attempt_id: String::new(),
    }
}

pub(super) fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        body_ref: String::new(),
    }
}

impl Harness {
    async fn claim(&self, input: ClaimInput) -> ClaimOutcome {
        self.engine
            .claim(TENANT, input)
            .await
            .expect("claim")
            .outcome
    }

    async fn claimed(&self, input: ClaimInput) -> Lease {
        match self.claim(input).await {
            ClaimOutcome::Claimed(lease) => lease,
            other => panic!("expected claimed, got {other:?}"),
        }
    }

    async fn complete(
        &self,
        endpoint: &str,
        key: &str,
        token: &str,
        body: &str,
    ) -> EngineResult<i64> {
        self.engine
            .complete(TENANT, endpoint, key, token, response(body))
            .await
    }
}

fn precondition(result: EngineResult<impl std::fmt::Debug>) -> PreconditionReason {
    match result {
        Err(EngineError::FailedPrecondition { reason, .. }) => reason,
        other => panic!("expected a failed precondition, got {other:?}"),
    }
}

#[tokio::test]
async fn the_holder_finishes_its_claim_without_a_read_on_the_granting_engine() {
    let h = harness();
    let lease = h.claimed(input(PAY, "k", "{}")).await;
    let reads = h.store.reads();
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("complete");
    assert_eq!(
        h.store.reads(),
        reads,
        "Complete went straight to its write"
    );
    let lease = h.claimed(input(PAY, "f", "{}")).await;
    h.engine
        .extend_lease(TENANT, PAY, "f", &lease.lease_token, Some(20_000))
        .await
        .expect("extend");
    h.engine
        .fail(
            TENANT,
            PAY,
            "f",
            &lease.lease_token,
            Some(Disposition::Unknown),
            "timeout",
        )
        .await
        .expect("fail");
    assert_eq!(h.store.reads(), reads + 1, "only the second Claim read");
    let record = h.engine.lookup(TENANT, PAY, "f").await.expect("lookup");
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(
        record.lease_expires_at_ms,
        h.clock.now_ms() + 20_000,
        "the extended lease was the one remembered"
    );
}

#[tokio::test]
async fn a_claim_granted_by_another_replica_is_read_then_finished() {
    let h = harness();
    let other = replica(h.store.clone(), &h.clock, 0);
    let lease = h.claimed(input(PAY, "k", "{}")).await;
    let reads = h.store.reads();
    other
        .complete(TENANT, PAY, "k", &lease.lease_token, response("ok"))
        .await
        .expect("complete on the other replica");
    assert_eq!(h.store.reads(), reads + 1, "it had to read the claim");
    // The granting engine still remembers the claim: its memory must not
    // turn a finished claim into a second completion.
    assert_eq!(
        precondition(h.complete(PAY, "k", &lease.lease_token, "different").await),
        PreconditionReason::AlreadyCompleted
    );
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("a retried Complete with the same response");
}

#[tokio::test]
async fn claim_complete_replay() {
    let h = harness();
    let lease = h.claimed(input(PAY, "k", "{\"a\":1}")).await;
    assert_eq!(lease.attempt, 1);
    assert_eq!(lease.lease_token.len(), 32, "128 bits, hex");
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("complete");
    // Key order in the body does not change the fingerprint (v1 is
    // canonical JSON), so this is the same request.
    match h.claim(input(PAY, "k", "{ \"a\" : 1 }")).await {
        ClaimOutcome::Replayed { response: r, .. } => assert_eq!(r, response("ok")),
        other => panic!("expected a replay, got {other:?}"),
    }
    // A retried Complete with the same response is a success; another
    // response is refused.
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("retried complete");
    assert_eq!(
        precondition(h.complete(PAY, "k", &lease.lease_token, "other").await),
        PreconditionReason::AlreadyCompleted
    );
}

#[tokio::test]
async fn a_different_request_under_the_same_key_is_a_mismatch() {
    let h = harness();
    h.claimed(input(PAY, "k", "{\"a\":1}")).await;
    assert_eq!(
        h.claim(input(PAY, "k", "{\"a\":2}")).await,
        ClaimOutcome::Mismatch
    );
    // The same key on another endpoint is another record.
    h.claimed(input(TAKEOVER, "k", "{\"a\":2}")).await;
}

#[tokio::test]
async fn a_duplicate_during_the_lease_is_in_progress_unless_it_is_the_same_attempt() {
    let h = harness();
    let mut first = input(PAY, "k", "{}");
    first.attempt_id = "attempt-1".to_string();
    let lease = h.claimed(first.clone()).await;
    match h.claim(input(PAY, "k", "{}")).await {
        ClaimOutcome::InProgress {
            retry_after,
            lease_expires_at_ms,
        } => {
            assert!(retry_after <= Duration::from_secs(1));
            assert_eq!(lease_expires_at_ms, lease.lease_expires_at_ms);
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    // The same Claim call retried after a lost answer gets its lease back.
    assert_eq!(h.claimed(first).await, lease);
}

/// Clock skew between replicas. A lease is judged expired by
/// the replica that reads it, on its own clock: a replica whose clock runs
/// ahead of the holder's sees a live lease as expired. Within the policy's
/// `max_clock_skew` (default 100 ms) it must not take the key over; past
/// it, takeover works as before.
#[tokio::test]
async fn a_replica_whose_clock_runs_ahead_does_not_take_over_a_live_lease() {
    let h = harness();
    // A second replica over the same store, its clock 80 ms ahead.
    let ahead = ManualClock::new(h.clock.now_ms() + 80);
    let replica = Engine::new(
        h.store.clone(),
        Arc::new(ahead.clone()),
        Arc::new(policies()),
        1024 * 1024,
    );
    let held = h.claimed(input(TAKEOVER, "k", "{}")).await;
    // 9.95 s into the 10 s lease: the holder has 50 ms left; by the other
    // replica's clock the lease ran out 30 ms ago.
    h.clock.advance(Duration::from_millis(9_950));
    ahead.advance(Duration::from_millis(9_950));
    let answer = replica
        .claim(TENANT, input(TAKEOVER, "k", "{}"))
        .await
        .expect("claim")
        .outcome;
    match answer {
        ClaimOutcome::InProgress { retry_after, .. } => assert!(
            retry_after <= Duration::from_millis(70),
            "retry once the margin has passed: {retry_after:?}"
        ),
        other => panic!("a live lease was handed out again: {other:?}"),
    }
    h.complete(TAKEOVER, "k", &held.lease_token, "once")
        .await
        .expect("the holder completes on its own lease");

    // Past expiry + max_clock_skew on the reading replica's clock, the
    // expired lease is taken over.
    let stale = h.claimed(input(TAKEOVER, "k2", "{}")).await;
    // Expired 50 ms ago by the holder's clock, 130 ms by the other's.
    h.clock.advance(Duration::from_millis(10_050));
    ahead.advance(Duration::from_millis(10_050));
    let taken = match replica
        .claim(TENANT, input(TAKEOVER, "k2", "{}"))
        .await
        .expect("claim")
        .outcome
    {
        ClaimOutcome::Claimed(lease) => lease,
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert_eq!(taken.attempt, 2);
    assert_ne!(taken.lease_token, stale.lease_token);
}

#[tokio::test]
async fn an_expired_lease_is_pending_under_reconcile_and_taken_over_under_takeover() {
    let h = harness();
    let old = h.claimed(input(PAY, "k", "{}")).await;
    let old_takeover = h.claimed(input(TAKEOVER, "k", "{}")).await;
    h.clock.advance(Duration::from_secs(11));

    match h.claim(input(PAY, "k", "{}")).await {
        ClaimOutcome::Pending { state, reason } => {
            assert_eq!(state, RecordState::InProgress);
            assert!(reason.contains("lease expired"), "{reason}");
        }
        other => panic!("expected pending, got {other:?}"),
    }
    // The late holder may still complete: nobody took the key over.
    h.complete(PAY, "k", &old.lease_token, "late")
        .await
        .expect("the holder completes after its lease when nobody took over");

    let new = h.claimed(input(TAKEOVER, "k", "{}")).await;
    assert_eq!(new.attempt, 2);
    assert_ne!(new.lease_token, old_takeover.lease_token);
    assert_eq!(new.expires_at_ms, old_takeover.expires_at_ms, "same window");
    // The old holder is fenced out.
    assert_eq!(
        precondition(
            h.complete(TAKEOVER, "k", &old_takeover.lease_token, "stale")
                .await
        ),
        PreconditionReason::LeaseLost
    );
    h.complete(TAKEOVER, "k", &new.lease_token, "fresh")
        .await
        .expect("the new holder completes");
}

#[tokio::test]
async fn fail_release_frees_the_key_and_unknown_waits_for_a_verdict() {
    let h = harness();
    let lease = h.claimed(input(PAY, "released", "{}")).await;
    h.engine
        .fail(
            TENANT,
            PAY,
            "released",
            &lease.lease_token,
            Some(Disposition::Release),
            "",
        )
        .await
        .expect("release");
    assert_eq!(h.claimed(input(PAY, "released", "{}")).await.attempt, 1);

    let lease = h.claimed(input(PAY, "unknown", "{}")).await;
    h.engine
        .fail(
            TENANT,
            PAY,
            "unknown",
            &lease.lease_token,
            Some(Disposition::Unknown),
            "timeout",
        )
        .await
        .expect("unknown");
    match h.claim(input(PAY, "unknown", "{}")).await {
        ClaimOutcome::Pending { state, reason } => {
            assert_eq!(state, RecordState::Unknown);
            assert_eq!(reason, "timeout");
        }
        other => panic!("expected pending, got {other:?}"),
    }
    // Only Reconcile may decide it now.
    assert_eq!(
        precondition(h.complete(PAY, "unknown", &lease.lease_token, "x").await),
        PreconditionReason::NotInProgress
    );
}

#[tokio::test]
async fn reconcile_verdicts() {
    let h = harness();
    let unknown = |key: &'static str| {
        let h = &h;
        async move {
            let lease = h.claimed(input(PAY, key, "{}")).await;
            h.engine
                .fail(
                    TENANT,
                    PAY,
                    key,
                    &lease.lease_token,
                    Some(Disposition::Unknown),
                    "?",
                )
                .await
                .expect("unknown");
            lease
        }
    };

    unknown("committed").await;
    let result = h
        .engine
        .reconcile(
            TENANT,
            PAY,
            "committed",
            Some(Verdict::Committed(response("done"))),
        )
        .await
        .expect("committed");
    assert_eq!(result.record.map(|r| r.state), Some(RecordState::Completed));
    assert!(matches!(
        h.claim(input(PAY, "committed", "{}")).await,
        ClaimOutcome::Replayed { .. }
    ));

    unknown("released").await;
    let result = h
        .engine
        .reconcile(TENANT, PAY, "released", Some(Verdict::Released))
        .await
        .expect("released");
    assert_eq!(result.record, None);
    h.claimed(input(PAY, "released", "{}")).await;

    unknown("failed").await;
    h.engine
        .reconcile(
            TENANT,
            PAY,
            "failed",
            Some(Verdict::Failed("card declined".into())),
        )
        .await
        .expect("failed");
    assert!(matches!(
        h.claim(input(PAY, "failed", "{}")).await,
        ClaimOutcome::Pending {
            state: RecordState::Failed,
            ..
        }
    ));

    let old = unknown("takeover").await;
    let result = h
        .engine
        .reconcile(
            TENANT,
            PAY,
            "takeover",
            Some(Verdict::Takeover { lease_ms: None }),
        )
        .await
        .expect("takeover");
    let lease = result.takeover.expect("a new lease");
    assert_eq!(lease.attempt, 2);
    assert_ne!(lease.lease_token, old.lease_token);
    h.complete(PAY, "takeover", &lease.lease_token, "after takeover")
        .await
        .expect("the reconciler completes");

    // A claim within its lease does not need a decision.
    h.claimed(input(PAY, "running", "{}")).await;
    assert_eq!(
        precondition(
            h.engine
                .reconcile(TENANT, PAY, "running", Some(Verdict::Released))
                .await
        ),
        PreconditionReason::NotPending
    );
}

#[tokio::test]
async fn list_pending_shows_what_needs_a_decision_oldest_first() {
    let h = harness();
    let first = h.claimed(input(PAY, "a", "{}")).await;
    h.clock.advance(Duration::from_secs(1));
    h.claimed(input(PAY, "b", "{}")).await;
    let page = h
        .engine
        .list_pending(TENANT, PendingInput::default())
        .await
        .expect("list");
    assert!(page.records.is_empty(), "both within their lease");
    h.clock.advance(Duration::from_secs(20));
    let page = h
        .engine
        .list_pending(
            TENANT,
            PendingInput {
                page_size: 1,
                ..PendingInput::default()
            },
        )
        .await
        .expect("list");
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.records[0].lease_token, first.lease_token);
    let next = h
        .engine
        .list_pending(
            TENANT,
            PendingInput {
                page_size: 1,
                page_token: page.next_page_token,
                ..PendingInput::default()
            },
        )
        .await
        .expect("next page");
    assert_eq!(next.records[0].id.key, "b");
    // Other tenants see nothing.
    let other = h
        .engine
        .list_pending("globex", PendingInput::default())
        .await
        .expect("list");
    assert!(other.records.is_empty());
}

#[tokio::test]
async fn keys_expire_with_their_window() {
    let h = harness();
    let mut short = input(PAY, "k", "{}");
    short.ttl_ms = Some(60_000);
    let lease = h.claimed(short.clone()).await;
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("complete");
    h.clock.advance(Duration::from_secs(61));
    assert!(matches!(
        h.engine.lookup(TENANT, PAY, "k").await,
        Err(EngineError::NotFound(_))
    ));
    assert_eq!(h.claimed(short).await.attempt, 1, "a new window");
    assert_eq!(h.engine.sweep_expired().await.expect("sweep"), 0);
}

/// A sweep runs in steps of [`crate::engine::SWEEP_STEP`] records (one
/// store write each on the embedded store, so writes queued meanwhile go
/// between them) until a step finds fewer due. Fails with one request for
/// everything, as the sweeper made before the step had one home.
#[tokio::test]
async fn sweeps_run_in_bounded_steps() {
    let h = harness();
    let expired = 2 * crate::engine::SWEEP_STEP + 50;
    for i in 0..expired {
        let mut short = input(PAY, &format!("k{i}"), "{}");
        short.ttl_ms = Some(60_000);
        h.claimed(short).await;
    }
    h.clock.advance(Duration::from_secs(61));
    assert_eq!(h.engine.sweep_expired().await.expect("sweep"), expired);
    assert_eq!(
        h.store.sweep_requests(),
        vec![crate::engine::SWEEP_STEP; 3],
        "three steps: two full, one of 50"
    );
    assert!(h.store.is_empty());
}

#[tokio::test]
async fn store_faults_are_errors_never_answers() {
    let h = harness();
    h.store.inject(WriteFault::Refuse(StoreError::Unavailable(
        "injected".to_string(),
    )));
    assert!(matches!(
        h.engine.claim(TENANT, input(PAY, "k", "{}")).await,
        Err(EngineError::Store(StoreError::Unavailable(_)))
    ));
    assert!(h.store.is_empty(), "nothing written");
    let lease = h.claimed(input(PAY, "k", "{}")).await;
    // A Complete that was applied but not confirmed is reported as
    // uncertain, never as done or failed; its retry then finds it done.
    h.store.inject(WriteFault::AppliedButUncertain);
    assert!(matches!(
        h.complete(PAY, "k", &lease.lease_token, "ok").await,
        Err(EngineError::Store(StoreError::Uncertain(_)))
    ));
    h.complete(PAY, "k", &lease.lease_token, "ok")
        .await
        .expect("the retry sees the completed record");
    // An uncertain Claim hands out no lease. Its retry with the same
    // attempt_id gets the lease that was written; anyone else is told the
    // key is in progress.
    let mut careful = input(PAY, "k2", "{}");
    careful.attempt_id = "call-7".to_string();
    h.store.inject(WriteFault::AppliedButUncertain);
    assert!(matches!(
        h.engine.claim(TENANT, careful.clone()).await,
        Err(EngineError::Store(StoreError::Uncertain(_)))
    ));
    assert!(matches!(
        h.claim(input(PAY, "k2", "{}")).await,
        ClaimOutcome::InProgress { .. }
    ));
    let lease = h.claimed(careful).await;
    h.complete(PAY, "k2", &lease.lease_token, "ok")
        .await
        .expect("the retried caller completes");
}

#[tokio::test]
async fn invalid_input_names_the_field() {
    let h = harness();
    let mut bad = input(PAY, "k", "{}");
    bad.key = "has space".to_string();
    assert!(matches!(
        h.engine.claim(TENANT, bad).await,
        Err(EngineError::InvalidArgument { field, .. }) if field == "key"
    ));
    let mut bad = input(PAY, "k", "{}");
    bad.lease_ms = Some(-1);
    assert!(matches!(
        h.engine.claim(TENANT, bad).await,
        Err(EngineError::InvalidArgument { field, .. }) if field == "lease"
    ));
    let mut bad = input(PAY, "k", "{}");
    bad.fingerprint = FingerprintInput::Sha256(vec![0; 31]);
    assert!(matches!(
        h.engine.claim(TENANT, bad).await,
        Err(EngineError::InvalidArgument { field, .. }) if field == "sha256"
    ));
    assert!(h.store.is_empty());
}
