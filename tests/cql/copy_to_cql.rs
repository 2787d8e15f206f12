//! `idemd copy-to-cql` against the real test cluster: an embedded store
//! filled through a real server (IN_PROGRESS with its lease held and one
//! past its lease, COMPLETED with an encrypted response, FAILED, UNKNOWN)
//! is stopped, copied, and served by a server on the CQL store: retries
//! replay, the lease holds and its token still completes, reuse is 422,
//! what needed a decision still does, the dedup window ends when it did.
//! Run again it copies nothing; after the new server wrote, it reports the
//! conflict without overwriting.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idemd::cli::CliError;
use idemd::config::{Cli, Command};
use idemd::crypto::Keyring;
use idemd::proto::v1 as pb;
use idemd::store::cql::CqlStore;
use idemd::store::cql::session::rows;
use scylla::value::CqlValue;

use crate::common::{
    PAYMENTS, TestServer, as_tenant, claim, claim_ok, claimed, dur, outcome_name, replayed,
    sample_response, test_settings, ts_ms, wall_ms,
};
use crate::cql_support::{TEST_KEYSPACE, migrated_options, nodes};

const KEYS: &str = "move-k1 AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\n";

/// Runs `idemd copy-to-cql` as its command line would, on `data_dir`.
async fn copy(
    data_dir: &std::path::Path,
    keys: &std::path::Path,
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
        TEST_KEYSPACE,
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
                "SELECT TTL(state) AS left FROM {TEST_KEYSPACE}.records WHERE tenant = ? AND endpoint = ? AND key = ?"
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
    let options = migrated_options().await;
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
    let running = copy(old.dir.path(), &keys).await;
    match &running {
        Err(CliError::Usage(message)) => assert!(
            message.contains("in use by") && message.contains("stop it first"),
            "{message}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }

    let TestServer { server, dir, .. } = old;
    server
        .expect("running")
        .shutdown()
        .await
        .expect("clean stop");

    let first = copy(dir.path(), &keys).await.expect("first copy");
    assert_eq!(
        (first.read, first.copied, first.present, first.conflicts),
        (5, 5, 0, 0),
        "{first:?}"
    );
    let again = copy(dir.path(), &keys).await.expect("second copy");
    assert_eq!(
        (again.read, again.copied, again.present, again.conflicts),
        (5, 0, 5, 0),
        "a rerun finds every record copied: {again:?}"
    );
    // The copied store is marked: an embedded server on it is refused,
    // naming the keyspace (a rerun of the copy is not).
    let mark = idemd::store::embedded::moved::MovedMarker::read(dir.path())
        .expect("read the mark")
        .expect("marked as moved");
    assert_eq!(mark.keyspace, TEST_KEYSPACE);
    let refused = idemd::server::open_store(&test_settings(dir.path())).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains(&format!("moved to the CQL keyspace {TEST_KEYSPACE}")),
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
    let conflict = copy(dir.path(), &keys).await;
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
    new.stop().await;
}

fn ts_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}
