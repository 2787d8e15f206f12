//! Records to and from CQL values: the values the record statements bind,
//! in [`RECORD_COLUMNS`] order, and the record a result row carries, its
//! `response` sealed and opened with the keyring.

use scylla::value::CqlValue;

use super::super::session::rows::{NamedRow, big_int, blob, int, text};
use crate::crypto::Keyring;
use crate::store::{Record, RecordKey, RecordState, StoreError, StoreResult, response};

/// The record columns every record statement reads and writes, in this
/// order ([`record_values`] binds them in the same order).
pub(super) const RECORD_COLUMNS: &str = "state, fingerprint, attempt, lease_token, attempt_id, created_at, \
     updated_at, lease_expires_at, completed_at, expires_at, response, reason";

fn state_from_text(value: &str) -> Result<RecordState, StoreError> {
    Ok(match value {
        "in_progress" => RecordState::InProgress,
        "completed" => RecordState::Completed,
        "failed" => RecordState::Failed,
        "unknown" => RecordState::Unknown,
        other => return Err(StoreError::Corrupt(format!("unknown state {other:?}"))),
    })
}

/// Builds the record for `id` from a row that carries every record column.
///
/// `Ok(None)` when the row has no record in it: a ScyllaDB LWT result for a
/// missing row (all values NULL), or a Cassandra result that only carries
/// `[applied]` or the condition columns. Callers that need the record then
/// read it at SERIAL.
/// A sealed `response` is opened with `keyring` (see [`response::open`]).
pub(super) fn record_from_row(
    id: &RecordKey,
    row: &NamedRow,
    keyring: Option<&Keyring>,
) -> Result<Option<Record>, StoreError> {
    let Some(state) = text(row, "state")? else {
        return Ok(None);
    };
    let required = |name: &str, value: Option<i64>| {
        value.ok_or_else(|| StoreError::Corrupt(format!("record column {name} is NULL")))
    };
    // A row with `state` but without the other columns is a partial LWT
    // result (condition columns only): not a record.
    let (Some(created_at_ms), Some(expires_at_ms)) =
        (big_int(row, "created_at")?, big_int(row, "expires_at")?)
    else {
        return Ok(None);
    };
    if !row.contains_key("fingerprint") || !row.contains_key("response") {
        return Ok(None);
    }
    let response = match blob(row, "response")? {
        Some(bytes) => Some(response::open(keyring, id, &bytes)?),
        None => None,
    };
    Ok(Some(Record {
        id: id.clone(),
        state: state_from_text(&state)?,
        fingerprint: blob(row, "fingerprint")?.unwrap_or_default(),
        attempt: u32::try_from(int(row, "attempt")?.unwrap_or(0)).unwrap_or(0),
        lease_token: text(row, "lease_token")?.unwrap_or_default(),
        attempt_id: text(row, "attempt_id")?.unwrap_or_default(),
        created_at_ms,
        updated_at_ms: required("updated_at", big_int(row, "updated_at")?)?,
        lease_expires_at_ms: big_int(row, "lease_expires_at")?.unwrap_or(0),
        completed_at_ms: big_int(row, "completed_at")?,
        expires_at_ms,
        response,
        reason: text(row, "reason")?.unwrap_or_default(),
    }))
}

fn attempt_value(record: &Record) -> i32 {
    i32::try_from(record.attempt).unwrap_or(i32::MAX)
}

/// Bound values of one statement. Plain tuples stop at 16 elements and do
/// not flatten, and a conditional update binds 19 values.
pub(super) type Values = Vec<Option<CqlValue>>;

pub(super) fn text_value(value: &str) -> Option<CqlValue> {
    Some(CqlValue::Text(value.to_string()))
}

/// The primary key columns.
pub(super) fn key_values(id: &RecordKey) -> Values {
    vec![
        text_value(&id.tenant),
        text_value(&id.endpoint),
        text_value(&id.key),
    ]
}

/// The record columns in [`RECORD_COLUMNS`] order, the response sealed when
/// there is a keyring.
pub(super) fn record_values(record: &Record, keyring: Option<&Keyring>) -> StoreResult<Values> {
    let response = match &record.response {
        Some(response) => Some(CqlValue::Blob(
            response::seal(keyring, &record.id, response)
                .map_err(|e| StoreError::Unavailable(e.to_string()))?,
        )),
        None => None,
    };
    Ok(vec![
        text_value(record.state.as_str()),
        Some(CqlValue::Blob(record.fingerprint.clone())),
        Some(CqlValue::Int(attempt_value(record))),
        text_value(&record.lease_token),
        text_value(&record.attempt_id),
        Some(CqlValue::BigInt(record.created_at_ms)),
        Some(CqlValue::BigInt(record.updated_at_ms)),
        Some(CqlValue::BigInt(record.lease_expires_at_ms)),
        record.completed_at_ms.map(CqlValue::BigInt),
        Some(CqlValue::BigInt(record.expires_at_ms)),
        response,
        text_value(&record.reason),
    ])
}

/// Concatenates groups of bound values.
pub(super) fn values(groups: impl IntoIterator<Item = Values>) -> Values {
    groups.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::super::super::session::rows::applied;
    use super::*;
    use crate::store::StoredResponse;

    fn id() -> RecordKey {
        RecordKey {
            tenant: "t".into(),
            endpoint: "POST /v1/payments".into(),
            key: "k".into(),
        }
    }

    fn record() -> Record {
        Record {
            id: id(),
            state: RecordState::Completed,
            fingerprint: vec![1; 32],
            attempt: 2,
            lease_token: "tok".into(),
            attempt_id: "a".into(),
            created_at_ms: 10,
            updated_at_ms: 20,
            lease_expires_at_ms: 30,
            completed_at_ms: Some(20),
            expires_at_ms: 40,
            response: Some(StoredResponse {
                status: 201,
                headers: vec![("a".into(), "1".into())],
                body: b"body".to_vec(),
                body_ref: String::new(),
            }),
            reason: String::new(),
        }
    }

    fn full_row(applied: bool, record: &Record) -> NamedRow {
        let mut row = NamedRow::new();
        row.insert("[applied]".into(), Some(CqlValue::Boolean(applied)));
        row.insert(
            "tenant".into(),
            Some(CqlValue::Text(record.id.tenant.clone())),
        );
        row.insert(
            "endpoint".into(),
            Some(CqlValue::Text(record.id.endpoint.clone())),
        );
        row.insert("key".into(), Some(CqlValue::Text(record.id.key.clone())));
        row.insert(
            "state".into(),
            Some(CqlValue::Text(record.state.as_str().into())),
        );
        row.insert(
            "fingerprint".into(),
            Some(CqlValue::Blob(record.fingerprint.clone())),
        );
        row.insert("attempt".into(), Some(CqlValue::Int(record.attempt as i32)));
        row.insert(
            "lease_token".into(),
            Some(CqlValue::Text(record.lease_token.clone())),
        );
        row.insert(
            "attempt_id".into(),
            Some(CqlValue::Text(record.attempt_id.clone())),
        );
        row.insert(
            "created_at".into(),
            Some(CqlValue::BigInt(record.created_at_ms)),
        );
        row.insert(
            "updated_at".into(),
            Some(CqlValue::BigInt(record.updated_at_ms)),
        );
        row.insert(
            "lease_expires_at".into(),
            Some(CqlValue::BigInt(record.lease_expires_at_ms)),
        );
        row.insert(
            "completed_at".into(),
            record.completed_at_ms.map(CqlValue::BigInt),
        );
        row.insert(
            "expires_at".into(),
            Some(CqlValue::BigInt(record.expires_at_ms)),
        );
        row.insert(
            "response".into(),
            record
                .response
                .as_ref()
                .map(|r| CqlValue::Blob(response::encode(r))),
        );
        row.insert("reason".into(), Some(CqlValue::Text(record.reason.clone())));
        row
    }

    #[test]
    fn cassandra_applied_insert_is_only_the_flag() {
        let mut row = NamedRow::new();
        row.insert("[applied]".into(), Some(CqlValue::Boolean(true)));
        assert_eq!(applied(&row), Ok(true));
        assert_eq!(record_from_row(&id(), &row, None), Ok(None));
    }

    #[test]
    fn failed_insert_carries_the_existing_row_on_both_engines() {
        let existing = record();
        let row = full_row(false, &existing);
        assert_eq!(applied(&row), Ok(false));
        assert_eq!(record_from_row(&id(), &row, None), Ok(Some(existing)));
    }

    #[test]
    fn scylla_applied_insert_has_null_columns() {
        let mut row = full_row(true, &record());
        for value in row
            .values_mut()
            .filter(|v| !matches!(v, Some(CqlValue::Boolean(_))))
        {
            *value = None;
        }
        assert_eq!(applied(&row), Ok(true));
        assert_eq!(
            record_from_row(&id(), &row, None),
            Ok(None),
            "no row existed"
        );
    }

    #[test]
    fn failed_update_carries_only_condition_columns() {
        // Cassandra: [applied] + the IF columns; ScyllaDB: + the primary key.
        for with_key in [false, true] {
            let mut row = NamedRow::new();
            row.insert("[applied]".into(), Some(CqlValue::Boolean(false)));
            row.insert("state".into(), Some(CqlValue::Text("completed".into())));
            row.insert("lease_token".into(), Some(CqlValue::Text("other".into())));
            row.insert("expires_at".into(), Some(CqlValue::BigInt(40)));
            if with_key {
                row.insert("tenant".into(), Some(CqlValue::Text("t".into())));
                row.insert("endpoint".into(), Some(CqlValue::Text("e".into())));
                row.insert("key".into(), Some(CqlValue::Text("k".into())));
            }
            assert_eq!(applied(&row), Ok(false));
            assert_eq!(
                record_from_row(&id(), &row, None),
                Ok(None),
                "partial rows are not records"
            );
        }
    }

    #[test]
    fn missing_applied_column_is_an_error() {
        assert!(applied(&NamedRow::new()).is_err());
        let mut row = NamedRow::new();
        row.insert("[applied]".into(), Some(CqlValue::Int(1)));
        assert!(applied(&row).is_err());
    }

    #[test]
    fn wrong_types_are_errors_not_panics() {
        let mut row = full_row(false, &record());
        row.insert(
            "created_at".into(),
            Some(CqlValue::Text("yesterday".into())),
        );
        assert!(record_from_row(&id(), &row, None).is_err());
    }
}
