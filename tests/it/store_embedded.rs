//! The `Store` conformance suite on the embedded backend (and on the
//! in-memory store, in `mod memory`), plus what only
//! the embedded backend promises: durability across reopen, exclusive
//! ownership of the file, bounded disk use under a steady load with the
//! sweeper.

use std::sync::Arc;

use crate::store_conformance::StoreUnderTest;
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::{InsertOutcome, Record, RecordKey, RecordState, Store, StoreError};

async fn make_store() -> StoreUnderTest {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(dir),
    }
}

store_conformance_suite!(make_store);

/// The in-memory store (`idemd::store::memory`) passes the same suite: the
/// engine's unit tests rely on it behaving like the real backends. It
/// lives in this binary rather than one more test executable.
mod memory {
    use std::sync::Arc;

    use idemd::store::memory::MemoryStore;

    use crate::store_conformance::StoreUnderTest;

    async fn make_store() -> StoreUnderTest {
        StoreUnderTest {
            store: Arc::new(MemoryStore::new()),
            _guard: Box::new(()),
        }
    }

    crate::store_conformance_suite!(make_store);
}

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

/// Opens `dir` again after the store on it was dropped. Other tests of this
/// binary spawn processes, and a child holds a copy of the parent's open
/// file descriptions from its fork until its exec closes them
/// (close-on-exec): in that window the locks of the dropped store's files
/// (redb's and the checksums' sidecar, both tied to the open file
/// description) are still held, and an open fails as "already open in
/// another process" (seen once in CI). Retried on that error for up to 5 s:
/// a store still open would fail every time.
fn reopen(dir: &std::path::Path) -> EmbeddedStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match EmbeddedStore::open(&EmbeddedOptions::new(dir)) {
            Err(StoreError::Unavailable(message))
                if message.contains("already open") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            opened => return opened.expect("reopen"),
        }
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
    let reopened = reopen(dir.path());
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
            assert!(message.contains("has one owner"), "{message}")
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

/// Data directories written by idemd 0.1.0 (`tests/fixtures/embedded-0.1.0`:
/// in clear, with encryption at rest, and as `kill -9` leaves them, with the
/// records only in the write-ahead log; how they were made is in the README
/// there) open and read back exactly: the on-disk format is a promise across
/// upgrades, whatever the code that reads it becomes.
#[tokio::test]
async fn data_written_by_0_1_0_still_opens() {
    use idemd::crypto::Keyring;
    use idemd::store::PendingQuery;

    const NOW: i64 = 1_800_000_000_000;
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embedded-0.1.0");
    let keyring = Arc::new(
        Keyring::parse(
            std::path::Path::new("fixture keys"),
            "k-2024 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
        )
        .expect("keyring"),
    );
    for (variant, keyring) in [
        ("plain", None),
        ("sealed", Some(keyring)),
        ("crashed", None),
    ] {
        // Opening replays and checkpoints: work on a copy.
        let dir = tempfile::tempdir().expect("temp dir");
        for entry in std::fs::read_dir(fixture.join(variant)).expect("fixture") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
        }
        let mut options = EmbeddedOptions::new(dir.path());
        options.keyring = keyring;
        let store = EmbeddedStore::open(&options).expect("a 0.1.0 data dir opens");
        let id = |key: &str| RecordKey {
            tenant: "acme".into(),
            endpoint: "POST /v1/payments".into(),
            key: key.into(),
        };
        let completed = store
            .get(&id("completed"), NOW)
            .await
            .expect("read")
            .expect("present");
        assert_eq!(completed.state, RecordState::Completed, "{variant}");
        assert_eq!(completed.lease_token, "token-completed");
        assert_eq!(completed.attempt_id, "call-1");
        assert_eq!(completed.completed_at_ms, Some(NOW + 10));
        assert_eq!(
            completed.response,
            Some(crate::common::fixture_0_1_0_response()),
            "{variant}"
        );
        let unknown = store
            .get(&id("unknown"), NOW)
            .await
            .expect("read")
            .expect("present");
        assert_eq!(
            (unknown.state, unknown.reason.as_str()),
            (RecordState::Unknown, "timeout")
        );
        // The pending index came along: both records that need a decision.
        let page = store
            .list_pending(
                &PendingQuery {
                    tenant: "acme".into(),
                    endpoint: None,
                    created_at_or_before_ms: None,
                    page_size: 10,
                    page_token: None,
                },
                NOW + 120_000,
            )
            .await
            .expect("list");
        let mut keys: Vec<&str> = page.records.iter().map(|r| r.id.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["in-progress", "unknown"], "{variant}");
        store.close().await.expect("close");
    }
}
