//! Upgrades from the release before migration 3 on the real cluster:
//! `idemd migrate` copies what that release's `pending_index` holds, and
//! while a rollout runs, the new replicas' sealers copy what the old ones
//! go on writing (`store::cql::pending::legacy`), at any time of day.

use std::time::Duration;

use crate::common::process::kill9;
use crate::common::*;
use crate::pending_cql::{claim_at, done, pending_keys, session};
use idemd::proto::v1 as pb;
use idemd::store::cql::CqlStore;
use idemd::store::{Expected, InsertOutcome, Store};

/// Rows the release before migration 3 (commit 3aab0ed) wrote, dumped with
/// `SELECT JSON` by `write_pre_bucket_fixture` below.
const FIXTURE: &str = "tests/fixtures/cql-pending-3aab0ed.json";

/// The fixture's keys and what ListPending must say about them after the
/// upgrade.
const FIXTURE_PENDING: [&str; 3] = ["failed", "stuck", "unknown"];

#[derive(serde::Serialize, serde::Deserialize)]
struct Fixture {
    /// When the last row was written (Unix ms): times are shifted from it.
    written_at_ms: i64,
    /// `SELECT JSON * FROM records` of the fixture's tenant.
    records: Vec<String>,
    /// `SELECT JSON * FROM pending_index` of the fixture's tenant.
    pending_index: Vec<String>,
}

async fn json_rows(
    session: &scylla::client::session::Session,
    keyspace: &str,
    table: &str,
    tenant: &str,
) -> Vec<String> {
    let result = session
        .query_unpaged(
            format!("SELECT JSON * FROM {keyspace}.{table} WHERE tenant = ? ALLOW FILTERING"),
            (tenant,),
        )
        .await
        .expect("select json");
    result
        .into_rows_result()
        .expect("rows")
        .rows::<(String,)>()
        .expect("typed")
        .map(|row| row.expect("row").0)
        .collect()
}

/// Regenerates [`FIXTURE`] with an idemd binary of the release before
/// migration 3 (`IDEMD_OLD_BIN`), against the test cluster:
/// `IDEMD_OLD_BIN=/path/to/idemd cargo test --features cql-tests --test cql
/// -- --ignored write_pre_bucket_fixture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture with an old binary (IDEMD_OLD_BIN)"]
async fn write_pre_bucket_fixture() {
    let old = std::env::var("IDEMD_OLD_BIN").expect("IDEMD_OLD_BIN");
    let keyspace = format!("idemd_fixture_{}", std::process::id());
    let nodes = crate::cql_support::nodes().join(",");
    let migrated = std::process::Command::new(&old)
        .args(["migrate", "--cql-nodes", &nodes, "--keyspace", &keyspace])
        .status()
        .expect("old migrate");
    assert!(migrated.success());
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = std::process::Command::new(&old);
    command
        .args([
            "--store",
            "cql",
            "--cql-nodes",
            &nodes,
            "--keyspace",
            &keyspace,
        ])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("IDEMD_METRICS_LISTEN", "off")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let server = crate::common::process::spawn_command(command);
    let mut client = connect(server.addr).await;
    let tenant = "upgrade";
    let claimer = client.clone();
    let lease_of = |key: &'static str, lease: Duration| {
        let mut client = claimer.clone();
        async move {
            let mut request = claim(PAYMENTS, key, 7);
            request.lease = Some(dur(lease));
            claimed(
                client
                    .claim(as_tenant(tenant, request))
                    .await
                    .expect("claim")
                    .get_ref(),
            )
            .lease_token
        }
    };
    let done = lease_of("done", Duration::from_secs(30)).await;
    client
        .complete(as_tenant(
            tenant,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "done".into(),
                lease_token: done,
                response: Some(sample_response("pay_done")),
            },
        ))
        .await
        .expect("complete");
    lease_of("stuck", Duration::from_secs(1)).await;
    lease_of("later", Duration::from_secs(3600)).await;
    for (key, disposition) in [
        ("unknown", pb::Disposition::Unknown),
        ("failed", pb::Disposition::Failed),
    ] {
        let token = lease_of(key, Duration::from_secs(30)).await;
        client
            .fail(as_tenant(
                tenant,
                pb::FailRequest {
                    endpoint: PAYMENTS.into(),
                    key: key.into(),
                    lease_token: token,
                    disposition: disposition as i32,
                    reason: "timeout talking to the bank".into(),
                },
            ))
            .await
            .expect("fail");
    }
    let written_at_ms = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    kill9(server);
    let session = session().await;
    let fixture = Fixture {
        written_at_ms,
        records: json_rows(&session, &keyspace, "records", tenant).await,
        pending_index: json_rows(&session, &keyspace, "pending_index", tenant).await,
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    std::fs::write(&path, serde_json::to_string_pretty(&fixture).expect("json")).expect("write");
    idemd::store::cql::migrate::execute_ddl(&session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop");
}

/// Shifts every instant column of a `SELECT JSON` row by `delta` ms (and
/// recomputes the index's day), so rows written on the fixture's day load
/// as if written just now. Everything else (fingerprints, the response
/// blob, tokens) loads as the old binary wrote it.
fn shifted(row: &str, delta: i64) -> (String, Option<i64>) {
    let mut value: serde_json::Value = serde_json::from_str(row).expect("fixture row");
    let object = value.as_object_mut().expect("object");
    for column in [
        "created_at",
        "updated_at",
        "lease_expires_at",
        "completed_at",
        "expires_at",
        "due_at",
    ] {
        if let Some(instant) = object.get(column).and_then(serde_json::Value::as_i64) {
            object.insert(column.into(), (instant + delta).into());
        }
    }
    if let Some(due) = object.get("due_at").and_then(serde_json::Value::as_i64) {
        object.insert("day".into(), due.div_euclid(86_400_000).into());
    }
    let expires = object.get("expires_at").and_then(serde_json::Value::as_i64);
    (value.to_string(), expires)
}

/// Writes the fixture's rows into `keyspace` as the old binary would have
/// written them `delta` ms after it did, for `tenant`.
async fn load_fixture(
    session: &scylla::client::session::Session,
    keyspace: &str,
    fixture: &Fixture,
    tenant: &str,
    delta: i64,
    now: i64,
) {
    for (table, rows, lwt) in [
        ("records", &fixture.records, " IF NOT EXISTS"),
        ("pending_index", &fixture.pending_index, ""),
    ] {
        for row in rows {
            let (row, expires) = shifted(row, delta);
            let mut row: serde_json::Value = serde_json::from_str(&row).expect("row");
            row["tenant"] = tenant.into();
            let ttl =
                i32::try_from((expires.unwrap_or(now + 86_400_000) - now) / 1000).expect("ttl");
            session
                .query_unpaged(
                    format!("INSERT INTO {keyspace}.{table} JSON ?{lwt} USING TTL ?"),
                    (row.to_string(), ttl),
                )
                .await
                .expect("load fixture row");
        }
    }
}

fn read_fixture() -> Fixture {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("parse")
}

/// A keyspace as the release before migration 3 left it (migrations 1 and
/// 2, rows its binary wrote), upgraded by `idemd migrate`: ListPending finds
/// every record that needed a decision, in the order of the old index, and
/// the record that becomes due later is found then. Fails without the copy
/// of the old index in `idemd migrate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_pending_before_the_upgrade_are_found_after_it() {
    let mut options = crate::cql_support::options();
    options.keyspace = format!("idemd_upgrade_{}", std::process::id());
    let replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}";
    let report = idemd::store::cql::migrate::run_to(&options, replication, "tests", 2)
        .await
        .expect("migrations 1 and 2");
    assert_eq!(report.applied, [1, 2]);
    let fixture = read_fixture();
    let now = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    // The fixture's last write lands 5 s ago: the 1 s lease of "stuck" ran out.
    let delta = now - 5_000 - fixture.written_at_ms;
    let session = session().await;
    let keyspace = &options.keyspace;
    load_fixture(&session, keyspace, &fixture, "upgrade", delta, now).await;
    assert_eq!(
        fixture.records.len(),
        5,
        "done, stuck, later, unknown, failed"
    );
    let report = idemd::store::cql::migrate::run(&options, replication, "tests")
        .await
        .expect("upgrade");
    assert_eq!(report.applied, [3, 4]);
    let copied = report.legacy_pending.expect("the old index was read");
    assert_eq!(
        copied.copied, 4,
        "stuck, later, unknown, failed: {copied:?}"
    );

    let store = CqlStore::open(&options).await.expect("open");
    let mut keys = pending_keys(&store, "upgrade", now).await;
    keys.sort();
    assert_eq!(keys, FIXTURE_PENDING);
    let later = pending_keys(&store, "upgrade", now + 3_600_000).await;
    assert!(later.contains(&"later".to_string()), "{later:?}");
    // A second migrate (after the rollout) copies again without duplicates.
    idemd::store::cql::migrate::run(&options, replication, "tests")
        .await
        .expect("migrate again");
    let mut again = pending_keys(&store, "upgrade", now).await;
    again.sort();
    assert_eq!(again, FIXTURE_PENDING);
    idemd::store::cql::migrate::execute_ddl(&session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop");
}

/// A rolling upgrade from the release before migration 3: the chart's
/// pre-upgrade Job runs `idemd migrate` (nothing to copy yet), new replicas
/// start, and replicas of the old release keep writing `pending_index`
/// until they are replaced. The new replicas' sealers copy what they write
/// (for a tenant both served, which has a cursor, and for one only old
/// replicas served, which the sealer adopts), so ListPending lists every
/// record an old replica left pending with no second `idemd migrate`.
/// Fails without `LegacyIndex::follow` (nothing listed) or without
/// `LegacyIndex::adopt_tenants` (nothing for the second tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_old_replicas_write_during_a_rollout_are_listed_without_a_second_migrate() {
    let options = rollout_keyspace("idemd_rollout").await;
    let clock = || idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    let store = CqlStore::open(&options).await.expect("a new replica");
    // The new replica serves "both" too: its cursor exists before the old
    // replicas' entries land.
    let fresh = claim_at("both", "served-by-new", clock(), 3_600_000);
    assert!(matches!(
        store
            .insert_if_absent(&fresh, clock())
            .await
            .expect("claim"),
        InsertOutcome::Inserted
    ));
    store
        .replace_if(&done(&fresh, clock()), &Expected::matching(&fresh), clock())
        .await
        .expect("complete");

    // The old replicas write now (the fixture, moved to this instant).
    let fixture = read_fixture();
    let session = session().await;
    let written = clock();
    for tenant in ["both", "only-old"] {
        load_fixture(
            &session,
            &options.keyspace,
            &fixture,
            tenant,
            written - fixture.written_at_ms,
            written,
        )
        .await;
    }

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut listed = std::collections::BTreeMap::new();
    let mut passes = Vec::new();
    loop {
        let started = std::time::Instant::now();
        let report = store.seal_pending_index(clock()).await.expect("seal");
        let watermark = cursor_watermark(&session, &options.keyspace, "only-old").await;
        passes.push(format!(
            "pass {} at {}: {:.0} ms, {report:?}, only-old watermark {}",
            passes.len() + 1,
            time_of_day(clock()),
            started.elapsed().as_secs_f64() * 1000.0,
            watermark.map_or("none".into(), time_of_day),
        ));
        for tenant in ["both", "only-old"] {
            let mut keys = pending_keys(&store, tenant, clock()).await;
            keys.sort();
            listed.insert(tenant, keys);
        }
        if listed.values().all(|keys| keys == &FIXTURE_PENDING) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ListPending after 60 s of sealing: {listed:?} (each tenant should list {FIXTURE_PENDING:?}); the sealer's passes:\n{}",
            passes.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    close_and_drop(store, &session, &options.keyspace).await;
}

/// `tenant`'s watermark in `pending_cursor`, `None` without a cursor.
async fn cursor_watermark(
    session: &scylla::client::session::Session,
    keyspace: &str,
    tenant: &str,
) -> Option<i64> {
    let result = session
        .query_unpaged(
            format!("SELECT watermark FROM {keyspace}.pending_cursor WHERE tenant = ?"),
            (tenant,),
        )
        .await
        .expect("read the cursor");
    let rows = result.into_rows_result().expect("rows");
    let mut typed = rows.rows::<(i64,)>().expect("typed");
    typed.next().map(|row| row.expect("row").0)
}

/// `ms` (Unix) as the UTC time of day, for the passes' log.
fn time_of_day(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The rollout above at a chosen time of day, on a clock of the test's own
/// (a day or two behind the wall clock, so the sealer's wall-clock cap never
/// binds): the old replicas' entries straddle midnight (one day partition
/// each side), late in the day as in issue 49's failing run, and the tenant
/// only old replicas serve appears after the new replica's first pass, so
/// only the next adoption finds it. Each pass moves the clock 2 s on: the
/// tenant must be listed within the adoption interval + grace + an idle
/// step of the old replicas' writes, as docs/scylla.md promises.
///
/// Fails with the cursor of an adopted tenant placed at the start of its
/// oldest day (48 passes of catching up from the day before: nothing
/// listed within the bound), and when a replica adopts only on its first
/// pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_only_old_replicas_served_is_listed_across_midnight_and_the_adoption_interval() {
    const DAY: i64 = 86_400_000;
    /// `ADOPT_EVERY_MS` in `store::cql::pending::legacy`.
    const ADOPT_EVERY: i64 = 60_000;
    const PASS: i64 = 2_000;
    let options = rollout_keyspace("idemd_rollout_midnight").await;
    let grace = 2_000;
    let idle_step = idemd::store::cql::SealTiming::for_grace(options.seal_grace).idle_step_ms;
    let fixture = read_fixture();
    let mut dues: Vec<i64> = fixture
        .pending_index
        .iter()
        .map(|row| serde_json::from_str::<serde_json::Value>(row).expect("row"))
        .filter(|row| FIXTURE_PENDING.contains(&row["key"].as_str().expect("key")))
        .map(|row| row["due_at"].as_i64().expect("due_at"))
        .collect();
    dues.sort_unstable();
    // The old replicas write so that midnight falls between the first and
    // the last stale entry's due instant (the fixture's fourth entry, due
    // an hour later, is not stale); the day before yesterday's midnight at
    // the latest, so that the test's clock stays a day behind the wall's.
    let wall = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    let midnight = wall.div_euclid(DAY) * DAY - DAY;
    let delta = midnight - (dues[0] + dues[dues.len() - 1]) / 2;
    assert!(
        dues[0] + delta < midnight && dues[dues.len() - 1] + delta >= midnight,
        "the entries straddle midnight"
    );
    let written = fixture.written_at_ms + delta;
    let mut now = written - 10_000;

    let store = CqlStore::open(&options).await.expect("a new replica");
    let fresh = claim_at("both", "served-by-new", now, 3_600_000);
    store.insert_if_absent(&fresh, now).await.expect("claim");
    store
        .replace_if(&done(&fresh, now), &Expected::matching(&fresh), now)
        .await
        .expect("complete");
    // The replica's first pass, before any old replica wrote "only-old".
    store.seal_pending_index(now).await.expect("first pass");
    now = written;
    let session = session().await;
    for tenant in ["both", "only-old"] {
        load_fixture(&session, &options.keyspace, &fixture, tenant, delta, now).await;
    }

    let bound = written + ADOPT_EVERY + grace + idle_step + 2 * PASS;
    let mut passes = Vec::new();
    loop {
        now += PASS;
        let report = store.seal_pending_index(now).await.expect("seal");
        let watermark = cursor_watermark(&session, &options.keyspace, "only-old").await;
        passes.push(format!(
            "{}: {report:?}, only-old watermark {}",
            time_of_day(now),
            watermark.map_or("none".into(), time_of_day),
        ));
        let mut listed = std::collections::BTreeMap::new();
        for tenant in ["both", "only-old"] {
            let mut keys = pending_keys(&store, tenant, now).await;
            keys.sort();
            listed.insert(tenant, keys);
        }
        if listed.values().all(|keys| keys == &FIXTURE_PENDING) {
            break;
        }
        assert!(
            now < bound,
            "ListPending {:.0} s after the old replicas wrote (midnight {}): {listed:?} \
             (each tenant should list {FIXTURE_PENDING:?}); the passes:\n{}",
            (now - written) as f64 / 1000.0,
            time_of_day(midnight),
            passes.join("\n")
        );
    }
    assert!(
        watermark_day(&session, &options.keyspace, "only-old").await >= midnight / DAY,
        "the adopted cursor starts near the clock, not at the start of a day; the passes:\n{}",
        passes.join("\n")
    );
    close_and_drop(store, &session, &options.keyspace).await;
}

/// The day `tenant`'s watermark is in.
async fn watermark_day(
    session: &scylla::client::session::Session,
    keyspace: &str,
    tenant: &str,
) -> i64 {
    cursor_watermark(session, keyspace, tenant)
        .await
        .expect("a cursor")
        .div_euclid(86_400_000)
}

/// A keyspace of its own, migrated as the chart's pre-upgrade Job does
/// (migrations 1 to 4), with a 2 s seal grace.
async fn rollout_keyspace(name: &str) -> idemd::store::cql::CqlOptions {
    let mut options = crate::cql_support::options();
    options.keyspace = format!("{name}_{}", std::process::id());
    options.seal_grace = Duration::from_secs(2);
    let replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}";
    let report = idemd::store::cql::migrate::run(&options, replication, "tests")
        .await
        .expect("migrate (the pre-upgrade Job)");
    assert_eq!(report.applied, [1, 2, 3, 4]);
    options
}

/// Closes the replica and drops its keyspace.
async fn close_and_drop(
    store: CqlStore,
    session: &scylla::client::session::Session,
    keyspace: &str,
) {
    store.close().await.expect("close");
    idemd::store::cql::migrate::execute_ddl(session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop");
}
