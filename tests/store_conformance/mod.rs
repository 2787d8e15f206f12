//! The `Store` conformance suite: the storage contract, tested directly on
//! the trait. Backend-generic: each backend's test binary instantiates it
//! with `store_conformance_suite!(make_store)`, where `make_store` is an
//! async fn returning a `StoreUnderTest`. Every test uses its own tenant,
//! so backends may share one database between tests.

use std::sync::Arc;

use idemd::store::{
    CasOutcome, Expected, InsertOutcome, PendingQuery, Record, RecordKey, RecordState, Store,
    StoreError, StoredResponse,
};

/// A store plus whatever keeps it alive (a temp dir, a session).
pub struct StoreUnderTest {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Dropped after the test.
    pub _guard: Box<dyn std::any::Any + Send>,
}

/// Instantiates every conformance test for one backend.
#[macro_export]
macro_rules! store_conformance_suite {
    ($make:path) => {
        $crate::store_conformance_suite!(@tests $make;
            insert_if_absent_has_one_winner,
            concurrent_inserts_have_one_winner,
            expired_records_are_absent,
            insert_replaces_an_expired_record,
            replace_if_checks_state_and_token,
            delete_if_checks_state_and_token,
            pending_index_follows_the_record,
            pending_filters_and_tenant_isolation,
            pending_pages_cover_everything_once,
            pending_rejects_foreign_tokens,
            sweep_removes_only_expired_records,
            responses_round_trip_verbatim,
            import_writes_records_as_they_are,
        );
    };
    (@tests $make:path; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let under_test = $make().await;
                $crate::store_conformance::$name(&under_test.store).await;
                under_test.store.close().await.expect("close");
            }
        )*
    };
}

const NOW: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;

fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{name}-{nanos:x}-{}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn id(tenant: &str, endpoint: &str, key: &str) -> RecordKey {
    RecordKey {
        tenant: tenant.into(),
        endpoint: endpoint.into(),
        key: key.into(),
    }
}

fn in_progress(id: RecordKey, token: &str, now: i64, lease_ms: i64, ttl_ms: i64) -> Record {
    Record {
        id,
        state: RecordState::InProgress,
        fingerprint: vec![1; 32],
        attempt: 1,
        lease_token: token.into(),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now + lease_ms,
        completed_at_ms: None,
        expires_at_ms: now + ttl_ms,
        response: None,
        reason: String::new(),
    }
}

fn completed(record: &Record, now: i64) -> Record {
    let mut done = record.clone();
    done.state = RecordState::Completed;
    done.completed_at_ms = Some(now);
    done.updated_at_ms = now;
    done.response = Some(StoredResponse {
        status: 200,
        headers: vec![("a".into(), "1".into())],
        body: b"ok".to_vec(),
        body_ref: String::new(),
    });
    done
}

fn with_state(record: &Record, state: RecordState, now: i64) -> Record {
    let mut changed = record.clone();
    changed.state = state;
    changed.updated_at_ms = now;
    changed.reason = format!("now {}", state.as_str());
    changed
}

async fn insert(store: &Arc<dyn Store>, record: &Record, now: i64) {
    assert_eq!(
        store.insert_if_absent(record, now).await.expect("insert"),
        InsertOutcome::Inserted
    );
}

async fn applied(store: &Arc<dyn Store>, record: &Record, expected: &Expected, now: i64) {
    assert_eq!(
        store
            .replace_if(record, expected, now)
            .await
            .expect("replace"),
        CasOutcome::Applied
    );
}

async fn pending(store: &Arc<dyn Store>, query: PendingQuery, now: i64) -> Vec<String> {
    let mut keys: Vec<String> = store
        .list_pending(&query, now)
        .await
        .expect("list")
        .records
        .into_iter()
        .map(|r| r.id.key)
        .collect();
    keys.sort();
    keys
}

fn query(tenant: &str) -> PendingQuery {
    PendingQuery {
        tenant: tenant.into(),
        endpoint: None,
        created_at_or_before_ms: None,
        page_size: 100,
        page_token: None,
    }
}

pub async fn insert_if_absent_has_one_winner(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let first = in_progress(id(&tenant, "e", "k"), "tok-1", NOW, HOUR, 24 * HOUR);
    insert(store, &first, NOW).await;
    let second = in_progress(id(&tenant, "e", "k"), "tok-2", NOW, HOUR, 24 * HOUR);
    match store.insert_if_absent(&second, NOW).await.expect("insert") {
        InsertOutcome::Exists(existing) => assert_eq!(existing, first),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(
        store.get(&first.id, NOW).await.expect("get"),
        Some(first.clone())
    );
    // Other endpoint and other tenant are other records.
    insert(
        store,
        &in_progress(id(&tenant, "e2", "k"), "x", NOW, HOUR, HOUR),
        NOW,
    )
    .await;
    insert(
        store,
        &in_progress(id(&unique("t"), "e", "k"), "x", NOW, HOUR, HOUR),
        NOW,
    )
    .await;
}

pub async fn concurrent_inserts_have_one_winner(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    for key in 0..20 {
        let mut tasks = Vec::new();
        for contender in 0..16 {
            let store = Arc::clone(store);
            let record = in_progress(
                id(&tenant, "e", &format!("k{key}")),
                &format!("tok-{contender}"),
                NOW,
                HOUR,
                HOUR,
            );
            tasks.push(tokio::spawn(async move {
                (
                    contender,
                    store.insert_if_absent(&record, NOW).await.expect("insert"),
                )
            }));
        }
        let mut winners = Vec::new();
        let mut seen_tokens = Vec::new();
        for task in tasks {
            match task.await.expect("task") {
                (contender, InsertOutcome::Inserted) => winners.push(format!("tok-{contender}")),
                (_, InsertOutcome::Exists(existing)) => seen_tokens.push(existing.lease_token),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one winner for k{key}");
        assert!(
            seen_tokens.iter().all(|t| *t == winners[0]),
            "losers see the winner"
        );
    }
}

pub async fn expired_records_are_absent(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let record = in_progress(id(&tenant, "e", "k"), "tok", NOW, 1000, 10_000);
    insert(store, &record, NOW).await;
    assert!(
        store
            .get(&record.id, NOW + 9_999)
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(
        store.get(&record.id, NOW + 10_000).await.expect("get"),
        None
    );
    let expected = Expected::matching(&record);
    assert_eq!(
        store
            .replace_if(&completed(&record, NOW), &expected, NOW + 10_000)
            .await
            .expect("replace"),
        CasOutcome::Conflict { current: None }
    );
    assert_eq!(
        store
            .delete_if(&record.id, &expected, NOW + 10_000)
            .await
            .expect("delete"),
        CasOutcome::Conflict { current: None }
    );
    assert!(
        pending(store, query(&tenant), NOW + 10_000)
            .await
            .is_empty(),
        "expired records are not pending"
    );
}

pub async fn insert_replaces_an_expired_record(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let old = in_progress(id(&tenant, "e", "k"), "old", NOW, 1000, 10_000);
    insert(store, &old, NOW).await;
    let later = NOW + 20_000;
    let new = in_progress(id(&tenant, "e", "k"), "new", later, 1000, 10_000);
    insert(store, &new, later).await;
    assert_eq!(
        store.get(&new.id, later).await.expect("get"),
        Some(new.clone())
    );
    // The old record's index entries are gone with it.
    assert!(pending(store, query(&tenant), later + 500).await.is_empty());
    assert_eq!(
        pending(store, query(&tenant), later + 1000).await,
        vec!["k"]
    );
}

pub async fn replace_if_checks_state_and_token(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let record = in_progress(id(&tenant, "e", "k"), "tok", NOW, HOUR, 24 * HOUR);
    insert(store, &record, NOW).await;
    let done = completed(&record, NOW + 1);
    let wrong_token = Expected {
        state: RecordState::InProgress,
        lease_token: "other".into(),
        pending_since_ms: None,
    };
    assert_eq!(
        store
            .replace_if(&done, &wrong_token, NOW + 1)
            .await
            .expect("replace"),
        CasOutcome::Conflict {
            current: Some(record.clone())
        }
    );
    let wrong_state = Expected {
        state: RecordState::Unknown,
        lease_token: "tok".into(),
        pending_since_ms: None,
    };
    assert!(matches!(
        store
            .replace_if(&done, &wrong_state, NOW + 1)
            .await
            .expect("replace"),
        CasOutcome::Conflict { current: Some(_) }
    ));
    assert_eq!(
        store.get(&record.id, NOW + 1).await.expect("get"),
        Some(record.clone()),
        "unchanged"
    );
    applied(store, &done, &Expected::matching(&record), NOW + 1).await;
    assert_eq!(
        store.get(&record.id, NOW + 2).await.expect("get"),
        Some(done.clone())
    );
    // The old expectation no longer holds.
    assert_eq!(
        store
            .replace_if(&done, &Expected::matching(&record), NOW + 2)
            .await
            .expect("replace"),
        CasOutcome::Conflict {
            current: Some(done.clone())
        }
    );
    let absent = in_progress(id(&tenant, "e", "absent"), "tok", NOW, HOUR, HOUR);
    assert_eq!(
        store
            .replace_if(&absent, &Expected::matching(&absent), NOW)
            .await
            .expect("replace"),
        CasOutcome::Conflict { current: None }
    );
}

pub async fn delete_if_checks_state_and_token(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let record = in_progress(id(&tenant, "e", "k"), "tok", NOW, HOUR, HOUR);
    insert(store, &record, NOW).await;
    let wrong = Expected {
        state: RecordState::InProgress,
        lease_token: "nope".into(),
        pending_since_ms: None,
    };
    assert!(matches!(
        store
            .delete_if(&record.id, &wrong, NOW)
            .await
            .expect("delete"),
        CasOutcome::Conflict { current: Some(_) }
    ));
    assert_eq!(
        store
            .delete_if(&record.id, &Expected::matching(&record), NOW)
            .await
            .expect("delete"),
        CasOutcome::Applied
    );
    assert_eq!(store.get(&record.id, NOW).await.expect("get"), None);
    // Deleted means absent: a new claim wins.
    insert(
        store,
        &in_progress(id(&tenant, "e", "k"), "tok2", NOW, HOUR, HOUR),
        NOW,
    )
    .await;
}

pub async fn pending_index_follows_the_record(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let record = in_progress(id(&tenant, "e", "k"), "tok", NOW, 1000, HOUR);
    insert(store, &record, NOW).await;
    assert!(
        pending(store, query(&tenant), NOW + 999).await.is_empty(),
        "held within lease"
    );
    assert_eq!(pending(store, query(&tenant), NOW + 1000).await, vec!["k"]);
    // Extending the lease moves it out of the pending set.
    let mut extended = record.clone();
    extended.lease_expires_at_ms = NOW + 5000;
    applied(store, &extended, &Expected::matching(&record), NOW + 1000).await;
    assert!(pending(store, query(&tenant), NOW + 4999).await.is_empty());
    assert_eq!(pending(store, query(&tenant), NOW + 5000).await, vec!["k"]);
    // Unknown is pending at once; completed never.
    let unknown = with_state(&extended, RecordState::Unknown, NOW + 2000);
    applied(store, &unknown, &Expected::matching(&extended), NOW + 2000).await;
    assert_eq!(pending(store, query(&tenant), NOW + 2000).await, vec!["k"]);
    let page = store
        .list_pending(&query(&tenant), NOW + 2000)
        .await
        .expect("list");
    assert_eq!(
        page.records,
        vec![unknown.clone()],
        "the full record is returned"
    );
    let done = completed(&unknown, NOW + 3000);
    applied(store, &done, &Expected::matching(&unknown), NOW + 3000).await;
    assert!(
        pending(store, query(&tenant), NOW + HOUR - 1)
            .await
            .is_empty()
    );
}

pub async fn pending_filters_and_tenant_isolation(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let other = unique("t");
    for (endpoint, key, created) in [
        ("a", "k1", NOW),
        ("b", "k2", NOW + 10_000),
        ("a", "k3", NOW + 20_000),
    ] {
        let record = in_progress(id(&tenant, endpoint, key), "tok", created, 1, HOUR);
        insert(store, &record, created).await;
    }
    insert(
        store,
        &in_progress(id(&other, "a", "theirs"), "tok", NOW, 1, HOUR),
        NOW,
    )
    .await;
    let now = NOW + 30_000;
    assert_eq!(
        pending(store, query(&tenant), now).await,
        vec!["k1", "k2", "k3"]
    );
    assert_eq!(
        pending(
            store,
            PendingQuery {
                endpoint: Some("a".into()),
                ..query(&tenant)
            },
            now
        )
        .await,
        vec!["k1", "k3"]
    );
    assert_eq!(
        pending(
            store,
            PendingQuery {
                created_at_or_before_ms: Some(NOW + 10_000),
                ..query(&tenant)
            },
            now
        )
        .await,
        vec!["k1", "k2"]
    );
    assert_eq!(pending(store, query(&other), now).await, vec!["theirs"]);
}

pub async fn pending_pages_cover_everything_once(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let total = 250;
    for i in 0..total {
        let record = in_progress(
            id(&tenant, "e", &format!("k{i:04}")),
            "tok",
            NOW + i,
            1,
            HOUR,
        );
        insert(store, &record, NOW + i).await;
    }
    let mut seen = Vec::new();
    let mut token = None;
    for _ in 0..100 {
        let page = store
            .list_pending(
                &PendingQuery {
                    page_size: 100,
                    page_token: token.clone(),
                    ..query(&tenant)
                },
                NOW + 10_000,
            )
            .await
            .expect("list");
        assert!(page.records.len() <= 100);
        seen.extend(page.records.into_iter().map(|r| r.id.key));
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    let expected: Vec<String> = (0..total).map(|i| format!("k{i:04}")).collect();
    assert_eq!(seen, expected, "oldest first, each exactly once");
}

pub async fn pending_rejects_foreign_tokens(store: &Arc<dyn Store>) {
    let result = store
        .list_pending(
            &PendingQuery {
                page_token: Some(vec![1, 2, 3]),
                ..query(&unique("t"))
            },
            NOW,
        )
        .await;
    assert_eq!(result, Err(StoreError::InvalidPageToken));
}

pub async fn sweep_removes_only_expired_records(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    for i in 0..30 {
        let ttl = if i < 20 { 1000 } else { HOUR };
        insert(
            store,
            &in_progress(id(&tenant, "e", &format!("k{i}")), "tok", NOW, 1, ttl),
            NOW,
        )
        .await;
    }
    // Backends with native TTL report 0 and expire on their own; either
    // way, expired records are absent and live ones stay.
    let mut removed = 0;
    loop {
        let batch = store.sweep_expired(NOW + 2000, 7).await.expect("sweep");
        assert!(batch <= 7, "respects the batch size");
        removed += batch;
        if batch < 7 {
            break;
        }
    }
    assert!(removed == 0 || removed >= 20, "removed {removed}");
    for i in 0..30 {
        let present = store
            .get(&id(&tenant, "e", &format!("k{i}")), NOW + 2000)
            .await
            .expect("get")
            .is_some();
        assert_eq!(present, i >= 20, "k{i}");
    }
}

pub async fn responses_round_trip_verbatim(store: &Arc<dyn Store>) {
    let tenant = unique("t");
    let record = in_progress(id(&tenant, "POST /v1/ünïcode", "k"), "tok", NOW, HOUR, HOUR);
    insert(store, &record, NOW).await;
    let mut done = completed(&record, NOW);
    done.response = Some(StoredResponse {
        status: 201,
        headers: vec![
            ("Set-Cookie".into(), "b=2".into()),
            ("X".into(), "".into()),
            ("Set-Cookie".into(), "a=1".into()),
        ],
        body: (0..=255u8).cycle().take(70_000).collect(),
        body_ref: "s3://bucket/obj".into(),
    });
    applied(store, &done, &Expected::matching(&record), NOW).await;
    assert_eq!(store.get(&record.id, NOW).await.expect("get"), Some(done));
}

/// `Store::import` (the copy from another store): each record lands as it
/// is, what needs a decision is listed, importing it again finds it
/// present and keeps it listed, a different record never replaces a live
/// one, and an expired one is replaced.
pub async fn import_writes_records_as_they_are(store: &Arc<dyn Store>) {
    let tenant = unique("import");
    let then = NOW - 10 * 60_000;
    let held = in_progress(id(&tenant, "e", "held"), "tok-held", then, HOUR, 24 * HOUR);
    let stale = in_progress(
        id(&tenant, "e", "stale"),
        "tok-stale",
        then,
        60_000,
        24 * HOUR,
    );
    let done = completed(
        &in_progress(id(&tenant, "e", "done"), "tok-done", then, HOUR, 24 * HOUR),
        then + 5,
    );
    let base = in_progress(id(&tenant, "e", "failed"), "tok-f", then, HOUR, 24 * HOUR);
    let failed = with_state(&base, RecordState::Failed, then + 5);
    let mut unknown = with_state(&base, RecordState::Unknown, then + 7);
    unknown.id = id(&tenant, "e", "unknown");
    let records = [held, stale, done, failed, unknown];
    for record in &records {
        let outcome = store.import(record, NOW).await.expect("import");
        assert_eq!(outcome, InsertOutcome::Inserted, "{}", record.id.key);
        let stored = store.get(&record.id, NOW).await.expect("get");
        assert_eq!(stored.as_ref(), Some(record), "stored as it is");
    }
    let listed = ["failed", "stale", "unknown"];
    assert_eq!(pending(store, query(&tenant), NOW).await, listed);

    for record in &records {
        let again = store.import(record, NOW).await.expect("import again");
        assert_eq!(again, InsertOutcome::Exists(record.clone()));
    }
    assert_eq!(
        pending(store, query(&tenant), NOW).await,
        listed,
        "still listed after a second import"
    );

    let mut other = records[2].clone();
    other.fingerprint = vec![9; 32];
    assert_eq!(
        store.import(&other, NOW).await.expect("import"),
        InsertOutcome::Exists(records[2].clone()),
        "a live record is never replaced"
    );

    let later = NOW + 25 * HOUR;
    let fresh = in_progress(id(&tenant, "e", "done"), "tok-new", later, HOUR, HOUR);
    assert_eq!(
        store.import(&fresh, later).await.expect("import"),
        InsertOutcome::Inserted,
        "an expired record is replaced"
    );
    assert_eq!(store.get(&fresh.id, later).await.expect("get"), Some(fresh));
}
