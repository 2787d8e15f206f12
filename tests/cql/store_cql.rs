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
