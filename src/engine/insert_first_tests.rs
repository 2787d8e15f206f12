//! Claim on a store that inserts before it reads (the CQL backend's way,
//! [`crate::store::Store::read_before_insert`] `false`): the insert answers
//! for a key the replica never saw, and a key it has seen is read first so
//! that its duplicates make no conditional write ([`super::existing`]).

use std::sync::Arc;
use std::time::Duration;

use super::tests::{PAY, TENANT, input, replica, response};
use super::*;
use crate::clock::ManualClock;
use crate::store::memory::MemoryStore;

/// What `engine` answers to a Claim of `key` (body `{}`).
async fn outcome(engine: &Engine, key: &str) -> ClaimOutcome {
    engine
        .claim(TENANT, input(PAY, key, "{}"))
        .await
        .expect("claim")
        .outcome
}

/// The lease `engine` grants for `key`; panics on any other answer.
async fn claimed(engine: &Engine, key: &str) -> Lease {
    match outcome(engine, key).await {
        ClaimOutcome::Claimed(lease) => lease,
        other => panic!("{key}: expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn without_a_read_before_insert_the_insert_answers_for_an_existing_key() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Arc::new(MemoryStore::inserting_first());
    let (first, other) = (
        replica(store.clone(), &clock, 1024 * 1024),
        replica(store.clone(), &clock, 0),
    );
    let lease = claimed(&first, "k").await;
    assert_eq!(store.reads(), 0, "a fresh key costs no read");
    // Another replica, nothing cached or seen: the insert reports the
    // in-flight claim.
    assert!(matches!(
        outcome(&other, "k").await,
        ClaimOutcome::InProgress { .. }
    ));
    assert_eq!(store.reads(), 0, "the insert answered for the existing key");
    first
        .complete(TENANT, PAY, "k", &lease.lease_token, response("ok"))
        .await
        .expect("complete");
    match outcome(&other, "k").await {
        ClaimOutcome::Replayed { response: r, .. } => assert_eq!(r, response("ok")),
        outcome => panic!("expected a replay, got {outcome:?}"),
    }
    assert_eq!(
        other
            .claim(TENANT, input(PAY, "k", "{\"changed\":1}"))
            .await
            .expect("claim")
            .outcome,
        ClaimOutcome::Mismatch
    );
    // Once seen, the key's next Claims read instead of inserting
    // (`engine::existing`).
    assert_eq!(store.inserts(), 2, "the holder's and the first duplicate's");
    assert_eq!(store.reads(), 2, "the replay and the mismatch");
    assert_eq!(store.len(), 1);
}

/// Duplicates polling an in-flight key (409 + Retry-After, or a Claim's
/// `wait`) on a store that inserts first: after the insert that found the
/// key, they read. On CQL each insert was a Paxos round on the key's
/// partition, and a crowd of them starved the holder's Complete. Fails
/// without `engine::existing`.
#[tokio::test]
async fn duplicates_of_an_in_flight_key_read_instead_of_inserting_again() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Arc::new(MemoryStore::inserting_first());
    let (holder, other) = (
        replica(store.clone(), &clock, 0),
        replica(store.clone(), &clock, 0),
    );
    let lease = claimed(&holder, "k").await;
    for engine in [&holder, &other] {
        for _ in 0..10 {
            assert!(matches!(
                outcome(engine, "k").await,
                ClaimOutcome::InProgress { .. }
            ));
        }
    }
    assert_eq!(
        store.inserts(),
        2,
        "the holder's insert and the other replica's first: 20 duplicates made no more"
    );
    // A duplicate that waits polls with reads too, and gets the replay.
    let waiting = {
        let mut waiting = input(PAY, "k", "{}");
        waiting.wait_ms = Some(5_000);
        other.claim(TENANT, waiting)
    };
    let completing = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        holder
            .complete(TENANT, PAY, "k", &lease.lease_token, response("ok"))
            .await
            .expect("complete");
    };
    let (waited, ()) = tokio::join!(waiting, completing);
    assert!(matches!(
        waited.expect("claim").outcome,
        ClaimOutcome::Replayed { .. }
    ));
    assert_eq!(store.inserts(), 2, "the waiting duplicate made no insert");
    // A key seen in flight and released since is created by the next
    // Claim: the read finds nothing, the insert goes ahead.
    let lease = claimed(&holder, "released").await;
    assert!(matches!(
        outcome(&other, "released").await,
        ClaimOutcome::InProgress { .. }
    ));
    holder
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
    let reads = store.reads();
    claimed(&other, "released").await;
    assert_eq!(store.reads(), reads + 1, "one read found the key gone");
}
