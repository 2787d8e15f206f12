//! `idemd copy-to-cql` against the real test cluster: an embedded store
//! filled through a real server (IN_PROGRESS with its lease held and one
//! past its lease, COMPLETED with an encrypted response, FAILED, UNKNOWN)
//! is stopped, copied, and served by a server on the CQL store: retries
//! replay, the lease holds and its token still completes, reuse is 422,
//! what needed a decision still does, the dedup window ends when it did.
//! Run again it copies nothing; after the new server wrote, it reports the
//! conflict without overwriting.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idemd::cli::CliError;
use idemd::config::{Cli, Command};
use idemd::crypto::Keyring;
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use idemd::store::Store;
use idemd::store::cql::CqlStore;
use idemd::store::cql::session::rows;
use scylla::value::CqlValue;
use tonic::transport::Channel;

use crate::common::{
    PAYMENTS, TestServer, as_tenant, claim, claim_ok, claimed, dur, outcome_name, replayed,
    sample_response, test_settings, ts_ms, wall_ms,
};
use crate::cql_support::{nodes, own_keyspace};

const KEYS: &str = "move-k1 AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\n";

/// Runs `idemd copy-to-cql` as its command line would, on `data_dir`, into
/// `keyspace`.
async fn copy(
    data_dir: &std::path::Path,
    keys: &std::path::Path,
    keyspace: &str,
) -> Result<idemd::store::transfer::CopyReport, CliError> {
    let nodes = nodes().join(",");
    let cli = Cli::try_parse_from([
        "idemd",
        "copy-to-cql",
        "--data-dir",
        &data_dir.display().to_string(),
        "--cql-nodes",
        &nodes,
        "--keyspace",
        keyspace,
        "--cql-request-timeout",
        "10s",
        "--encryption-keys",
        &keys.display().to_string(),
    ])
    .expect("flags parse");
    let Some(Command::CopyToCql(args)) = cli.command else {
        panic!("not copy-to-cql");
    };
    idemd::cli::copy_to_cql::run(&args).await
}

async fn fail_as(
    server: &TestServer,
    tenant: &str,
    key: &str,
    token: &str,
    disposition: pb::Disposition,
) {
    server
        .new_client()
        .await
        .fail(as_tenant(
            tenant,
            pb::FailRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token: token.into(),
                disposition: disposition.into(),
                reason: "provider timed out".into(),
            },
        ))
        .await
        .expect("fail");
}

async fn complete_as(
    server: &TestServer,
    tenant: &str,
    key: &str,
    token: &str,
) -> Result<pb::CompleteResponse, tonic::Status> {
    server
        .new_client()
        .await
        .complete(as_tenant(
            tenant,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token: token.into(),
                response: Some(sample_response(key)),
            },
        ))
        .await
        .map(|r| r.into_inner())
}

/// The (key, state) of the tenant's records that need a decision.
async fn pending(server: &TestServer, tenant: &str) -> Vec<(String, i32)> {
    let mut found: Vec<(String, i32)> = server
        .new_client()
        .await
        .list_pending(as_tenant(tenant, pb::ListPendingRequest::default()))
        .await
        .expect("list pending")
        .into_inner()
        .records
        .into_iter()
        .map(|r| (r.key, r.state))
        .collect();
    found.sort();
    found
}

/// What a CQL row's TTL says is left of the record's window, in seconds.
async fn row_ttl(options: &idemd::store::cql::CqlOptions, tenant: &str, key: &str) -> i32 {
    let session = idemd::store::cql::connect(options).await.expect("session");
    let result = session
        .query_unpaged(
            format!(
                "SELECT TTL(state) AS left FROM {}.records WHERE tenant = ? AND endpoint = ? AND key = ?",
                options.keyspace
            ),
            (tenant, PAYMENTS, key),
        )
        .await
        .expect("select ttl");
    let rows = rows::named_rows(result).expect("rows");
    match rows.first().and_then(|row| row.get("left")) {
        Some(Some(CqlValue::Int(left))) => *left,
        other => panic!("expected a TTL, got {other:?}"),
    }
}

#[tokio::test]
async fn a_moved_store_replays_keeps_leases_and_pending_and_a_rerun_copies_nothing() {
    let options = own_keyspace("moved").await;
    let keyspace = options.keyspace.clone();
    let tenant = format!("move-{}-{}", std::process::id(), ts_nanos());
    let keys_dir = tempfile::tempdir().expect("dir");
    let keys = keys_dir.path().join("keys");
    std::fs::write(&keys, KEYS).expect("keyring file");

    // The embedded store, filled through a real server.
    let dir = tempfile::tempdir().expect("dir");
    let mut settings = test_settings(dir.path());
    settings.encryption_keys = Some(keys.clone());
    let old = TestServer::start(dir, settings, None).await;
    let done = claimed(&claim_ok(&old, &tenant, claim(PAYMENTS, "done", 1)).await);
    complete_as(&old, &tenant, "done", &done.lease_token)
        .await
        .expect("complete");
    let mut long = claim(PAYMENTS, "held", 2);
    long.lease = Some(dur(Duration::from_secs(600)));
    let held = claimed(&claim_ok(&old, &tenant, long).await);
    let mut short = claim(PAYMENTS, "stale", 3);
    short.lease = Some(dur(Duration::from_secs(1)));
    claimed(&claim_ok(&old, &tenant, short).await);
    for (key, disposition) in [
        ("failed", pb::Disposition::Failed),
        ("unknown", pb::Disposition::Unknown),
    ] {
        let lease = claimed(&claim_ok(&old, &tenant, claim(PAYMENTS, key, 4)).await);
        fail_as(&old, &tenant, key, &lease.lease_token, disposition).await;
    }

    // Refused while the server owns the store.
    let running = copy(old.dir.path(), &keys, &keyspace).await;
    match &running {
        Err(CliError::Usage(message)) => assert!(
            message.contains("in use by") && message.contains("stop it first"),
            "{message}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // "stale"'s lease runs out before the stop, so the copy does not
    // credit it ("held"'s is live at the stop: it is).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let TestServer { server, dir, .. } = old;
    server
        .expect("running")
        .shutdown()
        .await
        .expect("clean stop");

    let first = copy(dir.path(), &keys, &keyspace)
        .await
        .expect("first copy");
    assert_eq!(
        (first.read, first.copied, first.present, first.conflicts),
        (5, 5, 0, 0),
        "{first:?}"
    );
    let again = copy(dir.path(), &keys, &keyspace)
        .await
        .expect("second copy");
    assert_eq!(
        (again.read, again.copied, again.present, again.conflicts),
        (5, 1, 4, 0),
        "a rerun finds every record copied, and writes again only the lease held across the stop, credited with the longer stop: {again:?}"
    );
    // The copied store is marked: an embedded server on it is refused,
    // naming the keyspace (a rerun of the copy is not).
    let mark = idemd::store::embedded::moved::MovedMarker::read(dir.path())
        .expect("read the mark")
        .expect("marked as moved");
    assert_eq!(mark.keyspace, keyspace);
    let refused = idemd::server::open_store(&test_settings(dir.path())).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains(&format!("moved to the CQL keyspace {keyspace}")),
        "{message}"
    );

    // The new deployment: the CQL store, the same keyring.
    let keyring = Arc::new(Keyring::load(&keys).expect("keyring"));
    let cql_dir = tempfile::tempdir().expect("dir");
    let mut settings = test_settings(cql_dir.path());
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    let for_store = options.clone();
    let factory: crate::common::StoreFactory = Box::pin(async move {
        let store: Arc<dyn idemd::store::Store> =
            Arc::new(CqlStore::open_with_keyring(&for_store, Some(keyring)).await?);
        Ok(store)
    });
    let new = TestServer::start(cql_dir, settings, Some(factory)).await;

    // The dedup window ends when it did on the old store.
    let left = row_ttl(&options, &tenant, "done").await;
    let expected = (ts_ms(&done.expires_at) - wall_ms()) as f64 / 1000.0;
    assert!(
        (f64::from(left) - expected).abs() <= 1.5,
        "TTL left {left} s, the record's window ends in {expected:.1} s"
    );

    // An acknowledged key replays, byte for byte.
    let retry = claim_ok(&new, &tenant, claim(PAYMENTS, "done", 1)).await;
    assert_eq!(
        replayed(&retry).response,
        Some(sample_response("done")),
        "the stored response replays"
    );
    // Reuse with another request is 422.
    let reuse = claim_ok(&new, &tenant, claim(PAYMENTS, "done", 99)).await;
    assert_eq!((outcome_name(&reuse), reuse.http_status), ("mismatch", 422));
    // The lease holds: a duplicate is 409, the holder's token completes.
    let duplicate = claim_ok(&new, &tenant, claim(PAYMENTS, "held", 2)).await;
    assert_eq!(
        (outcome_name(&duplicate), duplicate.http_status),
        ("in_progress", 409)
    );
    // What needed a decision still does; the claim past its lease too.
    new.clock.advance(Duration::from_secs(2));
    assert_eq!(
        pending(&new, &tenant).await,
        [
            ("failed".to_string(), pb::State::Failed as i32),
            ("stale".to_string(), pb::State::InProgress as i32),
            ("unknown".to_string(), pb::State::Unknown as i32),
        ],
        "FAILED, UNKNOWN and the expired lease are listed"
    );
    complete_as(&new, &tenant, "held", &held.lease_token)
        .await
        .expect("the original lease token completes after the move");
    let after = claim_ok(&new, &tenant, claim(PAYMENTS, "held", 2)).await;
    assert_eq!(replayed(&after).response, Some(sample_response("held")));

    // The target now differs from the source for "held": a third run
    // reports it, hashed, and overwrites nothing.
    let conflict = copy(dir.path(), &keys, &keyspace).await;
    let message = match conflict {
        Err(CliError::Refused(message)) => message,
        other => panic!("expected a conflict, got {other:?}"),
    };
    assert!(message.starts_with("1 keys"), "{message}");
    assert!(
        message.contains(&idemd::fingerprint::short_hash(b"held")),
        "{message}"
    );
    assert!(
        !message.contains("\"held\""),
        "never the raw key: {message}"
    );
    let still = claim_ok(&new, &tenant, claim(PAYMENTS, "held", 2)).await;
    assert_eq!(outcome_name(&still), "replayed", "not overwritten");
    // A run over a store whose cut-over had finished leaves no mark: the
    // deployment's replicas still start on the keyspace.
    let session = idemd::store::cql::connect(&options).await.expect("session");
    let mark = idemd::store::cql::cutover::CutoverMark::read(&session, &keyspace).await;
    assert_eq!(
        mark.expect("read the mark"),
        None,
        "no replica is refused after a check run"
    );
    new.stop().await;
}

/// `idemd copy-to-cql` run as an operator runs it (the binary), with
/// `step` (`--from-backup B`, `--since-backup B`) and `--data-dir`.
fn copy_command(data_dir: &Path, keyspace: &str, step: &[&str]) -> std::process::Output {
    std::process::Command::new(crate::common::process::this_idemd())
        .arg("copy-to-cql")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--cql-nodes", &nodes().join(","), "--keyspace", keyspace])
        .args(["--cql-request-timeout", "10s", "--log-format", "json"])
        .args(step)
        .env("IDEMD_METRICS_LISTEN", "off")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run idemd copy-to-cql")
}

/// Claims `key` for `tenant` on a process's server with `lease`; its token.
async fn claim_on(
    client: &IdempotencyClient<Channel>,
    tenant: &str,
    key: &str,
    lease: Duration,
) -> pb::Claimed {
    let mut request = claim(PAYMENTS, key, 5);
    request.lease = Some(dur(lease));
    let answer = client
        .clone()
        .claim(as_tenant(tenant, request))
        .await
        .expect("claim")
        .into_inner();
    claimed(&answer)
}

/// The short cut-over (issue 50): the bulk copied from a backup while the
/// old idemd serves, a catch-up to a later backup (still serving), then,
/// stopped, only what changed since the later one. Afterwards the keyspace
/// holds exactly what the stopped store held: keys completed, released,
/// released and claimed anew, and claimed since the backups; the lease
/// held across the stop is credited with it (and a grace), so a takeover
/// cannot follow from the move. Refused: `--since-backup` for a backup no
/// bulk copy finished, and for one a catch-up went past; a catch-up from a
/// backup to itself, or back to an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_cutover_copies_the_bulk_and_catches_up_while_serving_and_only_the_changes_when_stopped()
 {
    let options = own_keyspace("short_cutover").await;
    let keyspace = options.keyspace.clone();
    let tenant = format!("short-{}-{}", std::process::id(), ts_nanos());
    let scratch = tempfile::tempdir().expect("dir");
    let (data, backup) = (scratch.path().join("data"), scratch.path().join("backup"));
    let later = scratch.path().join("later");
    let server = crate::common::process::spawn(&data, &[]);
    let client = crate::common::connect(server.addr).await;
    let long = Duration::from_secs(600);
    let complete = |key: &'static str, token: String| {
        let mut client = client.clone();
        let tenant = tenant.clone();
        async move {
            client
                .complete(as_tenant(
                    &tenant,
                    pb::CompleteRequest {
                        endpoint: PAYMENTS.into(),
                        key: key.into(),
                        lease_token: token,
                        response: Some(sample_response(key)),
                    },
                ))
                .await
                .expect("complete");
        }
    };
    let release = |key: &'static str, token: String| {
        let mut client = client.clone();
        let tenant = tenant.clone();
        async move {
            client
                .fail(as_tenant(
                    &tenant,
                    pb::FailRequest {
                        endpoint: PAYMENTS.into(),
                        key: key.into(),
                        lease_token: token,
                        disposition: pb::Disposition::Release.into(),
                        reason: String::new(),
                    },
                ))
                .await
                .expect("release");
        }
    };

    // Before the backup.
    let done = claim_on(&client, &tenant, "done", long).await;
    complete("done", done.lease_token).await;
    let changed = claim_on(&client, &tenant, "changed", long).await;
    let released = claim_on(&client, &tenant, "released", long).await;
    let reclaimed = claim_on(&client, &tenant, "reclaimed", long).await;
    let held = claim_on(&client, &tenant, "held", Duration::from_secs(90)).await;
    let back_up = |to: &Path| {
        let backed_up = std::process::Command::new(crate::common::process::this_idemd())
            .args(["backup", "--data-dir"])
            .arg(&data)
            .arg("--to")
            .arg(to)
            .env("IDEMD_METRICS_LISTEN", "off")
            .output()
            .expect("idemd backup");
        assert!(
            backed_up.status.success(),
            "{}",
            String::from_utf8_lossy(&backed_up.stderr)
        );
    };
    back_up(&backup);

    let too_early = copy_command(
        &data,
        &keyspace,
        &["--since-backup", &backup.display().to_string()],
    );
    let said = String::from_utf8_lossy(&too_early.stderr);
    assert!(
        !too_early.status.success() && said.contains("--from-backup"),
        "--since-backup before a bulk copy: {said}"
    );
    let bulk = copy_command(
        &data,
        &keyspace,
        &["--from-backup", &backup.display().to_string()],
    );
    assert!(
        bulk.status.success(),
        "bulk while serving: {}",
        String::from_utf8_lossy(&bulk.stderr)
    );
    let summary = String::from_utf8_lossy(&bulk.stdout);
    assert!(summary.contains("5 copied"), "{summary}");
    // Until the last step, no replica starts on the keyspace: "fresh"
    // below would be claimed there although the old node completes it.
    let flags = crate::cql_support::cql_flags(&keyspace);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let early = crate::common::process::idemd_command(&scratch.path().join("early"), &flags)
        .output()
        .expect("run idemd --store cql");
    let said = String::from_utf8_lossy(&early.stderr);
    assert!(
        !early.status.success() && said.contains("is being filled by `idemd copy-to-cql`"),
        "a replica started between the bulk and the last step: {said}"
    );

    // Since the backup, while the old idemd still serves; then a catch-up
    // to a later backup.
    complete("changed", changed.lease_token).await;
    release("released", released.lease_token).await;
    back_up(&later);
    let (b1, b2) = (backup.display().to_string(), later.display().to_string());
    let itself = copy_command(
        &data,
        &keyspace,
        &["--from-backup", &b1, "--since-backup", &b1],
    );
    let said = String::from_utf8_lossy(&itself.stderr);
    assert!(
        !itself.status.success() && said.contains("name the same backup"),
        "a catch-up from a backup to itself: {said}"
    );
    let catchup = copy_command(
        &data,
        &keyspace,
        &["--from-backup", &b2, "--since-backup", &b1],
    );
    let summary = String::from_utf8_lossy(&catchup.stdout);
    assert!(
        catchup.status.success(),
        "catch-up while serving: {}",
        String::from_utf8_lossy(&catchup.stderr)
    );
    // "changed" completed, "released" gone; no lease credited while the
    // old node serves.
    for part in [
        "1 copied",
        "1 removed",
        "3 unchanged",
        "0 conflicts",
        "0 leases credited",
    ] {
        assert!(summary.contains(part), "catch-up {part}: {summary}");
    }
    let back = copy_command(
        &data,
        &keyspace,
        &["--from-backup", &b1, "--since-backup", &b2],
    );
    let said = String::from_utf8_lossy(&back.stderr);
    assert!(
        !back.status.success() && said.contains("was taken before"),
        "a catch-up back to an older backup: {said}"
    );
    let passed = copy_command(&data, &keyspace, &["--since-backup", &b1]);
    let said = String::from_utf8_lossy(&passed.stderr);
    assert!(
        !passed.status.success() && said.contains(&format!("give --since-backup {b2}")),
        "--since-backup of a backup the keyspace went past: {said}"
    );

    // Since the later backup.
    release("reclaimed", reclaimed.lease_token.clone()).await;
    let anew = claim_on(&client, &tenant, "reclaimed", long).await;
    let fresh = claim_on(&client, &tenant, "fresh", long).await;
    complete("fresh", fresh.lease_token).await;
    crate::common::process::sigterm(&server);
    let mut server = server;
    server.child.wait().expect("stopped");
    let stopped = wall_ms();
    // A stop longer than nothing: the credit must cover it.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let delta = copy_command(&data, &keyspace, &["--since-backup", &b2]);
    let summary = String::from_utf8_lossy(&delta.stdout);
    assert!(
        delta.status.success(),
        "delta: {}",
        String::from_utf8_lossy(&delta.stderr)
    );
    // Copied: "reclaimed" (released and claimed anew), "fresh", and "held"
    // with its lease credited; unchanged since the later backup: "done",
    // "changed"; credited: "held" and the new claim of "reclaimed".
    for part in [
        "3 copied",
        "0 removed",
        "2 unchanged",
        "0 conflicts",
        "2 leases credited",
    ] {
        assert!(summary.contains(part), "{part}: {summary}");
    }
    let delta_done = wall_ms();

    let store = CqlStore::open(&options).await.expect("open cql");
    let now = wall_ms();
    let get = |key: &str| {
        let id = idemd::store::RecordKey {
            tenant: tenant.clone(),
            endpoint: PAYMENTS.into(),
            key: key.into(),
        };
        let store = &store;
        async move { store.get(&id, now).await.expect("get") }
    };
    use idemd::store::RecordState;
    for key in ["done", "changed", "fresh"] {
        let record = get(key).await.unwrap_or_else(|| panic!("{key} copied"));
        assert_eq!(record.state, RecordState::Completed, "{key}");
    }
    assert_eq!(get("released").await, None, "released since the backup");
    let record = get("reclaimed").await.expect("claimed anew");
    assert_eq!(
        (record.state, record.lease_token.as_str()),
        (RecordState::InProgress, anew.lease_token.as_str()),
        "the new claim, not the released one"
    );
    let record = get("held").await.expect("held");
    assert_eq!(record.lease_token, held.lease_token);
    let granted = ts_ms(&held.lease_expires_at);
    let credited = record.lease_expires_at_ms - granted;
    assert!(
        credited >= (delta_done - stopped) + 60_000 - 1_000,
        "the lease is credited with the stop ({} ms) and the 60 s grace: {credited} ms",
        delta_done - stopped
    );
    let marked = idemd::store::embedded::moved::MovedMarker::read(&data).expect("read mark");
    assert_eq!(marked.map(|mark| mark.keyspace), Some(keyspace.clone()));
    let _ = store.close().await;

    // Complete: a replica starts, and a retry of a key completed after the
    // backup replays.
    let new = crate::common::process::spawn(&scratch.path().join("new"), &flags);
    let answer = crate::common::connect(new.addr)
        .await
        .claim(as_tenant(&tenant, claim(PAYMENTS, "fresh", 5)))
        .await
        .expect("claim on the cluster")
        .into_inner();
    assert_eq!(outcome_name(&answer), "replayed", "{answer:?}");
}

fn ts_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}
