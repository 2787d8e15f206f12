//! The `Store` conformance suite on the embedded backend, plus what only
//! the embedded backend promises: durability across reopen, exclusive
//! ownership of the file, bounded disk use under a steady load with the
//! sweeper.

mod store_conformance;

use std::sync::Arc;

use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::{InsertOutcome, Record, RecordKey, RecordState, Store, StoreError};
use store_conformance::StoreUnderTest;

async fn make_store() -> StoreUnderTest {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(dir),
    }
}

store_conformance_suite!(make_store);

fn record(key: &str, now: i64, ttl_ms: i64) -> Record {
    Record {
        id: RecordKey {
            tenant: "t".into(),
            endpoint: "e".into(),
            key: key.into(),
        },
        state: RecordState::Completed,
        fingerprint: vec![3; 32],
        attempt: 1,
        lease_token: "tok".into(),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now,
        completed_at_ms: Some(now),
        expires_at_ms: now + ttl_ms,
        response: Some(idemd::store::StoredResponse {
            status: 200,
            headers: vec![],
            body: vec![b'x'; 1024],
            body_ref: String::new(),
        }),
        reason: String::new(),
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    let written = record("durable", 1_000, 1_000_000);
    assert_eq!(
        store
            .insert_if_absent(&written, 1_000)
            .await
            .expect("insert"),
        InsertOutcome::Inserted
    );
    store.close().await.expect("close");
    assert_eq!(
        store.insert_if_absent(&written, 1_000).await,
        Err(StoreError::Closed),
        "closed stores refuse writes"
    );
    drop(store);
    let reopened = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("reopen");
    assert_eq!(
        reopened.get(&written.id, 2_000).await.expect("get"),
        Some(written)
    );
}

#[tokio::test]
async fn one_owner_per_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let _owner = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    match EmbeddedStore::open(&EmbeddedOptions::new(dir.path())) {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("already open"), "{message}")
        }
        other => panic!("second owner must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn steady_load_with_sweeping_keeps_the_file_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    let path = EmbeddedStore::database_path(dir.path());
    let ttl = 10_000;
    let mut sizes = Vec::new();
    // 12 rounds of 1,000 records (1 KiB each) with a 10 s TTL, one round per
    // simulated 5 s: at most ~2-3 rounds are live at any time.
    for round in 0..12i64 {
        let now = round * 5_000;
        let mut tasks = Vec::new();
        let store = Arc::new(&store);
        for i in 0..1000 {
            let record = record(&format!("r{round}-{i}"), now, ttl);
            let store = Arc::clone(&store);
            tasks.push(async move { store.insert_if_absent(&record, now).await });
        }
        for result in futures::future::join_all(tasks).await {
            assert_eq!(result.expect("insert"), InsertOutcome::Inserted);
        }
        while store.sweep_expired(now, 1000).await.expect("sweep") == 1000 {}
        sizes.push(std::fs::metadata(&path).expect("file").len());
    }
    let peak_late = sizes[6..].iter().copied().max().unwrap_or(0);
    let after_warmup = sizes[4];
    assert!(
        peak_late <= after_warmup * 2,
        "file keeps growing despite sweeping: {sizes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_commits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open"));
    let writes = 2000;
    let mut tasks = Vec::new();
    for i in 0..writes {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            store
                .insert_if_absent(&record(&format!("g{i}"), 0, 1_000_000), 0)
                .await
        }));
    }
    for task in tasks {
        assert_eq!(
            task.await.expect("task").expect("insert"),
            InsertOutcome::Inserted
        );
    }
    let (commits, operations) = store.writer_stats();
    assert_eq!(operations, writes, "every write committed");
    assert!(
        commits < writes / 4,
        "group commit: {operations} writes took {commits} commits (fsyncs)"
    );
}
