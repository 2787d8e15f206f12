//! Admission limits over gRPC against a real server: the per-tenant rate of
//! new keys (time driven by the manual clock) and the in-flight limit with
//! load shedding. Both answer RESOURCE_EXHAUSTED with RetryInfo and a reason.

use std::time::Duration;

use crate::common::*;
use idemd::proto::v1 as pb;
use tonic::Code;
use tonic_types::StatusExt;

fn retry_after_and_reason(status: &tonic::Status) -> (Option<Duration>, String) {
    let details = status.get_error_details();
    (
        details.retry_info().and_then(|info| info.retry_delay),
        details
            .error_info()
            .map(|info| info.reason.clone())
            .unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_are_rate_limited_per_tenant_and_replays_are_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.limits.claim_rate = 1.0;
    settings.limits.claim_burst = 2;
    let server = TestServer::start(dir, settings, None).await;
    let mut client = server.new_client().await;

    let first = claimed(
        &client
            .claim(as_tenant("acme", claim(PAYMENTS, "rl-1", 1)))
            .await
            .expect("within the burst")
            .into_inner(),
    );
    client
        .claim(as_tenant("acme", claim(PAYMENTS, "rl-2", 1)))
        .await
        .expect("within the burst");
    let status = client
        .claim(as_tenant("acme", claim(PAYMENTS, "rl-3", 1)))
        .await
        .expect_err("over the rate");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let (retry_after, reason) = retry_after_and_reason(&status);
    assert_eq!(reason, "RATE_LIMITED");
    assert_eq!(
        retry_after,
        Some(Duration::from_secs(1)),
        "one key per second"
    );
    // Nothing was written for the refused key.
    let missing = client
        .lookup(as_tenant(
            "acme",
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: "rl-3".into(),
                include_response: false,
            },
        ))
        .await
        .expect_err("not created");
    assert_eq!(missing.code(), Code::NotFound);

    // Answers about existing keys are not limited: in-progress and replay.
    let again = client
        .claim(as_tenant("acme", claim(PAYMENTS, "rl-2", 1)))
        .await
        .expect("existing key")
        .into_inner();
    assert_eq!(outcome_name(&again), "in_progress");
    client
        .complete(as_tenant(
            "acme",
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "rl-1".into(),
                lease_token: first.lease_token,
                response: Some(sample_response("rl")),
            },
        ))
        .await
        .expect("complete");
    let replay = client
        .claim(as_tenant("acme", claim(PAYMENTS, "rl-1", 1)))
        .await
        .expect("replays are not limited")
        .into_inner();
    assert_eq!(outcome_name(&replay), "replayed");

    // Another tenant has its own bucket.
    client
        .claim(as_tenant("globex", claim(PAYMENTS, "rl-3", 1)))
        .await
        .expect("other tenant");
    // A second later the tenant may create one more key.
    server.clock.advance(Duration::from_secs(1));
    client
        .claim(as_tenant("acme", claim(PAYMENTS, "rl-3", 1)))
        .await
        .expect("refilled");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_of_one_new_key_cost_one_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    // The manual clock never advances here: no refill, only the burst.
    settings.limits.claim_rate = 1.0;
    settings.limits.claim_burst = 2;
    let server = TestServer::start(dir, settings, None).await;

    let mut racers = Vec::new();
    for _ in 0..8 {
        let mut client = server.new_client().await;
        racers.push(tokio::spawn(async move {
            client
                .claim(as_tenant("acme", claim(PAYMENTS, "race-1", 1)))
                .await
        }));
    }
    let mut winners = 0;
    for racer in racers {
        match racer.await.expect("racer task") {
            Ok(response) => {
                let outcome = outcome_name(&response.into_inner());
                assert!(
                    outcome == "claimed" || outcome == "in_progress",
                    "{outcome}"
                );
                winners += usize::from(outcome == "claimed");
            }
            // A racer refused before the winner's insert was visible: it
            // would have created the key, so the limit applies to it.
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
    }
    assert_eq!(winners, 1, "exactly one racer creates the key");

    // However many racers took a token, the losers gave theirs back: the
    // burst of 2 has exactly one key left in it.
    let mut client = server.new_client().await;
    client
        .claim(as_tenant("acme", claim(PAYMENTS, "race-2", 1)))
        .await
        .expect("the second token of the burst is still there");
    let status = client
        .claim(as_tenant("acme", claim(PAYMENTS, "race-3", 1)))
        .await
        .expect_err("the burst is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_in_flight_limit_are_shed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.limits.max_in_flight = 2;
    let server = TestServer::start(dir, settings, None).await;
    let mut client = server.new_client().await;
    let holder = claimed(
        &client
            .claim(as_tenant("acme", claim(PAYMENTS, "busy", 1)))
            .await
            .expect("claim")
            .into_inner(),
    );
    // Two duplicates wait on the holder, which never finishes while they
    // wait: both slots stay taken for as long as the test needs, however
    // slow the machine.
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let mut waiting = claim(PAYMENTS, "busy", 1);
        waiting.wait = Some(dur(Duration::from_secs(10)));
        let mut waiter = server.new_client().await;
        // A waiter that arrives after one of the probing Lookups below
        // is itself shed; like any caller it retries until it holds a slot.
        waiters.push(tokio::spawn(async move {
            loop {
                match waiter.claim(as_tenant("acme", waiting.clone())).await {
                    Err(status) if status.code() == Code::ResourceExhausted => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    answer => return answer,
                }
            }
        }));
    }
    let lookup = || {
        as_tenant(
            "acme",
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: "busy".into(),
                include_response: false,
            },
        )
    };
    // The waiters take their slots within moments; a third call is shed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let shed = loop {
        match client.lookup(lookup()).await {
            Err(status) if status.code() == Code::ResourceExhausted => break status,
            _ if tokio::time::Instant::now() > deadline => {
                panic!("the third call was never shed")
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let (retry_after, reason) = retry_after_and_reason(&shed);
    assert_eq!(reason, "OVERLOADED");
    assert!(retry_after.is_some(), "RetryInfo tells when to retry");
    // Callers that give up (the client cancels the stream) release their
    // slots: a shed server must not stay shut because of abandoned waits.
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        assert!(waiter.await.is_err_and(|error| error.is_cancelled()));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match client.lookup(lookup()).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the cancelled waits never released their slots"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(status) => panic!("lookup failed: {status}"),
        }
    }
    client
        .complete(as_tenant(
            "acme",
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "busy".into(),
                lease_token: holder.lease_token,
                response: Some(sample_response("busy")),
            },
        ))
        .await
        .expect("admitted again");
    server.stop().await;
}
