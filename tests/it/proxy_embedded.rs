//! The `idemd proxy` suite on the embedded store.

use crate::common::{TestServer, test_settings};
use crate::proxy_suite::SettingsHook;

async fn start(hook: SettingsHook) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    hook(&mut settings);
    TestServer::start(dir, settings, None).await
}

proxy_suite!(start);
