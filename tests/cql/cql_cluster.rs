//! The CQL backend as a shared service: several idemd replicas on one
//! cluster, uncertain (timed-out) writes, and concurrent migrations.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::process::{kill9, spawn};
use crate::common::*;
use idemd::proto::v1 as pb;
use idemd::store::cql::CqlStore;
use idemd::store::{InsertOutcome, Record, RecordKey, RecordState, Store, StoreError};

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{nanos:x}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_cluster_have_one_winner_per_key() {
    crate::cql_support::migrated_options().await;
    let flags = crate::cql_support::cql_flags(crate::cql_support::TEST_KEYSPACE);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let dir_a = tempfile::tempdir().expect("temp dir");
    let dir_b = tempfile::tempdir().expect("temp dir");
    let replica_a = spawn(dir_a.path(), &flags);
    let replica_b = spawn(dir_b.path(), &flags);
    let tenant = unique("replicas");
    let keys = 200;
    let per_key = 32;

    let mut tasks = Vec::new();
    let clients = [connect(replica_a.addr).await, connect(replica_b.addr).await];
    for contender in 0..per_key {
        for key in 0..keys {
            let replica = contender % 2;
            let mut client = clients[replica].clone();
            let request = claim(PAYMENTS, &format!("k{key}"), 7);
            let tenant = tenant.clone();
            tasks.push(tokio::spawn(async move {
                let response = client.claim(as_tenant(&tenant, request)).await;
                (key, replica, response)
            }));
        }
    }
    let mut winners: HashMap<usize, Vec<(usize, pb::Claimed)>> = HashMap::new();
    let mut unavailable = 0;
    for task in tasks {
        let (key, replica, response) = task.await.expect("task");
        match response {
            Ok(response) => match outcome_name(&response.get_ref().clone()) {
                "claimed" => winners
                    .entry(key)
                    .or_default()
                    .push((replica, claimed(response.get_ref()))),
                "in_progress" => {}
                other => panic!("unexpected outcome {other}"),
            },
            // An uncertain write that could not be resolved is reported,
            // never guessed; it must be rare and is not a winner.
            Err(status) if status.code() == tonic::Code::Unavailable => unavailable += 1,
            Err(status) => panic!("claim failed: {status:?}"),
        }
    }
    assert!(
        unavailable <= keys * per_key / 100,
        "{unavailable} unavailable answers"
    );
    for key in 0..keys {
        let found = winners.get(&key).map_or(0, Vec::len);
        assert!(found <= 1, "key k{key} has {found} winners");
    }
    assert!(
        winners.len() >= keys - unavailable,
        "almost every key has its winner"
    );

    // Complete through the replica that won, replay through the other.
    let mut completed = 0;
    for (key, holders) in &winners {
        let (replica, lease) = &holders[0];
        let mut writer = clients[*replica].clone();
        let mut reader = clients[1 - *replica].clone();
        let response = sample_response(&format!("pay-{key}"));
        writer
            .complete(as_tenant(
                &tenant,
                pb::CompleteRequest {
                    endpoint: PAYMENTS.into(),
                    key: format!("k{key}"),
                    lease_token: lease.lease_token.clone(),
                    response: Some(response.clone()),
                },
            ))
            .await
            .expect("complete");
        let replay = reader
            .claim(as_tenant(&tenant, claim(PAYMENTS, &format!("k{key}"), 7)))
            .await
            .expect("claim on the other replica")
            .into_inner();
        assert_eq!(
            replayed(&replay).response,
            Some(response),
            "replayed across replicas"
        );
        completed += 1;
        if completed == 50 {
            break;
        }
    }
    kill9(replica_a);
    kill9(replica_b);
}

/// A claim is never invisible to ListPending, whichever write idemd dies
/// after: killed between the pending-index entry and the insert, nothing was
/// claimed (the key is free, the stray entry is not listed); killed after the
/// insert, before answering, the claim is listed once its lease runs out.
/// Fails if the index entry is ever written after the insert (or off the
/// reply path), since the second crash would then hide a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_two_writes_never_hides_a_claim_from_list_pending() {
    crate::cql_support::migrated_options().await;
    let flags = crate::cql_support::cql_flags(crate::cql_support::TEST_KEYSPACE);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let tenant = unique("crash-points");
    let lease = Duration::from_millis(1500);
    for (point, key) in [
        ("claim-after-index", "before"),
        ("claim-after-insert", "after"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = crate::common::process::idemd_command(dir.path(), &flags);
        command.env("IDEMD_CRASH_AT", point);
        let mut doomed = crate::common::process::spawn_command(command);
        let mut request = claim(PAYMENTS, key, 7);
        request.lease = Some(dur(lease));
        let answer = connect(doomed.addr)
            .await
            .claim(as_tenant(&tenant, request))
            .await;
        assert!(answer.is_err(), "{point}: idemd answered instead of dying");
        let status = doomed.child.wait().expect("reaped");
        assert!(!status.success(), "{point}: idemd exited cleanly");
    }
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let survivor = spawn(dir.path(), &flags);
    let mut client = connect(survivor.addr).await;
    let pending = client
        .list_pending(as_tenant(&tenant, pb::ListPendingRequest::default()))
        .await
        .expect("list pending")
        .into_inner();
    let keys: Vec<&str> = pending.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["after"], "the claim that was written, and only it");
    let fresh = client
        .claim(as_tenant(&tenant, claim(PAYMENTS, "before", 7)))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(
        outcome_name(&fresh),
        "claimed",
        "nothing was claimed before the crash"
    );
    kill9(survivor);
}

fn contender_record(key: &RecordKey, contender: usize, now: i64) -> Record {
    Record {
        id: key.clone(),
        state: RecordState::InProgress,
        fingerprint: vec![5; 32],
        attempt: 1,
        lease_token: format!("token-{contender}-{}", unique("t")),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now + 60_000,
        completed_at_ms: None,
        expires_at_ms: now + 3_600_000,
        response: None,
        reason: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_timeouts_never_yield_two_winners() {
    let options = crate::cql_support::migrated_options().await;
    // A client timeout on conditional writes far below a Paxos round trip:
    // most time out after being sent, so their outcome is unknown until
    // resolved. Plain statements keep the normal timeout.
    let mut impatient_options = options.clone();
    impatient_options.lwt_timeout = Some(Duration::from_micros(300));
    let impatient = Arc::new(CqlStore::open(&impatient_options).await.expect("connect"));
    let verifier = CqlStore::open(&options).await.expect("connect");
    let tenant = unique("timeouts");
    let now = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    let keys: Vec<RecordKey> = (0..60)
        .map(|i| RecordKey {
            tenant: tenant.clone(),
            endpoint: "e".into(),
            key: format!("k{i}"),
        })
        .collect();
    let mut tasks = Vec::new();
    for key in &keys {
        for contender in 0..6 {
            let store = Arc::clone(&impatient);
            let record = contender_record(key, contender, now);
            tasks.push(tokio::spawn(async move {
                let outcome = store.insert_if_absent(&record, now).await;
                (record, outcome)
            }));
        }
    }
    let mut winners: HashMap<RecordKey, Vec<String>> = HashMap::new();
    let mut uncertain = 0;
    for task in tasks {
        let (record, outcome) = task.await.expect("task");
        match outcome {
            Ok(InsertOutcome::Inserted) => winners
                .entry(record.id.clone())
                .or_default()
                .push(record.lease_token),
            Ok(InsertOutcome::Exists(existing)) => {
                assert_ne!(
                    existing.lease_token, record.lease_token,
                    "a loser is shown someone else's claim"
                );
            }
            Err(StoreError::Uncertain(_)) | Err(StoreError::Unavailable(_)) => uncertain += 1,
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    let resolved = impatient.stats().uncertain_writes.load(Ordering::Relaxed);
    assert!(resolved > 0, "the timeout path was exercised");
    for key in &keys {
        let stored = verifier
            .get(key, now)
            .await
            .expect("serial-consistent read");
        let claimed_by = winners.get(key).cloned().unwrap_or_default();
        assert!(
            claimed_by.len() <= 1,
            "{key:?} has {} winners",
            claimed_by.len()
        );
        if let (Some(winner), Some(stored)) = (claimed_by.first(), stored) {
            assert_eq!(
                &stored.lease_token, winner,
                "the reported winner is the stored one"
            );
        }
    }
    println!(
        "uncertain writes resolved by SERIAL reads: {resolved}; reported uncertain/unavailable: {uncertain}; keys with a confirmed winner: {}",
        winners.len()
    );
}

/// Parses `idemd migrate`'s report line: (applied by this run, already applied).
fn migration_report(stdout: &str) -> (Vec<i32>, Vec<i32>) {
    let list = |marker: &str| -> Vec<i32> {
        let start = stdout
            .find(marker)
            .unwrap_or_else(|| panic!("no '{marker}' in {stdout}"))
            + marker.len();
        let rest = &stdout[start..];
        let inner = &rest[1..rest.find(']').expect("closing bracket")];
        inner
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().expect("version"))
            .collect()
    };
    (list("applied by this run: "), list("already applied: "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_apply_each_migration_once() {
    let keyspace = format!("idemd_mig_{}", unique("x").replace('-', "_"));
    let run = |keyspace: String| {
        std::thread::spawn(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
                .args([
                    "migrate",
                    "--cql-nodes",
                    &crate::cql_support::nodes().join(","),
                    "--keyspace",
                    &keyspace,
                ])
                .output()
                .expect("run idemd migrate")
        })
    };
    let first = run(keyspace.clone());
    let second = run(keyspace.clone());
    let outputs = [first.join().expect("join"), second.join().expect("join")];
    // Every migration is applied by exactly one of the racing runs and
    // reported as already applied by the other.
    let all: Vec<i32> = idemd::store::cql::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    let mut applied = Vec::new();
    for output in &outputs {
        assert!(
            output.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (mine, theirs) = migration_report(&String::from_utf8_lossy(&output.stdout));
        let mut union = [mine.clone(), theirs].concat();
        union.sort_unstable();
        assert_eq!(union, all, "each run accounts for every migration");
        applied.extend(mine);
    }
    applied.sort_unstable();
    assert_eq!(applied, all, "each migration applied exactly once");
    let third = run(keyspace.clone()).join().expect("join");
    let (mine, theirs) = migration_report(&String::from_utf8_lossy(&third.stdout));
    assert!(mine.is_empty(), "a rerun applies nothing: {mine:?}");
    assert_eq!(theirs, all, "a rerun finds everything applied");
    // The migrated keyspace serves.
    let mut options = crate::cql_support::options();
    options.keyspace = keyspace.clone();
    let store = CqlStore::open(&options)
        .await
        .expect("open migrated keyspace");
    let id = RecordKey {
        tenant: "t".into(),
        endpoint: "e".into(),
        key: "k".into(),
    };
    let now = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    assert_eq!(
        store
            .insert_if_absent(&contender_record(&id, 0, now), now)
            .await
            .expect("insert"),
        InsertOutcome::Inserted
    );
    let session = idemd::store::cql::connect(&options).await.expect("connect");
    idemd::store::cql::migrate::execute_ddl(&session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop test keyspace");
}
