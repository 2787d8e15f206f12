//! The stored response as bytes: one encoding and one sealing for every
//! backend.
//!
//! # Why it lives here
//!
//! Both backends persist a record's response as one opaque value (a field
//! of the embedded store's record value, the `response` blob of the CQL
//! `records` table), and both must read what the other's code wrote when
//! data moves between them or a backend is rewritten. The format therefore
//! belongs to neither: changing a backend cannot change what the other
//! writes, and [`crate::crypto`] stays a bytes-in, bytes-out keyring.
//!
//! # Format (versioned by its first byte)
//!
//! * Plaintext, format 1: the protobuf message `ResponseValue { 1: status
//!   (uint32), 2: headers (repeated { 1: name, 2: value }), 3: body
//!   (bytes), 4: body_ref (string) }`. It is empty or starts with the tag
//!   of field 1 to 4 (`0x08`, `0x12`, `0x1a`, `0x22`), and fields can be
//!   added without a migration. Pinned byte for byte by
//!   `tests::format_1_is_stable`.
//! * Sealed: [`crate::crypto::ENVELOPE_V1`] (`0xE1`) then the envelope
//!   around a format-1 encoding, with [`response_aad`] as associated data.
//!
//! A future format must start with a byte that is neither of these, so a
//! reader always knows what it holds; values written before encryption
//! was turned on stay readable after it is.

use crate::crypto::{self, CryptoError, Keyring};
use crate::store::error::StoreError;
use crate::store::record::{RecordKey, StoredResponse};

/// Domain separation of the associated data: a sealed response cannot be
/// mistaken for any other kind of sealed value added later.
const RESPONSE_CONTEXT: &[u8] = b"idemd/stored-response/v1";

/// Why stored response bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(String);

#[derive(Clone, PartialEq, prost::Message)]
struct ResponseValue {
    #[prost(uint32, tag = "1")]
    status: u32,
    #[prost(message, repeated, tag = "2")]
    headers: Vec<HeaderValue>,
    #[prost(bytes = "vec", tag = "3")]
    body: Vec<u8>,
    #[prost(string, tag = "4")]
    body_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HeaderValue {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// Encodes a response in clear (format 1).
pub fn encode(response: &StoredResponse) -> Vec<u8> {
    use prost::Message as _;
    ResponseValue {
        status: response.status,
        headers: response
            .headers
            .iter()
            .map(|(name, value)| HeaderValue {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        body: response.body.clone(),
        body_ref: response.body_ref.clone(),
    }
    .encode_to_vec()
}

/// Inverse of [`encode`]; never panics on bad bytes.
pub fn decode(bytes: &[u8]) -> Result<StoredResponse, DecodeError> {
    use prost::Message as _;
    let value = ResponseValue::decode(bytes).map_err(|e| DecodeError(e.to_string()))?;
    Ok(StoredResponse {
        status: value.status,
        headers: value
            .headers
            .into_iter()
            .map(|header| (header.name, header.value))
            .collect(),
        body: value.body,
        body_ref: value.body_ref,
    })
}

fn push_frame(out: &mut Vec<u8>, part: &[u8]) {
    // u32 lengths: unambiguous for any field size.
    out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(part);
}

/// Associated data of a record's response: binds it to (tenant, endpoint,
/// key), length-prefixed so that distinct triples never encode alike.
pub fn response_aad(id: &RecordKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        RESPONSE_CONTEXT.len() + 12 + id.tenant.len() + id.endpoint.len() + id.key.len(),
    );
    out.extend_from_slice(RESPONSE_CONTEXT);
    push_frame(&mut out, id.tenant.as_bytes());
    push_frame(&mut out, id.endpoint.as_bytes());
    push_frame(&mut out, id.key.as_bytes());
    out
}

/// The bytes a backend stores for `response` of record `id`: sealed with
/// the keyring when there is one, the plain encoding otherwise.
pub fn seal(
    keyring: Option<&Keyring>,
    id: &RecordKey,
    response: &StoredResponse,
) -> Result<Vec<u8>, CryptoError> {
    let encoded = encode(response);
    match keyring {
        Some(keyring) => keyring.seal(&response_aad(id), &encoded),
        None => Ok(encoded),
    }
}

/// Inverse of [`seal`]: accepts sealed and plaintext values (those written
/// before encryption was turned on). A sealed value without a keyring, or
/// one the keyring cannot open, is [`StoreError::Undecryptable`] naming its
/// key id, never garbage.
pub fn open(
    keyring: Option<&Keyring>,
    id: &RecordKey,
    bytes: &[u8],
) -> Result<StoredResponse, StoreError> {
    let decoded = if crypto::is_sealed(bytes) {
        let plaintext = match keyring {
            Some(keyring) => keyring.open(&response_aad(id), bytes)?,
            None => {
                return Err(CryptoError::NoKeyring {
                    key_id: crypto::sealed_key_id(bytes)?.to_string(),
                }
                .into());
            }
        };
        decode(&plaintext)
    } else {
        decode(bytes)
    };
    decoded.map_err(|e| StoreError::Corrupt(format!("stored response: {e}")))
}

impl From<CryptoError> for StoreError {
    fn from(error: CryptoError) -> Self {
        StoreError::Undecryptable(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const K1: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="; // 32 x 0x01
    const K2: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="; // 32 x 0x02

    fn ring(text: &str) -> Keyring {
        Keyring::parse(Path::new("keys.txt"), text).expect("valid keyring")
    }

    fn id(key: &str) -> RecordKey {
        RecordKey {
            tenant: "t".into(),
            endpoint: "POST /v1/payments".into(),
            key: key.into(),
        }
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{\"secret\":\"card-4242\"}".to_vec(),
            body_ref: "s3://bucket/obj".into(),
        }
    }

    /// Both stores hold values in this encoding: a change here is a format
    /// change and must come with a new first byte and a reader for the old.
    #[test]
    fn format_1_is_stable() {
        let response = StoredResponse {
            status: 201,
            headers: vec![("a".into(), "b".into())],
            body: vec![0, 255],
            body_ref: "r".into(),
        };
        let expected: &[u8] = &[
            0x08, 0xc9, 0x01, // 1: status 201
            0x12, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b', // 2: header a=b
            0x1a, 0x02, 0x00, 0xff, // 3: body
            0x22, 0x01, b'r', // 4: body_ref
        ];
        assert_eq!(encode(&response), expected);
        assert_eq!(decode(expected), Ok(response));
        assert_eq!(encode(&StoredResponse::default()), b"");
    }

    #[test]
    fn wrong_associated_data_fails() {
        let keys = ring(&format!("k1 {K1}"));
        let sealed = seal(Some(&keys), &id("a"), &response()).expect("seal");
        assert_eq!(open(Some(&keys), &id("a"), &sealed), Ok(response()));
        let copied = open(Some(&keys), &id("b"), &sealed).expect_err("copied row");
        assert!(matches!(&copied, StoreError::Undecryptable(m) if m.contains("\"k1\"")));
        // Length prefixes: moving bytes between fields changes the AAD.
        let a = RecordKey {
            tenant: "ab".into(),
            endpoint: "c".into(),
            key: "d".into(),
        };
        let b = RecordKey {
            tenant: "a".into(),
            endpoint: "bc".into(),
            key: "d".into(),
        };
        assert_ne!(response_aad(&a), response_aad(&b));
    }

    #[test]
    fn unknown_key_and_missing_keyring_name_the_key_id() {
        let old = ring(&format!("old-1 {K1}"));
        let sealed = seal(Some(&old), &id("a"), &response()).expect("seal");
        let other = ring(&format!("new-2 {K2}"));
        let error = open(Some(&other), &id("a"), &sealed).expect_err("unknown key");
        assert!(error.to_string().contains("\"old-1\""), "{error}");
        assert!(error.to_string().contains("not in the encryption keyring"));
        let error = open(None, &id("a"), &sealed).expect_err("no keyring");
        assert!(error.to_string().contains("\"old-1\""), "{error}");
        // Same id, different material: authentication failure, not garbage.
        let impostor = ring(&format!("old-1 {K2}"));
        let error = open(Some(&impostor), &id("a"), &sealed).expect_err("wrong key");
        assert!(
            error.to_string().contains("failed authentication"),
            "{error}"
        );
    }

    #[test]
    fn plaintext_values_stay_readable() {
        let keys = ring(&format!("k1 {K1}"));
        let plain = seal(None, &id("a"), &response()).expect("encode");
        assert!(!crypto::is_sealed(&plain));
        assert_eq!(open(Some(&keys), &id("a"), &plain), Ok(response()));
        assert_eq!(open(None, &id("a"), &plain), Ok(response()));
        // Every plaintext encoding starts with a protobuf tag, never 0xE1.
        assert!(!crypto::is_sealed(&encode(&StoredResponse::default())));
        assert!(matches!(
            open(None, &id("a"), &[0x12, 0x09]),
            Err(StoreError::Corrupt(_))
        ));
    }
}
