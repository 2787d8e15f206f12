//! The `Store` and `AuditLog` conformance suites on the CQL backend,
//! against the real test cluster.

use std::sync::Arc;

use crate::store_conformance::StoreUnderTest;
use idemd::store::cql::CqlStore;

async fn make_store() -> StoreUnderTest {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open(&options)
        .await
        .expect("connect to the test cluster");
    StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(()),
    }
}

store_conformance_suite!(make_store);

async fn make_audit_log(retention: std::time::Duration) -> crate::audit_conformance::LogUnderTest {
    let options = crate::cql_support::migrated_options().await;
    let log = idemd::audit::cql::CqlAuditLog::open(&options, retention)
        .await
        .expect("open the audit tables (migration 2)");
    crate::audit_conformance::LogUnderTest {
        log: Arc::new(log),
        _guard: Box::new(()),
    }
}

audit_conformance_suite!(make_audit_log);

/// The cluster's clock that replicas measure their offset against
/// (`engine::skew`): read from the coordinator, within a second of this
/// machine's clock (the node runs here), and an engine over the store
/// measures an offset of a few ms at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_clock_is_read_from_the_coordinator() {
    use idemd::clock::{Clock, SystemClock};
    use idemd::store::Store;
    let options = crate::cql_support::migrated_options().await;
    let store: Arc<dyn Store> = Arc::new(CqlStore::open(&options).await.expect("open"));
    let before = SystemClock.now_ms();
    let cluster = store
        .cluster_time_ms()
        .await
        .expect("read")
        .expect("a CQL store has a cluster clock");
    let after = SystemClock.now_ms();
    assert!(
        (before - 1_000..=after + 1_000).contains(&cluster),
        "cluster clock {cluster} far from this machine's [{before}, {after}]"
    );
    let engine = idemd::engine::Engine::new(
        store,
        Arc::new(SystemClock),
        Arc::new(idemd::engine::policy::PolicySet::default()),
        0,
    );
    engine.maintain_store().await.expect("maintain");
    let offset = engine.clock_offset().expect("measured");
    assert!(
        offset.offset_ms.abs() <= 50,
        "offset to a node on the same machine: {offset:?}"
    );
}
