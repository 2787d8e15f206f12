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
