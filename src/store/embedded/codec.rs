//! On-disk encoding of the embedded store.
//!
//! Keys are built so that byte order is the order the store needs: a record
//! key is `frame(tenant) frame(endpoint) frame(key)`, an expiry entry starts
//! with the expiry instant, a pending entry with the tenant and then the
//! instant the record started to need a decision. `frame(x)` is a 2-byte
//! big-endian length and the bytes; instants are `i64` with the sign bit
//! flipped, big-endian, so that they sort numerically.
//!
//! Values are protobuf messages (prost derive): fields can be added without a
//! migration, and a decoder never panics on bad bytes. The response inside
//! a record is the backend-neutral encoding of [`crate::store::response`]
//! (field 12, wire-identical to the embedded message it was before that
//! module existed, so files written by 0.1.0 open unchanged).
//!
//! With encryption at rest on, a record's response is not field 12 but
//! field 14: the encoded response sealed by
//! [`crate::store::response::seal`]. Every other field stays in clear (the
//! store needs them for conditions, expiry and the pending index). A value
//! has at most one of the two, so values written before encryption was
//! turned on are read as they are. Sealing happens here, before the bytes
//! reach the records table or the write-ahead log, so neither ever holds a
//! plaintext response once encryption is on.

use crate::crypto::{self, CryptoError, Keyring};
use crate::store::{Record, RecordKey, RecordState, response};

/// Encoding version written into every record value.
const RECORD_FORMAT_VERSION: u32 = 1;

/// Why bytes on disk could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

#[derive(Clone, PartialEq, prost::Message)]
struct RecordValue {
    #[prost(uint32, tag = "1")]
    format_version: u32,
    #[prost(int32, tag = "2")]
    state: i32,
    #[prost(bytes = "vec", tag = "3")]
    fingerprint: Vec<u8>,
    #[prost(uint32, tag = "4")]
    attempt: u32,
    #[prost(string, tag = "5")]
    lease_token: String,
    #[prost(string, tag = "6")]
    attempt_id: String,
    #[prost(int64, tag = "7")]
    created_at_ms: i64,
    #[prost(int64, tag = "8")]
    updated_at_ms: i64,
    #[prost(int64, tag = "9")]
    lease_expires_at_ms: i64,
    #[prost(int64, optional, tag = "10")]
    completed_at_ms: Option<i64>,
    #[prost(int64, tag = "11")]
    expires_at_ms: i64,
    /// The response in clear, [`response::encode`]d.
    #[prost(bytes = "vec", optional, tag = "12")]
    response: Option<Vec<u8>>,
    #[prost(string, tag = "13")]
    reason: String,
    /// The response, [`response::seal`]ed; replaces field 12.
    #[prost(bytes = "vec", optional, tag = "14")]
    sealed_response: Option<Vec<u8>>,
}

/// The fields of a record value a merge of two exports decides on without
/// decoding the rest ([`peek_record_value`]): prost skips the others,
/// length-delimited ones by their length, without copying them.
#[derive(Clone, PartialEq, prost::Message)]
struct RecordHead {
    #[prost(int32, tag = "2")]
    state: i32,
    #[prost(int64, tag = "11")]
    expires_at_ms: i64,
}

/// What [`peek_record_value`] reads of a record value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordPeek {
    /// The record is IN_PROGRESS (its lease may need crediting).
    pub in_progress: bool,
    /// The end of its dedup window (Unix ms): live before it.
    pub expires_at_ms: i64,
}

/// The state and expiry of an encoded record value, without decoding its
/// strings, fingerprint or response: the cost of a key that two exports
/// hold with the same bytes (`export::Changes`).
pub fn peek_record_value(bytes: &[u8]) -> Result<RecordPeek, CodecError> {
    use prost::Message as _;
    let head = RecordHead::decode(bytes).map_err(|e| CodecError(e.to_string()))?;
    Ok(RecordPeek {
        in_progress: head.state == state_code(RecordState::InProgress),
        expires_at_ms: head.expires_at_ms,
    })
}

fn state_code(state: RecordState) -> i32 {
    match state {
        RecordState::InProgress => 1,
        RecordState::Completed => 2,
        RecordState::Failed => 3,
        RecordState::Unknown => 4,
    }
}

fn state_from_code(code: i32) -> Result<RecordState, CodecError> {
    Ok(match code {
        1 => RecordState::InProgress,
        2 => RecordState::Completed,
        3 => RecordState::Failed,
        4 => RecordState::Unknown,
        other => return Err(CodecError(format!("unknown state code {other}"))),
    })
}

/// Encodes a record's value (everything but its key), response in clear.
pub fn encode_record(record: &Record) -> Vec<u8> {
    use prost::Message as _;
    RecordValue {
        response: record.response.as_ref().map(response::encode),
        ..record_value(record)
    }
    .encode_to_vec()
}

/// Encodes a record's value with its response sealed by `keyring` (in
/// clear, as [`encode_record`], when there is none).
pub fn encode_record_sealed(
    record: &Record,
    keyring: Option<&Keyring>,
) -> Result<Vec<u8>, CryptoError> {
    use prost::Message as _;
    let Some(keyring) = keyring else {
        return Ok(encode_record(record));
    };
    let sealed_response = match &record.response {
        Some(stored) => Some(response::seal(Some(keyring), &record.id, stored)?),
        None => None,
    };
    Ok(RecordValue {
        sealed_response,
        ..record_value(record)
    }
    .encode_to_vec())
}

/// Every field but the response (the callers add it, clear or sealed).
fn record_value(record: &Record) -> RecordValue {
    RecordValue {
        format_version: RECORD_FORMAT_VERSION,
        state: state_code(record.state),
        fingerprint: record.fingerprint.clone(),
        attempt: record.attempt,
        lease_token: record.lease_token.clone(),
        attempt_id: record.attempt_id.clone(),
        created_at_ms: record.created_at_ms,
        updated_at_ms: record.updated_at_ms,
        lease_expires_at_ms: record.lease_expires_at_ms,
        completed_at_ms: record.completed_at_ms,
        expires_at_ms: record.expires_at_ms,
        response: None,
        reason: record.reason.clone(),
        sealed_response: None,
    }
}

/// Decodes a record value stored under `id` whose response is in clear; a
/// sealed response is an error (use [`decode_record_value`]).
pub fn decode_record(id: RecordKey, bytes: &[u8]) -> Result<Record, CodecError> {
    match decode_record_value(id, bytes)? {
        (record, None) => Ok(record),
        (_, Some(sealed)) => Err(CodecError(format!(
            "the response is encrypted (key id {:?}); reading it needs the keyring",
            crypto::sealed_key_id(&sealed).unwrap_or("?")
        ))),
    }
}

/// Decodes a record value stored under `id`, leaving a sealed response
/// sealed: the record comes back with `response: None` and the sealed bytes
/// beside it, for [`response::open`]. Lets the embedded
/// store's writer check conditions without decrypting (and without failing
/// a whole batch on a value it cannot decrypt).
pub fn decode_record_value(
    id: RecordKey,
    bytes: &[u8],
) -> Result<(Record, Option<Vec<u8>>), CodecError> {
    use prost::Message as _;
    let value = RecordValue::decode(bytes).map_err(|e| CodecError(e.to_string()))?;
    if let Some(sealed) = &value.sealed_response {
        if value.response.is_some() {
            return Err(CodecError(
                "record has both a clear and a sealed response".to_string(),
            ));
        }
        if !crypto::is_sealed(sealed) {
            return Err(CodecError(
                "sealed response field does not hold an encrypted value".to_string(),
            ));
        }
    }
    let sealed = value.sealed_response;
    let clear_response = value
        .response
        .as_deref()
        .map(response::decode)
        .transpose()
        .map_err(|e| CodecError(format!("stored response: {e}")))?;
    if value.format_version != RECORD_FORMAT_VERSION {
        return Err(CodecError(format!(
            "unsupported record format version {}",
            value.format_version
        )));
    }
    let record = Record {
        id,
        state: state_from_code(value.state)?,
        fingerprint: value.fingerprint,
        attempt: value.attempt,
        lease_token: value.lease_token,
        attempt_id: value.attempt_id,
        created_at_ms: value.created_at_ms,
        updated_at_ms: value.updated_at_ms,
        lease_expires_at_ms: value.lease_expires_at_ms,
        completed_at_ms: value.completed_at_ms,
        expires_at_ms: value.expires_at_ms,
        response: clear_response,
        reason: value.reason,
    };
    Ok((record, sealed))
}

fn push_frame(out: &mut Vec<u8>, part: &str) {
    // Tenants, endpoints and keys are validated far below 64 KiB; saturate
    // rather than wrap if that ever changes, so a bad length can only make a
    // key unreadable, never alias another.
    let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&part.as_bytes()[..usize::from(len)]);
}

fn take_frame<'a>(input: &mut &'a [u8]) -> Result<&'a str, CodecError> {
    let too_short = || CodecError("truncated key".to_string());
    let (len_bytes, rest) = input.split_first_chunk::<2>().ok_or_else(too_short)?;
    let len = usize::from(u16::from_be_bytes(*len_bytes));
    if rest.len() < len {
        return Err(too_short());
    }
    let (part, rest) = rest.split_at(len);
    *input = rest;
    std::str::from_utf8(part).map_err(|_| CodecError("key is not UTF-8".to_string()))
}

/// Sortable encoding of an instant.
pub fn encode_instant(instant_ms: i64) -> [u8; 8] {
    ((instant_ms as u64) ^ (1 << 63)).to_be_bytes()
}

fn take_instant(input: &mut &[u8]) -> Result<i64, CodecError> {
    let (bytes, rest) = input
        .split_first_chunk::<8>()
        .ok_or_else(|| CodecError("truncated instant".to_string()))?;
    *input = rest;
    Ok((u64::from_be_bytes(*bytes) ^ (1 << 63)) as i64)
}

/// Key of a record in the records table.
pub fn record_key(id: &RecordKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + id.tenant.len() + id.endpoint.len() + id.key.len());
    push_frame(&mut out, &id.tenant);
    push_frame(&mut out, &id.endpoint);
    push_frame(&mut out, &id.key);
    out
}

/// Inverse of [`record_key`].
pub fn decode_record_key(mut bytes: &[u8]) -> Result<RecordKey, CodecError> {
    let tenant = take_frame(&mut bytes)?.to_string();
    let endpoint = take_frame(&mut bytes)?.to_string();
    let key = take_frame(&mut bytes)?.to_string();
    if !bytes.is_empty() {
        return Err(CodecError("trailing bytes after record key".to_string()));
    }
    Ok(RecordKey {
        tenant,
        endpoint,
        key,
    })
}

/// Key of an expiry-index entry: sorted by expiry, then record key.
pub fn expiry_key(expires_at_ms: i64, id: &RecordKey) -> Vec<u8> {
    let mut out = encode_instant(expires_at_ms).to_vec();
    out.extend_from_slice(&record_key(id));
    out
}

/// Inverse of [`expiry_key`].
pub fn decode_expiry_key(mut bytes: &[u8]) -> Result<(i64, RecordKey), CodecError> {
    let instant = take_instant(&mut bytes)?;
    Ok((instant, decode_record_key(bytes)?))
}

/// Prefix of every pending-index entry of a tenant.
pub fn pending_tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + tenant.len());
    push_frame(&mut out, tenant);
    out
}

/// The part of a pending-index key after the tenant prefix: also the page
/// token handed to callers.
pub fn pending_position(since_ms: i64, id: &RecordKey) -> Vec<u8> {
    let mut out = encode_instant(since_ms).to_vec();
    push_frame(&mut out, &id.endpoint);
    push_frame(&mut out, &id.key);
    out
}

/// Key of a pending-index entry: tenant, then since, then endpoint and key.
pub fn pending_key(since_ms: i64, id: &RecordKey) -> Vec<u8> {
    let mut out = pending_tenant_prefix(&id.tenant);
    out.extend_from_slice(&pending_position(since_ms, id));
    out
}

/// Decodes the position part of a pending key (or a page token) for `tenant`.
pub fn decode_pending_position(
    tenant: &str,
    mut bytes: &[u8],
) -> Result<(i64, RecordKey), CodecError> {
    let since = take_instant(&mut bytes)?;
    let endpoint = take_frame(&mut bytes)?.to_string();
    let key = take_frame(&mut bytes)?.to_string();
    if !bytes.is_empty() {
        return Err(CodecError(
            "trailing bytes after pending position".to_string(),
        ));
    }
    Ok((
        since,
        RecordKey {
            tenant: tenant.to_string(),
            endpoint,
            key,
        },
    ))
}

/// Decodes a whole pending-index key: its `pending_since` and record key.
pub fn decode_pending_key(mut bytes: &[u8]) -> Result<(i64, RecordKey), CodecError> {
    let tenant = take_frame(&mut bytes)?.to_string();
    decode_pending_position(&tenant, bytes)
}

/// A record with every field set and a response with a repeated header:
/// the codec's round-trip tests and the fuzz corpus
/// (`fuzz/examples/gen_corpus.rs`) start from this one record, so the
/// corpus holds what the tests check.
#[doc(hidden)]
pub fn sample_record() -> Record {
    Record {
        id: RecordKey {
            tenant: "t".into(),
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
        },
        state: RecordState::Completed,
        fingerprint: vec![7; 32],
        attempt: 2,
        lease_token: "tok".into(),
        attempt_id: "a".into(),
        created_at_ms: -5,
        updated_at_ms: 10,
        lease_expires_at_ms: 20,
        completed_at_ms: Some(30),
        expires_at_ms: 40,
        response: Some(crate::store::StoredResponse {
            status: 201,
            headers: vec![
                ("b".into(), "1".into()),
                ("a".into(), "2".into()),
                ("b".into(), "3".into()),
            ],
            body: vec![0, 1, 255],
            body_ref: String::new(),
        }),
        reason: "why".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peek reads what a full decode reads, for every state.
    #[test]
    fn a_peek_reads_the_state_and_the_expiry_of_a_full_decode() {
        for state in [
            RecordState::InProgress,
            RecordState::Completed,
            RecordState::Failed,
            RecordState::Unknown,
        ] {
            let mut record = sample_record();
            record.state = state;
            record.expires_at_ms = 1_234_567 + state_code(state) as i64;
            let peek = peek_record_value(&encode_record(&record)).expect("peek");
            assert_eq!(
                peek,
                RecordPeek {
                    in_progress: state == RecordState::InProgress,
                    expires_at_ms: record.expires_at_ms,
                },
                "{state:?}"
            );
        }
        assert!(peek_record_value(&[0xff, 0xff, 0xff]).is_err(), "bad bytes");
    }

    #[test]
    fn records_round_trip() {
        let record = sample_record();
        let bytes = encode_record(&record);
        assert_eq!(decode_record(record.id.clone(), &bytes), Ok(record.clone()));
        assert_eq!(
            decode_record_key(&record_key(&record.id)),
            Ok(record.id.clone())
        );
        assert_eq!(
            decode_expiry_key(&expiry_key(40, &record.id)),
            Ok((40, record.id))
        );
    }

    #[test]
    fn sealed_records_hide_the_response_and_round_trip() {
        let keyring = Keyring::parse(
            std::path::Path::new("test"),
            "k1 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
        )
        .expect("keyring");
        let mut record = sample_record();
        if let Some(response) = &mut record.response {
            response.body = b"marker-0123456789".to_vec();
        }
        let bytes = encode_record_sealed(&record, Some(&keyring)).expect("seal");
        assert!(!bytes.windows(17).any(|w| w == b"marker-0123456789"));
        let (mut decoded, sealed) = decode_record_value(record.id.clone(), &bytes).expect("decode");
        let sealed = sealed.expect("sealed response");
        assert_eq!(crypto::sealed_key_id(&sealed), Ok("k1"));
        decoded.response = Some(response::open(Some(&keyring), &record.id, &sealed).expect("open"));
        assert_eq!(decoded, record);
        // Without the keyring: an error naming the key id.
        let error = decode_record(record.id.clone(), &bytes).expect_err("sealed");
        assert!(error.0.contains("\"k1\""), "{error}");
        // Records without a response and keyring-less encoding are as before.
        assert_eq!(
            encode_record_sealed(&record, None).expect("plain"),
            encode_record(&record)
        );
        let mut pending = record.clone();
        pending.response = None;
        assert_eq!(
            decode_record(
                pending.id.clone(),
                &encode_record_sealed(&pending, Some(&keyring)).expect("seal")
            ),
            Ok(pending)
        );
    }

    #[test]
    fn instants_sort_numerically() {
        let mut values = [5i64, -3, 0, i64::MIN, i64::MAX, 1_700_000_000_000];
        let mut encoded: Vec<[u8; 8]> = values.iter().map(|v| encode_instant(*v)).collect();
        values.sort();
        encoded.sort();
        let decoded: Vec<i64> = encoded
            .iter()
            .map(|bytes| take_instant(&mut &bytes[..]).expect("8 bytes"))
            .collect();
        assert_eq!(decoded, values);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_record(sample_record().id, &[0xff, 0xff, 0xff]).is_err());
        assert!(decode_record_key(&[0, 9, b'a']).is_err());
        assert!(decode_pending_position("t", &[1, 2, 3]).is_err());
    }
}
