//! A tenant's `pending_cursor` row: its watermark and stored summary, as
//! readers (ListPending) and the sealer read it.

use scylla::value::CqlValue;

use super::super::session::{rows, unavailable};
use super::index::Index;
use crate::store::{PendingCounts, StoreError, StoreResult};

/// A tenant's `pending_cursor` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cursor {
    /// Whose.
    pub tenant: String,
    /// Buckets below it are sealed; readers start here.
    pub watermark: i64,
    /// When the summary was last computed (`None`: never).
    pub summary_at: Option<i64>,
    /// The summary, when computed.
    pub summary: Option<PendingCounts>,
}

impl Cursor {
    /// The cursor a `pending_cursor` row holds.
    pub(super) fn from_row(row: &rows::NamedRow) -> StoreResult<Self> {
        let tenant = rows::text_or_none(row, "tenant")
            .ok_or_else(|| StoreError::Corrupt("pending cursor without tenant".into()))?;
        let watermark = rows::big_int_or_none(row, "watermark")
            .ok_or_else(|| StoreError::Corrupt("pending cursor without watermark".into()))?;
        let summary_at = rows::big_int_or_none(row, "summary_at");
        let count = |name| {
            rows::big_int_or_none(row, name)
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0)
        };
        let summary = summary_at.map(|_| PendingCounts {
            in_progress: count("summary_in_progress"),
            unknown: count("summary_unknown"),
            failed: count("summary_failed"),
            oldest_since_ms: rows::big_int_or_none(row, "summary_oldest_due"),
            truncated: matches!(
                row.get("summary_truncated"),
                Some(Some(CqlValue::Boolean(true)))
            ),
        });
        Ok(Cursor {
            tenant,
            watermark,
            summary_at,
            summary,
        })
    }

    /// The tenant's cursor row, `None` before its first index write.
    pub(super) async fn read(index: &Index, tenant: &str) -> StoreResult<Option<Self>> {
        let result = index
            .session
            .execute_unpaged(&index.statements.cursor_read, (tenant,))
            .await
            .map_err(|e| unavailable("pending cursor read", e))?;
        rows::named_rows(result)?
            .first()
            .map(Self::from_row)
            .transpose()
    }
}
