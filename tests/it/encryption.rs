//! Encryption at rest on the embedded store, end to end over gRPC: stored
//! responses never reach the data directory (records file or write-ahead
//! log) in clear, replays are byte-identical, rotation works across a
//! restart, and a missing key is a clear error naming the key id.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use idemd::crypto::Keyring;
use idemd::proto::v1 as pb;
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::{RecordKey, Store, StoreError};
use tonic::Code;
use tonic_types::StatusExt;

const TENANT: &str = "acme";
const KEY_1: &str = "k-2024 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
const KEY_2: &str = "k-2025 AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";

/// A response whose body and a header value carry `marker`.
fn marked_response(marker: &str) -> pb::StoredResponse {
    let mut response = sample_response(marker);
    response.headers.push(pb::Header {
        name: "X-Secret".into(),
        value: format!("hdr-{marker}"),
    });
    response.body_ref = format!("s3://bucket/{marker}");
    response
}

fn write_keyring(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let mut text = "# test keyring: the last key encrypts\n".to_string();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&path, text).expect("write keyring");
    path
}

async fn start(dir: tempfile::TempDir, keyring: Option<PathBuf>) -> TestServer {
    let mut settings = test_settings(dir.path());
    settings.encryption_keys = keyring;
    TestServer::start(dir, settings, None).await
}

/// Claims and completes `key` with a response marked `marker`.
async fn store_marked(server: &TestServer, key: &str, marker: &str) -> pb::StoredResponse {
    let mut client = server.client.clone();
    let claim = client
        .claim(as_tenant(TENANT, crate::common::claim(PAYMENTS, key, 4200)))
        .await
        .expect("claim")
        .into_inner();
    let lease_token = claimed(&claim).lease_token;
    let response = marked_response(marker);
    client
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token,
                response: Some(response.clone()),
            },
        ))
        .await
        .expect("complete");
    response
}

/// The replay a retried Claim gets.
async fn replay(server: &TestServer, key: &str) -> Result<pb::StoredResponse, tonic::Status> {
    let mut client = server.client.clone();
    let claim = client
        .claim(as_tenant(TENANT, crate::common::claim(PAYMENTS, key, 4200)))
        .await?
        .into_inner();
    Ok(replayed(&claim).response.expect("replayed response"))
}

async fn lookup(server: &TestServer, key: &str) -> Result<pb::Record, tonic::Status> {
    let mut client = server.client.clone();
    client
        .lookup(as_tenant(
            TENANT,
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                include_response: true,
            },
        ))
        .await
        .map(|r| r.into_inner().record.expect("record"))
}

/// Files under `dir` (recursively) that contain `needle`, and every file
/// scanned.
fn files_containing(dir: &Path, needle: &[u8]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut found = Vec::new();
    let mut scanned = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            // The admin socket (`idemd backup` talks to it) holds no data.
            if !path.is_file() {
                continue;
            }
            let bytes = std::fs::read(&path).expect("read data file");
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path.clone());
            }
            scanned.push(path);
        }
    }
    (found, scanned)
}

fn names(paths: &[PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = paths
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

fn record_id(key: &str) -> RecordKey {
    RecordKey {
        tenant: TENANT.into(),
        endpoint: PAYMENTS.into(),
        key: key.into(),
    }
}

/// The error a keyring-less store gives for `key`: names the key id the
/// stored response was sealed with.
async fn sealed_with(data_dir: &Path, key: &str) -> String {
    let options = EmbeddedOptions::new(data_dir);
    let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&options))
        .await
        .expect("join")
        .expect("open store");
    let result = store.get(&record_id(key), 0).await;
    store.close().await.expect("close");
    match result {
        Err(StoreError::Undecryptable(message)) => message,
        other => panic!("expected an undecryptable response, got {other:?}"),
    }
}

#[tokio::test]
async fn plaintext_is_absent_from_every_file_and_replays_are_identical() {
    let keys = tempfile::tempdir().expect("temp dir");
    let keyring = write_keyring(keys.path(), "keys", &[KEY_1]);
    let data_holder = tempfile::tempdir().expect("temp dir");
    let data = data_holder.path().join("data");
    let server = restart(&data, Some(keyring.clone())).await;
    let marker = "MARKER-7f3a9c1e-card-4242";
    let stored = store_marked(&server, "k-secret", marker).await;

    // While running: the write is in the write-ahead log (and maybe redb).
    let (found, scanned) = files_containing(&data, marker.as_bytes());
    assert!(
        names(&scanned).contains(&"idemd.wal".to_string()),
        "{scanned:?}"
    );
    assert!(found.is_empty(), "plaintext in {found:?}");

    // A replay over gRPC is byte-identical; so is Lookup.
    assert_eq!(replay(&server, "k-secret").await.expect("replay"), stored);
    assert_eq!(
        lookup(&server, "k-secret").await.expect("lookup").response,
        Some(stored.clone())
    );
    server.stop().await;

    // After shutdown (checkpointed into the records file).
    let (found, scanned) = files_containing(&data, marker.as_bytes());
    assert!(
        names(&scanned).contains(&"idemd.redb".to_string()),
        "{scanned:?}"
    );
    assert!(found.is_empty(), "plaintext in {found:?}");
    for needle in [format!("hdr-{marker}"), format!("s3://bucket/{marker}")] {
        assert!(files_containing(&data, needle.as_bytes()).0.is_empty());
    }

    // After a restart: read back from disk, not from a cache.
    let server = restart(&data, Some(keyring)).await;
    assert_eq!(replay(&server, "k-secret").await.expect("replay"), stored);
    server.stop().await;
}

/// Without a keyring the same flow leaves the marker on disk: proves the
/// scan above would have found plaintext.
#[tokio::test]
async fn control_without_keyring_the_marker_is_on_disk() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start(dir, None).await;
    let marker = "MARKER-control-5b2d";
    store_marked(&server, "k-plain", marker).await;
    let data = server.dir.path().to_path_buf();
    let (found, _) = files_containing(&data, marker.as_bytes());
    assert!(!found.is_empty(), "the probe finds plaintext");
    server.stop().await;
}

/// A server on an existing data directory (the returned server owns a
/// throwaway temp dir; the data stays where it is).
async fn restart(data: &Path, keyring: Option<PathBuf>) -> TestServer {
    let holder = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(data);
    settings.encryption_keys = keyring;
    TestServer::start(holder, settings, None).await
}

#[tokio::test]
async fn rotation_across_a_restart() {
    let keys = tempfile::tempdir().expect("temp dir");
    let one = write_keyring(keys.path(), "one", &[KEY_1]);
    let both = write_keyring(keys.path(), "both", &[KEY_1, KEY_2]);
    let data_holder = tempfile::tempdir().expect("temp dir");
    let data = data_holder.path().join("data");

    let server = restart(&data, Some(one.clone())).await;
    let old = store_marked(&server, "k-old", "MARKER-old-11").await;
    server.stop().await;

    // Rotate: key 2 appended; old records still replay, new ones use key 2.
    let server = restart(&data, Some(both.clone())).await;
    assert_eq!(replay(&server, "k-old").await.expect("old replays"), old);
    let new = store_marked(&server, "k-new", "MARKER-new-22").await;
    assert_eq!(replay(&server, "k-new").await.expect("new replays"), new);
    server.stop().await;

    let old_error = sealed_with(&data, "k-old").await;
    assert!(old_error.contains("\"k-2024\""), "{old_error}");
    let new_error = sealed_with(&data, "k-new").await;
    assert!(new_error.contains("\"k-2025\""), "{new_error}");
    for marker in ["MARKER-old-11", "MARKER-new-22"] {
        assert!(files_containing(&data, marker.as_bytes()).0.is_empty());
    }

    // Both replay after yet another restart with the rotated keyring.
    let server = restart(&data, Some(both)).await;
    assert_eq!(replay(&server, "k-old").await.expect("old"), old);
    assert_eq!(replay(&server, "k-new").await.expect("new"), new);
    server.stop().await;
}

fn assert_names_key(status: &tonic::Status, key_id: &str) {
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains(&format!("\"{key_id}\"")),
        "message names the key id: {}",
        status.message()
    );
    let info = status.get_details_error_info().expect("ErrorInfo detail");
    assert_eq!(info.reason, "RESPONSE_UNDECRYPTABLE");
}

#[tokio::test]
async fn missing_key_is_a_clear_error_naming_the_key_id() {
    let keys = tempfile::tempdir().expect("temp dir");
    let one = write_keyring(keys.path(), "one", &[KEY_1]);
    let only_two = write_keyring(keys.path(), "two", &[KEY_2]);
    let data_holder = tempfile::tempdir().expect("temp dir");
    let data = data_holder.path().join("data");

    let server = restart(&data, Some(one.clone())).await;
    let old = store_marked(&server, "k-old", "MARKER-old-33").await;
    server.stop().await;

    // Key 1 dropped from the keyring too early.
    let server = restart(&data, Some(only_two)).await;
    let status = lookup(&server, "k-old").await.expect_err("lookup fails");
    assert_names_key(&status, "k-2024");
    assert!(!status.message().contains("MARKER"), "{status:?}");
    let status = replay(&server, "k-old").await.expect_err("replay fails");
    assert_names_key(&status, "k-2024");
    // Other records are unaffected: the writer never decrypts.
    let fresh = store_marked(&server, "k-fresh", "MARKER-fresh-44").await;
    assert_eq!(replay(&server, "k-fresh").await.expect("fresh"), fresh);
    server.stop().await;

    // Encryption turned off: sealed values still need the keyring (the
    // error says so), new values are written in clear and readable.
    let server = restart(&data, None).await;
    let status = replay(&server, "k-old").await.expect_err("replay fails");
    assert_names_key(&status, "k-2024");
    assert!(
        status.message().contains("no encryption keyring"),
        "{status:?}"
    );
    let plain = store_marked(&server, "k-plain", "MARKER-plain-55").await;
    server.stop().await;
    assert!(!files_containing(&data, b"MARKER-plain-55").0.is_empty());

    // Turned back on with the full keyring: everything reads.
    let server = restart(&data, Some(one)).await;
    assert_eq!(replay(&server, "k-old").await.expect("old"), old);
    assert_eq!(replay(&server, "k-plain").await.expect("plaintext"), plain);
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_keyring_stops_start_up_naming_file_and_line() {
    let keys = tempfile::tempdir().expect("temp dir");
    let bad = write_keyring(keys.path(), "bad", &[KEY_1, "k2 too-short"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.encryption_keys = Some(bad.clone());
    let clock: Arc<dyn idemd::clock::Clock> = Arc::new(idemd::clock::ManualClock::starting_now());
    let error = match idemd::server::start(settings, clock).await {
        Ok(_) => panic!("a bad keyring must stop start-up"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains(&format!("{}:3:", bad.display())),
        "names file and line: {error}"
    );
    let _ = Keyring::load(&bad).expect_err("invalid");
}

/// Rotation without a restart: the keyring file is re-read when it
/// changes; a bad version keeps the keys in force; after the rotation new
/// responses are sealed with the new key and old ones still open with
/// theirs (the replay cache is off, so every replay decrypts).
#[tokio::test]
async fn rotation_without_a_restart() {
    let keys = tempfile::tempdir().expect("temp dir");
    let keyring = write_keyring(keys.path(), "keys", &[KEY_1]);
    let data_holder = tempfile::tempdir().expect("temp dir");
    let data = data_holder.path().join("data");
    let holder = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(&data);
    settings.encryption_keys = Some(keyring.clone());
    settings.cache_bytes = 0;
    let server = TestServer::start(holder, settings, None).await;
    let mut events = server
        .server
        .as_ref()
        .expect("server")
        .reload_events()
        .subscribe();
    let old = store_marked(&server, "k-old", "MARKER-old-31").await;

    // A broken file (a half-written Secret): the keys in force stay.
    std::fs::write(&keyring, "k-2025 not-base64-at-all\n").expect("write");
    let outcome = next_reload(&mut events, "encryption keyring").await;
    let error = outcome.expect_err("bad file");
    assert!(error.contains("not valid base64"), "{error}");
    let mid = store_marked(&server, "k-mid", "MARKER-mid-32").await;

    write_keyring(keys.path(), "keys", &[KEY_1, KEY_2]);
    let outcome = next_reload(&mut events, "encryption keyring").await;
    assert!(outcome.expect("reloaded").contains("\"k-2025\""));
    let new = store_marked(&server, "k-new", "MARKER-new-33").await;
    for (key, expected) in [("k-old", &old), ("k-mid", &mid), ("k-new", &new)] {
        assert_eq!(
            &replay(&server, key).await.expect("replays"),
            expected,
            "{key}"
        );
    }
    server.stop().await;

    for (key, key_id) in [
        ("k-old", "k-2024"),
        ("k-mid", "k-2024"),
        ("k-new", "k-2025"),
    ] {
        let error = sealed_with(&data, key).await;
        assert!(error.contains(&format!("\"{key_id}\"")), "{key}: {error}");
    }
}
