//! The sealer: keeps each tenant's watermark `grace` behind the clock, so
//! that readers never walk the tombstones of claims completed before it;
//! and the pending summary the gauges read.
//!
//! Every replica runs it (`Store::maintain`, every step) for every tenant
//! with a cursor row; they race on the cursor with an LWT
//! (`IF watermark = old`), so each advance happens once, and a replica that
//! loses simply finds the watermark moved on its next pass. One advance:
//!
//! 1. read the slice `[watermark, now - grace)` of every bucket partition it
//!    covers (paged; it walks the tombstones of that slice once, on one
//!    replica) and copy every entry that may still be pending (verified
//!    against `records`, as readers do) into `pending_overdue`; and the same
//!    slice of migration 1's `pending_index`, which replicas of an older
//!    release write during a rollout ([`super::legacy`]);
//! 2. every 15 s, count the tenant's pending records (a ListPending walk)
//!    for the gauges;
//! 3. advance the watermark (and store the counts) with the LWT;
//! 4. drop the buckets now wholly below the watermark, one partition delete
//!    per shard.
//!
//! A busy tenant (this replica wrote one of its entries within the idle
//! step) advances every step (5 s); an idle one every idle step (60 s), so
//! a thousand idle tenants cost a thousand LWTs a minute, not every 5 s.

use std::collections::HashMap;
use std::ops::ControlFlow;

use futures::future::join_all;
use scylla::response::PagingState;

use super::super::records::Records;
use super::super::session::{rows, ttl_seconds, unavailable};
use super::cursor::Cursor;
use super::entry::{BUCKET_MS, SHARDS};
use super::entry::{EntryVerdict, bucket_of, classify_entry, shard_of};
use super::index::Index;
use super::scan::Scan;
use crate::crash::crash_point_in;
use crate::store::{PendingCounts, RecordKey, Store, StoreResult, count_pending};

/// The pending index seen by the sealer that moves watermarks and overdue entries: a view of its [`Index`] for one
/// pass, so that each pass is a type with its `impl` here while
/// [`super::PendingIndex`] keeps the store's entry points in one place.
pub(super) struct Sealer<'a>(pub(super) &'a Index);

impl std::ops::Deref for Sealer<'_> {
    type Target = Index;

    fn deref(&self) -> &Index {
        self.0
    }
}

/// How often the sealer recounts a tenant's pending records (the gauges'
/// source): as often as the gauges refresh.
const SUMMARY_EVERY_MS: i64 = 15_000;

/// Most pending records one count reads (the gauges saturate beyond it,
/// and say so with `summary_truncated`).
const SUMMARY_MAX_RECORDS: usize = 10_000;

/// Most buckets one advance seals: a watermark left far behind (every
/// replica down for a while) catches up over several passes of bounded
/// cost instead of one unbounded one.
const MAX_BUCKETS_PER_ADVANCE: i64 = 90;

/// What one maintenance pass did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SealReport {
    /// Tenants whose watermark this pass advanced.
    pub advanced: usize,
    /// Entries copied into `pending_overdue`.
    pub moved: usize,
    /// Bucket partitions dropped.
    pub dropped: usize,
}

fn signed(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

impl Sealer<'_> {
    /// Every tenant's cursor (one row per tenant, paged).
    async fn all_cursors(&self) -> StoreResult<Vec<Cursor>> {
        let mut cursors = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .session
                .execute_single_page(&self.statements.cursor_all, (), paging)
                .await
                .map_err(|e| unavailable("pending cursor scan", e))?;
            for row in rows::named_rows(result)? {
                cursors.push(Cursor::from_row(&row)?);
            }
            match next.into_paging_control_flow() {
                ControlFlow::Break(()) => return Ok(cursors),
                ControlFlow::Continue(state) => paging = state,
            }
        }
    }

    /// The work of [`super::PendingIndex::seal_all`].
    pub(super) async fn seal_all(
        &self,
        records: &Records,
        store: &dyn Store,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        let now_ms = now_ms.min(crate::clock::Clock::now_ms(&crate::clock::SystemClock));
        let mut report = SealReport::default();
        let mut first_error = None;
        let mut cursors = self.all_cursors().await?;
        if let Some(legacy) = &self.legacy {
            let known = cursors.iter().map(|c| c.tenant.clone()).collect();
            match legacy
                .adopt_tenants(&self.session, &known, self.timing.grace_ms, now_ms)
                .await
            {
                Ok(0) => {}
                Ok(adopted) => {
                    tracing::info!(
                        adopted,
                        "tenants only an older release served now have a cursor"
                    );
                    cursors = self.all_cursors().await?;
                }
                Err(error) => {
                    tracing::warn!(%error, "looking for tenants in pending_index failed");
                    first_error.get_or_insert(error);
                }
            }
        }
        self.remember_summaries(&cursors);
        for cursor in cursors {
            self.tenants.saw_watermark(&cursor.tenant, cursor.watermark);
            match self
                .seal_tenant(records, store, &cursor, now_ms, &mut report)
                .await
            {
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(%error, "sealing a tenant's pending index failed");
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }

    /// The work of [`super::PendingIndex::seal_one`].
    pub(super) async fn seal_one(
        &self,
        records: &Records,
        store: &dyn Store,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        let mut report = SealReport::default();
        if let Some(cursor) = Cursor::read(self.0, tenant).await? {
            self.seal_tenant(records, store, &cursor, now_ms, &mut report)
                .await?;
        }
        Ok(report)
    }

    /// One tenant's advance (see the module docs), at `now_ms` as given.
    async fn seal_tenant(
        &self,
        records: &Records,
        store: &dyn Store,
        cursor: &Cursor,
        now_ms: i64,
        report: &mut SealReport,
    ) -> StoreResult<()> {
        let timing = self.timing;
        let busy = now_ms - self.tenants.get(&cursor.tenant).last_put_ms < timing.idle_step_ms;
        let step = if busy {
            timing.step_ms
        } else {
            timing.idle_step_ms
        };
        let old = cursor.watermark;
        let target = (now_ms - timing.grace_ms).min(old + MAX_BUCKETS_PER_ADVANCE * BUCKET_MS);
        if target - old < step {
            return Ok(());
        }
        report.moved += self
            .move_to_overdue(records, &cursor.tenant, old, target, now_ms)
            .await?;
        if let Some(legacy) = &self.legacy {
            report.moved += legacy
                .follow(&self.session, &cursor.tenant, old, target, now_ms)
                .await?;
        }
        crash_point_in("seal-after-move", &cursor.tenant);
        let summary = match cursor.summary_at {
            Some(at) if now_ms - at < SUMMARY_EVERY_MS => None,
            _ => Some(count_pending(store, &cursor.tenant, now_ms, SUMMARY_MAX_RECORDS).await?),
        };
        let result = match &summary {
            None => {
                self.session
                    .execute_unpaged(
                        &self.statements.cursor_advance,
                        (target, now_ms, &self.replica, &cursor.tenant, old),
                    )
                    .await
            }
            Some(counts) => {
                self.session
                    .execute_unpaged(
                        &self.statements.cursor_advance_with_summary,
                        (
                            target,
                            now_ms,
                            &self.replica,
                            now_ms,
                            signed(counts.in_progress),
                            signed(counts.unknown),
                            signed(counts.failed),
                            counts.oldest_since_ms,
                            counts.truncated,
                            &cursor.tenant,
                            old,
                        ),
                    )
                    .await
            }
        }
        .map_err(|e| unavailable("pending cursor advance", e))?;
        let applied = rows::named_rows(result)?
            .first()
            .map(rows::applied)
            .transpose()?
            .unwrap_or(false);
        if !applied {
            // Another replica advanced it first; its copy covers ours.
            return Ok(());
        }
        report.advanced += 1;
        self.tenants.saw_watermark(&cursor.tenant, target);
        crash_point_in("seal-after-advance", &cursor.tenant);
        // Buckets wholly below the new watermark, not dropped before (their
        // end was above the old one).
        for bucket in bucket_of(old)..bucket_of(target) {
            let drops = (0..SHARDS).map(|shard| {
                self.session.execute_unpaged(
                    &self.statements.bucket_drop,
                    (&cursor.tenant, bucket, shard),
                )
            });
            for result in join_all(drops).await {
                // A failed drop leaves a partition below the watermark:
                // never read again, its entries expire with their TTL.
                match result {
                    Ok(_) => report.dropped += 1,
                    Err(error) => tracing::debug!(%error, "dropping a sealed bucket failed"),
                }
            }
        }
        Ok(())
    }

    /// Copies the entries due in `[from, to)` that may still be pending
    /// into `pending_overdue`; returns how many.
    async fn move_to_overdue(
        &self,
        records: &Records,
        tenant: &str,
        from: i64,
        to: i64,
        now_ms: i64,
    ) -> StoreResult<usize> {
        let mut live = Vec::new();
        let scan = Scan(self.0);
        for bucket in bucket_of(from)..=bucket_of(to - 1) {
            let reads = (0..SHARDS).map(|shard| {
                scan.read_slice(
                    &self.statements.bucket_scan,
                    (tenant, bucket, shard, from, "", "", to - 1),
                    usize::MAX,
                )
            });
            for result in join_all(reads).await {
                live.extend(result?.0);
            }
        }
        let checks = live.into_iter().map(|(due, endpoint, key)| async move {
            let id = RecordKey {
                tenant: tenant.to_string(),
                endpoint,
                key,
            };
            let record = records.read(&id, false).await;
            (due, id, record)
        });
        let mut copies = HashMap::new();
        for (due, id, record) in join_all(checks).await {
            let record = record?.filter(|r| r.is_live(now_ms));
            match classify_entry(due, record.as_ref(), now_ms) {
                EntryVerdict::Stale => {}
                // Pending, or a claim whose insert may still land: keep it
                // where readers will look.
                EntryVerdict::Pending | EntryVerdict::Keep => {
                    // Without a record (an insert still in flight) the
                    // record's expiry is unknown: the longest a policy
                    // allows. Readers drop the copy once it proves stale.
                    let ttl = record.map_or(self.max_ttl_seconds, |r| {
                        ttl_seconds(r.expires_at_ms, now_ms)
                    });
                    copies.insert((due, id.endpoint.clone(), id.key.clone()), (id, ttl));
                }
            }
        }
        let moved = copies.len();
        let writes = copies
            .into_iter()
            .map(|((due, _, _), (id, ttl))| async move {
                self.session
                    .execute_unpaged(
                        &self.statements.overdue_put,
                        (
                            &id.tenant,
                            shard_of(&id.endpoint, &id.key),
                            due,
                            &id.endpoint,
                            &id.key,
                            ttl,
                        ),
                    )
                    .await
            });
        for result in join_all(writes).await {
            result.map_err(|e| unavailable("pending overdue write", e))?;
        }
        Ok(moved)
    }

    /// The work of [`super::PendingIndex::stored_summary`].
    pub(super) async fn stored_summary(&self, tenant: &str) -> StoreResult<Option<PendingCounts>> {
        let fresh_for = self.step() * 2;
        if let Ok(scanned) = self.summaries.lock()
            && let Some(scanned) = scanned.as_ref()
            && scanned.at.elapsed() <= fresh_for
        {
            return Ok(scanned.by_tenant.get(tenant).cloned().flatten());
        }
        Ok(Cursor::read(self.0, tenant).await?.and_then(|c| c.summary))
    }

    /// Keeps the summaries of a scan for [`PendingIndex::stored_summary`].
    fn remember_summaries(&self, cursors: &[Cursor]) {
        let by_tenant = cursors
            .iter()
            .map(|c| (c.tenant.clone(), c.summary.clone()))
            .collect();
        if let Ok(mut summaries) = self.summaries.lock() {
            *summaries = Some(super::index::ScannedSummaries {
                at: std::time::Instant::now(),
                by_tenant,
            });
        }
    }
}
