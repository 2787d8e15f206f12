//! The embedded store's on-disk codec (`idemd::store::embedded::codec`) and
//! the stored-response encoding both stores share (`idemd::store::response`):
//! every decoder on arbitrary bytes returns an error instead of panicking,
//! and whatever decodes re-encodes to something that decodes to the same
//! value. Key encodings are canonical, so for them the re-encoding must be
//! the input byte for byte.
//!
//! Input: the bytes, handed to every decoder in turn (sealed responses are
//! opened with the fixed `idemd_fuzz::fuzz_keyring`).
#![no_main]

use std::sync::OnceLock;

use idemd::crypto::Keyring;
use idemd::store::{RecordKey, response};
use idemd::store::embedded::codec;
use libfuzzer_sys::fuzz_target;

/// Built once: parsing the keyring per input would dominate the run.
fn keyring() -> &'static Keyring {
    static KEYRING: OnceLock<Keyring> = OnceLock::new();
    KEYRING.get_or_init(idemd_fuzz::fuzz_keyring)
}

fuzz_target!(|data: &[u8]| {
    let id = RecordKey {
        tenant: "tenant-a".into(),
        endpoint: "POST /v1/payments".into(),
        key: "key-1".into(),
    };

    // Record values (protobuf).
    if let Ok(record) = codec::decode_record(id.clone(), data) {
        let encoded = codec::encode_record(&record);
        let again =
            codec::decode_record(id.clone(), &encoded).expect("re-encoded record must decode");
        assert_eq!(again, record, "decode(encode(decode(x))) != decode(x)");
        assert_eq!(
            codec::encode_record(&again),
            encoded,
            "record encoding is not stable"
        );
        if let Some(stored) = &record.response {
            let bytes = response::encode(stored);
            assert_eq!(response::decode(&bytes).as_ref(), Ok(stored));
        }
    }

    // Record values with a sealed response (encryption at rest): the clear
    // fields round-trip like any record's, and a response that opens with
    // the keyring reseals (fresh nonce) into a value that decodes to the
    // same fields and opens to the same response. The seed
    // `record-sealed` is authentic under `idemd_fuzz::fuzz_keyring`.
    if let Ok((record, Some(sealed))) = codec::decode_record_value(id.clone(), data)
        && let Ok(opened_response) = response::open(Some(keyring()), &id, &sealed)
    {
        let mut opened = record.clone();
        opened.response = Some(opened_response.clone());
        let encoded = codec::encode_record_sealed(&opened, Some(keyring()))
            .expect("an opened record reseals");
        let (again, resealed) = codec::decode_record_value(id.clone(), &encoded)
            .expect("a resealed record must decode");
        assert_eq!(again, record, "the clear fields changed when resealing");
        let resealed = resealed.expect("a resealed record stays sealed");
        assert_eq!(
            response::open(Some(keyring()), &id, &resealed).ok(),
            Some(opened_response),
            "the resealed response does not open to the same response"
        );
    }

    // Stored response blobs (the CQL backend's column).
    if let Ok(decoded) = response::decode(data) {
        let encoded = response::encode(&decoded);
        assert_eq!(response::decode(&encoded), Ok(decoded));
    }

    // Keys: canonical, so the input itself comes back.
    if let Ok(key) = codec::decode_record_key(data) {
        assert_eq!(
            codec::record_key(&key),
            data,
            "record key does not round-trip"
        );
    }
    if let Ok((instant, key)) = codec::decode_expiry_key(data) {
        assert_eq!(
            codec::expiry_key(instant, &key),
            data,
            "expiry key does not round-trip"
        );
        assert_eq!(codec::encode_instant(instant).as_slice(), &data[..8]);
    }
    if let Ok((since, key)) = codec::decode_pending_position("tenant-a", data) {
        assert_eq!(key.tenant, "tenant-a");
        assert_eq!(
            codec::pending_position(since, &key),
            data,
            "pending position does not round-trip"
        );
        let full = codec::pending_key(since, &key);
        assert!(full.starts_with(&codec::pending_tenant_prefix("tenant-a")));
    }
});
