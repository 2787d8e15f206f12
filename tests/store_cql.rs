//! The `Store` and `AuditLog` conformance suites on the CQL backend,
//! against the real test cluster.

mod audit_conformance;
mod cql_support;
mod store_conformance;

use std::sync::Arc;

use idemd::store::cql::CqlStore;
use store_conformance::StoreUnderTest;

async fn make_store() -> StoreUnderTest {
    let options = cql_support::migrated_options().await;
    let store = CqlStore::open(&options)
        .await
        .expect("connect to the test cluster");
    StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(()),
    }
}

store_conformance_suite!(make_store);

async fn make_audit_log(retention: std::time::Duration) -> audit_conformance::LogUnderTest {
    let options = cql_support::migrated_options().await;
    let log = idemd::audit::cql::CqlAuditLog::open(&options, retention)
        .await
        .expect("open the audit tables (migration 2)");
    audit_conformance::LogUnderTest {
        log: Arc::new(log),
        _guard: Box::new(()),
    }
}

audit_conformance_suite!(make_audit_log);
