//! The embedded store's on-disk codec (`idemd::store::embedded::codec`):
//! every decoder on arbitrary bytes returns an error instead of panicking,
//! and whatever decodes re-encodes to something that decodes to the same
//! value. Key encodings are canonical, so for them the re-encoding must be
//! the input byte for byte.
//!
//! Input: the bytes, handed to every decoder in turn.
#![no_main]

use idemd::store::RecordKey;
use idemd::store::embedded::codec;
use libfuzzer_sys::fuzz_target;

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
        if let Some(response) = &record.response {
            let bytes = codec::encode_response(response);
            assert_eq!(codec::decode_response(&bytes).as_ref(), Ok(response));
        }
    }

    // Stored response blobs (the CQL backend's column).
    if let Ok(response) = codec::decode_response(data) {
        let encoded = codec::encode_response(&response);
        assert_eq!(codec::decode_response(&encoded), Ok(response));
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
