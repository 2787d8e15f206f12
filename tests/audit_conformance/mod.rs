//! The `AuditLog` conformance suite: the contract of `idemd::audit`,
//! exercised on a real backend. Each backend's test binary instantiates it
//! with `audit_conformance_suite!(make_log)`, where `make_log(retention)`
//! returns a fresh log. Tests keep apart by unique tenants (the CQL backend
//! shares one keyspace).

use idemd::audit::{AuditCursor, AuditEvent, AuditLog, AuditQuery};
use std::sync::Arc;

/// A log under test and whatever keeps it alive (a temp dir).
pub struct LogUnderTest {
    /// The log.
    pub log: Arc<dyn AuditLog>,
    /// Dropped after the test.
    pub _guard: Box<dyn std::any::Any + Send>,
}

/// Instantiates every test of the suite for one backend.
#[macro_export]
macro_rules! audit_conformance_suite {
    ($make:path) => {
        $crate::audit_conformance_suite!(@tests $make;
            appended_events_read_back_in_time_order,
            pages_resume_after_the_cursor,
            key_history_is_scoped_to_its_key,
            endpoint_filter_and_tenant_isolation,
            events_past_retention_are_hidden,
        );
    };
    (@tests $make:path; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let under_test = $make(std::time::Duration::from_secs(3600)).await;
                $crate::audit_conformance::$name(&under_test.log).await;
                under_test.log.close().await.expect("close");
            }
        )*
    };
}

const HOUR_MS: i64 = 3_600_000;

fn unique(name: &str) -> String {
    format!("{name}-{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish()
}

fn now_ms() -> i64 {
    idemd::clock::Clock::now_ms(&idemd::clock::SystemClock)
}

fn event(tenant: &str, endpoint: &str, key: &str, at_ms: i64, to: &str) -> AuditEvent {
    AuditEvent {
        tenant: tenant.to_string(),
        endpoint: endpoint.to_string(),
        key_sha256: idemd::audit::key_sha256(key),
        at_ms,
        event_id: idemd::audit::new_event_id(),
        from_state: "none".to_string(),
        to_state: to.to_string(),
        replayed: false,
        attempt: 1,
        response_status: 201,
        fingerprint_prefix: "0123456789ab".to_string(),
        latency_us: 1234,
    }
}

fn query(tenant: &str, now: i64) -> AuditQuery {
    AuditQuery {
        tenant: tenant.to_string(),
        endpoint: None,
        key_sha256: None,
        after: AuditCursor::before(0),
        limit: 100,
        now_ms: now,
    }
}

fn sorted(mut events: Vec<AuditEvent>) -> Vec<AuditEvent> {
    events.sort_by_key(AuditEvent::cursor);
    events
}

pub async fn appended_events_read_back_in_time_order(log: &Arc<dyn AuditLog>) {
    let tenant = unique("order");
    let now = now_ms();
    // Appended out of order, in two appends.
    let events = vec![
        event(&tenant, "POST /a", "k1", now - 2_000, "completed"),
        event(&tenant, "POST /a", "k1", now - 30 * 60_000, "claimed"),
    ];
    log.append(&events).await.expect("append");
    let later = vec![event(&tenant, "POST /a", "k2", now - 1_000, "claimed")];
    log.append(&later).await.expect("append");
    let read = log.list(&query(&tenant, now)).await.expect("list");
    let expected = sorted([events, later].concat());
    assert_eq!(read, expected, "every field round-trips, oldest first");
}

pub async fn pages_resume_after_the_cursor(log: &Arc<dyn AuditLog>) {
    let tenant = unique("pages");
    let now = now_ms();
    // Several events in the same millisecond: the event id orders them.
    let events: Vec<AuditEvent> = (0..7)
        .map(|i| {
            event(
                &tenant,
                "POST /a",
                &format!("k{i}"),
                now - 5_000 + (i / 3),
                "claimed",
            )
        })
        .collect();
    log.append(&events).await.expect("append");
    let mut seen = Vec::new();
    let mut request = query(&tenant, now);
    request.limit = 3;
    loop {
        let page = log.list(&request).await.expect("list");
        assert!(page.len() <= 3, "limit honoured");
        let Some(last) = page.last() else { break };
        request.after = last.cursor();
        let full = page.len() == 3;
        seen.extend(page);
        if !full {
            break;
        }
    }
    assert_eq!(
        seen,
        sorted(events),
        "pages cover every event once, in order"
    );
    // `since` is inclusive: starting at the newest event's instant finds it.
    let newest = seen.last().expect("events").clone();
    let mut since = query(&tenant, now);
    since.after = AuditCursor::before(newest.at_ms);
    let from_newest = log.list(&since).await.expect("list");
    assert!(from_newest.contains(&newest));
    assert!(from_newest.iter().all(|e| e.at_ms >= newest.at_ms));
}

pub async fn key_history_is_scoped_to_its_key(log: &Arc<dyn AuditLog>) {
    let tenant = unique("history");
    let now = now_ms();
    let mine = vec![
        event(&tenant, "POST /a", "key-1", now - 3_000, "claimed"),
        event(&tenant, "POST /a", "key-1", now - 2_000, "completed"),
    ];
    let others = vec![
        event(&tenant, "POST /a", "key-2", now - 2_500, "claimed"),
        event(&tenant, "POST /b", "key-1", now - 2_400, "claimed"),
    ];
    log.append(&[mine.clone(), others].concat())
        .await
        .expect("append");
    let mut request = query(&tenant, now);
    request.endpoint = Some("POST /a".to_string());
    request.key_sha256 = Some(idemd::audit::key_sha256("key-1"));
    assert_eq!(log.list(&request).await.expect("list"), sorted(mine));
}

pub async fn endpoint_filter_and_tenant_isolation(log: &Arc<dyn AuditLog>) {
    let tenant = unique("filter");
    let other = unique("other");
    let now = now_ms();
    let on_a = event(&tenant, "POST /a", "k", now - 3_000, "claimed");
    let on_b = event(&tenant, "POST /b", "k", now - 2_000, "claimed");
    let foreign = event(&other, "POST /a", "k", now - 1_000, "claimed");
    log.append(&[on_a.clone(), on_b, foreign.clone()])
        .await
        .expect("append");
    let mut request = query(&tenant, now);
    request.endpoint = Some("POST /a".to_string());
    assert_eq!(log.list(&request).await.expect("list"), vec![on_a.clone()]);
    let all = log.list(&query(&tenant, now)).await.expect("list");
    assert_eq!(all.len(), 2);
    assert!(
        !all.contains(&foreign),
        "another tenant's event never shows"
    );
    let mut foreign_key = query(&tenant, now);
    foreign_key.endpoint = Some("POST /a".to_string());
    foreign_key.key_sha256 = Some(idemd::audit::key_sha256("k"));
    assert_eq!(
        log.list(&foreign_key).await.expect("list"),
        vec![on_a],
        "key history is tenant-scoped too"
    );
}

/// The suite's logs have a one-hour retention.
pub async fn events_past_retention_are_hidden(log: &Arc<dyn AuditLog>) {
    let tenant = unique("retention");
    let now = now_ms();
    let old = event(&tenant, "POST /a", "k", now - 2 * HOUR_MS, "claimed");
    let fresh = event(&tenant, "POST /a", "k", now - 1_000, "completed");
    log.append(&[old.clone(), fresh.clone()])
        .await
        .expect("append");
    assert_eq!(
        log.list(&query(&tenant, now)).await.expect("list"),
        vec![fresh.clone()],
        "older than the retention: never returned"
    );
    // Seen from two hours earlier, the old event is within retention.
    assert_eq!(
        log.list(&query(&tenant, now - 2 * HOUR_MS + 1))
            .await
            .expect("list")
            .first(),
        Some(&old)
    );
    // A sweep removes it for good (backends with native expiry report 0
    // and rely on the TTL).
    let removed = log.sweep(now, 1000).await.expect("sweep");
    if log.backend_name() == "embedded" {
        assert!(removed >= 1, "the embedded sweep removes expired events");
        assert_eq!(
            log.list(&query(&tenant, now - 2 * HOUR_MS + 1))
                .await
                .expect("list"),
            vec![fresh],
            "swept"
        );
    }
}
