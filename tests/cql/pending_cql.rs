//! The bucketed pending index on the real cluster (migration 3): the
//! sealer moves what is still pending out of the buckets and drops them,
//! readers keep finding every pending record whichever write a process dies
//! after, and entries written by the release before migration 3 are found
//! after `idemd migrate`.

use std::time::Duration;

use crate::common::process::{kill9, spawn};
use crate::common::*;
use idemd::proto::v1 as pb;
use idemd::store::cql::{BUCKET_MS, CqlStore, SHARDS};
use idemd::store::{
    CasOutcome, Expected, InsertOutcome, PendingQuery, Record, RecordKey, RecordState, Store,
    StoredResponse,
};

/// A clock of these tests' own, far ahead of the wall clock: the sealers of
/// the other tests' servers (wall clock) never touch these tenants.
const FUTURE: i64 = 1_900_000_000_000;

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{nanos:x}")
}

pub(crate) fn claim_at(tenant: &str, key: &str, now: i64, lease_ms: i64) -> Record {
    Record {
        id: RecordKey {
            tenant: tenant.into(),
            endpoint: "POST /v1/payments".into(),
            key: key.into(),
        },
        state: RecordState::InProgress,
        fingerprint: vec![3; 32],
        attempt: 1,
        lease_token: format!("tok-{key}"),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now + lease_ms,
        completed_at_ms: None,
        expires_at_ms: now + 86_400_000,
        response: None,
        reason: String::new(),
    }
}

pub(crate) fn done(record: &Record, now: i64) -> Record {
    let mut done = record.clone();
    done.state = RecordState::Completed;
    done.completed_at_ms = Some(now);
    done.updated_at_ms = now;
    done.response = Some(StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{}".to_vec(),
        body_ref: String::new(),
    });
    done
}

pub(crate) async fn pending_keys(store: &CqlStore, tenant: &str, now: i64) -> Vec<String> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let page = store
            .list_pending(
                &PendingQuery {
                    tenant: tenant.into(),
                    endpoint: None,
                    created_at_or_before_ms: None,
                    page_size: 2,
                    page_token: token,
                },
                now,
            )
            .await
            .expect("list pending");
        keys.extend(page.records.into_iter().map(|r| r.id.key));
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => return keys,
        }
    }
}

/// Live rows of one tenant's bucket partitions, counted with CQL.
async fn bucket_rows(
    session: &scylla::client::session::Session,
    tenant: &str,
    buckets: std::ops::Range<i64>,
) -> usize {
    let keyspace = crate::cql_support::TEST_KEYSPACE;
    let mut total = 0;
    for bucket in buckets {
        for shard in 0..SHARDS {
            let result = session
                .query_unpaged(
                    format!(
                        "SELECT COUNT(*) FROM {keyspace}.pending_buckets \
                         WHERE tenant = ? AND bucket = ? AND shard = ?"
                    ),
                    (tenant, bucket, shard),
                )
                .await
                .expect("count");
            let (count,): (i64,) = result
                .into_rows_result()
                .expect("rows")
                .single_row()
                .expect("one row");
            total += usize::try_from(count).expect("count");
        }
    }
    total
}

pub(crate) async fn session() -> scylla::client::session::Session {
    scylla::client::session_builder::SessionBuilder::new()
        .known_nodes(crate::cql_support::nodes())
        .build()
        .await
        .expect("connect")
}

/// The first claims of a tenant arriving together create its cursor row
/// with one LWT: each sending its own `IF NOT EXISTS` to the same partition
/// made Paxos rounds contend, and under load they timed out and failed
/// Claims (cql-scale-smoke). Fails with one creation per claim without the
/// single flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_first_claims_create_its_cursor_once() {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open(&options).await.expect("open");
    let tenant = unique("first-claims");
    let claims = (0..32).map(|i| {
        let record = claim_at(&tenant, &format!("k{i}"), FUTURE, 2_000);
        let store = &store;
        async move { store.insert_if_absent(&record, FUTURE).await }
    });
    for outcome in futures::future::join_all(claims).await {
        assert_eq!(outcome.expect("claim"), InsertOutcome::Inserted);
    }
    assert_eq!(store.cursors_created(), 1);
}

/// A losing insert whose record is due at the same instant as the winner
/// (two claims of one key in one millisecond with the same lease, or one
/// record inserted twice) wrote the winner's own index entry, same primary
/// key: deleting "its" entry must not hide the winner from ListPending.
/// Fails with an empty list when the loser deletes the shared entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_losing_insert_due_at_the_same_instant_keeps_the_winners_entry() {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open(&options).await.expect("open");
    let tenant = unique("same-instant");
    let winner = claim_at(&tenant, "k", FUTURE, 2_000);
    let mut loser = winner.clone();
    loser.lease_token = "tok-other".into();
    assert_eq!(
        store
            .insert_if_absent(&winner, FUTURE)
            .await
            .expect("insert"),
        InsertOutcome::Inserted
    );
    for duplicate in [&loser, &winner] {
        let outcome = store
            .insert_if_absent(duplicate, FUTURE)
            .await
            .expect("insert");
        assert_eq!(outcome, InsertOutcome::Exists(winner.clone()));
    }
    assert_eq!(pending_keys(&store, &tenant, FUTURE + 2_000).await, ["k"]);
}

/// 200 claims over several buckets, all completed but three left stale and
/// one UNKNOWN: sealing moves exactly the four to the overdue partitions,
/// drops every bucket below the watermark (no row left in them), keeps
/// ListPending's answer unchanged, and stores the gauges' summary. Fails if
/// the sealer drops a bucket before copying, or copies completed entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealing_moves_what_is_pending_and_drops_the_buckets() {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open(&options).await.expect("open");
    let tenant = unique("seal");
    let stale = ["k007", "k077", "k150"];
    let mut last = FUTURE;
    for i in 0..200 {
        let now = FUTURE + i * 250;
        let key = format!("k{i:03}");
        let record = claim_at(&tenant, &key, now, 2_000);
        assert_eq!(
            store.insert_if_absent(&record, now).await.expect("claim"),
            InsertOutcome::Inserted
        );
        let finished = if key == "k100" {
            let mut unknown = record.clone();
            unknown.state = RecordState::Unknown;
            unknown.updated_at_ms = now + 10;
            unknown
        } else if stale.contains(&key.as_str()) {
            continue;
        } else {
            done(&record, now + 10)
        };
        assert_eq!(
            store
                .replace_if(&finished, &Expected::matching(&record), now + 10)
                .await
                .expect("finish"),
            CasOutcome::Applied
        );
        last = now;
    }
    let now = last + 10_000;
    let mut expected: Vec<String> = stale.iter().map(|k| k.to_string()).collect();
    expected.push("k100".into());
    expected.sort();
    let mut before = pending_keys(&store, &tenant, now).await;
    before.sort();
    assert_eq!(before, expected, "ListPending before sealing");

    let seal_at = now + 60_000;
    let report = store
        .seal_tenant_pending_index(&tenant, seal_at)
        .await
        .expect("seal");
    assert_eq!(report.advanced, 1, "{report:?}");
    assert_eq!(
        report.moved, 3,
        "the three stale claims (UNKNOWN is overdue already)"
    );
    assert!(report.dropped > 0, "{report:?}");
    let session = session().await;
    let first_bucket = (FUTURE - 60_000).div_euclid(BUCKET_MS);
    let sealed_to = (seal_at - 15_000).div_euclid(BUCKET_MS);
    assert_eq!(
        bucket_rows(&session, &tenant, first_bucket..sealed_to).await,
        0,
        "every sealed bucket is gone"
    );
    let mut after = pending_keys(&store, &tenant, seal_at).await;
    after.sort();
    assert_eq!(after, expected, "ListPending after sealing");
    // The summary the gauges read was computed by the sealer.
    let summary = store
        .pending_summary(&tenant, seal_at)
        .await
        .expect("summary")
        .expect("stored with the watermark");
    assert_eq!((summary.in_progress, summary.unknown), (3, 1));
    assert_eq!(summary.oldest_since_ms, Some(FUTURE + 7 * 250 + 2_000));

    // A stale claim finished late leaves the overdue partition at once.
    let late = claim_at(&tenant, "k007", FUTURE + 7 * 250, 2_000);
    assert_eq!(
        store
            .replace_if(&done(&late, seal_at), &Expected::matching(&late), seal_at)
            .await
            .expect("late complete"),
        CasOutcome::Applied
    );
    let mut rest = pending_keys(&store, &tenant, seal_at).await;
    rest.sort();
    assert_eq!(rest, ["k077", "k100", "k150"]);
}

/// New claims keep being found while the sealer runs between them, and a
/// claim indexed near the watermark (a writer whose clock lags) lands in the
/// overdue partition, not in a sealed bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_near_the_watermark_are_never_sealed_away() {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open(&options).await.expect("open");
    let tenant = unique("near");
    let first = claim_at(&tenant, "first", FUTURE, 1_000);
    store.insert_if_absent(&first, FUTURE).await.expect("claim");
    let seal_at = FUTURE + 120_000;
    store
        .seal_tenant_pending_index(&tenant, seal_at)
        .await
        .expect("seal");
    // A replica whose clock is 100 s behind claims with a 1 s lease: its due
    // instant is below the watermark this store has seen.
    let lagging = claim_at(&tenant, "lagging", FUTURE + 20_000, 1_000);
    store
        .insert_if_absent(&lagging, FUTURE + 20_000)
        .await
        .expect("claim");
    let mut keys = pending_keys(&store, &tenant, seal_at).await;
    keys.sort();
    assert_eq!(keys, ["first", "lagging"]);
}

fn seal_flags(keyspace: &str) -> Vec<String> {
    let mut flags = crate::cql_support::cql_flags(keyspace);
    flags.extend(
        [
            // A short grace, so the sealer reaches a fresh claim's bucket in
            // seconds; it must exceed max_clock_skew (100 ms) plus the request
            // timeout (Settings::validate), hence the shorter timeout.
            "--cql-seal-grace",
            "1500ms",
            "--cql-request-timeout",
            "1s",
        ]
        .map(String::from),
    );
    flags
}

/// The sealer's two crash points: idemd killed after copying a stale claim
/// to the overdue partition but before advancing the watermark, then (a
/// second process) after advancing but before dropping the bucket. A third
/// process finds the claim exactly once. Fails if the sealer ever advances
/// before it copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_inside_the_sealer_never_hides_a_claim() {
    // A keyspace of its own: these replicas seal with a 1.5 s grace, which
    // must not apply to the other tests' tenants.
    let mut options = crate::cql_support::options();
    options.keyspace = "idemd_seal_test".into();
    idemd::store::cql::migrate::run(
        &options,
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        "tests",
    )
    .await
    .expect("migrate the sealer's keyspace");
    let flags = seal_flags(&options.keyspace);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let tenant = unique("seal-crash");
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let writer = spawn(dir.path(), &flags);
        let mut client = connect(writer.addr).await;
        let mut request = claim(PAYMENTS, "stuck", 7);
        request.lease = Some(dur(Duration::from_millis(1000)));
        client
            .claim(as_tenant(&tenant, request))
            .await
            .expect("claim");
        for i in 0..20 {
            let key = format!("done-{i}");
            let mut request = claim(PAYMENTS, &key, 7);
            request.lease = Some(dur(Duration::from_millis(1000)));
            let lease = claimed(
                client
                    .claim(as_tenant(&tenant, request))
                    .await
                    .expect("claim")
                    .get_ref(),
            );
            client
                .complete(as_tenant(
                    &tenant,
                    pb::CompleteRequest {
                        endpoint: PAYMENTS.into(),
                        key,
                        lease_token: lease.lease_token,
                        response: Some(sample_response("ok")),
                    },
                ))
                .await
                .expect("complete");
        }
        kill9(writer);
    }
    for point in ["seal-after-move", "seal-after-advance"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = crate::common::process::idemd_command(dir.path(), &flags);
        command
            .env("IDEMD_CRASH_AT", point)
            .env("IDEMD_CRASH_TENANT", &tenant);
        let mut doomed = crate::common::process::spawn_command(command);
        // An idle tenant is sealed every 12 steps (6 s with a 1.5 s grace).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = doomed.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{point}: the sealer never reached the crash point"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(!status.success(), "{point}: idemd exited cleanly");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let survivor = spawn(dir.path(), &flags);
    let mut client = connect(survivor.addr).await;
    let pending = client
        .list_pending(as_tenant(&tenant, pb::ListPendingRequest::default()))
        .await
        .expect("list pending")
        .into_inner();
    let keys: Vec<&str> = pending.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["stuck"], "the stale claim, once");
    kill9(survivor);
}

/// The gauges ask every replica for every tenant's summary every 15 s;
/// the sealer scans every cursor every step anyway, so the summaries come
/// from its last scan while it is at most two steps old, and from a read of
/// the cursor after that. Shown by changing the stored summary behind the
/// replica's back: the scanned one is answered until the scan is stale.
/// Fails without the scan's cache (the change shows at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_read_the_sealers_last_scan_not_the_cursor() {
    let mut options = crate::cql_support::options();
    options.keyspace = format!("idemd_summaries_{}", std::process::id());
    options.seal_grace = Duration::from_millis(900);
    let replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}";
    idemd::store::cql::migrate::run(&options, replication, "tests")
        .await
        .expect("migrate");
    let store = CqlStore::open(&options).await.expect("open");
    let clock = || idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    let record = claim_at("gauged", "k", clock(), 3_600_000);
    store
        .insert_if_absent(&record, clock())
        .await
        .expect("claim (creates the cursor)");
    let session = session().await;
    let keyspace = &options.keyspace;
    let set_in_progress = |count: i64| {
        let session = &session;
        async move {
            session
                .query_unpaged(
                    format!(
                        "UPDATE {keyspace}.pending_cursor SET summary_at = ?, \
                         summary_in_progress = ? WHERE tenant = 'gauged' IF EXISTS"
                    ),
                    (clock(), count),
                )
                .await
                .expect("set the summary");
        }
    };
    set_in_progress(5).await;
    store
        .seal_pending_index(clock())
        .await
        .expect("a sealer pass");
    set_in_progress(9).await;
    let cached = store
        .pending_summary("gauged", clock())
        .await
        .expect("summary")
        .expect("stored");
    assert_eq!(cached.in_progress, 5, "the scanned summary, without a read");
    // Two steps (2 x 300 ms) later the scan is stale: the cursor is read.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let read = store
        .pending_summary("gauged", clock())
        .await
        .expect("summary")
        .expect("stored");
    assert_eq!(
        read.in_progress, 9,
        "the cursor, read once the scan is stale"
    );
    store.close().await.expect("close");
    idemd::store::cql::migrate::execute_ddl(&session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop");
}

/// A Complete's index delete runs after the reply (issue 27,
/// `PendingIndex::after_completion` in `store::cql::pending`), and a
/// graceful close waits for the ones in flight: after 100 concurrent
/// completions and `close`, none of their entries is left in the buckets. Fails if a completion leaves its
/// entry, or if close returns before the cleanups land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_drop_their_entries_after_the_reply() {
    let options = crate::cql_support::migrated_options().await;
    let store = std::sync::Arc::new(CqlStore::open(&options).await.expect("open"));
    let tenant = unique("detached");
    let now = FUTURE;
    let lease_ms = 30_000;
    let claims: Vec<Record> = (0..100)
        .map(|i| claim_at(&tenant, &format!("k{i}"), now, lease_ms))
        .collect();
    for claim in &claims {
        let outcome = store.insert_if_absent(claim, now).await.expect("claim");
        assert!(matches!(outcome, InsertOutcome::Inserted));
    }
    let session = session().await;
    let bucket = (now + lease_ms).div_euclid(BUCKET_MS);
    assert_eq!(
        bucket_rows(&session, &tenant, bucket..bucket + 1).await,
        100,
        "every claim indexed before its insert"
    );
    let completions = claims.iter().map(|claim| {
        let store = store.clone();
        let claim = claim.clone();
        tokio::spawn(async move {
            store
                .replace_if(&done(&claim, now + 1), &Expected::matching(&claim), now + 1)
                .await
        })
    });
    for completion in futures::future::join_all(completions).await {
        let outcome = completion.expect("task").expect("complete");
        assert!(matches!(outcome, CasOutcome::Applied));
    }
    store.close().await.expect("close");
    assert_eq!(
        bucket_rows(&session, &tenant, bucket..bucket + 1).await,
        0,
        "entries of completed claims left after close"
    );
}
