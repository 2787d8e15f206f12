//! Key, tenant, attempt id, lease token, endpoint, reason, duration and JSON
//! Pointer validation (`idemd::engine::validate`,
//! `idemd::fingerprint::parse_ignore_fields`), each checked against an
//! independent model of the documented rule, plus the record-key encoding
//! of every identity that validation accepts.
//!
//! Input: the whole input as one (lossy UTF-8) string for the single-value
//! validators; its newline-separated lines as an `ignore_fields` list; the
//! first 8 bytes as a signed millisecond duration.
#![no_main]

use idemd::engine::validate;
use idemd::fingerprint::{self, canonical_json};
use idemd::store::RecordKey;
use idemd::store::embedded::codec;
use idemd_fuzz::{escape_token, lines};
use libfuzzer_sys::fuzz_target;

fn key_like(value: &str, max_chars: usize) -> bool {
    let chars = value.chars().count();
    (1..=max_chars).contains(&chars)
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn endpoint_ok(value: &str) -> bool {
    !value.trim().is_empty()
        && value.chars().count() <= validate::MAX_ENDPOINT_CHARS
        && !value.chars().any(char::is_control)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let s: &str = &text;

    assert_eq!(
        validate::key(s).is_ok(),
        key_like(s, validate::MAX_KEY_CHARS),
        "key {s:?}"
    );
    assert_eq!(
        validate::tenant("tenant", s).is_ok(),
        key_like(s, validate::MAX_TENANT_CHARS),
        "tenant {s:?}"
    );
    assert_eq!(
        validate::attempt_id(s).is_ok(),
        s.is_empty() || key_like(s, validate::MAX_ATTEMPT_ID_CHARS),
        "attempt_id {s:?}"
    );
    assert_eq!(
        validate::lease_token(s).is_ok(),
        key_like(s, validate::MAX_LEASE_TOKEN_CHARS),
        "lease_token {s:?}"
    );
    assert_eq!(
        validate::endpoint(s).is_ok(),
        endpoint_ok(s),
        "endpoint {s:?}"
    );
    assert_eq!(
        validate::reason("reason", s).is_ok(),
        s.len() <= validate::MAX_REASON_BYTES
    );

    // Durations from the first 8 bytes.
    if let Some(bytes) = data.first_chunk::<8>() {
        let ms = i64::from_le_bytes(*bytes);
        match validate::positive_duration("lease", Some(ms)) {
            Ok(Some(d)) => assert!(ms > 0 && d.as_millis() == u128::from(ms.unsigned_abs())),
            Ok(None) => panic!("Some duration became None"),
            Err(_) => assert!(ms <= 0),
        }
        match validate::non_negative_duration("wait", Some(ms)) {
            Ok(Some(d)) => assert!(ms >= 0 && d.as_millis() == u128::from(ms.unsigned_abs())),
            Ok(None) => panic!("Some duration became None"),
            Err(_) => assert!(ms < 0),
        }
    }

    // Lines as (tenant, endpoint, key): whatever validation lets through must
    // survive the embedded store's key encodings unchanged.
    let parts = lines(data);
    if let [tenant, endpoint, key, ..] = parts.as_slice() {
        let valid = validate::tenant("tenant", tenant).is_ok()
            && validate::endpoint(endpoint).is_ok()
            && validate::key(key).is_ok();
        if valid {
            let id = RecordKey {
                tenant: tenant.clone(),
                endpoint: endpoint.clone(),
                key: key.clone(),
            };
            assert_eq!(
                codec::decode_record_key(&codec::record_key(&id)),
                Ok(id.clone())
            );
            assert_eq!(
                codec::decode_expiry_key(&codec::expiry_key(-7, &id)),
                Ok((-7, id.clone()))
            );
            let position = codec::pending_position(42, &id);
            assert_eq!(
                codec::decode_pending_position(tenant, &position),
                Ok((42, id.clone()))
            );
            assert!(codec::pending_key(42, &id).starts_with(&codec::pending_tenant_prefix(tenant)));
        }
    }

    // JSON Pointers: each line alone, then the whole list.
    for line in &parts {
        if let Ok(tokens) = canonical_json::parse_pointer(line) {
            // Escaping the tokens again gives back the pointer exactly.
            let rebuilt: String = tokens
                .iter()
                .map(|t| format!("/{}", escape_token(t)))
                .collect();
            assert_eq!(&rebuilt, line, "pointer does not round-trip");
        } else {
            assert!(
                line.is_empty() || !line.starts_with('/') || line.contains('~'),
                "pointer {line:?} refused without a reason"
            );
        }
    }
    let list: Vec<&str> = parts.iter().map(String::as_str).collect();
    match fingerprint::parse_ignore_fields(&list) {
        Ok(parsed) => {
            assert_eq!(parsed.len(), list.len());
            assert!(list.len() <= fingerprint::MAX_IGNORE_FIELDS);
            assert!(
                list.iter()
                    .all(|p| p.len() <= fingerprint::MAX_POINTER_BYTES)
            );
        }
        Err(_) => assert!(
            list.len() > fingerprint::MAX_IGNORE_FIELDS
                || list.iter().any(|p| p.len() > fingerprint::MAX_POINTER_BYTES
                    || canonical_json::parse_pointer(p).is_err())
        ),
    }
});
