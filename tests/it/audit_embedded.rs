//! The `AuditLog` conformance suite on the embedded backend.

use std::sync::Arc;
use std::time::Duration;

use crate::audit_conformance::LogUnderTest;
use idemd::audit::embedded::EmbeddedAuditLog;

async fn make_log(retention: Duration) -> LogUnderTest {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = EmbeddedAuditLog::open(dir.path(), retention).expect("open");
    LogUnderTest {
        log: Arc::new(log),
        _guard: Box::new(dir),
    }
}

audit_conformance_suite!(make_log);

/// Appends survive a restart: they are durable when `append` returns.
#[tokio::test]
async fn appends_survive_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let now = idemd::clock::Clock::now_ms(&idemd::clock::SystemClock);
    let event = idemd::audit::AuditEvent {
        tenant: "t".into(),
        endpoint: "POST /a".into(),
        key_sha256: idemd::audit::key_sha256("k"),
        at_ms: now,
        event_id: 7,
        from_state: "none".into(),
        to_state: "claimed".into(),
        replayed: false,
        attempt: 1,
        response_status: 0,
        fingerprint_prefix: "00".into(),
        latency_us: 1,
    };
    let log = EmbeddedAuditLog::open(dir.path(), Duration::from_secs(3600)).expect("open");
    idemd::audit::AuditLog::append(&log, std::slice::from_ref(&event))
        .await
        .expect("append");
    idemd::audit::AuditLog::close(&log).await.expect("close");
    drop(log);
    let reopened = EmbeddedAuditLog::open(dir.path(), Duration::from_secs(3600)).expect("reopen");
    let query = idemd::audit::AuditQuery {
        tenant: "t".into(),
        endpoint: None,
        key_sha256: None,
        after: idemd::audit::AuditCursor::before(0),
        limit: 10,
        now_ms: now,
    };
    assert_eq!(
        idemd::audit::AuditLog::list(&reopened, &query)
            .await
            .expect("list"),
        vec![event]
    );
}
