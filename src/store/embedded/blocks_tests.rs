//! The promises of the block checksums, on a real store: an open reads
//! the whole file only when the sums cannot vouch for it, and damaged bytes
//! are never served, whether a request or the scrub meets them first.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::blocks::sidecar::{Header, Sidecar};
use super::blocks::{BLOCK, Blocks, SUMS_FILE, ScrubOptions};
use crate::store::embedded::tests::{NOW, completed, id};
use crate::store::embedded::{DATABASE_FILE, EmbeddedOptions, EmbeddedStore};
use crate::store::{Store, StoreError};

/// Enough records that the file has many blocks of records.
const RECORDS: usize = 2_000;

fn options(dir: &Path) -> EmbeddedOptions {
    let mut options = EmbeddedOptions::new(dir);
    // Off unless a test wants it: a scrub finding damage first would make
    // the read-side tests depend on timing.
    options.scrub.rate = 0;
    options
}

fn body(i: usize) -> Vec<u8> {
    format!("response body {i} {}", "x".repeat(200)).into_bytes()
}

async fn filled(dir: &Path) -> EmbeddedStore {
    let store = EmbeddedStore::open(&options(dir)).expect("open");
    for i in 0..RECORDS {
        let record = completed(&format!("k{i}"), &body(i), NOW + 1_000_000);
        store.insert_if_absent(&record, NOW).await.expect("insert");
    }
    store
}

/// A body of about 2 KiB.
fn large_body(i: usize) -> Vec<u8> {
    body(i).repeat(8)
}

/// Every record reads back right or is refused as damage: never wrong.
async fn read_all(store: &EmbeddedStore) -> (usize, usize) {
    let (mut right, mut refused) = (0, 0);
    for i in 0..RECORDS {
        match store.get(&id(&format!("k{i}")), NOW).await {
            Ok(Some(record)) => {
                let got = record.response.map(|r| r.body).unwrap_or_default();
                assert_eq!(got, body(i), "k{i} served with other bytes");
                right += 1;
            }
            Ok(None) => panic!("k{i} served as absent"),
            Err(StoreError::Corrupt(_)) => refused += 1,
            Err(other) => panic!("k{i}: {other}"),
        }
    }
    (right, refused)
}

/// XORs 512 bytes in every fourth block after the first (as the fault
/// suite's corrupt-page does), through a file handle of its own.
fn damage(path: &Path) -> usize {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let blocks = file.metadata().expect("stat").len() as usize / BLOCK;
    let mut damaged = 0;
    for block in (1..blocks).step_by(4) {
        let at = (block * BLOCK + 1024) as u64;
        let mut bytes = vec![0u8; 512];
        file.read_exact_at(&mut bytes, at).expect("read");
        bytes.iter_mut().for_each(|b| *b ^= 0x5a);
        file.write_all_at(&bytes, at).expect("write");
        damaged += 1;
    }
    damaged
}

#[tokio::test]
async fn a_clean_restart_reads_only_what_it_needs() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    assert!(
        store.full_check_on_open().is_none(),
        "a new file needs none"
    );
    store.close().await.expect("close");
    drop(store);
    let store = EmbeddedStore::open(&options(dir.path())).expect("reopen");
    assert_eq!(store.full_check_on_open(), None);
    assert_eq!(read_all(&store).await, (RECORDS, 0));
}

#[tokio::test]
async fn damage_is_refused_and_remembered_never_served() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    store.close().await.expect("close");
    drop(store);
    assert!(damage(&dir.path().join(DATABASE_FILE)) > 10);
    // The open itself may meet a damaged block (redb's tables and allocator
    // state): then it refuses. Otherwise the reads meet one.
    if let Ok(store) = EmbeddedStore::open(&options(dir.path())) {
        assert_eq!(store.full_check_on_open(), None);
        let (_, refused) = read_all(&store).await;
        assert!(refused > 0, "a damaged block was read and refused");
        let report = store.damage().expect("damage reported");
        assert!(report.contains("found by a read"), "{report}");
        // Every later answer is the damage, writes too.
        let fresh = completed("fresh", b"x", NOW + 1_000_000);
        assert!(matches!(
            store.insert_if_absent(&fresh, NOW).await,
            Err(StoreError::Corrupt(_))
        ));
        store.close().await.ok();
    }
    match EmbeddedStore::open(&options(dir.path())) {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains("restore"), "{message}");
            assert!(message.contains("block"), "names the block: {message}");
        }
        other => panic!("a restart must refuse the damaged file: {other:?}"),
    }
}

#[tokio::test]
async fn the_scrub_finds_damage_in_a_block_nobody_reads() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    store.close().await.expect("close");
    drop(store);
    let mut options = options(dir.path());
    options.scrub = ScrubOptions {
        rate: 256 * 1024 * 1024,
        interval: Duration::from_millis(20),
    };
    let store = EmbeddedStore::open(&options).expect("open");
    // Damage while serving, behind redb's back; no request reads it.
    damage(&dir.path().join(DATABASE_FILE));
    let started = Instant::now();
    while store.damage().is_none() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = store.damage().expect("the scrub found the damage");
    assert!(report.contains("found by the scrub"), "{report}");
    assert!(matches!(
        store.get(&id("k1"), NOW).await,
        Err(StoreError::Corrupt(_))
    ));
}

#[tokio::test]
async fn a_file_without_sums_is_checked_whole_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    store.close().await.expect("close");
    drop(store);
    std::fs::remove_file(dir.path().join(SUMS_FILE)).expect("remove sums");
    let store = EmbeddedStore::open(&options(dir.path())).expect("reopen");
    let reason = store.full_check_on_open().expect("checked whole");
    assert!(reason.contains("no block checksums"), "{reason}");
    assert_eq!(read_all(&store).await, (RECORDS, 0));
    store.close().await.expect("close");
    drop(store);
    let store = EmbeddedStore::open(&options(dir.path())).expect("reopen");
    assert_eq!(store.full_check_on_open(), None, "once");
}

#[tokio::test]
async fn a_commit_by_another_program_is_noticed() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    store.close().await.expect("close");
    drop(store);
    {
        // What an older idemd (no checksums) does to the file.
        let database = redb::Database::create(dir.path().join(DATABASE_FILE)).expect("redb");
        let txn = database.begin_write().expect("begin");
        {
            let table: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("other");
            txn.open_table(table)
                .expect("table")
                .insert("x", 1)
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let store = EmbeddedStore::open(&options(dir.path())).expect("reopen");
    let reason = store.full_check_on_open().expect("checked whole");
    assert!(reason.contains("another program"), "{reason}");
    assert_eq!(read_all(&store).await, (RECORDS, 0));
}

/// Copies the store's files while it runs: what a `kill -9` leaves (the
/// page cache holds every write the process made).
fn crash_image(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

#[tokio::test]
async fn a_killed_process_and_a_lost_machine_restart_without_a_full_check() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    // Past a checkpoint, so the image holds redb pages and log frames.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store
        .insert_if_absent(&completed("late", b"late", NOW + 1_000_000), NOW)
        .await
        .expect("insert");
    // The checkpoint that write may start is over before the copy (a kill
    // stops everything at once; a copy of several files does not).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = tempfile::tempdir().expect("dir");
    crash_image(dir.path(), killed.path());
    let lost = tempfile::tempdir().expect("dir");
    crash_image(dir.path(), lost.path());
    store.close().await.expect("close");
    drop(store);

    let store = EmbeddedStore::open(&options(killed.path())).expect("open after kill");
    assert_eq!(store.full_check_on_open(), None, "same boot: no full check");
    assert_eq!(read_all(&store).await, (RECORDS, 0));
    assert!(store.get(&id("late"), NOW).await.expect("get").is_some());
    drop(store);

    // The same files after the machine stopped: another boot id, which
    // changes nothing (the sums of redb's last durable commit hold on any
    // boot; see blocks/mod.rs).
    let sidecar = Sidecar::open(&lost.path().join(SUMS_FILE))
        .expect("open")
        .expect("lock");
    let header = sidecar.header().expect("read").expect("header");
    assert!(!header.clean);
    sidecar
        .write_header(&Header {
            boot_id: "another-boot".into(),
            ..header
        })
        .expect("write");
    drop(sidecar);
    let store = EmbeddedStore::open(&options(lost.path())).expect("open after power loss");
    assert_eq!(
        store.full_check_on_open(),
        None,
        "another boot: no full check"
    );
    assert_eq!(read_all(&store).await, (RECORDS, 0));
    assert!(store.get(&id("late"), NOW).await.expect("get").is_some());
}

/// Blocks of `data` (from block 1) that do not match `sums` (a checksum
/// file's bytes).
fn mismatched_blocks(data: &[u8], sums: &[u8]) -> Vec<usize> {
    let entries = &sums[super::blocks::sidecar::ENTRIES_AT as usize..];
    data.chunks(BLOCK)
        .enumerate()
        .skip(1)
        .filter(|(i, chunk)| {
            entries
                .get(i * 4..i * 4 + 4)
                .is_none_or(|sum| sum != super::wal::crc32c(chunk).to_le_bytes())
        })
        .map(|(i, _)| i)
        .collect()
}

/// What a disk image (a VolumeSnapshot, a copied loop device) or a power
/// loss leaves: blocks redb wrote after the last sync are on the disk, their
/// sums are not. Such an image once opened as "damaged for good" when its
/// boot id matched (the page cache was assumed to have survived).
// The gate is held across the writes on purpose: it keeps the next
// checkpoint from its durable commit (only the checkpoint thread waits).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_image_with_blocks_newer_than_their_sums_serves_every_key() {
    let dir = tempfile::tempdir().expect("dir");
    // A small cache: redb's non-durable commits leave pages in its write
    // buffer, and only a full buffer writes them to the file before the
    // next durable commit (what a busy store does all the time).
    let mut small_cache = EmbeddedOptions::new(dir.path());
    small_cache.cache_bytes = 256 * 1024;
    let (store, checkpoint_gate) = super::tests::open_gated(&small_cache);
    let insert = |name: String, body: Vec<u8>| {
        let store = &store;
        async move {
            let record = completed(&name, &body, NOW + 1_000_000);
            store.insert_if_absent(&record, NOW).await.expect("insert");
        }
    };
    for i in 0..RECORDS {
        insert(format!("k{i}"), body(i)).await;
    }
    // A durable commit of all of them, and none running after it: each
    // write lets the writer take a finished checkpoint's outcome.
    let checkpoints = |store: &EmbeddedStore| {
        use std::sync::atomic::Ordering::SeqCst;
        (
            store.stats.checkpoints_started.load(SeqCst),
            store.stats.checkpoints.load(SeqCst),
        )
    };
    // Each attempt: wait for a checkpoint to end, hold the next one at the
    // gate, remember the sums as the disk has them, write large records (64
    // at a time, so the first overflow redb's write buffer into the file
    // well before the next checkpoint diverts writes to the overlay), and
    // copy the files with the remembered sums. An attempt whose writes all
    // stayed in memory (a loaded machine) proves nothing and is repeated.
    let mut late = Vec::new();
    let image = tempfile::tempdir().expect("dir");
    let mut newer = Vec::new();
    for attempt in 0..5 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let started = Instant::now();
        let gate = loop {
            insert("trigger".into(), body(0)).await;
            let (begun, done) = checkpoints(&store);
            if done > 0 && begun == done {
                let gate = checkpoint_gate.lock().unwrap_or_else(|e| e.into_inner());
                // A checkpoint that began between the count and the gate
                // passed the gate already and would commit (rewriting the
                // header) while the image is taken: counted again after a
                // pause long enough for the writer to count it, else the
                // attempt starts over (a loaded machine once hit it).
                std::thread::sleep(Duration::from_millis(50));
                if checkpoints(&store) == (begun, done) {
                    break gate;
                }
                drop(gate);
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no checkpoint");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let sums_then = std::fs::read(dir.path().join(SUMS_FILE)).expect("read sums");
        let names: Vec<(String, Vec<u8>)> = (0..RECORDS / 4)
            .map(|i| (format!("n{attempt}-{i}"), large_body(i)))
            .collect();
        for chunk in names.chunks(64) {
            futures::future::join_all(
                chunk
                    .iter()
                    .map(|(name, body)| insert(name.clone(), body.clone())),
            )
            .await;
        }
        late.extend(names);
        crash_image(dir.path(), image.path());
        std::fs::write(image.path().join(SUMS_FILE), &sums_then).expect("write sums");
        drop(gate);
        let data = std::fs::read(image.path().join(DATABASE_FILE)).expect("read data");
        newer = mismatched_blocks(&data, &sums_then);
        if !newer.is_empty() {
            break;
        }
    }
    store.close().await.expect("close");
    drop(store);
    assert!(
        !newer.is_empty(),
        "the image must hold blocks newer than their sums, or it proves nothing"
    );
    let damaged = tempfile::tempdir().expect("dir");
    crash_image(image.path(), damaged.path());

    let mut scrubbing = options(image.path());
    scrubbing.scrub = ScrubOptions {
        rate: 256 * 1024 * 1024,
        interval: Duration::from_millis(20),
    };
    let store = EmbeddedStore::open(&scrubbing).expect("the image opens");
    assert_eq!(store.full_check_on_open(), None);
    assert_eq!(read_all(&store).await, (RECORDS, 0));
    for (name, body) in &late {
        let record = store.get(&id(name), NOW).await.expect("get");
        assert_eq!(
            record.and_then(|r| r.response).map(|r| r.body).as_ref(),
            Some(body),
            "{name}"
        );
    }
    // Many scrub passes over the blocks newer than their sums.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        store.damage(),
        None,
        "{} blocks newer than their sums",
        newer.len()
    );
    store.close().await.expect("close");
    drop(store);

    // Damage to what redb's last durable commit holds is still found: a
    // byte flipped in every block that matched its sum in the image.
    let path = damaged.path().join(DATABASE_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let blocks = std::fs::metadata(&path).expect("stat").len() as usize / BLOCK;
    for block in 1..blocks {
        if !newer.contains(&block) {
            let at = (block * BLOCK + 100) as u64;
            let mut byte = [0u8; 1];
            file.read_exact_at(&mut byte, at).expect("read");
            file.write_all_at(&[byte[0] ^ 0x5a], at).expect("write");
        }
    }
    drop(file);
    match EmbeddedStore::open(&options(damaged.path())) {
        Err(StoreError::Corrupt(report)) => assert!(report.contains("checksum"), "{report}"),
        Err(other) => panic!("damage must be named as damage: {other}"),
        Ok(store) => {
            let (_, refused) = read_all(&store).await;
            assert!(refused > 0, "damaged committed pages served");
        }
    }
}

#[test]
fn a_second_owner_is_refused_before_it_touches_the_sums() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join(DATABASE_FILE);
    let (_first, _) = Blocks::open(&path).expect("first");
    match Blocks::open(&path) {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("already open"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stop_inside_a_resize_needs_no_full_check() {
    let dir = tempfile::tempdir().expect("dir");
    let store = filled(dir.path()).await;
    store.close().await.expect("close");
    drop(store);
    // What a kill between growing the sums and growing the file leaves,
    // then (second round) between growing the file and its sums: the
    // process stopped uncleanly on this boot.
    let path = dir.path().join(DATABASE_FILE);
    for grow_data in [false, true] {
        let sidecar = Sidecar::open(&dir.path().join(SUMS_FILE))
            .expect("open")
            .expect("lock");
        let header = sidecar.header().expect("read").expect("header");
        sidecar
            .write_header(&Header {
                clean: false,
                ..header
            })
            .expect("write");
        let len = std::fs::metadata(&path).expect("stat").len();
        if grow_data {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open");
            file.set_len(len + 64 * BLOCK as u64).expect("grow");
        } else {
            let blocks = sidecar.entry_count().expect("count");
            sidecar.set_entry_count(blocks + 64).expect("grow sums");
        }
        drop(sidecar);
        let store = EmbeddedStore::open(&options(dir.path())).expect("reopen");
        assert_eq!(store.full_check_on_open(), None, "grow_data: {grow_data}");
        assert_eq!(read_all(&store).await, (RECORDS, 0));
        store.close().await.expect("close");
    }
}
