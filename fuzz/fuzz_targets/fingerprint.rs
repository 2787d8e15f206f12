//! Fingerprint v1 canonicalization: the strict JSON parser, JSON Pointer
//! removal (`ignore_fields`) and the canonical serializer.
//!
//! Input: `ignore_fields` (newline-separated) NUL body; without a NUL the
//! whole input is the body. Checks, besides "never panics":
//! * canonical output is valid JSON and a fixed point of canonicalization;
//! * the fingerprint of a body equals the fingerprint of its canonical form
//!   (with the ignored fields already removed);
//! * non-JSON content types hash the body as sent.
#![no_main]

use idemd::fingerprint::{self, RequestParts, canonical_json};
use idemd_fuzz::{lines, split_nul};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, body) = split_nul(data);
    let pointers = lines(head);
    let pointers: Vec<&str> = pointers.iter().map(String::as_str).collect();

    let json = RequestParts {
        method: "post",
        path: "/v1/payments",
        body,
        content_type: "application/json; charset=utf-8",
    };
    let canonical = fingerprint::canonical_body(&json, &pointers);
    let digest = fingerprint::fingerprint_v1(&json, &pointers);
    assert_eq!(canonical.is_ok(), digest.is_ok());

    // The parser alone, and the serializer's fixed point.
    if let Ok(value) = canonical_json::parse(body) {
        let out = canonical_json::serialize(&value);
        let again = canonical_json::parse(&out).expect("canonical output must parse");
        assert_eq!(
            canonical_json::serialize(&again),
            out,
            "canonical form is not a fixed point"
        );
    }

    if let (Ok(canonical), Ok(digest)) = (&canonical, &digest) {
        if !body.is_empty() {
            // Canonical JSON re-parses to itself with no pointers left to drop.
            let value = canonical_json::parse(canonical).expect("canonical body must parse");
            assert_eq!(&canonical_json::serialize(&value), canonical);
        }
        let of_canonical = fingerprint::fingerprint_v1(
            &RequestParts {
                method: "POST",
                body: canonical,
                ..json
            },
            &[],
        )
        .expect("canonical body must fingerprint");
        assert_eq!(
            &of_canonical, digest,
            "fingerprint differs from its canonical form's"
        );
    }

    // Not JSON: the body is hashed as sent (pointers are still validated).
    let plain = RequestParts {
        content_type: "text/plain",
        ..json
    };
    match fingerprint::canonical_body(&plain, &pointers) {
        Ok(bytes) => assert_eq!(bytes, body),
        Err(error) => assert!(
            matches!(
                error,
                fingerprint::FingerprintError::Pointer { .. }
                    | fingerprint::FingerprintError::PointerLimit(_)
                    | fingerprint::FingerprintError::BodyTooLarge { .. }
            ),
            "non-JSON body failed with a JSON error: {error:?}"
        ),
    }
    let _ = fingerprint::fingerprint_v1(&plain, &pointers);
    let _ = fingerprint::is_json_content_type(&String::from_utf8_lossy(head));
});
