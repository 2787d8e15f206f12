//! Migration 1's `pending_index` ((tenant, day) partitions), which releases
//! before migration 3 still write while a rollout replaces them. Nothing
//! reads it to answer a call; [`LegacyIndex`] copies what it holds into
//! `pending_overdue` (where readers find it whatever its due instant, and
//! drop it once its record is decided), in two places:
//!
//! * `idemd migrate` copies every entry whose record still exists and
//!   creates each tenant's cursor ([`LegacyIndex::copy_all`]);
//! * every replica's sealer, in each advance of a tenant's watermark, copies
//!   the entries due in the range it seals, before it advances
//!   ([`LegacyIndex::follow`]), and adopts the tenants that only old
//!   replicas have served (no cursor yet): it copies their recent entries
//!   due before `now - grace` and then creates their cursor there, as
//!   `idemd migrate` does ([`LegacyIndex::adopt_tenants`]).
//!
//! The second is why a rolling upgrade needs no second `idemd migrate`: an
//! old replica writes an entry at `t` due at `t + lease`, the sealer seals
//! that instant only `grace` after it, and reads the range before it
//! advances past it; so a claim an old replica left stale is listed at most
//! `grace + step` after it became due, whenever it was written. For a
//! tenant only old replicas serve, add the time until a replica adopts it:
//! at most [`ADOPT_EVERY_MS`] after the old replicas wrote its first entry.
//!
//! Why adoption copies instead of placing the cursor at the start of the
//! tenant's oldest recent day (what it did before): the sealer advances a
//! watermark by at most 30 minutes a pass, so a cursor placed at midnight
//! took one pass per half hour of the day to reach the stale claim, 36
//! passes at 18:00 (issue 49); late in the day a tenant stayed unlisted for
//! minutes, and every ListPending meanwhile walked the whole day's buckets. Copies are
//! idempotent (same primary key). The follow costs one slice read per
//! tenant per advance (one advance per 5 s for a busy tenant, per minute for
//! an idle one, cluster-wide), of an empty partition once no old replica
//! writes; it ends when a later migration drops the table (a replica finds
//! nothing to prepare then). Entries in the old table expire with their TTL.
//!
//! A busy tenant's old partitions hold up to a day of tombstones, more than
//! Cassandra lets one read walk (100,000), so a partition is read in slices
//! of at most one minute of its clustering range, and a slice that still
//! fails is split into one-second slices.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::StreamExt;
use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;
use std::ops::ControlFlow;

use super::super::session::{DAY_MS, day_of, rows, ttl_seconds, unavailable};
use super::super::statements::INDEX_PAGE_ROWS;
use super::entry::shard_of;
use crate::store::{StoreError, StoreResult};

/// Concurrent slice reads while copying.
const CONCURRENCY: usize = 16;

/// Widest slice of one partition read at once.
const SLICE_MS: i64 = 60_000;

/// How often a replica looks for tenants that only old replicas served: a
/// scan of the old table's partition keys (two or three per tenant: one a
/// day, TTL'd), cheap but not per step; the idle step's pace, so a tenant
/// only old replicas serve waits at most a minute more than one a new
/// replica serves (it was 10 minutes, which the docs did not say).
const ADOPT_EVERY_MS: i64 = 60_000;

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LegacyReport {
    /// (tenant, day) partitions of `pending_index` read.
    pub partitions: usize,
    /// Live entries found there.
    pub entries: usize,
    /// Entries whose record exists, copied to `pending_overdue`.
    pub copied: usize,
}

impl std::ops::AddAssign for LegacyReport {
    fn add_assign(&mut self, other: Self) {
        self.partitions += other.partitions;
        self.entries += other.entries;
        self.copied += other.copied;
    }
}

/// The old index's statements, prepared once per process (see the module
/// docs).
pub(in crate::store::cql) struct LegacyIndex {
    /// Entries of one partition due in a range.
    slice: PreparedStatement,
    /// The record an entry names (its expiry: no record, nothing to copy).
    record: PreparedStatement,
    /// The copy into `pending_overdue`.
    put: PreparedStatement,
    /// A tenant's cursor, created if missing (LWT, as every cursor write).
    cursor: PreparedStatement,
    /// Every (tenant, day) partition key of the old table.
    partitions: PreparedStatement,
    /// When this replica last adopted tenants (`i64::MIN`: never).
    adopted_at_ms: AtomicI64,
}

async fn prepare(session: &Session, cql: String) -> StoreResult<PreparedStatement> {
    let mut statement = session
        .prepare(cql)
        .await
        .map_err(|e| unavailable("prepare (pending_index of migration 1)", e))?;
    statement.set_page_size(INDEX_PAGE_ROWS);
    Ok(statement)
}

async fn all_pages(
    session: &Session,
    statement: &PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow,
) -> Result<Vec<rows::NamedRow>, String> {
    let mut out = Vec::new();
    let mut paging = PagingState::start();
    loop {
        let (result, next) = session
            .execute_single_page(statement, &values, paging)
            .await
            .map_err(|e| e.to_string())?;
        out.extend(rows::named_rows(result).map_err(|e| e.to_string())?);
        match next.into_paging_control_flow() {
            ControlFlow::Break(()) => return Ok(out),
            ControlFlow::Continue(state) => paging = state,
        }
    }
}

/// The slices `[from, to)` is read in: within one day partition each, at
/// most [`SLICE_MS`] wide, aligned to whole minutes.
fn slices(from: i64, to: i64) -> Vec<(i32, i64, i64)> {
    let mut out = Vec::new();
    let mut start = from;
    while start < to {
        let minute_end = (start.div_euclid(SLICE_MS) + 1) * SLICE_MS;
        let end = minute_end.min(to);
        out.push((day_of(start), start, end));
        start = end;
    }
    out
}

impl LegacyIndex {
    /// Prepares the statements; fails when the keyspace has no
    /// `pending_index` (a later migration dropped it).
    pub(in crate::store::cql) async fn prepare(
        session: &Session,
        keyspace: &str,
    ) -> StoreResult<Self> {
        Ok(Self {
            slice: prepare(
                session,
                format!(
                    "SELECT due_at, endpoint, key FROM {keyspace}.pending_index \
                     WHERE tenant = ? AND day = ? AND due_at >= ? AND due_at < ?"
                ),
            )
            .await?,
            record: prepare(
                session,
                format!(
                    "SELECT expires_at FROM {keyspace}.records \
                     WHERE tenant = ? AND endpoint = ? AND key = ?"
                ),
            )
            .await?,
            put: prepare(
                session,
                format!(
                    "INSERT INTO {keyspace}.pending_overdue (tenant, shard, due_at, endpoint, key) \
                     VALUES (?, ?, ?, ?, ?) USING TTL ?"
                ),
            )
            .await?,
            cursor: prepare(
                session,
                format!(
                    "INSERT INTO {keyspace}.pending_cursor (tenant, watermark, sealed_at) \
                     VALUES (?, ?, ?) IF NOT EXISTS"
                ),
            )
            .await?,
            partitions: prepare(
                session,
                format!("SELECT DISTINCT tenant, day FROM {keyspace}.pending_index"),
            )
            .await?,
            adopted_at_ms: AtomicI64::new(i64::MIN),
        })
    }

    /// Every (tenant, day) partition of the old table.
    async fn partitions(&self, session: &Session) -> StoreResult<Vec<(String, i32)>> {
        let rows = all_pages(session, &self.partitions, ())
            .await
            .map_err(|e| unavailable("pending_index: list partitions", e))?;
        rows.iter()
            .map(
                |row| match (rows::text_or_none(row, "tenant"), row.get("day")) {
                    (Some(tenant), Some(Some(CqlValue::Int(day)))) => Ok((tenant, *day)),
                    _ => Err(StoreError::Corrupt(
                        "pending_index partition without tenant or day".into(),
                    )),
                },
            )
            .collect()
    }

    /// Creates `tenant`'s cursor at `watermark` unless it has one.
    async fn ensure_cursor(
        &self,
        session: &Session,
        tenant: &str,
        watermark: i64,
        now_ms: i64,
    ) -> StoreResult<()> {
        session
            .execute_unpaged(&self.cursor, (tenant, watermark, now_ms))
            .await
            .map_err(|e| unavailable("pending_index: tenant cursor", e))?;
        Ok(())
    }

    /// `idemd migrate`'s copy: every entry of every partition, and a cursor
    /// (watermark `now - grace`) for every tenant found.
    pub(in crate::store::cql) async fn copy_all(
        &self,
        session: &Session,
        grace_ms: i64,
        now_ms: i64,
    ) -> StoreResult<LegacyReport> {
        let mut report = LegacyReport::default();
        for (tenant, day) in self.partitions(session).await? {
            report.partitions += 1;
            self.ensure_cursor(session, &tenant, now_ms - grace_ms, now_ms)
                .await?;
            let start = i64::from(day) * DAY_MS;
            report += self
                .copy_range(session, &tenant, start, start + DAY_MS, now_ms)
                .await?;
        }
        Ok(report)
    }

    /// The sealer's share: copies `tenant`'s entries due in `[from, to)`
    /// (the range it is about to seal); returns how many.
    pub(in crate::store::cql) async fn follow(
        &self,
        session: &Session,
        tenant: &str,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> StoreResult<usize> {
        Ok(self
            .copy_range(session, tenant, from, to, now_ms)
            .await?
            .copied)
    }

    /// Every [`ADOPT_EVERY_MS`] (and on a replica's first pass): for each
    /// tenant with a partition of the old table from yesterday on and no
    /// cursor among `known`, copies its entries due from the start of the
    /// oldest such day up to `now - grace`, then creates its cursor at
    /// `now - grace` (the sealer's follow copies what is due from there
    /// on). Returns the tenants adopted.
    ///
    /// Copy first, cursor second: a copy that fails leaves the tenant
    /// without a cursor, so the next pass adopts it again (copies are
    /// idempotent); the other order would leave a cursor above entries
    /// nobody copied. Nothing due below the cursor can be written after the
    /// copy read its range: an old replica writes an entry when it claims,
    /// due a lease later, and the cursor is `grace` behind the instant the
    /// copy began.
    pub(in crate::store::cql) async fn adopt_tenants(
        &self,
        session: &Session,
        known: &HashSet<String>,
        grace_ms: i64,
        now_ms: i64,
    ) -> StoreResult<usize> {
        let last = self.adopted_at_ms.load(Ordering::Relaxed);
        if last != i64::MIN && now_ms - last < ADOPT_EVERY_MS {
            return Ok(0);
        }
        let recent = day_of(now_ms) - 1;
        let mut oldest: std::collections::HashMap<String, i32> = Default::default();
        // A failed scan is tried again on the next pass, not a minute later.
        let partitions = self.partitions(session).await?;
        for (tenant, day) in partitions {
            if day >= recent && !known.contains(&tenant) {
                let entry = oldest.entry(tenant).or_insert(day);
                *entry = (*entry).min(day);
            }
        }
        let watermark = now_ms - grace_ms;
        for (tenant, day) in &oldest {
            self.copy_range(session, tenant, i64::from(*day) * DAY_MS, watermark, now_ms)
                .await?;
            self.ensure_cursor(session, tenant, watermark, now_ms)
                .await?;
        }
        self.adopted_at_ms.store(now_ms, Ordering::Relaxed);
        Ok(oldest.len())
    }

    /// Copies the entries of `tenant` due in `[from, to)`, slice by slice.
    async fn copy_range(
        &self,
        session: &Session,
        tenant: &str,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> StoreResult<LegacyReport> {
        let reads = slices(from, to)
            .into_iter()
            .map(|(day, start, end)| async move {
                self.slice_with_retry(session, tenant, day, start, end, now_ms)
                    .await
            });
        let mut results = futures::stream::iter(reads).buffer_unordered(CONCURRENCY);
        let mut report = LegacyReport::default();
        while let Some(result) = results.next().await {
            let (entries, copied) = result?;
            report.entries += entries;
            report.copied += copied;
        }
        Ok(report)
    }

    /// One minute of one partition; split into seconds if the read fails
    /// (too many tombstones in one slice).
    async fn slice_with_retry(
        &self,
        session: &Session,
        tenant: &str,
        day: i32,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> StoreResult<(usize, usize)> {
        match self.slice(session, tenant, day, from, to, now_ms).await {
            Ok(counts) => Ok(counts),
            Err(first) => {
                tracing::debug!(error = %first, "pending_index: splitting a slice");
                let mut total = (0, 0);
                for second in (from..to).step_by(1000) {
                    let (entries, copied) = self
                        .slice(
                            session,
                            tenant,
                            day,
                            second,
                            (second + 1000).min(to),
                            now_ms,
                        )
                        .await
                        .map_err(|e| {
                            unavailable(
                                "pending_index: a one-second slice \
                                 cannot be read (too many tombstones? wait for compaction \
                                 past gc_grace and run `idemd migrate` again)",
                                e,
                            )
                        })?;
                    total.0 += entries;
                    total.1 += copied;
                }
                Ok(total)
            }
        }
    }

    async fn slice(
        &self,
        session: &Session,
        tenant: &str,
        day: i32,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> Result<(usize, usize), String> {
        let entries = all_pages(session, &self.slice, (tenant, day, from, to)).await?;
        let mut copied = 0;
        for entry in &entries {
            let (Some(due), Some(endpoint), Some(key)) = (
                rows::big_int_or_none(entry, "due_at"),
                rows::text_or_none(entry, "endpoint"),
                rows::text_or_none(entry, "key"),
            ) else {
                return Err("malformed pending_index entry".into());
            };
            let record = session
                .execute_unpaged(&self.record, (tenant, &endpoint, &key))
                .await
                .map_err(|e| e.to_string())?;
            let expires = rows::named_rows(record)
                .map_err(|e| e.to_string())?
                .first()
                .and_then(|row| rows::big_int_or_none(row, "expires_at"));
            // No record (released, expired, never written): nothing to find.
            let Some(expires) = expires.filter(|at| *at > now_ms) else {
                continue;
            };
            session
                .execute_unpaged(
                    &self.put,
                    (
                        tenant,
                        shard_of(&endpoint, &key),
                        due,
                        &endpoint,
                        &key,
                        ttl_seconds(expires, now_ms),
                    ),
                )
                .await
                .map_err(|e| e.to_string())?;
            copied += 1;
        }
        Ok((entries.len(), copied))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_within_a_minute_and_a_day() {
        assert_eq!(slices(5_000, 9_000), vec![(0, 5_000, 9_000)]);
        assert_eq!(
            slices(50_000, 130_000),
            vec![
                (0, 50_000, 60_000),
                (0, 60_000, 120_000),
                (0, 120_000, 130_000)
            ]
        );
        let midnight = DAY_MS;
        assert_eq!(
            slices(midnight - 1_000, midnight + 1_000),
            vec![
                (0, midnight - 1_000, midnight),
                (1, midnight, midnight + 1_000)
            ]
        );
        assert_eq!(slices(0, DAY_MS).len(), 1_440);
        assert!(slices(7, 7).is_empty());
    }
}
