//! The `Store` conformance suite on the CQL backend, against the real test
//! cluster.

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
