//! Encryption at rest on the CQL backend, against the real test cluster:
//! the `response` blob read with a plain CQL SELECT holds no plaintext, a
//! blob copied into another row fails to decrypt, and blobs written before
//! encryption was turned on stay readable.

use std::sync::Arc;

use idemd::crypto::{self, Keyring};
use idemd::store::cql::CqlStore;
use idemd::store::cql::session::rows;
use idemd::store::{
    InsertOutcome, Record, RecordKey, RecordState, Store, StoreError, StoredResponse,
};
use scylla::value::CqlValue;

use crate::common::wall_ms;

const KEYS: &str = "cql-k1 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";

fn keyring() -> Arc<Keyring> {
    Arc::new(Keyring::parse(std::path::Path::new("test-keys"), KEYS).expect("keyring"))
}

/// A tenant unique to this run, so reruns and parallel tests never meet.
fn tenant() -> String {
    format!("enc-{}-{}", std::process::id(), wall_ms())
}

fn completed(tenant: &str, key: &str, marker: &str) -> Record {
    let now = wall_ms();
    Record {
        id: RecordKey {
            tenant: tenant.into(),
            endpoint: "POST /v1/payments".into(),
            key: key.into(),
        },
        state: RecordState::Completed,
        fingerprint: vec![7; 32],
        attempt: 1,
        lease_token: format!("lease-{key}"),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now,
        completed_at_ms: Some(now),
        expires_at_ms: now + 3_600_000,
        response: Some(StoredResponse {
            status: 201,
            headers: vec![("x-secret".into(), format!("hdr-{marker}"))],
            body: format!("{{\"card\":\"{marker}\"}}").into_bytes(),
            body_ref: String::new(),
        }),
        reason: String::new(),
    }
}

/// The raw `response` blob of a row, by plain CQL.
async fn raw_response(session: &scylla::client::session::Session, id: &RecordKey) -> Vec<u8> {
    let result = session
        .query_unpaged(
            format!(
                "SELECT response FROM {}.records WHERE tenant = ? AND endpoint = ? AND key = ?",
                crate::cql_support::TEST_KEYSPACE
            ),
            (&id.tenant, &id.endpoint, &id.key),
        )
        .await
        .expect("select");
    let rows = rows::named_rows(result).expect("rows");
    match rows.first().and_then(|row| row.get("response")) {
        Some(Some(CqlValue::Blob(bytes))) => bytes.clone(),
        other => panic!("expected a response blob, got {other:?}"),
    }
}

#[tokio::test]
async fn response_blob_is_sealed_and_bound_to_its_row() {
    let options = crate::cql_support::migrated_options().await;
    let store = CqlStore::open_with_keyring(&options, Some(keyring()))
        .await
        .expect("open");
    let session = idemd::store::cql::connect(&options).await.expect("connect");
    let tenant = tenant();
    let marker = "MARKER-cql-9d41";
    let record = completed(&tenant, "k-a", marker);
    let now = wall_ms();
    assert_eq!(
        store.insert_if_absent(&record, now).await,
        Ok(InsertOutcome::Inserted)
    );

    let blob = raw_response(&session, &record.id).await;
    assert!(crypto::is_sealed(&blob));
    assert_eq!(crypto::sealed_key_id(&blob), Ok("cql-k1"));
    assert!(!blob.windows(marker.len()).any(|w| w == marker.as_bytes()));
    assert_eq!(
        store.get(&record.id, now).await.expect("get"),
        Some(record.clone())
    );

    // Copy the blob into another row: authentication fails, naming the key.
    let other = completed(&tenant, "k-b", "MARKER-cql-other");
    assert_eq!(
        store.insert_if_absent(&other, now).await,
        Ok(InsertOutcome::Inserted)
    );
    session
        .query_unpaged(
            format!(
                "UPDATE {}.records SET response = ? WHERE tenant = ? AND endpoint = ? AND key = ?",
                crate::cql_support::TEST_KEYSPACE
            ),
            (&blob, &other.id.tenant, &other.id.endpoint, &other.id.key),
        )
        .await
        .expect("copy the blob");
    match store.get(&other.id, now).await {
        Err(StoreError::Undecryptable(message)) => {
            assert!(message.contains("\"cql-k1\""), "{message}");
            assert!(message.contains("failed authentication"), "{message}");
        }
        other => panic!("a copied blob must not decrypt, got {other:?}"),
    }

    // Without the keyring: an error naming the key id, never garbage.
    let plain_store = CqlStore::open(&options).await.expect("open");
    match plain_store.get(&record.id, now).await {
        Err(StoreError::Undecryptable(message)) => {
            assert!(message.contains("\"cql-k1\""), "{message}")
        }
        other => panic!("expected undecryptable, got {other:?}"),
    }
    plain_store.close().await.expect("close");
    store.close().await.expect("close");
}

#[tokio::test]
async fn blobs_written_in_clear_stay_readable_after_turning_encryption_on() {
    let options = crate::cql_support::migrated_options().await;
    let tenant = tenant();
    let record = completed(&tenant, "k-old", "MARKER-cql-plain");
    let now = wall_ms();
    let plain_store = CqlStore::open(&options).await.expect("open");
    assert_eq!(
        plain_store.insert_if_absent(&record, now).await,
        Ok(InsertOutcome::Inserted)
    );
    plain_store.close().await.expect("close");

    let store = CqlStore::open_with_keyring(&options, Some(keyring()))
        .await
        .expect("open");
    assert_eq!(
        store.get(&record.id, now).await.expect("get"),
        Some(record.clone())
    );
    store.close().await.expect("close");
}

/// `response` blobs exactly as idemd 0.1.0 wrote them (captured from the
/// 0.1.0 library, in clear and sealed under key `k-2024` = 32 bytes of
/// `0x01`) read back through today's code: the encoding is shared with the
/// embedded store now (`store::response`), and existing keyspaces must not
/// notice.
#[tokio::test]
async fn response_blobs_written_by_0_1_0_still_read() {
    const PLAIN_0_1_0: &str = "08c90112200a0c636f6e74656e742d7479706512106170706c69636174696f6e2f6a736f6e12080a03782d6112013112080a03782d611201321a0e7b226964223a227061795f31227d";
    // Sealed for tenant `fixture-010`, endpoint `POST /v1/payments`, key
    // `completed` (the associated data binds it to that row).
    const SEALED_0_1_0: &str = "e1066b2d323032341385b44aec6e0c828e72b663c388f2b7fec04d07a8d3a1cbf0640c1e1a71eb99039442ac04600e17a52c75f001538d218439a2bd07e6969bbdadbc68e505240375d82037bc7623cc62918837facc0cf25a47d1d072c3b4630787cd66c5de5a5a0c583b542c";
    let expected = crate::common::fixture_0_1_0_response();
    let options = crate::cql_support::migrated_options().await;
    let keyring = Arc::new(
        Keyring::parse(
            std::path::Path::new("fixture keys"),
            "k-2024 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
        )
        .expect("keyring"),
    );
    let store = CqlStore::open_with_keyring(&options, Some(keyring))
        .await
        .expect("open");
    let session = idemd::store::cql::connect(&options).await.expect("connect");
    let now = wall_ms();
    for (tenant, key, blob) in [
        (tenant(), "completed".to_string(), PLAIN_0_1_0),
        (
            "fixture-010".to_string(),
            "completed".to_string(),
            SEALED_0_1_0,
        ),
    ] {
        // The row as any idemd writes it, then its blob replaced by the
        // 0.1.0 bytes (the fixed sealed row may exist from an earlier run).
        let record = completed(&tenant, &key, "placeholder");
        let _ = store.insert_if_absent(&record, now).await.expect("insert");
        let blob = hex::decode(blob).expect("hex");
        session
            .query_unpaged(
                format!(
                    "UPDATE {}.records USING TTL 3600 SET response = ?, state = 'completed', expires_at = ? \
                     WHERE tenant = ? AND endpoint = ? AND key = ?",
                    crate::cql_support::TEST_KEYSPACE
                ),
                (&blob, now + 3_600_000, &record.id.tenant, &record.id.endpoint, &record.id.key),
            )
            .await
            .expect("write the 0.1.0 blob");
        let read = store
            .get(&record.id, now)
            .await
            .expect("read")
            .expect("present");
        assert_eq!(read.response, Some(expected.clone()), "tenant {tenant}");
    }
    store.close().await.expect("close");
}
