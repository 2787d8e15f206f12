//! The gRPC contract suite: every semantic and bad-input rule of the API,
//! exercised through a real server. Backend-generic: each backend's test
//! binary instantiates it with `grpc_suite!(start_fn)`, where `start_fn` is
//! an async fn returning a fresh [`TestServer`].

use std::time::Duration;

use idemd::proto::v1 as pb;
use tonic::Code;

use crate::common::*;
use idemd::proto::v1::audit_client::AuditClient;

/// Instantiates every test of the suite for one backend.
#[macro_export]
macro_rules! grpc_suite {
    ($start:path) => {
        $crate::grpc_suite!($start, after = $crate::grpc_suite::no_check);
    };
    ($start:path, after = $after:path) => {
        $crate::grpc_suite!(@tests $start, $after;
            claim_fresh_key_returns_a_lease,
            scope_is_tenant_endpoint_and_key,
            concurrent_claims_have_one_winner,
            replay_is_byte_identical,
            mismatch_in_every_state_is_422_and_changes_nothing,
            in_progress_within_lease_is_409,
            wait_replays_when_the_holder_completes,
            wait_times_out_with_in_progress,
            expired_lease_is_pending_by_default,
            expired_lease_takeover_fences_the_old_holder,
            unknown_and_failed_are_pending,
            attempt_id_returns_the_same_lease,
            complete_is_fenced_and_retry_safe,
            fail_release_deletes_and_allows_reexecution,
            fail_unknown_and_failed_keep_the_record,
            extend_lease_is_fenced_and_capped,
            lookup_includes_response_only_when_asked,
            list_pending_finds_what_needs_a_decision,
            list_pending_pages_and_filters,
            reconcile_only_pending_records,
            reconcile_takeover_fences_old_token,
            ttl_expiry_hides_records_from_every_rpc,
            defaults_and_ttl_bounds,
            bad_keys_are_rejected_and_change_nothing,
            bad_endpoints_are_rejected,
            bad_fingerprints_are_rejected,
            bad_durations_are_rejected,
            oversized_response_is_resource_exhausted,
            unknown_lease_token_is_lease_lost,
            reconcile_on_completed_is_failed_precondition,
            audit_log_records_transitions_of_audited_endpoints,
            audit_requests_are_validated,
            batch_items_answer_as_the_single_rpcs_would,
            batch_bounds_and_endpoints_are_enforced,
        );
    };
    (@tests $start:path, $after:path; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let server = $start().await;
                $crate::grpc_suite::$name(&server).await;
                server.stop().await;
                $after();
            }
        )*
    };
}

const T: &str = "acme";

async fn complete(
    server: &TestServer,
    key: &str,
    token: &str,
    response: pb::StoredResponse,
) -> Result<pb::CompleteResponse, tonic::Status> {
    complete_on(server, PAYMENTS, key, token, response).await
}

async fn complete_on(
    server: &TestServer,
    endpoint: &str,
    key: &str,
    token: &str,
    response: pb::StoredResponse,
) -> Result<pb::CompleteResponse, tonic::Status> {
    server
        .new_client()
        .await
        .complete(as_tenant(
            T,
            pb::CompleteRequest {
                endpoint: endpoint.into(),
                key: key.into(),
                lease_token: token.into(),
                response: Some(response),
            },
        ))
        .await
        .map(|r| r.into_inner())
}

async fn fail(
    server: &TestServer,
    endpoint: &str,
    key: &str,
    token: &str,
    disposition: pb::Disposition,
    reason: &str,
) -> Result<(), tonic::Status> {
    server
        .new_client()
        .await
        .fail(as_tenant(
            T,
            pb::FailRequest {
                endpoint: endpoint.into(),
                key: key.into(),
                lease_token: token.into(),
                disposition: disposition.into(),
                reason: reason.into(),
            },
        ))
        .await
        .map(|_| ())
}

async fn lookup(
    server: &TestServer,
    tenant: &str,
    endpoint: &str,
    key: &str,
) -> Result<pb::Record, tonic::Status> {
    server
        .new_client()
        .await
        .lookup(as_tenant(
            tenant,
            pb::LookupRequest {
                endpoint: endpoint.into(),
                key: key.into(),
                include_response: true,
            },
        ))
        .await
        .map(|r| r.into_inner().record.expect("record"))
}

async fn reconcile(
    server: &TestServer,
    endpoint: &str,
    key: &str,
    verdict: pb::reconcile_request::Verdict,
) -> Result<pb::ReconcileResponse, tonic::Status> {
    server
        .new_client()
        .await
        .reconcile(as_tenant(
            T,
            pb::ReconcileRequest {
                endpoint: endpoint.into(),
                key: key.into(),
                verdict: Some(verdict),
            },
        ))
        .await
        .map(|r| r.into_inner())
}

async fn list_pending(
    server: &TestServer,
    tenant: &str,
    request: pb::ListPendingRequest,
) -> pb::ListPendingResponse {
    server
        .new_client()
        .await
        .list_pending(as_tenant(tenant, request))
        .await
        .expect("list pending")
        .into_inner()
}

fn pending_keys(response: &pb::ListPendingResponse) -> Vec<String> {
    let mut keys: Vec<String> = response.records.iter().map(|r| r.key.clone()).collect();
    keys.sort();
    keys
}

/// Every key [`key`] handed out in this test binary (what the log-hygiene
/// test looks for in the logs).
pub static KEYS_USED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A key unique to one test run, so suites can share a store (CQL).
fn key(name: &str) -> String {
    let key = format!("{name}-{}", uuid_like());
    KEYS_USED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(key.clone());
    key
}

/// The default post-test check: none. (Unused in binaries that pass their
/// own check, such as tests/log_hygiene.rs.)
#[allow(dead_code)]
pub fn no_check() {}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}{:x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A tenant unique to one test, for tests that list a tenant's records.
fn unique_tenant(name: &str) -> String {
    format!("{name}-{}", uuid_like())
}

pub async fn claim_fresh_key_returns_a_lease(server: &TestServer) {
    let k = key("fresh");
    let now = server.now_ms();
    let mut request = claim(PAYMENTS, &k, 4200);
    request.ttl = Some(dur(Duration::from_secs(3600)));
    request.lease = Some(dur(Duration::from_secs(30)));
    let response = claim_ok(server, T, request).await;
    assert_eq!(response.http_status, 0);
    assert_eq!(response.error_code, "");
    assert_eq!(response.fingerprint.len(), 32);
    let lease = claimed(&response);
    assert!(
        lease.lease_token.len() >= 32,
        "token carries at least 128 bits"
    );
    assert_eq!(lease.attempt, 1);
    assert_eq!(ts_ms(&lease.lease_expires_at), now + 30_000);
    assert_eq!(ts_ms(&lease.expires_at), now + 3_600_000);
    let second = claim_ok(server, T, claim(PAYMENTS, &key("fresh"), 4200)).await;
    assert_ne!(
        claimed(&second).lease_token,
        lease.lease_token,
        "tokens are unique"
    );
}

pub async fn scope_is_tenant_endpoint_and_key(server: &TestServer) {
    let k = key("scope");
    let mine = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    complete(server, &k, &mine.lease_token, sample_response("mine"))
        .await
        .expect("complete");
    // Same key, other tenant: a different record, never the stored response.
    let other_tenant = claim_ok(server, "globex", claim(PAYMENTS, &k, 1)).await;
    assert_eq!(outcome_name(&other_tenant), "claimed");
    // Same key, other endpoint: a different record.
    let other_endpoint = claim_ok(server, T, claim("POST /v1/refunds", &k, 1)).await;
    assert_eq!(outcome_name(&other_endpoint), "claimed");
    // Other tenant cannot read it either.
    let status = lookup(server, "initech", PAYMENTS, &k)
        .await
        .expect_err("isolated");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "replayed"
    );
}

pub async fn concurrent_claims_have_one_winner(server: &TestServer) {
    let k = key("race");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut client = server.new_client().await;
        let request = claim(PAYMENTS, &k, 7);
        tasks.push(tokio::spawn(async move {
            client
                .claim(as_tenant(T, request))
                .await
                .expect("claim")
                .into_inner()
        }));
    }
    let mut winners = 0;
    for task in tasks {
        let response = task.await.expect("task");
        match outcome_name(&response) {
            "claimed" => winners += 1,
            "in_progress" => {
                assert_eq!(response.http_status, 409);
                assert_eq!(response.error_code, "request_in_progress");
            }
            other => panic!("unexpected outcome {other}"),
        }
    }
    assert_eq!(winners, 1, "exactly one winner");
}

pub async fn replay_is_byte_identical(server: &TestServer) {
    let k = key("replay");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 4200)).await);
    let stored = sample_response("pay_9F2Kx");
    let completed = complete(server, &k, &lease.lease_token, stored.clone())
        .await
        .expect("complete");
    assert_eq!(
        ts_ms(&completed.expires_at),
        ts_ms(&lease.expires_at),
        "expiry unchanged"
    );
    server.clock.advance(Duration::from_secs(5));
    // Same payment, keys reordered and spaced: same fingerprint.
    let mut retry = claim(PAYMENTS, &k, 4200);
    if let Some(pb::claim_request::Fingerprint::Request(http)) = &mut retry.fingerprint {
        http.body = br#"{ "customer":"cus_8812", "currency":"usd", "amount":4200.0 }"#.to_vec();
    }
    let response = claim_ok(server, T, retry).await;
    assert_eq!(response.http_status, 201);
    assert_eq!(response.error_code, "");
    let replay = replayed(&response);
    assert_eq!(replay.response, Some(stored));
    assert_eq!(
        ts_ms(&replay.completed_at),
        ts_ms(&completed.expires_at) - 24 * 3600 * 1000
    );
}

pub async fn mismatch_in_every_state_is_422_and_changes_nothing(server: &TestServer) {
    // In progress.
    let k1 = key("mismatch-ip");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k1, 10)).await);
    let response = claim_ok(server, T, claim(PAYMENTS, &k1, 100)).await;
    assert_eq!(outcome_name(&response), "mismatch");
    assert_eq!(response.http_status, 422);
    assert_eq!(response.error_code, "idempotency_key_reuse");
    // The original holder is unaffected and the original fingerprint kept.
    let original_fp = claim_ok(server, T, claim(PAYMENTS, &k1, 10))
        .await
        .fingerprint;
    assert_eq!(
        lookup(server, T, PAYMENTS, &k1)
            .await
            .expect("record")
            .fingerprint,
        original_fp
    );
    complete(server, &k1, &lease.lease_token, sample_response("a"))
        .await
        .expect("complete");
    // Completed.
    let response = claim_ok(server, T, claim(PAYMENTS, &k1, 100)).await;
    assert_eq!(
        (outcome_name(&response), response.http_status),
        ("mismatch", 422)
    );
    let replay = replayed(&claim_ok(server, T, claim(PAYMENTS, &k1, 10)).await);
    assert_eq!(
        replay.response,
        Some(sample_response("a")),
        "response not overwritten"
    );
    // Unknown.
    let k2 = key("mismatch-unknown");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k2, 10)).await);
    fail(
        server,
        PAYMENTS,
        &k2,
        &lease.lease_token,
        pb::Disposition::Unknown,
        "timeout",
    )
    .await
    .expect("fail");
    let response = claim_ok(server, T, claim(PAYMENTS, &k2, 11)).await;
    assert_eq!(
        (outcome_name(&response), response.http_status),
        ("mismatch", 422)
    );
    // A caller-supplied digest that differs is a mismatch too.
    let mut by_digest = claim(PAYMENTS, &k2, 10);
    by_digest.fingerprint = Some(pb::claim_request::Fingerprint::Sha256(vec![9; 32]));
    assert_eq!(
        outcome_name(&claim_ok(server, T, by_digest).await),
        "mismatch"
    );
}

pub async fn in_progress_within_lease_is_409(server: &TestServer) {
    let k = key("inprogress");
    let mut request = claim(PAYMENTS, &k, 1);
    request.lease = Some(dur(Duration::from_millis(600)));
    let lease = claimed(&claim_ok(server, T, request).await);
    let response = claim_ok(server, T, claim(PAYMENTS, &k, 1)).await;
    assert_eq!(response.http_status, 409);
    assert_eq!(response.error_code, "request_in_progress");
    let Some(pb::claim_response::Outcome::InProgress(in_progress)) = response.outcome else {
        panic!("expected in_progress");
    };
    let retry_after = in_progress.retry_after.expect("retry_after");
    let retry_ms = retry_after.seconds * 1000 + i64::from(retry_after.nanos) / 1_000_000;
    assert!(
        retry_ms > 0 && retry_ms <= 600,
        "bounded by the remaining lease: {retry_ms}"
    );
    assert_eq!(
        ts_ms(&in_progress.lease_expires_at),
        ts_ms(&lease.lease_expires_at)
    );
    // With a long lease the hint is the 1 s default.
    let k = key("inprogress-long");
    claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let Some(pb::claim_response::Outcome::InProgress(in_progress)) =
        claim_ok(server, T, claim(PAYMENTS, &k, 1)).await.outcome
    else {
        panic!("expected in_progress");
    };
    assert_eq!(in_progress.retry_after, Some(dur(Duration::from_secs(1))));
}

pub async fn wait_replays_when_the_holder_completes(server: &TestServer) {
    let k = key("wait");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let mut waiter_client = server.new_client().await;
    let mut waiting = claim(PAYMENTS, &k, 1);
    waiting.wait = Some(dur(Duration::from_secs(5)));
    let started = std::time::Instant::now();
    let waiter = tokio::spawn(async move { waiter_client.claim(as_tenant(T, waiting)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    complete(server, &k, &lease.lease_token, sample_response("w"))
        .await
        .expect("complete");
    let response = waiter.await.expect("task").expect("claim").into_inner();
    let elapsed = started.elapsed();
    assert_eq!(outcome_name(&response), "replayed");
    assert_eq!(replayed(&response).response, Some(sample_response("w")));
    assert!(
        elapsed < Duration::from_secs(3),
        "woken by the completion, not the deadline: {elapsed:?}"
    );
}

pub async fn wait_times_out_with_in_progress(server: &TestServer) {
    let k = key("wait-timeout");
    claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let mut waiting = claim(PAYMENTS, &k, 1);
    waiting.wait = Some(dur(Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let response = claim_ok(server, T, waiting).await;
    let elapsed = started.elapsed();
    assert_eq!(outcome_name(&response), "in_progress");
    assert!(elapsed >= Duration::from_millis(290), "waited: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "bounded: {elapsed:?}");
}

pub async fn expired_lease_is_pending_by_default(server: &TestServer) {
    let k = key("expired");
    let mut request = claim(PAYMENTS, &k, 1);
    request.lease = Some(dur(Duration::from_secs(10)));
    let lease = claimed(&claim_ok(server, T, request).await);
    server.clock.advance(Duration::from_secs(11));
    let response = claim_ok(server, T, claim(PAYMENTS, &k, 1)).await;
    assert_eq!(response.http_status, 409);
    assert_eq!(response.error_code, "outcome_pending");
    let Some(pb::claim_response::Outcome::Pending(pending)) = response.outcome else {
        panic!("expected pending");
    };
    assert_eq!(pending.state, pb::State::InProgress as i32);
    assert!(
        pending.reason.contains("lease expired"),
        "{}",
        pending.reason
    );
    // The late holder may still complete: its token was never fenced.
    complete(server, &k, &lease.lease_token, sample_response("late"))
        .await
        .expect("late complete");
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "replayed"
    );
}

pub async fn expired_lease_takeover_fences_the_old_holder(server: &TestServer) {
    let k = key("takeover");
    let mut request = claim(TAKEOVER_ENDPOINT, &k, 1);
    request.lease = Some(dur(Duration::from_secs(10)));
    let first = claimed(&claim_ok(server, T, request).await);
    server.clock.advance(Duration::from_secs(11));
    let second = claimed(&claim_ok(server, T, claim(TAKEOVER_ENDPOINT, &k, 1)).await);
    assert_eq!(second.attempt, 2);
    assert_ne!(second.lease_token, first.lease_token);
    assert_eq!(
        ts_ms(&second.expires_at),
        ts_ms(&first.expires_at),
        "dedup window unchanged"
    );
    let status = complete_on(
        server,
        TAKEOVER_ENDPOINT,
        &k,
        &first.lease_token,
        sample_response("old"),
    )
    .await
    .expect_err("fenced");
    assert_precondition(&status, "LEASE_LOST");
    complete_on(
        server,
        TAKEOVER_ENDPOINT,
        &k,
        &second.lease_token,
        sample_response("new"),
    )
    .await
    .expect("new holder completes");
}

pub async fn unknown_and_failed_are_pending(server: &TestServer) {
    for (disposition, state) in [
        (pb::Disposition::Unknown, pb::State::Unknown),
        (pb::Disposition::Failed, pb::State::Failed),
    ] {
        let k = key("pending");
        let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
        fail(
            server,
            PAYMENTS,
            &k,
            &lease.lease_token,
            disposition,
            "provider timed out",
        )
        .await
        .expect("fail");
        let response = claim_ok(server, T, claim(PAYMENTS, &k, 1)).await;
        assert_eq!(
            (response.http_status, response.error_code.as_str()),
            (409, "outcome_pending")
        );
        let Some(pb::claim_response::Outcome::Pending(pending)) = response.outcome else {
            panic!("expected pending");
        };
        assert_eq!(pending.state, state as i32);
        assert_eq!(pending.reason, "provider timed out");
    }
}

pub async fn attempt_id_returns_the_same_lease(server: &TestServer) {
    let k = key("attempt");
    let mut request = claim(PAYMENTS, &k, 1);
    request.attempt_id = "attempt-1".into();
    let first = claimed(&claim_ok(server, T, request.clone()).await);
    let again = claimed(&claim_ok(server, T, request.clone()).await);
    assert_eq!(again, first, "a retried Claim call gets its own lease back");
    let mut other = request.clone();
    other.attempt_id = "attempt-2".into();
    assert_eq!(
        outcome_name(&claim_ok(server, T, other).await),
        "in_progress"
    );
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "in_progress"
    );
}

pub async fn complete_is_fenced_and_retry_safe(server: &TestServer) {
    let k = key("complete");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let status = complete(
        server,
        &k,
        "0123456789abcdef0123456789abcdef",
        sample_response("x"),
    )
    .await
    .expect_err("wrong token");
    assert_precondition(&status, "LEASE_LOST");
    let first = complete(server, &k, &lease.lease_token, sample_response("x"))
        .await
        .expect("complete");
    server.clock.advance(Duration::from_secs(1));
    let again = complete(server, &k, &lease.lease_token, sample_response("x"))
        .await
        .expect("retry is OK");
    assert_eq!(first, again);
    assert_eq!(ts_ms(&first.expires_at), ts_ms(&lease.expires_at));
    let status = complete(server, &k, &lease.lease_token, sample_response("different"))
        .await
        .expect_err("different response");
    assert_eq!(status.code(), Code::FailedPrecondition);
    let replay = replayed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    assert_eq!(replay.response, Some(sample_response("x")));
    // Complete of a key nobody claimed.
    let status = complete(
        server,
        &key("nobody"),
        &lease.lease_token,
        sample_response("x"),
    )
    .await
    .expect_err("absent");
    assert_eq!(status.code(), Code::NotFound);
}

pub async fn fail_release_deletes_and_allows_reexecution(server: &TestServer) {
    let k = key("release");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let status = fail(
        server,
        PAYMENTS,
        &k,
        "ffffffffffffffffffffffffffffffff",
        pb::Disposition::Release,
        "",
    )
    .await
    .expect_err("fenced");
    assert_precondition(&status, "LEASE_LOST");
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Release,
        "validation failed",
    )
    .await
    .expect("release");
    assert_eq!(
        lookup(server, T, PAYMENTS, &k)
            .await
            .expect_err("deleted")
            .code(),
        Code::NotFound
    );
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Release,
        "",
    )
    .await
    .expect("retried release is OK");
    let again = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    assert_eq!(again.attempt, 1);
    let status = fail(
        server,
        PAYMENTS,
        &k,
        &again.lease_token,
        pb::Disposition::Unspecified,
        "",
    )
    .await
    .expect_err("disposition required");
    assert_bad_field(&status, Code::InvalidArgument, "disposition");
}

pub async fn fail_unknown_and_failed_keep_the_record(server: &TestServer) {
    let k = key("unknown");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Unknown,
        "gateway timeout",
    )
    .await
    .expect("unknown");
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Unknown,
        "gateway timeout",
    )
    .await
    .expect("retried");
    let record = lookup(server, T, PAYMENTS, &k).await.expect("kept");
    assert_eq!(record.state, pb::State::Unknown as i32);
    assert_eq!(record.reason, "gateway timeout");
    let status = complete(server, &k, &lease.lease_token, sample_response("x"))
        .await
        .expect_err("decided");
    assert_precondition(&status, "NOT_IN_PROGRESS");
    let status = fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Release,
        "",
    )
    .await
    .expect_err("decided");
    assert_precondition(&status, "NOT_IN_PROGRESS");
    let k = key("failed");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Failed,
        "card declined",
    )
    .await
    .expect("failed");
    let record = lookup(server, T, PAYMENTS, &k).await.expect("kept");
    assert_eq!(
        (record.state, record.reason.as_str()),
        (pb::State::Failed as i32, "card declined")
    );
}

pub async fn extend_lease_is_fenced_and_capped(server: &TestServer) {
    let k = key("extend");
    let mut request = claim(PAYMENTS, &k, 1);
    request.ttl = Some(dur(Duration::from_secs(120)));
    request.lease = Some(dur(Duration::from_secs(10)));
    let lease = claimed(&claim_ok(server, T, request).await);
    let mut client = server.new_client().await;
    let extend = |token: &str, secs: u64| pb::ExtendLeaseRequest {
        endpoint: PAYMENTS.into(),
        key: k.clone(),
        lease_token: token.into(),
        lease: Some(dur(Duration::from_secs(secs))),
    };
    server.clock.advance(Duration::from_secs(5));
    let extended = client
        .extend_lease(as_tenant(T, extend(&lease.lease_token, 60)))
        .await
        .expect("extend")
        .into_inner();
    assert_eq!(ts_ms(&extended.lease_expires_at), server.now_ms() + 60_000);
    // Past the lease it would have had, the claim is still held.
    server.clock.advance(Duration::from_secs(30));
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "in_progress"
    );
    let capped = client
        .extend_lease(as_tenant(T, extend(&lease.lease_token, 3600)))
        .await
        .expect("extend")
        .into_inner();
    assert_eq!(
        ts_ms(&capped.lease_expires_at),
        ts_ms(&lease.expires_at),
        "never beyond expires_at"
    );
    let status = client
        .extend_lease(as_tenant(T, extend("00000000000000000000000000000000", 60)))
        .await
        .expect_err("fenced");
    assert_precondition(&status, "LEASE_LOST");
}

pub async fn lookup_includes_response_only_when_asked(server: &TestServer) {
    let k = key("lookup");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let record = lookup(server, T, PAYMENTS, &k).await.expect("in progress");
    assert_eq!(record.state, pb::State::InProgress as i32);
    assert_eq!(
        ts_ms(&record.lease_expires_at),
        ts_ms(&lease.lease_expires_at)
    );
    complete(server, &k, &lease.lease_token, sample_response("l"))
        .await
        .expect("complete");
    let with = lookup(server, T, PAYMENTS, &k).await.expect("completed");
    assert_eq!(with.state, pb::State::Completed as i32);
    assert_eq!(with.response, Some(sample_response("l")));
    assert!(with.completed_at.is_some());
    let without = server
        .new_client()
        .await
        .lookup(as_tenant(
            T,
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: k.clone(),
                include_response: false,
            },
        ))
        .await
        .expect("lookup")
        .into_inner()
        .record
        .expect("record");
    assert_eq!(without.response, None);
    assert_eq!(
        lookup(server, T, PAYMENTS, &key("absent"))
            .await
            .expect_err("absent")
            .code(),
        Code::NotFound
    );
}

pub async fn list_pending_finds_what_needs_a_decision(server: &TestServer) {
    let tenant = unique_tenant("pending");
    let claim_as = |k: &str, lease_secs: u64| {
        let mut request = claim(PAYMENTS, k, 1);
        request.lease = Some(dur(Duration::from_secs(lease_secs)));
        request
    };
    let expired = claimed(&claim_ok(server, &tenant, claim_as("expired", 5)).await);
    let _held = claimed(&claim_ok(server, &tenant, claim_as("held", 3600)).await);
    let unknown = claimed(&claim_ok(server, &tenant, claim_as("unknown", 3600)).await);
    let failed = claimed(&claim_ok(server, &tenant, claim_as("failed", 3600)).await);
    let done = claimed(&claim_ok(server, &tenant, claim_as("done", 3600)).await);
    let mut client = server.new_client().await;
    let fail_as = |k: &str, token: &str, disposition: pb::Disposition| {
        as_tenant(
            &tenant,
            pb::FailRequest {
                endpoint: PAYMENTS.into(),
                key: k.into(),
                lease_token: token.into(),
                disposition: disposition.into(),
                reason: "r".into(),
            },
        )
    };
    client
        .fail(fail_as(
            "unknown",
            &unknown.lease_token,
            pb::Disposition::Unknown,
        ))
        .await
        .expect("fail");
    client
        .fail(fail_as(
            "failed",
            &failed.lease_token,
            pb::Disposition::Failed,
        ))
        .await
        .expect("fail");
    client
        .complete(as_tenant(
            &tenant,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "done".into(),
                lease_token: done.lease_token.clone(),
                response: Some(sample_response("d")),
            },
        ))
        .await
        .expect("complete");
    let before = list_pending(server, &tenant, pb::ListPendingRequest::default()).await;
    assert_eq!(
        pending_keys(&before),
        vec!["failed", "unknown"],
        "lease not yet expired"
    );
    server.clock.advance(Duration::from_secs(6));
    let after = list_pending(server, &tenant, pb::ListPendingRequest::default()).await;
    assert_eq!(pending_keys(&after), vec!["expired", "failed", "unknown"]);
    assert!(after.records.iter().all(|r| r.response.is_none()));
    assert_eq!(after.next_page_token, "");
    // Other tenants see none of it.
    let other = list_pending(
        server,
        &unique_tenant("other"),
        pb::ListPendingRequest::default(),
    )
    .await;
    assert!(other.records.is_empty());
    let _ = expired;
}

pub async fn list_pending_pages_and_filters(server: &TestServer) {
    let tenant = unique_tenant("paging");
    let mut client = server.new_client().await;
    for (i, endpoint) in ["POST /a", "POST /a", "POST /b", "POST /a", "POST /b"]
        .iter()
        .enumerate()
    {
        let lease = claimed(&claim_ok(server, &tenant, claim(endpoint, &format!("k{i}"), 1)).await);
        client
            .fail(as_tenant(
                &tenant,
                pb::FailRequest {
                    endpoint: (*endpoint).into(),
                    key: format!("k{i}"),
                    lease_token: lease.lease_token,
                    disposition: pb::Disposition::Unknown.into(),
                    reason: String::new(),
                },
            ))
            .await
            .expect("fail");
        server.clock.advance(Duration::from_secs(60));
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = list_pending(
            server,
            &tenant,
            pb::ListPendingRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            },
        )
        .await;
        assert!(page.records.len() <= 2);
        seen.extend(page.records.iter().map(|r| r.key.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(
        seen,
        vec!["k0", "k1", "k2", "k3", "k4"],
        "every record once, oldest first"
    );
    let only_b = list_pending(
        server,
        &tenant,
        pb::ListPendingRequest {
            endpoint: "POST /b".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(pending_keys(&only_b), vec!["k2", "k4"]);
    // Created at least 150 s ago: k0 (300 s), k1 (240 s), k2 (180 s).
    let old = list_pending(
        server,
        &tenant,
        pb::ListPendingRequest {
            older_than: Some(dur(Duration::from_secs(150))),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(pending_keys(&old), vec!["k0", "k1", "k2"]);
    let status = client
        .list_pending(as_tenant(
            &tenant,
            pb::ListPendingRequest {
                page_token: "zz-not-a-token".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("bad token");
    assert_bad_field(&status, Code::InvalidArgument, "page_token");
    let status = client
        .list_pending(as_tenant(
            &tenant,
            pb::ListPendingRequest {
                page_size: 5000,
                ..Default::default()
            },
        ))
        .await
        .expect_err("page too big");
    assert_bad_field(&status, Code::InvalidArgument, "page_size");
}

pub async fn reconcile_only_pending_records(server: &TestServer) {
    use pb::reconcile_request::Verdict;
    // committed
    let k = key("rec-commit");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let status = reconcile(server, PAYMENTS, &k, Verdict::Released(pb::Released {}))
        .await
        .expect_err("held");
    assert_precondition(&status, "NOT_PENDING");
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Unknown,
        "timeout",
    )
    .await
    .expect("unknown");
    let result = reconcile(
        server,
        PAYMENTS,
        &k,
        Verdict::Committed(sample_response("found")),
    )
    .await
    .expect("committed");
    assert_eq!(
        result.record.expect("record").state,
        pb::State::Completed as i32
    );
    assert_eq!(
        replayed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await).response,
        Some(sample_response("found"))
    );
    // released
    let k = key("rec-release");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Unknown,
        "timeout",
    )
    .await
    .expect("unknown");
    let result = reconcile(server, PAYMENTS, &k, Verdict::Released(pb::Released {}))
        .await
        .expect("released");
    assert!(result.record.is_none());
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "claimed"
    );
    // failed
    let k = key("rec-failed");
    let mut request = claim(PAYMENTS, &k, 1);
    request.lease = Some(dur(Duration::from_secs(1)));
    claimed(&claim_ok(server, T, request).await);
    server.clock.advance(Duration::from_secs(2));
    let result = reconcile(
        server,
        PAYMENTS,
        &k,
        Verdict::Failed("no charge found".into()),
    )
    .await
    .expect("failed");
    let record = result.record.expect("record");
    assert_eq!(
        (record.state, record.reason.as_str()),
        (pb::State::Failed as i32, "no charge found")
    );
    let status = reconcile(
        server,
        PAYMENTS,
        &key("rec-absent"),
        Verdict::Released(pb::Released {}),
    )
    .await
    .expect_err("absent");
    assert_eq!(status.code(), Code::NotFound);
    let status = server
        .new_client()
        .await
        .reconcile(as_tenant(
            T,
            pb::ReconcileRequest {
                endpoint: PAYMENTS.into(),
                key: k.clone(),
                verdict: None,
            },
        ))
        .await
        .expect_err("verdict required");
    assert_bad_field(&status, Code::InvalidArgument, "verdict");
}

pub async fn reconcile_takeover_fences_old_token(server: &TestServer) {
    use pb::reconcile_request::Verdict;
    let k = key("rec-takeover");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    fail(
        server,
        PAYMENTS,
        &k,
        &lease.lease_token,
        pb::Disposition::Failed,
        "declined?",
    )
    .await
    .expect("failed");
    let result = reconcile(
        server,
        PAYMENTS,
        &k,
        Verdict::Takeover(pb::Takeover {
            lease: Some(dur(Duration::from_secs(30))),
        }),
    )
    .await
    .expect("takeover");
    let takeover = result.takeover.expect("new lease");
    assert_eq!(takeover.attempt, 2);
    assert_eq!(ts_ms(&takeover.lease_expires_at), server.now_ms() + 30_000);
    assert_eq!(
        result.record.expect("record").state,
        pb::State::InProgress as i32
    );
    let status = complete(server, &k, &lease.lease_token, sample_response("old"))
        .await
        .expect_err("fenced");
    assert_precondition(&status, "LEASE_LOST");
    complete(server, &k, &takeover.lease_token, sample_response("new"))
        .await
        .expect("complete");
    assert_eq!(
        replayed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await).response,
        Some(sample_response("new"))
    );
}

pub async fn ttl_expiry_hides_records_from_every_rpc(server: &TestServer) {
    let k = key("ttl");
    let mut request = claim(PAYMENTS, &k, 1);
    request.ttl = Some(dur(Duration::from_secs(60)));
    let lease = claimed(&claim_ok(server, T, request).await);
    complete(server, &k, &lease.lease_token, sample_response("t"))
        .await
        .expect("complete");
    server.clock.advance(Duration::from_secs(59));
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await),
        "replayed"
    );
    server.clock.advance(Duration::from_secs(1));
    // Gone for Lookup, Complete, Fail, ExtendLease, Reconcile...
    assert_eq!(
        lookup(server, T, PAYMENTS, &k)
            .await
            .expect_err("expired")
            .code(),
        Code::NotFound
    );
    assert_eq!(
        complete(server, &k, &lease.lease_token, sample_response("t"))
            .await
            .expect_err("expired")
            .code(),
        Code::NotFound
    );
    assert_eq!(
        fail(
            server,
            PAYMENTS,
            &k,
            &lease.lease_token,
            pb::Disposition::Unknown,
            ""
        )
        .await
        .expect_err("expired")
        .code(),
        Code::NotFound
    );
    assert_eq!(
        reconcile(
            server,
            PAYMENTS,
            &k,
            pb::reconcile_request::Verdict::Released(pb::Released {})
        )
        .await
        .expect_err("expired")
        .code(),
        Code::NotFound
    );
    // ...and a new Claim, even with a different payload, starts afresh.
    let again = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 999)).await);
    assert_eq!(again.attempt, 1);
}

pub async fn defaults_and_ttl_bounds(server: &TestServer) {
    let now = server.now_ms();
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &key("defaults"), 1)).await);
    assert_eq!(
        ts_ms(&lease.expires_at),
        now + 24 * 3600 * 1000,
        "default ttl 24h"
    );
    assert_eq!(
        ts_ms(&lease.lease_expires_at),
        now + 60 * 1000,
        "default lease 60s"
    );
    let mut max = claim(PAYMENTS, &key("max-ttl"), 1);
    max.ttl = Some(dur(Duration::from_secs(7 * 24 * 3600)));
    claimed(&claim_ok(server, T, max).await);
    let k = key("over-ttl");
    let mut over = claim(PAYMENTS, &k, 1);
    over.ttl = Some(dur(Duration::from_secs(7 * 24 * 3600 + 1)));
    let status = server
        .new_client()
        .await
        .claim(as_tenant(T, over))
        .await
        .expect_err("ttl over max");
    assert_bad_field(&status, Code::InvalidArgument, "ttl");
    assert_eq!(
        lookup(server, T, PAYMENTS, &k)
            .await
            .expect_err("nothing stored")
            .code(),
        Code::NotFound
    );
}

async fn assert_claim_rejected(
    server: &TestServer,
    request: pb::ClaimRequest,
    code: Code,
    field: &str,
) {
    let status = server
        .new_client()
        .await
        .claim(as_tenant(T, request.clone()))
        .await
        .expect_err("rejected");
    assert_bad_field(&status, code, field);
    // Nothing was stored: a valid key in the request is still free.
    if idemd::engine::validate::key(&request.key).is_ok()
        && idemd::engine::validate::endpoint(&request.endpoint).is_ok()
    {
        let status = lookup(server, T, &request.endpoint, &request.key)
            .await
            .expect_err("nothing stored");
        assert_eq!(status.code(), Code::NotFound);
    }
}

pub async fn bad_keys_are_rejected_and_change_nothing(server: &TestServer) {
    for bad in [
        "",
        "   ",
        &"k".repeat(256),
        "has space",
        "a/b",
        "ключ",
        "a+b=",
        "a.b",
    ] {
        assert_claim_rejected(
            server,
            claim(PAYMENTS, bad, 1),
            Code::InvalidArgument,
            "key",
        )
        .await;
    }
    for ok in [
        "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90".to_string(),
        "01ARZ3NDEKTSV4RRFFQ69G5FAV".to_string(),
        "q8Vv4y1ZCk6m2ddH_bn-Ug".to_string(),
        format!("{}{}", key("max"), "k".repeat(255))
            .chars()
            .take(255)
            .collect::<String>(),
    ] {
        assert_eq!(
            outcome_name(&claim_ok(server, T, claim(PAYMENTS, &ok, 1)).await),
            "claimed",
            "{ok}"
        );
    }
    let mut request = claim(PAYMENTS, &key("attempt"), 1);
    request.attempt_id = "has space".into();
    assert_claim_rejected(server, request, Code::InvalidArgument, "attempt_id").await;
}

pub async fn bad_endpoints_are_rejected(server: &TestServer) {
    let k = key("endpoint");
    assert_claim_rejected(server, claim("", &k, 1), Code::InvalidArgument, "endpoint").await;
    assert_claim_rejected(
        server,
        claim("  ", &k, 1),
        Code::InvalidArgument,
        "endpoint",
    )
    .await;
    assert_claim_rejected(
        server,
        claim(&"e".repeat(201), &k, 1),
        Code::InvalidArgument,
        "endpoint",
    )
    .await;
    assert_eq!(
        outcome_name(&claim_ok(server, T, claim(&"e".repeat(200), &k, 1)).await),
        "claimed"
    );
}

pub async fn bad_fingerprints_are_rejected(server: &TestServer) {
    let k = key("fp");
    let with_body = |body: Vec<u8>| {
        let mut request = claim(PAYMENTS, &k, 1);
        if let Some(pb::claim_request::Fingerprint::Request(http)) = &mut request.fingerprint {
            http.body = body;
        }
        request
    };
    let mut missing = claim(PAYMENTS, &k, 1);
    missing.fingerprint = None;
    assert_claim_rejected(server, missing, Code::InvalidArgument, "fingerprint").await;
    for len in [0, 31, 33] {
        let mut request = claim(PAYMENTS, &k, 1);
        request.fingerprint = Some(pb::claim_request::Fingerprint::Sha256(vec![1; len]));
        assert_claim_rejected(server, request, Code::InvalidArgument, "sha256").await;
    }
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129)).into_bytes();
    assert_claim_rejected(
        server,
        with_body(deep),
        Code::InvalidArgument,
        "request.body",
    )
    .await;
    let ok_deep = format!("{}{}", "[".repeat(128), "]".repeat(128)).into_bytes();
    assert_eq!(
        outcome_name(&claim_ok(server, T, with_body(ok_deep)).await),
        "claimed"
    );
    let k = key("fp2");
    let with_body = |body: Vec<u8>| {
        let mut request = claim(PAYMENTS, &k, 1);
        if let Some(pb::claim_request::Fingerprint::Request(http)) = &mut request.fingerprint {
            http.body = body;
        }
        request
    };
    let huge = format!("{{\"pad\":\"{}\"}}", "x".repeat(1024 * 1024)).into_bytes();
    assert_claim_rejected(
        server,
        with_body(huge),
        Code::ResourceExhausted,
        "request.body",
    )
    .await;
    assert_claim_rejected(
        server,
        with_body(b"{\"amount\":".to_vec()),
        Code::InvalidArgument,
        "request.body",
    )
    .await;
    assert_claim_rejected(
        server,
        with_body(br#"{"a":1,"a":2}"#.to_vec()),
        Code::InvalidArgument,
        "request.body",
    )
    .await;
    let mut pointer = with_body(b"{}".to_vec());
    if let Some(pb::claim_request::Fingerprint::Request(http)) = &mut pointer.fingerprint {
        http.ignore_fields = vec!["/ok".into(), "no-slash".into()];
    }
    assert_claim_rejected(
        server,
        pointer,
        Code::InvalidArgument,
        "request.ignore_fields[1]",
    )
    .await;
}

pub async fn bad_durations_are_rejected(server: &TestServer) {
    let k = key("durations");
    let negative = prost_types::Duration {
        seconds: -1,
        nanos: 0,
    };
    let zero = prost_types::Duration {
        seconds: 0,
        nanos: 0,
    };
    for (lease, field) in [(zero, "lease"), (negative, "lease")] {
        let mut request = claim(PAYMENTS, &k, 1);
        request.lease = Some(lease);
        assert_claim_rejected(server, request, Code::InvalidArgument, field).await;
    }
    let mut request = claim(PAYMENTS, &k, 1);
    request.ttl = Some(dur(Duration::from_secs(60)));
    request.lease = Some(dur(Duration::from_secs(61)));
    assert_claim_rejected(server, request, Code::InvalidArgument, "lease").await;
    let mut request = claim(PAYMENTS, &k, 1);
    request.ttl = Some(negative);
    assert_claim_rejected(server, request, Code::InvalidArgument, "ttl").await;
    let mut request = claim(PAYMENTS, &k, 1);
    request.wait = Some(negative);
    assert_claim_rejected(server, request, Code::InvalidArgument, "wait").await;
}

pub async fn oversized_response_is_resource_exhausted(server: &TestServer) {
    let k = key("big");
    let lease = claimed(&claim_ok(server, T, claim(SMALL_ENDPOINT, &k, 1)).await);
    let mut big = sample_response("big");
    big.body = vec![b'x'; 2048];
    let status = complete_on(server, SMALL_ENDPOINT, &k, &lease.lease_token, big)
        .await
        .expect_err("too big");
    assert_bad_field(&status, Code::ResourceExhausted, "response");
    let record = lookup(server, T, SMALL_ENDPOINT, &k)
        .await
        .expect("still held");
    assert_eq!(
        record.state,
        pb::State::InProgress as i32,
        "nothing changed"
    );
    // The 256 KiB default applies elsewhere.
    let k = key("big-default");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let mut big = sample_response("big");
    big.body = vec![b'x'; 256 * 1024 + 1];
    let status = complete(server, &k, &lease.lease_token, big)
        .await
        .expect_err("too big");
    assert_bad_field(&status, Code::ResourceExhausted, "response");
    let mut bad_status = sample_response("s");
    bad_status.status = 42;
    let status = complete(server, &k, &lease.lease_token, bad_status)
        .await
        .expect_err("bad status");
    assert_bad_field(&status, Code::InvalidArgument, "response.status");
}

pub async fn unknown_lease_token_is_lease_lost(server: &TestServer) {
    let k = key("unknown-token");
    claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    let status = complete(server, &k, "0000", sample_response("x"))
        .await
        .expect_err("unknown token");
    assert_precondition(&status, "LEASE_LOST");
    let status = complete(server, &k, "", sample_response("x"))
        .await
        .expect_err("empty token");
    assert_bad_field(&status, Code::InvalidArgument, "lease_token");
    let record = lookup(server, T, PAYMENTS, &k).await.expect("record");
    assert_eq!(
        record.state,
        pb::State::InProgress as i32,
        "nothing changed"
    );
}

pub async fn reconcile_on_completed_is_failed_precondition(server: &TestServer) {
    let k = key("rec-done");
    let lease = claimed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await);
    complete(server, &k, &lease.lease_token, sample_response("done"))
        .await
        .expect("complete");
    let status = reconcile(
        server,
        PAYMENTS,
        &k,
        pb::reconcile_request::Verdict::Committed(sample_response("other")),
    )
    .await
    .expect_err("completed");
    assert_precondition(&status, "NOT_PENDING");
    assert_eq!(
        replayed(&claim_ok(server, T, claim(PAYMENTS, &k, 1)).await).response,
        Some(sample_response("done"))
    );
}

async fn audit_client(server: &TestServer) -> AuditClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    AuditClient::new(channel)
}

async fn audit_events(
    server: &TestServer,
    tenant: &str,
    request: pb::ListAuditEventsRequest,
) -> Result<pb::ListAuditEventsResponse, tonic::Status> {
    audit_client(server)
        .await
        .list_audit_events(as_tenant(tenant, request))
        .await
        .map(tonic::Response::into_inner)
}

fn transitions(events: &[pb::AuditEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .map(|e| (e.from_state.clone(), e.to_state.clone(), e.replayed))
        .collect()
}

pub async fn audit_log_records_transitions_of_audited_endpoints(server: &TestServer) {
    let tenant = unique_tenant("audit");
    let mut client = server.new_client().await;
    let k = key("audited");
    let since = server.now_ms();
    // Claim, complete, replay on the audited endpoint.
    let lease = claimed(
        &client
            .claim(as_tenant(&tenant, claim(AUDITED_ENDPOINT, &k, 10)))
            .await
            .expect("claim")
            .into_inner(),
    );
    client
        .complete(as_tenant(
            &tenant,
            pb::CompleteRequest {
                endpoint: AUDITED_ENDPOINT.into(),
                key: k.clone(),
                lease_token: lease.lease_token.clone(),
                response: Some(sample_response("aud_1")),
            },
        ))
        .await
        .expect("complete");
    let replay = client
        .claim(as_tenant(&tenant, claim(AUDITED_ENDPOINT, &k, 10)))
        .await
        .expect("replay")
        .into_inner();
    assert_eq!(outcome_name(&replay), "replayed");
    // A second key ends UNKNOWN; a key on a non-audited endpoint leaves no
    // trace in the audit log.
    let other = key("audited-unknown");
    let other_lease = claimed(
        &client
            .claim(as_tenant(&tenant, claim(AUDITED_ENDPOINT, &other, 11)))
            .await
            .expect("claim")
            .into_inner(),
    );
    client
        .fail(as_tenant(
            &tenant,
            pb::FailRequest {
                endpoint: AUDITED_ENDPOINT.into(),
                key: other.clone(),
                lease_token: other_lease.lease_token,
                disposition: pb::Disposition::Unknown.into(),
                reason: "gateway timeout".into(),
            },
        ))
        .await
        .expect("fail");
    client
        .claim(as_tenant(&tenant, claim(PAYMENTS, &k, 10)))
        .await
        .expect("claim on a non-audited endpoint");

    // One key's history, oldest first, without the raw key.
    let history = audit_events(
        server,
        &tenant,
        pb::ListAuditEventsRequest {
            endpoint: AUDITED_ENDPOINT.into(),
            key: k.clone(),
            ..Default::default()
        },
    )
    .await
    .expect("history");
    assert_eq!(
        transitions(&history.events),
        vec![
            ("none".into(), "claimed".into(), false),
            ("in_progress".into(), "completed".into(), false),
            ("completed".into(), "completed".into(), true),
        ]
    );
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(k.as_bytes()));
    for event in &history.events {
        assert_eq!(event.key_sha256, digest);
        assert_eq!(event.endpoint, AUDITED_ENDPOINT);
        assert!(ts_ms(&event.at) >= since);
        assert!(!format!("{event:?}").contains(&k), "no raw key in an event");
        assert_eq!(
            event.fingerprint_prefix,
            hex::encode(&replay.fingerprint[..6])
        );
    }
    assert_eq!(history.events[1].response_status, 201);
    assert_eq!(history.events[0].attempt, 1);
    assert!(history.next_page_token.is_empty());

    // The tenant's timeline: both audited keys, nothing from PAYMENTS.
    let timeline = audit_events(
        server,
        &tenant,
        pb::ListAuditEventsRequest {
            since: Some(prost_types::Timestamp {
                seconds: since / 1000,
                nanos: 0,
            }),
            ..Default::default()
        },
    )
    .await
    .expect("timeline");
    assert_eq!(
        timeline.events.len(),
        5,
        "{:?}",
        transitions(&timeline.events)
    );
    assert!(
        timeline
            .events
            .iter()
            .all(|e| e.endpoint == AUDITED_ENDPOINT)
    );
    assert!(
        timeline
            .events
            .iter()
            .any(|e| e.from_state == "in_progress" && e.to_state == "unknown")
    );
    // Paging by two reaches the same five events.
    let mut paged = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = audit_events(
            server,
            &tenant,
            pb::ListAuditEventsRequest {
                page_size: 2,
                page_token: page_token.clone(),
                ..Default::default()
            },
        )
        .await
        .expect("page");
        assert!(page.events.len() <= 2);
        paged.extend(page.events);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(paged, timeline.events);
    // Another tenant sees none of it.
    let foreign = audit_events(
        server,
        &unique_tenant("audit-other"),
        pb::ListAuditEventsRequest {
            endpoint: AUDITED_ENDPOINT.into(),
            key: k,
            ..Default::default()
        },
    )
    .await
    .expect("foreign");
    assert!(foreign.events.is_empty());
}

pub async fn audit_requests_are_validated(server: &TestServer) {
    let bad = [
        (
            pb::ListAuditEventsRequest {
                key: "k".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "endpoint",
        ),
        (
            pb::ListAuditEventsRequest {
                page_size: 5000,
                ..Default::default()
            },
            Code::InvalidArgument,
            "page_size",
        ),
        (
            pb::ListAuditEventsRequest {
                page_token: "garbage".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "page_token",
        ),
        (
            pb::ListAuditEventsRequest {
                endpoint: AUDITED_ENDPOINT.into(),
                key: "bad key with spaces".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "key",
        ),
    ];
    for (request, code, field) in bad {
        let status = audit_events(server, T, request)
            .await
            .expect_err("rejected");
        assert_bad_field(&status, code, field);
    }
}

/// An item error as the `Status` the single RPC would have returned.
fn item_status(error: &pb::ItemError) -> tonic::Status {
    tonic::Status::with_details(
        Code::from(error.code),
        error.message.clone(),
        error.status_details.clone().into(),
    )
}

fn claim_item(result: &pb::ClaimBatchResult) -> Result<&pb::ClaimResponse, tonic::Status> {
    match result.result.as_ref().expect("every item has a result") {
        pb::claim_batch_result::Result::Response(response) => Ok(response),
        pb::claim_batch_result::Result::Error(error) => Err(item_status(error)),
    }
}

fn complete_item(result: &pb::CompleteBatchResult) -> Result<&pb::CompleteResponse, tonic::Status> {
    match result.result.as_ref().expect("every item has a result") {
        pb::complete_batch_result::Result::Response(response) => Ok(response),
        pb::complete_batch_result::Result::Error(error) => Err(item_status(error)),
    }
}

/// ClaimBatch and CompleteBatch: each item answered in order as Claim and
/// Complete answer it alone (fresh, the same key twice in one batch, a bad
/// key, a stale token), the other items unaffected, and what a batch stored
/// is what single calls see.
pub async fn batch_items_answer_as_the_single_rpcs_would(server: &TestServer) {
    let (a, b, c) = (key("batch-a"), key("batch-b"), key("batch-c"));
    let mut client = server.new_client().await;
    let mut no_endpoint = claim("", &b, 2);
    no_endpoint.endpoint.clear();
    let claims = client
        .claim_batch(as_tenant(
            T,
            pb::ClaimBatchRequest {
                endpoint: PAYMENTS.into(),
                claims: vec![
                    claim(PAYMENTS, &a, 1),
                    no_endpoint,
                    claim(PAYMENTS, "not a key!", 3),
                    claim(PAYMENTS, &c, 4),
                    claim(PAYMENTS, &c, 4),
                ],
            },
        ))
        .await
        .expect("ClaimBatch")
        .into_inner()
        .results;
    assert_eq!(claims.len(), 5, "one result per item");
    let lease_a = claimed(claim_item(&claims[0]).expect("a claimed"));
    let lease_b = claimed(claim_item(&claims[1]).expect("b claimed under the batch's endpoint"));
    let bad = claim_item(&claims[2]).expect_err("a bad key is that item's error");
    assert_bad_field(&bad, Code::InvalidArgument, "key");
    // The same key twice in one batch: the items race like two callers do;
    // exactly one wins, the other is told the key is in progress.
    let mut twice: Vec<&str> = [&claims[3], &claims[4]]
        .iter()
        .map(|r| outcome_name(claim_item(r).expect("c answered")))
        .collect();
    twice.sort_unstable();
    assert_eq!(twice, ["claimed", "in_progress"], "one winner per key");
    let lease_c = [&claims[3], &claims[4]]
        .iter()
        .find_map(|r| match &claim_item(r).ok()?.outcome {
            Some(pb::claim_response::Outcome::Claimed(lease)) => Some(lease.clone()),
            _ => None,
        })
        .expect("c has a winner");

    // A single Claim sees what the batch did.
    let single = claim_ok(server, T, claim(PAYMENTS, &a, 1)).await;
    assert_eq!(
        outcome_name(&single),
        "in_progress",
        "a is held by the batch's lease"
    );

    let completion = |key: &str, token: &str| pb::CompleteRequest {
        endpoint: String::new(),
        key: key.into(),
        lease_token: token.into(),
        response: Some(sample_response(key)),
    };
    let mut missing_response = completion(&b, &lease_b.lease_token);
    missing_response.response = None;
    let completions = client
        .complete_batch(as_tenant(
            T,
            pb::CompleteBatchRequest {
                endpoint: PAYMENTS.into(),
                completions: vec![
                    completion(&a, &lease_a.lease_token),
                    completion(&c, "0123456789abcdef0123456789abcdef"),
                    missing_response,
                    completion(&c, &lease_c.lease_token),
                ],
            },
        ))
        .await
        .expect("CompleteBatch")
        .into_inner()
        .results;
    assert_eq!(completions.len(), 4, "one result per item");
    assert!(
        ts_ms(
            &complete_item(&completions[0])
                .expect("a completes")
                .expires_at
        ) > 0
    );
    assert_precondition(
        &complete_item(&completions[1]).expect_err("a stale token is refused"),
        "LEASE_LOST",
    );
    assert_bad_field(
        &complete_item(&completions[2]).expect_err("a response is required"),
        Code::InvalidArgument,
        "response",
    );
    complete_item(&completions[3]).expect("c completes");

    // What the batch stored replays to single calls and to another batch;
    // b, whose Complete was refused, is still held.
    assert_eq!(
        replayed(&claim_ok(server, T, claim(PAYMENTS, &a, 1)).await).response,
        Some(sample_response(&a))
    );
    let again = client
        .claim_batch(as_tenant(
            T,
            pb::ClaimBatchRequest {
                endpoint: PAYMENTS.into(),
                claims: vec![
                    claim(PAYMENTS, &c, 4),
                    claim(PAYMENTS, &b, 2),
                    claim(PAYMENTS, &a, 999),
                ],
            },
        ))
        .await
        .expect("ClaimBatch")
        .into_inner()
        .results;
    let names: Vec<&str> = again
        .iter()
        .map(|r| outcome_name(claim_item(r).expect("answered")))
        .collect();
    assert_eq!(names, ["replayed", "in_progress", "mismatch"]);
    assert_eq!(
        replayed(claim_item(&again[0]).expect("c")).response,
        Some(sample_response(&c))
    );
}

/// A batch needs a valid endpoint and 1 to 500 items (INVALID_ARGUMENT
/// naming the field, nothing applied); an item naming another endpoint is
/// refused alone, since the caller was authorized for the batch's only.
pub async fn batch_bounds_and_endpoints_are_enforced(server: &TestServer) {
    let mut client = server.new_client().await;
    let batch = |endpoint: &str, claims: Vec<pb::ClaimRequest>| {
        as_tenant(
            T,
            pb::ClaimBatchRequest {
                endpoint: endpoint.into(),
                claims,
            },
        )
    };
    let empty = client
        .claim_batch(batch(PAYMENTS, vec![]))
        .await
        .expect_err("an empty batch");
    assert_bad_field(&empty, Code::InvalidArgument, "claims");
    let first = key("batch-over");
    let over: Vec<pb::ClaimRequest> = (0..501)
        .map(|i| claim(PAYMENTS, &format!("{first}-{i}"), 1))
        .collect();
    let too_many = client
        .claim_batch(batch(PAYMENTS, over.clone()))
        .await
        .expect_err("501 items");
    assert_bad_field(&too_many, Code::InvalidArgument, "claims");
    assert!(too_many.message().contains("500"), "{}", too_many.message());
    // Nothing of the refused batch was applied.
    let status = client
        .lookup(as_tenant(
            T,
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: format!("{first}-0"),
                include_response: false,
            },
        ))
        .await
        .expect_err("not claimed");
    assert_eq!(status.code(), Code::NotFound);
    // 500 is allowed.
    let full = client
        .claim_batch(batch(PAYMENTS, over[..500].to_vec()))
        .await
        .expect("500 items")
        .into_inner()
        .results;
    assert_eq!(full.len(), 500);
    assert!(
        full.iter()
            .all(|r| outcome_name(claim_item(r).expect("claimed")) == "claimed")
    );

    let no_endpoint = client
        .claim_batch(batch("", vec![claim(PAYMENTS, &key("batch-ep"), 1)]))
        .await
        .expect_err("the batch's endpoint is required");
    assert_bad_field(&no_endpoint, Code::InvalidArgument, "endpoint");

    let other = key("batch-other");
    let mixed = client
        .claim_batch(batch(
            PAYMENTS,
            vec![
                claim(TAKEOVER_ENDPOINT, &other, 1),
                claim(PAYMENTS, &other, 1),
            ],
        ))
        .await
        .expect("ClaimBatch")
        .into_inner()
        .results;
    assert_bad_field(
        &claim_item(&mixed[0]).expect_err("another endpoint"),
        Code::InvalidArgument,
        "claims[0].endpoint",
    );
    assert_eq!(outcome_name(claim_item(&mixed[1]).expect("ok")), "claimed");

    let completions = client
        .complete_batch(as_tenant(
            T,
            pb::CompleteBatchRequest {
                endpoint: PAYMENTS.into(),
                completions: vec![],
            },
        ))
        .await
        .expect_err("an empty batch");
    assert_bad_field(&completions, Code::InvalidArgument, "completions");
}
