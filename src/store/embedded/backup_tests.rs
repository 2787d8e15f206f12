//! Backup and restore on a real store: what a backup taken while writes
//! go on holds, and what a restore refuses.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::EmbeddedStore;
use super::backup::MANIFEST;
use super::options::{DATABASE_FILE, EmbeddedOptions};
use super::restore::restore;
use super::tests::{NOW, completed, id};
use crate::store::{Expected, RecordState, Store, StoreError};

const RECORDS: usize = 3_000;

fn options(dir: &Path) -> EmbeddedOptions {
    let mut options = EmbeddedOptions::new(dir);
    options.scrub.rate = 0;
    options
}

fn body(i: usize) -> Vec<u8> {
    format!("body {i}").into_bytes()
}

async fn body_of(store: &EmbeddedStore, key: &str) -> Option<Vec<u8>> {
    store
        .get(&id(key), NOW)
        .await
        .expect("get")
        .map(|r| r.response.map(|r| r.body).unwrap_or_default())
}

#[tokio::test]
async fn a_backup_taken_under_writes_holds_everything_acknowledged_before_it() {
    let source = tempfile::tempdir().expect("dir");
    let store = Arc::new(EmbeddedStore::open(&options(source.path())).expect("open"));
    for i in 0..RECORDS {
        let record = completed(&format!("k{i}"), &body(i), NOW + 1_000_000);
        store.insert_if_absent(&record, NOW).await.expect("insert");
    }
    // A record in progress, then replaced, and one deleted: the backup
    // must hold each as it was acknowledged.
    let mut claim = completed("held", b"", NOW + 1_000_000);
    claim.state = RecordState::InProgress;
    claim.response = None;
    claim.completed_at_ms = None;
    claim.lease_expires_at_ms = NOW + 60_000;
    store.insert_if_absent(&claim, NOW).await.expect("claim");
    store
        .delete_if(
            &id("k0"),
            &Expected::matching(&completed("k0", &body(0), NOW + 1_000_000)),
            NOW,
        )
        .await
        .expect("delete");
    // Writes go on while the backup runs.
    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for i in 0..2_000 {
                let record = completed(&format!("during{i}"), b"d", NOW + 1_000_000);
                store
                    .insert_if_absent(&record, NOW)
                    .await
                    .expect("insert during");
            }
        })
    };
    let out = tempfile::tempdir().expect("dir");
    let backup_dir = out.path().join("backup");
    let summary = store
        .backup(&backup_dir, Arc::new(|_| {}))
        .await
        .expect("backup");
    writer.await.expect("writer");
    assert!(summary.records >= RECORDS as u64, "{summary:?}");
    assert!(backup_dir.join(MANIFEST).exists());
    store.close().await.expect("close");

    let target = tempfile::tempdir().expect("dir");
    let restored = restore(&backup_dir, &options(target.path()), false)
        .await
        .expect("restore");
    assert_eq!(restored.records, summary.records);
    let store = EmbeddedStore::open(&options(target.path())).expect("open restored");
    for i in 1..RECORDS {
        assert_eq!(
            body_of(&store, &format!("k{i}")).await,
            Some(body(i)),
            "k{i}"
        );
    }
    assert_eq!(
        body_of(&store, "k0").await,
        None,
        "the delete was acknowledged first"
    );
    let held = store
        .get(&id("held"), NOW)
        .await
        .expect("get")
        .expect("held");
    assert_eq!(held.state, RecordState::InProgress);
    assert_eq!(held.lease_token, claim.lease_token);
    assert_eq!(held.lease_expires_at_ms, claim.lease_expires_at_ms);
    assert_eq!(held.fingerprint, claim.fingerprint);
    assert_eq!(held.expires_at_ms, claim.expires_at_ms);
}

#[tokio::test]
async fn restore_refuses_a_damaged_backup_and_an_occupied_directory() {
    let source = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(&options(source.path())).expect("open");
    for i in 0..RECORDS {
        let record = completed(&format!("k{i}"), &body(i), NOW + 1_000_000);
        store.insert_if_absent(&record, NOW).await.expect("insert");
    }
    let out = tempfile::tempdir().expect("dir");
    let backup_dir = out.path().join("backup");
    store
        .backup(&backup_dir, Arc::new(|_| {}))
        .await
        .expect("backup");
    store.close().await.expect("close");
    drop(store);

    // Into the occupied source directory: refused without --replace, and
    // with it the old files are kept aside.
    match restore(&backup_dir, &options(source.path()), false).await {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("--replace"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let replaced = restore(&backup_dir, &options(source.path()), true)
        .await
        .expect("replace")
        .replaced
        .expect("moved aside");
    assert!(replaced.join(DATABASE_FILE).exists());

    // A damaged copy is refused, and the target is left as it was.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(backup_dir.join(DATABASE_FILE))
        .expect("open");
    let len = file.metadata().expect("stat").len();
    let mut block = vec![0u8; 4096];
    let at = (len / 4096 / 2) * 4096;
    file.read_exact_at(&mut block, at).expect("read");
    block.iter_mut().for_each(|b| *b ^= 0x5a);
    file.write_all_at(&block, at).expect("write");
    let target = tempfile::tempdir().expect("dir");
    match restore(&backup_dir, &options(target.path()), false).await {
        Err(StoreError::Corrupt(message)) => assert!(message.contains("block"), "{message}"),
        other => panic!("a damaged backup must be refused: {other:?}"),
    }
    assert!(!target.path().join(DATABASE_FILE).exists());
}
