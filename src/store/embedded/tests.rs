//! Writes that meet a running checkpoint: answered from the log and the
//! overlay, read back through it, folded into redb after it, and rebuilt
//! by the replay after a crash in the middle of it.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::checkpoint::{BeforeCheckpoint, CHECKPOINT_INTERVAL};
use super::*;
use crate::store::{
    CasOutcome, Expected, InsertOutcome, PendingQuery, Record, RecordKey, RecordState, Store,
    StoredResponse,
};

pub(crate) const NOW: i64 = 1_000_000;

pub(crate) fn id(key: &str) -> RecordKey {
    RecordKey {
        tenant: "t".into(),
        endpoint: "e".into(),
        key: key.into(),
    }
}

pub(crate) fn completed(key: &str, body: &[u8], expires_at_ms: i64) -> Record {
    Record {
        id: id(key),
        state: RecordState::Completed,
        fingerprint: vec![3; 32],
        attempt: 1,
        lease_token: "tok".into(),
        attempt_id: String::new(),
        created_at_ms: NOW - 10,
        updated_at_ms: NOW - 10,
        lease_expires_at_ms: NOW - 10,
        completed_at_ms: Some(NOW - 10),
        expires_at_ms,
        response: Some(StoredResponse {
            status: 200,
            headers: vec![],
            body: body.to_vec(),
            body_ref: String::new(),
        }),
        reason: String::new(),
    }
}

/// In progress, its lease over: pending.
fn stale_claim(key: &str) -> Record {
    Record {
        state: RecordState::InProgress,
        completed_at_ms: None,
        response: None,
        lease_expires_at_ms: NOW - 5,
        ..completed(key, b"", NOW + 1_000_000)
    }
}

async fn body(store: &EmbeddedStore, key: &str) -> Option<Vec<u8>> {
    store
        .get(&id(key), NOW)
        .await
        .expect("get")
        .map(|record| record.response.map(|r| r.body).unwrap_or_default())
}

async fn pending_keys(store: &EmbeddedStore) -> Vec<String> {
    pending_keys_at(store, NOW).await
}

/// The keys ListPending lists for tenant `t` at `now_ms`.
async fn pending_keys_at(store: &EmbeddedStore, now_ms: i64) -> Vec<String> {
    let query = PendingQuery {
        tenant: "t".into(),
        endpoint: None,
        created_at_or_before_ms: None,
        page_size: 100,
        page_token: None,
    };
    store
        .list_pending(&query, now_ms)
        .await
        .expect("list pending")
        .records
        .into_iter()
        .map(|record| record.id.key)
        .collect()
}

/// How many entries the index `table` (`log` in the overlay) holds, through
/// the overlay. An entry left behind is invisible to ListPending and to the
/// sweep, which check the record it names, so only a count shows it.
fn index_len(
    store: &EmbeddedStore,
    table: redb::TableDefinition<&'static [u8], ()>,
    log: wal::LogTable,
) -> usize {
    let (overlay, txn) = store.overlay.read_view(&store.database).expect("read view");
    let index = txn.open_table(table).expect("open index");
    let end = [0xff_u8; 64];
    super::overlay::MergedKeys::new(
        super::overlay::redb_keys(&index, &[], &end).expect("keys"),
        super::tables::overlay_keys(&[&overlay], log, &[], &end),
    )
    .collect::<crate::store::StoreResult<Vec<_>>>()
    .expect("keys")
    .len()
}

/// (pending entries, expiry entries).
fn index_lens(store: &EmbeddedStore) -> (usize, usize) {
    (
        index_len(store, super::tables::PENDING, wal::LogTable::Pending),
        index_len(store, super::tables::EXPIRY, wal::LogTable::Expiry),
    )
}

fn copy_data_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// A store in `dir` whose every checkpoint takes the returned gate before
/// its durable commit: a test holding it keeps a checkpoint running.
pub(super) fn open_gated(options: &EmbeddedOptions) -> (EmbeddedStore, Arc<Mutex<()>>) {
    let dir = options.data_dir.as_path();
    let checkpoint_gate = Arc::new(Mutex::new(()));
    let before_checkpoint: BeforeCheckpoint = Some({
        let gate = Arc::clone(&checkpoint_gate);
        Arc::new(move || drop(gate.lock().unwrap_or_else(|e| e.into_inner())))
    });
    let store = EmbeddedStore::open_with(
        options,
        owner::DirOwner::acquire(dir, "idemd serve").expect("owner"),
        before_checkpoint,
        false,
    )
    .expect("open");
    (store, checkpoint_gate)
}

// The gate is held across the writes on purpose: it is what keeps the
// checkpoint running while they happen (only the checkpoint thread waits
// for it).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_checkpoint_are_read_back_folded_and_replayed() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, checkpoint_gate) = open_gated(&EmbeddedOptions::new(dir.path()));
    let gate = checkpoint_gate.lock().unwrap_or_else(|e| e.into_inner());
    let insert = |record: Record| {
        let store = &store;
        async move { store.insert_if_absent(&record, NOW).await.expect("insert") }
    };
    // Before the checkpoint: straight into redb.
    assert_eq!(
        insert(completed("a", b"a1", NOW + 1_000_000)).await,
        InsertOutcome::Inserted
    );
    assert_eq!(
        insert(completed("b", b"b1", NOW + 1_000_000)).await,
        InsertOutcome::Inserted
    );
    // The next write after the checkpoint interval starts one, which the
    // gate holds before it begins.
    std::thread::sleep(CHECKPOINT_INTERVAL + Duration::from_millis(100));
    assert_eq!(
        insert(completed("x", b"x", NOW + 1_000_000)).await,
        InsertOutcome::Inserted
    );
    let started = |store: &EmbeddedStore| store.stats.checkpoints_started.load(Ordering::SeqCst);
    for _ in 0..100 {
        if started(&store) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(started(&store), 1, "a checkpoint started");
    assert_eq!(store.stats.checkpoints.load(Ordering::SeqCst), 0);

    // While it runs: every kind of write, each answered.
    let a = store.get(&id("a"), NOW).await.expect("get").expect("a");
    let mut a2 = completed("a", b"a2", NOW + 1_000_000);
    a2.attempt = 2;
    a2.lease_token = "tok2".into();
    assert_eq!(
        store
            .replace_if(&a2, &Expected::matching(&a), NOW)
            .await
            .expect("replace"),
        CasOutcome::Applied
    );
    let b = store.get(&id("b"), NOW).await.expect("get").expect("b");
    assert_eq!(
        store
            .delete_if(&id("b"), &Expected::matching(&b), NOW)
            .await
            .expect("delete"),
        CasOutcome::Applied
    );
    assert_eq!(insert(stale_claim("c")).await, InsertOutcome::Inserted);
    assert_eq!(
        insert(completed("gone", b"g", NOW - 1)).await,
        InsertOutcome::Inserted
    );
    assert!(
        !store.overlay.snapshot().is_empty(),
        "the writes went to the overlay"
    );

    // Read back through the overlay, by readers and by the writer's own
    // conditions.
    assert_eq!(body(&store, "a").await, Some(b"a2".to_vec()));
    assert_eq!(body(&store, "b").await, None);
    assert_eq!(body(&store, "c").await, Some(Vec::new()));
    assert!(matches!(
        insert(completed("c", b"dup", NOW + 1_000_000)).await,
        InsertOutcome::Exists(_)
    ));
    assert!(matches!(
        store
            .replace_if(&a2, &Expected::matching(&a), NOW)
            .await
            .expect("replace"),
        CasOutcome::Conflict { current: Some(current) } if current.attempt == 2
    ));
    assert_eq!(pending_keys(&store).await, vec!["c".to_string()]);
    assert_eq!(store.sweep_expired(NOW, 100).await.expect("sweep"), 1);
    assert_eq!(
        store.stats.checkpoints.load(Ordering::SeqCst),
        0,
        "still running"
    );

    // A crash now: the redb file is at the last durable state, the log
    // segments hold the rest. The copy's replay rebuilds everything.
    let crashed = tempfile::tempdir().expect("dir");
    copy_data_dir(dir.path(), crashed.path());
    drop(gate);
    let recovered = EmbeddedStore::open(&EmbeddedOptions::new(crashed.path())).expect("reopen");
    assert_eq!(body(&recovered, "a").await, Some(b"a2".to_vec()));
    assert_eq!(body(&recovered, "b").await, None);
    assert_eq!(body(&recovered, "x").await, Some(b"x".to_vec()));
    assert_eq!(pending_keys(&recovered).await, vec!["c".to_string()]);
    assert_eq!(recovered.sweep_expired(NOW, 100).await.expect("sweep"), 0);
    recovered.close().await.expect("close");

    // The checkpoint ends; the next write folds the overlay into redb.
    for round in 0..200 {
        if store.stats.checkpoints.load(Ordering::SeqCst) == 1
            && store.overlay.snapshot().is_empty()
        {
            break;
        }
        insert(completed(&format!("after-{round}"), b"n", NOW + 1_000_000)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.overlay.snapshot().is_empty(), "folded into redb");
    assert_eq!(body(&store, "a").await, Some(b"a2".to_vec()));
    assert_eq!(body(&store, "b").await, None);
    assert_eq!(pending_keys(&store).await, vec!["c".to_string()]);
    assert_eq!(store.sweep_expired(NOW, 100).await.expect("sweep"), 0);
    store.close().await.expect("close");
    drop(store);
    let reopened = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("reopen");
    assert_eq!(body(&reopened, "a").await, Some(b"a2".to_vec()));
    assert_eq!(body(&reopened, "b").await, None);
    assert_eq!(body(&reopened, "c").await, Some(Vec::new()));
    assert_eq!(body(&reopened, "gone").await, None);
    reopened.close().await.expect("close");
}

/// A sweep is one writer operation that removes at most what it is asked
/// for: the caller's step bounds how long writes wait behind it.
#[tokio::test]
async fn a_sweep_is_one_bounded_writer_operation() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    let (step, expired) = (100, 257);
    for i in 0..expired {
        let record = completed(&format!("expired-{i}"), b"x", NOW - 1);
        store
            .insert_if_absent(&record, NOW - 2)
            .await
            .expect("insert");
    }
    let kept = completed("kept", b"k", NOW + 1_000_000);
    store.insert_if_absent(&kept, NOW).await.expect("insert");
    let operations = || store.stats.operations.load(Ordering::SeqCst);
    let before = operations();
    assert_eq!(store.sweep_expired(NOW, step).await.expect("sweep"), step);
    assert_eq!(operations() - before, 1, "one writer operation");
    assert_eq!(
        store.sweep_expired(NOW, 10_000).await.expect("sweep"),
        expired - step,
        "the rest, in one operation"
    );
    assert_eq!(operations() - before, 2);
    assert_eq!(body(&store, "kept").await, Some(b"k".to_vec()));
    assert_eq!(body(&store, "expired-0").await, None);
    store.close().await.expect("close");
}

/// An in-progress claim of `key` whose lease ends at `lease_end` and whose
/// record expires at `expires_at`.
fn claim_until(key: &str, lease_end: i64, expires_at: i64) -> Record {
    let mut record = stale_claim(key);
    record.lease_expires_at_ms = lease_end;
    record.expires_at_ms = expires_at;
    record
}

/// A serve's open credits the leases live at the last heartbeat with the
/// time since (`alive`), up to the record's expiry, and no other: a lease
/// that had ended before idemd stopped stays ended. Fails without
/// `recovery::credit_leases`.
#[tokio::test]
async fn a_reopen_credits_the_leases_live_at_the_last_beat_and_no_other() {
    let dir = tempfile::tempdir().expect("dir");
    let now = super::alive::now_ms();
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    let records = [
        claim_until("live", now + 10_000, now + 1_000_000),
        claim_until("ended", now - 60_000, now + 1_000_000),
        claim_until("capped", now + 1_000, now + 2_000),
    ];
    for record in &records {
        store.insert_if_absent(record, now).await.expect("insert");
    }
    store.close().await.expect("close");
    drop(store);
    // The last beat 30 s ago: idemd has been down since.
    let beat = (now - 30_000).to_le_bytes();
    let mut bytes = beat.to_vec();
    bytes.extend_from_slice(&crate::store::embedded::wal::crc32c(&beat).to_le_bytes());
    std::fs::write(dir.path().join(super::alive::ALIVE_FILE), bytes).expect("beat");

    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("reopen");
    let lease = |key: &'static str| {
        let store = &store;
        async move {
            store
                .get(&id(key), now)
                .await
                .expect("get")
                .expect(key)
                .lease_expires_at_ms
        }
    };
    let live = lease("live").await;
    assert!(
        (now + 40_000..now + 45_000).contains(&live),
        "credited with the 30 s since the last beat: {}",
        live - now
    );
    assert_eq!(lease("ended").await, now - 60_000, "ended before the stop");
    assert_eq!(lease("capped").await, now + 2_000, "never past the expiry");
    // The pending index follows: only the lease that had ended is due.
    assert_eq!(
        pending_keys_at(&store, now).await,
        vec!["ended".to_string()]
    );
}

/// A Replace, or an Insert over an expired record, writes the record once
/// and moves only the index entries that change (`Tables::overwrite`): the
/// pending index follows the lease and leaves with the completion, and the
/// expiry index follows a new expiry, before a reopen and after it.
#[tokio::test]
async fn an_overwrite_moves_exactly_the_index_entries_that_change() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open");
    let claim = Record {
        state: RecordState::InProgress,
        completed_at_ms: None,
        response: None,
        lease_expires_at_ms: NOW + 10,
        ..completed("k", b"", NOW + 1_000)
    };
    assert_eq!(
        store.insert_if_absent(&claim, NOW).await.expect("insert"),
        InsertOutcome::Inserted
    );
    assert_eq!(
        pending_keys_at(&store, NOW + 10).await,
        vec!["k".to_string()]
    );
    assert_eq!(index_lens(&store), (1, 1));

    // The lease extended: due at its new end, not at the old one.
    let extended = Record {
        lease_expires_at_ms: NOW + 500,
        ..claim.clone()
    };
    assert_eq!(
        store
            .replace_if(&extended, &Expected::matching(&claim), NOW)
            .await
            .expect("extend"),
        CasOutcome::Applied
    );
    assert!(pending_keys_at(&store, NOW + 10).await.is_empty());
    assert_eq!(
        pending_keys_at(&store, NOW + 500).await,
        vec!["k".to_string()]
    );
    assert_eq!(index_lens(&store), (1, 1), "the old lease's entry is gone");

    // Completed: off the pending index, its expiry kept.
    let done = completed("k", b"done", NOW + 1_000);
    assert_eq!(
        store
            .replace_if(&done, &Expected::matching(&extended), NOW)
            .await
            .expect("complete"),
        CasOutcome::Applied
    );
    assert!(pending_keys_at(&store, NOW + 500).await.is_empty());
    assert_eq!(index_lens(&store), (0, 1));

    // Expired, then claimed again with a later expiry: the old expiry no
    // longer removes it, the new one does (after a reopen too).
    let again = Record {
        lease_expires_at_ms: NOW + 1_100,
        expires_at_ms: NOW + 5_000,
        ..claim.clone()
    };
    assert_eq!(
        store
            .insert_if_absent(&again, NOW + 1_001)
            .await
            .expect("insert again"),
        InsertOutcome::Inserted
    );
    assert_eq!(
        pending_keys_at(&store, NOW + 1_100).await,
        vec!["k".to_string()]
    );
    assert_eq!(index_lens(&store), (1, 1), "the old expiry's entry is gone");
    assert_eq!(
        store.sweep_expired(NOW + 1_001, 100).await.expect("sweep"),
        0
    );
    store.close().await.expect("close");
    drop(store);

    let store = EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("reopen");
    assert_eq!(
        pending_keys_at(&store, NOW + 1_100).await,
        vec!["k".to_string()]
    );
    assert_eq!(
        store.sweep_expired(NOW + 1_001, 100).await.expect("sweep"),
        0
    );
    assert!(
        store
            .get(&id("k"), NOW + 1_001)
            .await
            .expect("get")
            .is_some()
    );
    // Due once its expiry has passed (the sweep takes entries before `now`).
    assert_eq!(
        store.sweep_expired(NOW + 5_001, 100).await.expect("sweep"),
        1
    );
    assert!(pending_keys_at(&store, NOW + 1_100).await.is_empty());
    assert_eq!(index_lens(&store), (0, 0));
    store.close().await.expect("close");
}
