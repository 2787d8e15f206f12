//! Connection to the test CQL cluster that `make test` starts with
//! `scripts/cassandra.sh` (Apache Cassandra 5.0 from Maven Central jars,
//! standing in for ScyllaDB). The cluster's contact points come from
//! `IDEMD_TEST_CQL_NODES` (default `127.0.0.1:9042`); every test binary
//! migrates one shared keyspace once, and tests keep apart by unique tenants
//! and keys.
#![allow(dead_code)]

use std::time::Duration;

use idemd::store::cql::{CqlOptions, migrate};

/// Keyspace shared by the CQL test binaries.
pub const TEST_KEYSPACE: &str = "idemd_test";

/// Contact points of the test cluster.
pub fn nodes() -> Vec<String> {
    std::env::var("IDEMD_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:9042".to_string())
        .split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// Options for the shared test keyspace.
pub fn options() -> CqlOptions {
    let mut options = CqlOptions::local(TEST_KEYSPACE);
    options.nodes = nodes();
    options.request_timeout = Duration::from_secs(10);
    options
}

static MIGRATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Options for the shared keyspace, migrated (once per test binary).
pub async fn migrated_options() -> CqlOptions {
    let options = options();
    if MIGRATED.get().is_none() {
        // Each test has its own runtime; migrate on a dedicated thread with
        // its own runtime so no test's runtime owns the session.
        let for_thread = options.clone();
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime
                .block_on(migrate::run(
                    &for_thread,
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}",
                    "tests",
                ))
                .expect(
                    "migrations apply to the test cluster (is it running? make test starts it)",
                );
        })
        .await
        .expect("migration thread");
        let _ = MIGRATED.set(());
    }
    options
}

/// A [`crate::common::Starter`] on the CQL backend (a fresh migrated
/// keyspace per server).
pub async fn start_cql(hook: crate::common::SettingsHook) -> crate::common::TestServer {
    let options = migrated_options().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = crate::common::test_settings(dir.path());
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    hook(&mut settings);
    let factory: crate::common::StoreFactory = Box::pin(async move {
        let store: std::sync::Arc<dyn idemd::store::Store> =
            std::sync::Arc::new(idemd::store::cql::CqlStore::open(&options).await?);
        Ok(store)
    });
    crate::common::TestServer::start(dir, settings, Some(factory)).await
}

/// The `idemd` flags that serve `keyspace` of the test cluster.
pub fn cql_flags(keyspace: &str) -> Vec<String> {
    vec![
        "--store".into(),
        "cql".into(),
        "--cql-nodes".into(),
        nodes().join(","),
        "--keyspace".into(),
        keyspace.into(),
    ]
}

/// What one contender saw for its key ([`contend`]).
#[derive(Debug)]
pub enum Seen {
    /// It won and stored the response of this id (`sample_response`).
    Won(String),
    /// It was replayed this body.
    Replayed(Vec<u8>),
}

/// Claims `key` of `tenant` until it either wins (then completes with a
/// response naming `me`) or is replayed; waits out holders in progress and
/// retries `UNAVAILABLE`. The multi-replica tests' careful caller.
pub async fn contend(
    mut client: idemd::proto::v1::idempotency_client::IdempotencyClient<tonic::transport::Channel>,
    tenant: String,
    key: String,
    me: String,
) -> Seen {
    use crate::common::{PAYMENTS, as_tenant, claim, sample_response};
    use idemd::proto::v1 as pb;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "{me}: {key} never settled"
        );
        let answer = match client
            .claim(as_tenant(&tenant, claim(PAYMENTS, &key, 7)))
            .await
        {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(status) => panic!("{me}: claim {key}: {status}"),
        };
        match &answer.outcome {
            Some(pb::claim_response::Outcome::Claimed(claimed)) => {
                let id = format!("{key}-{me}");
                client
                    .complete(as_tenant(
                        &tenant,
                        pb::CompleteRequest {
                            endpoint: PAYMENTS.into(),
                            key: key.clone(),
                            lease_token: claimed.lease_token.clone(),
                            response: Some(sample_response(&id)),
                        },
                    ))
                    .await
                    .unwrap_or_else(|status| panic!("{me}: complete {key}: {status}"));
                return Seen::Won(id);
            }
            Some(pb::claim_response::Outcome::Replayed(replayed)) => {
                let body = replayed.response.as_ref().map(|r| r.body.clone());
                return Seen::Replayed(body.unwrap_or_default());
            }
            Some(pb::claim_response::Outcome::InProgress(_)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{me}: claim {key}: unexpected {other:?}"),
        }
    }
}
