//! Result rows read by column name: what every reader of idemd's tables
//! (the record store, its pending index, migrations, the audit log) does
//! with a statement's result.
//!
//! LWT results do not have one shape: ScyllaDB answers every conditional
//! statement with `[applied]`, the primary key and the old values of the
//! condition columns (all columns for `IF NOT EXISTS`, NULL when there was no
//! row); Cassandra answers `[applied]` alone when applied, the current values
//! of the IF columns after a failed `UPDATE … IF`, and the whole existing row
//! after a failed `INSERT … IF NOT EXISTS`. So results are read as a map from
//! column name to value, never with a fixed row shape, and a record is only
//! built when every column it needs is present.

use std::collections::HashMap;

use scylla::response::query_result::QueryResult;
use scylla::value::{CqlValue, Row};

use crate::store::StoreError;

/// One result row: column name → value (`None` for NULL).
pub type NamedRow = HashMap<String, Option<CqlValue>>;

/// The rows of a result, each as a [`NamedRow`]. A result without rows (a
/// plain write) yields an empty list.
pub fn named_rows(result: QueryResult) -> Result<Vec<NamedRow>, StoreError> {
    if !result.is_rows() {
        return Ok(Vec::new());
    }
    let rows = result
        .into_rows_result()
        .map_err(|e| StoreError::Corrupt(format!("unreadable result: {e}")))?;
    let names: Vec<String> = rows
        .column_specs()
        .iter()
        .map(|spec| spec.name().to_string())
        .collect();
    let mut out = Vec::new();
    for row in rows
        .rows::<Row>()
        .map_err(|e| StoreError::Corrupt(format!("unreadable rows: {e}")))?
    {
        let row = row.map_err(|e| StoreError::Corrupt(format!("unreadable row: {e}")))?;
        out.push(names.iter().cloned().zip(row.columns).collect());
    }
    Ok(out)
}

/// A text column, `None` when absent, NULL or of another type: for rows of
/// idemd's bookkeeping tables, where a missing value has one meaning.
pub fn text_or_none(row: &NamedRow, name: &str) -> Option<String> {
    text(row, name).ok().flatten()
}

/// A bigint column, `None` when absent, NULL or of another type (see
/// [`text_or_none`]).
pub fn big_int_or_none(row: &NamedRow, name: &str) -> Option<i64> {
    big_int(row, name).ok().flatten()
}

/// Whether a conditional statement was applied (`[applied]`).
pub fn applied(row: &NamedRow) -> Result<bool, StoreError> {
    match row.get("[applied]") {
        Some(Some(CqlValue::Boolean(applied))) => Ok(*applied),
        _ => Err(StoreError::Corrupt(
            "conditional statement result has no [applied] column".to_string(),
        )),
    }
}

/// A text column; `None` when absent or NULL, an error for another type.
pub fn text(row: &NamedRow, name: &str) -> Result<Option<String>, StoreError> {
    match row.get(name) {
        None | Some(None) => Ok(None),
        Some(Some(CqlValue::Text(value) | CqlValue::Ascii(value))) => Ok(Some(value.clone())),
        Some(Some(other)) => Err(type_error(name, other)),
    }
}

/// A bigint column (see [`text`]).
pub fn big_int(row: &NamedRow, name: &str) -> Result<Option<i64>, StoreError> {
    match row.get(name) {
        None | Some(None) => Ok(None),
        Some(Some(CqlValue::BigInt(value))) => Ok(Some(*value)),
        Some(Some(other)) => Err(type_error(name, other)),
    }
}

/// An int column (see [`text`]).
pub fn int(row: &NamedRow, name: &str) -> Result<Option<i32>, StoreError> {
    match row.get(name) {
        None | Some(None) => Ok(None),
        Some(Some(CqlValue::Int(value))) => Ok(Some(*value)),
        Some(Some(other)) => Err(type_error(name, other)),
    }
}

/// A blob column (see [`text`]).
pub fn blob(row: &NamedRow, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
    match row.get(name) {
        None | Some(None) => Ok(None),
        Some(Some(CqlValue::Blob(value))) => Ok(Some(value.clone())),
        Some(Some(other)) => Err(type_error(name, other)),
    }
}

fn type_error(name: &str, value: &CqlValue) -> StoreError {
    StoreError::Corrupt(format!("column {name} has unexpected type: {value:?}"))
}
