//! The `idemd proxy` suite on the embedded store.

use crate::common::{SettingsHook, TestServer, test_settings};

async fn start(hook: SettingsHook) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    hook(&mut settings);
    TestServer::start(dir, settings, None).await
}

proxy_suite!(start);
