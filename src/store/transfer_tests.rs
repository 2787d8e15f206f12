//! The copy on an in-memory target: what a run writes, what a second run
//! finds, and what the lease credit gives.

use super::transfer::*;
use super::{Record, Store};
use std::time::Duration;

use crate::clock::{Clock, ManualClock};
use crate::store::memory::MemoryStore;
use crate::store::{RecordKey, RecordState, StoredResponse};

fn record(key: &str, state: RecordState, now: i64) -> Record {
    Record {
        id: RecordKey {
            tenant: "t".into(),
            endpoint: "POST /v1/payments".into(),
            key: key.into(),
        },
        state,
        fingerprint: vec![1; 32],
        attempt: 1,
        lease_token: format!("lease-{key}"),
        attempt_id: String::new(),
        created_at_ms: now - 1_000,
        updated_at_ms: now - 500,
        lease_expires_at_ms: now + 60_000,
        completed_at_ms: (state == RecordState::Completed).then_some(now - 500),
        expires_at_ms: now + 3_600_000,
        response: (state == RecordState::Completed).then(|| StoredResponse {
            status: 201,
            body: b"ok".to_vec(),
            ..StoredResponse::default()
        }),
        reason: String::new(),
    }
}

async fn copy(records: &[Record], target: &MemoryStore, clock: &ManualClock) -> CopyReport {
    let source = futures::stream::iter(records.iter().cloned().map(Ok));
    copy_records(source, target, clock, CopyOptions::default(), |_| {})
        .await
        .expect("copy")
}

#[tokio::test]
async fn a_second_run_finds_every_record_present_and_names_conflicts_by_hash() {
    let clock = ManualClock::starting_now();
    let now = clock.now_ms();
    let target = MemoryStore::new();
    let records: Vec<Record> = [
        RecordState::InProgress,
        RecordState::Completed,
        RecordState::Failed,
        RecordState::Unknown,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, state)| record(&format!("secret-key-{i}"), state, now))
    .collect();

    let first = copy(&records, &target, &clock).await;
    assert_eq!((first.read, first.copied, first.present), (4, 4, 0));
    for source in &records {
        let copied = target.get(&source.id, now).await.expect("get");
        assert_eq!(copied.as_ref(), Some(source), "copied as it is");
    }

    let second = copy(&records, &target, &clock).await;
    assert_eq!((second.copied, second.present, second.conflicts), (0, 4, 0));

    let mut changed = records[1].clone();
    changed.fingerprint = vec![2; 32];
    let third = copy(&[changed], &target, &clock).await;
    assert_eq!((third.copied, third.conflicts), (0, 1));
    let named = &third.conflict_keys[0];
    assert!(!named.contains("secret-key"), "never the raw key: {named}");
    assert!(
        named.contains(&crate::fingerprint::short_hash(b"secret-key-1")),
        "{named}"
    );
}

#[tokio::test]
async fn a_record_expired_before_its_write_is_not_written() {
    let clock = ManualClock::starting_now();
    let now = clock.now_ms();
    let mut expired = record("gone", RecordState::Completed, now);
    expired.expires_at_ms = now;
    let target = MemoryStore::new();
    let report = copy(&[expired.clone()], &target, &clock).await;
    assert_eq!((report.copied, report.expired), (0, 1));
    assert_eq!(target.get(&expired.id, now - 1).await.expect("get"), None);
}
async fn apply(
    changes: Vec<Change>,
    target: &MemoryStore,
    clock: &ManualClock,
    lease_credit: Option<LeaseCredit>,
) -> CopyReport {
    let options = CopyOptions {
        lease_credit,
        ..CopyOptions::default()
    };
    copy_changes(
        futures::stream::iter(changes.into_iter().map(Ok)),
        target,
        clock,
        options,
        |_| {},
    )
    .await
    .expect("copy changes")
}

#[tokio::test]
async fn changes_since_a_bulk_copy_leave_the_target_as_the_source_and_run_again_harmlessly() {
    let clock = ManualClock::starting_now();
    let now = clock.now_ms();
    let target = MemoryStore::new();
    // The bulk: four records of a backup.
    let backup: Vec<Record> = ["done", "running", "released", "reclaimed"]
        .iter()
        .map(|key| record(key, RecordState::InProgress, now))
        .collect();
    let bulk = copy(&backup, &target, &clock).await;
    assert_eq!(bulk.copied, 4);

    // Since the backup: "done" completed, "running" unchanged,
    // "released" failed and released, "reclaimed" released and claimed
    // anew (another dedup window), "new" claimed.
    let mut done = record("done", RecordState::Completed, now);
    done.lease_token = backup[0].lease_token.clone();
    let mut reclaimed = record("reclaimed", RecordState::InProgress, now);
    reclaimed.lease_token = "lease-anew".into();
    reclaimed.expires_at_ms = now + 7_200_000;
    let fresh = record("new", RecordState::Completed, now);
    let changes = vec![
        Change::Put {
            before: Some(backup[0].clone()),
            after: done.clone(),
        },
        Change::Same(backup[1].clone()),
        // Keys a merge only counted (their records are not even decoded).
        Change::Unchanged { keys: 40 },
        Change::Remove {
            before: backup[2].clone(),
        },
        Change::Put {
            before: Some(backup[3].clone()),
            after: reclaimed.clone(),
        },
        Change::Put {
            before: None,
            after: fresh.clone(),
        },
    ];
    let first = apply(changes.clone(), &target, &clock, None).await;
    assert_eq!(
        (
            first.copied,
            first.removed,
            first.unchanged,
            first.conflicts
        ),
        (3, 1, 41, 0),
        "{first:?}"
    );
    assert_eq!(first.read, 45, "counted keys are read keys: {first:?}");
    for expected in [&done, &backup[1], &reclaimed, &fresh] {
        let held = target.get(&expected.id, now).await.expect("get");
        assert_eq!(held.as_ref(), Some(expected), "{}", expected.id.key);
    }
    assert_eq!(
        target.get(&backup[2].id, now).await.expect("get"),
        None,
        "released"
    );

    let again = apply(changes, &target, &clock, None).await;
    assert_eq!(
        (again.copied, again.present, again.removed, again.conflicts),
        (0, 3, 1, 0),
        "a second run finds its own writes: {again:?}"
    );

    // A key someone else wrote since is a conflict, not overwritten.
    let mut other = done.clone();
    other.fingerprint = vec![9; 32];
    let conflict = apply(
        vec![Change::Put {
            before: Some(backup[0].clone()),
            after: other,
        }],
        &target,
        &clock,
        None,
    )
    .await;
    assert_eq!(conflict.conflicts, 1);
    assert_eq!(
        target.get(&done.id, now).await.expect("get").as_ref(),
        Some(&done)
    );
}

#[tokio::test]
async fn leases_live_at_the_stop_get_the_stop_and_the_grace_and_no_other_record_does() {
    let clock = ManualClock::starting_now();
    let now = clock.now_ms();
    let stopped_at_ms = now - 40_000;
    let target = MemoryStore::new();
    // Live when idemd stopped 40 s ago, run out since (by wall clock).
    let mut held = record("held", RecordState::InProgress, now);
    held.lease_expires_at_ms = stopped_at_ms + 5_000;
    // Ran out before the stop: its holder was gone already.
    let mut lapsed = record("lapsed", RecordState::InProgress, now);
    lapsed.lease_expires_at_ms = stopped_at_ms - 1;
    // Near the end of its dedup window: capped there.
    let mut ending = record("ending", RecordState::InProgress, now);
    ending.expires_at_ms = now + 10_000;
    ending.lease_expires_at_ms = now + 5_000;
    let done = record("done", RecordState::Completed, now);
    let credit = LeaseCredit {
        stopped_at_ms,
        grace: Duration::from_secs(60),
    };
    let report = apply(
        vec![
            Change::Put {
                before: None,
                after: held.clone(),
            },
            Change::Same(lapsed.clone()),
            Change::Put {
                before: None,
                after: ending.clone(),
            },
            Change::Put {
                before: None,
                after: done.clone(),
            },
        ],
        &target,
        &clock,
        Some(credit),
    )
    .await;
    assert_eq!(report.leases_credited, 2, "{report:?}");
    let lease = |record: Option<Record>| record.expect("held").lease_expires_at_ms;
    assert_eq!(
        lease(target.get(&held.id, now).await.expect("get")),
        held.lease_expires_at_ms + 40_000 + 60_000,
        "the stop and the grace"
    );
    assert_eq!(
        lease(target.get(&ending.id, now).await.expect("get")),
        ending.expires_at_ms,
        "never past the dedup window"
    );
    assert_eq!(
        target.get(&done.id, now).await.expect("get").as_ref(),
        Some(&done),
        "a completed record is copied as it is"
    );
}
