//! One index entry: where it lives (its shard, its bucket, which table),
//! what it says about its record, and the ListPending page token built
//! from it. Pure functions: what the index stores and how a reader judges
//! it, apart from the statements that move it.

use scylla::value::CqlValue;

use super::super::session::rows::NamedRow;
use crate::store::{Record, RecordState, StoreError, StoreResult};

/// Width of one bucket of due instants. With [`SHARDS`] it sets the rows a
/// partition receives: `claims/s × 20 s / 8` (2.5 rows per claim/s; 25,000
/// at the default claim-rate ceiling of 10,000/s, an eighth of ScyllaDB's
/// 200,000-row write guardrail and a quarter of Cassandra's tombstone
/// failure threshold even if one read walked a whole partition, which none
/// does). Never change it on a live keyspace: bucket numbers are stored.
pub const BUCKET_MS: i64 = 20_000;

/// Partitions per bucket (and overdue partitions per tenant). Spreads one
/// tenant's index writes over 8 partitions, so on ScyllaDB over up to 8
/// shards per replica; a read fans out to 8 partitions per bucket. Stored:
/// never change it on a live keyspace.
pub const SHARDS: i32 = 8;

/// One index entry: `(due_at, endpoint, key)`, in the index's order.
pub(in crate::store::cql) type Entry = (i64, String, String);

/// How long an index entry may disagree with its record before it counts as
/// stale: longer than any statement can stay in flight (driver timeouts are
/// seconds), so an entry written just before a conditional write that has
/// not landed yet is never deleted under it.
pub(super) const INDEX_GRACE_MS: i64 = 60_000;

/// The stable shard of a key: FNV-1a over `endpoint \0 key`. Stored in the
/// partition key, so it must never change.
pub(super) fn shard_of(endpoint: &str, key: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in endpoint.bytes().chain([0]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i32::try_from(hash % SHARDS.unsigned_abs() as u64).unwrap_or(0)
}

/// The bucket holding due instant `due`.
pub(super) fn bucket_of(due: i64) -> i64 {
    due.div_euclid(BUCKET_MS)
}

/// Where one index entry is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::cql) enum Slot {
    /// `pending_buckets`, in this bucket.
    Bucket(i64),
    /// `pending_overdue`.
    Overdue,
}

/// Where a new entry goes: FAILED/UNKNOWN entries (due at once) to the
/// overdue partition; IN_PROGRESS ones to their bucket, unless their due
/// instant is within a step of the last watermark seen (a writer whose clock
/// lags the sealer's), where the bucket may be sealed before they land.
pub(super) fn slot_for_put(state: RecordState, due: i64, watermark: i64, step_ms: i64) -> Slot {
    if state != RecordState::InProgress || due < watermark.saturating_add(step_ms) {
        Slot::Overdue
    } else {
        Slot::Bucket(bucket_of(due))
    }
}

/// What an index entry says about its record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EntryVerdict {
    /// The record is due and this is its entry.
    Pending,
    /// The entry no longer describes the record: delete it.
    Stale,
    /// Not due, but a write may be in flight: leave it.
    Keep,
}

/// The verdict on the entry due at `due` given its record as read now.
pub(super) fn classify_entry(due: i64, record: Option<&Record>, now_ms: i64) -> EntryVerdict {
    let old_enough = due < now_ms - INDEX_GRACE_MS;
    match record {
        Some(record) if record.state == RecordState::Completed => EntryVerdict::Stale,
        Some(record) => match record.pending_since_ms() {
            Some(since) if since == due && record.needs_decision(now_ms) => EntryVerdict::Pending,
            // The record moved past this entry (a later due instant, written
            // before the write that set it).
            Some(since) if since > due => EntryVerdict::Stale,
            _ if old_enough => EntryVerdict::Stale,
            _ => EntryVerdict::Keep,
        },
        // Absent: released, expired, or a claim still in flight.
        None if old_enough => EntryVerdict::Stale,
        None => EntryVerdict::Keep,
    }
}

/// The entry a scan row carries.
pub(super) fn index_entry(row: &NamedRow) -> StoreResult<Entry> {
    let bad = || StoreError::Corrupt("malformed pending index entry".to_string());
    let due = match row.get("due_at") {
        Some(Some(CqlValue::BigInt(due))) => *due,
        _ => return Err(bad()),
    };
    let text = |name: &str| match row.get(name) {
        Some(Some(CqlValue::Text(value))) => Ok(value.clone()),
        _ => Err(bad()),
    };
    Ok((due, text("endpoint")?, text("key")?))
}

/// A ListPending page token of this backend: `day (i32) | due_at (i64,
/// sign bit flipped) | endpoint | key`, big-endian, strings as a u16 length
/// and their bytes. Opaque to callers and owned here: no other backend
/// reads it. (Byte-identical to the tokens of 0.1.0, which borrowed the
/// embedded store's pending-key encoding, so pages in flight across an
/// upgrade keep working.)
pub(super) fn encode_token(day: i32, cursor: &Entry) -> Vec<u8> {
    let (due, endpoint, key) = cursor;
    let mut out = Vec::with_capacity(16 + endpoint.len() + key.len());
    out.extend_from_slice(&day.to_be_bytes());
    out.extend_from_slice(&((*due as u64) ^ (1 << 63)).to_be_bytes());
    for part in [endpoint, key] {
        // Endpoints and keys are validated far below 64 KiB.
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&part.as_bytes()[..usize::from(len)]);
    }
    out
}

/// Inverse of [`encode_token`]; `None` for anything it did not make.
pub(super) fn decode_token(token: &[u8]) -> Option<(i32, Entry)> {
    fn take_text(input: &mut &[u8]) -> Option<String> {
        let (len, rest) = input.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        if rest.len() < len {
            return None;
        }
        let (text, rest) = rest.split_at(len);
        *input = rest;
        String::from_utf8(text.to_vec()).ok()
    }
    let (day, rest) = token.split_first_chunk::<4>()?;
    let (due, mut rest) = rest.split_first_chunk::<8>()?;
    let due = (u64::from_be_bytes(*due) ^ (1 << 63)) as i64;
    let endpoint = take_text(&mut rest)?;
    let key = take_text(&mut rest)?;
    rest.is_empty()
        .then(|| (i32::from_be_bytes(*day), (due, endpoint, key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordKey;

    fn record(state: RecordState, lease: i64, updated: i64) -> Record {
        Record {
            id: RecordKey {
                tenant: "t".into(),
                endpoint: "e".into(),
                key: "k".into(),
            },
            state,
            fingerprint: vec![],
            attempt: 1,
            lease_token: "tok".into(),
            attempt_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: updated,
            lease_expires_at_ms: lease,
            completed_at_ms: None,
            expires_at_ms: i64::MAX,
            response: None,
            reason: String::new(),
        }
    }

    #[test]
    fn index_entries_are_verified_against_records() {
        let now = 1_000_000;
        let expired_lease = record(RecordState::InProgress, 900_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&expired_lease), now),
            EntryVerdict::Pending
        );
        // An older lease entry after ExtendLease moved it.
        let extended = record(RecordState::InProgress, 990_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&extended), now),
            EntryVerdict::Stale
        );
        // An entry written for an extension whose write has not landed yet.
        let not_yet = record(RecordState::InProgress, 800_000, 0);
        assert_eq!(
            classify_entry(999_000, Some(&not_yet), now),
            EntryVerdict::Keep
        );
        assert_eq!(
            classify_entry(999_000 - INDEX_GRACE_MS - 1, Some(&not_yet), now + 200_000),
            EntryVerdict::Stale
        );
        let done = record(RecordState::Completed, 900_000, 950_000);
        assert_eq!(
            classify_entry(900_000, Some(&done), now),
            EntryVerdict::Stale
        );
        let unknown = record(RecordState::Unknown, 900_000, 950_000);
        assert_eq!(
            classify_entry(950_000, Some(&unknown), now),
            EntryVerdict::Pending
        );
        assert_eq!(
            classify_entry(900_000, Some(&unknown), now),
            EntryVerdict::Stale
        );
        // Absent record: a claim may be in flight, unless the entry is old.
        assert_eq!(classify_entry(999_000, None, now), EntryVerdict::Keep);
        assert_eq!(
            classify_entry(now - INDEX_GRACE_MS - 1, None, now),
            EntryVerdict::Stale
        );
    }

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let cursor = (123_456, "POST /x".to_string(), "k-1".to_string());
        assert_eq!(
            decode_token(&encode_token(20_000, &cursor)),
            Some((20_000, cursor))
        );
        assert_eq!(decode_token(&[1, 2]), None);
        assert_eq!(decode_token(&[0, 0, 0, 1, 9]), None);
        // A token as 0.1.0 wrote it still decodes: day 1, due 2, "e", "k".
        let v010 = [
            0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 1, b'e', 0, 1, b'k',
        ];
        assert_eq!(
            decode_token(&v010),
            Some((1, (2, "e".to_string(), "k".to_string())))
        );
        assert_eq!(encode_token(1, &(2, "e".into(), "k".into())), v010);
        let mut trailing = v010.to_vec();
        trailing.push(0);
        assert_eq!(decode_token(&trailing), None);
    }
}
