//! The `idemd keys` suite on the CQL backend.

use std::sync::Arc;

use crate::common::{SettingsHook, StoreFactory, TestServer, test_settings};
use idemd::store::Store;
use idemd::store::cql::CqlStore;

async fn start(hook: SettingsHook) -> TestServer {
    let options = crate::cql_support::migrated_options().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    hook(&mut settings);
    let factory: StoreFactory = Box::pin(async move {
        let store: Arc<dyn Store> = Arc::new(CqlStore::open(&options).await?);
        Ok(store)
    });
    TestServer::start(dir, settings, Some(factory)).await
}

keys_suite!(start);
