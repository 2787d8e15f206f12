//! The gRPC contract suite against a real server on the CQL backend.

use crate::common::{StoreFactory, TestServer, test_settings};
use idemd::store::Store;
use idemd::store::cql::CqlStore;
use std::sync::Arc;

async fn start() -> TestServer {
    let options = crate::cql_support::migrated_options().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    // The audit log follows the store setting (the records come from the
    // factory below).
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    let factory: StoreFactory = Box::pin(async move {
        let store: Arc<dyn Store> = Arc::new(CqlStore::open(&options).await?);
        Ok(store)
    });
    TestServer::start(dir, settings, Some(factory)).await
}

grpc_suite!(start);
