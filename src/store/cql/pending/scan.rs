//! ListPending on the bucketed index: the overdue partitions and the
//! buckets from the tenant's watermark up, merged in due order.
//!
//! Buckets hold disjoint ranges of due instants, so a call walks them one
//! at a time: the eight shard partitions of one bucket and the eight
//! overdue partitions, each a paged slice starting at the page cursor (and
//! never below the watermark), merged and cut where every source agrees
//! that nothing smaller is left. Entries are then verified against
//! `records`, concurrently; a stale one is deleted on the way. The price
//! of a step: the 8 overdue slices plus 8 per bucket (up to
//! [`BUCKETS_PER_STEP`]), and one record read per entry.

use futures::future::join_all;
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use std::ops::ControlFlow;

use super::super::records::Records;
use super::super::session::{day_of, rows, unavailable};
use super::cursor::Cursor;
use super::entry::{BUCKET_MS, SHARDS};
use super::entry::{
    Entry, EntryVerdict, Slot, bucket_of, classify_entry, decode_token, encode_token, index_entry,
};
use super::index::Index;
use crate::store::{PendingPage, PendingQuery, RecordKey, StoreError, StoreResult};

/// The pending index seen by ListPending's read of the buckets: a view of its [`Index`] for one
/// pass, so that each pass is a type with its `impl` here while
/// [`super::PendingIndex`] keeps the store's entry points in one place.
pub(super) struct Scan<'a>(pub(super) &'a Index);

impl std::ops::Deref for Scan<'_> {
    type Target = Index;

    fn deref(&self) -> &Index {
        self.0
    }
}

/// Most steps ([`BUCKETS_PER_STEP`] buckets each) one ListPending call
/// takes before it returns (possibly an empty page with a token): a
/// watermark left far behind (every replica down for an hour) costs several
/// calls, never one unbounded one.
const MAX_STEPS_PER_CALL: usize = 11;

/// Buckets read at once (8 slices each): the watermark trails the clock
/// by about one bucket, so one step usually covers everything due.
const BUCKETS_PER_STEP: i64 = 3;

/// Index entries examined per ListPending page beyond the page size.
const MAX_SCAN_EXTRA: usize = 5_000;

/// What one partition's slice returned.
struct Source {
    /// The entries, in order.
    entries: Vec<Entry>,
    /// Whether the slice has nothing after `entries`.
    exhausted: bool,
    /// Which table it came from.
    slot: Slot,
}

/// Candidates of one step: entries in order with every slot holding them.
type Candidates = Vec<(Entry, Vec<Slot>)>;

impl Scan<'_> {
    /// Up to `limit` entries of one slice, following the driver's paging
    /// (through empty pages: ScyllaDB ends a page early at its tombstone
    /// limit); `exhausted` when the slice has no more.
    pub(super) async fn read_slice(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
        limit: usize,
    ) -> StoreResult<(Vec<Entry>, bool)> {
        let mut entries = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .session
                .execute_single_page(statement, &values, paging)
                .await
                .map_err(|e| unavailable("pending index read", e))?;
            for row in rows::named_rows(result)? {
                entries.push(index_entry(&row)?);
            }
            match next.into_paging_control_flow() {
                ControlFlow::Break(()) => return Ok((entries, true)),
                ControlFlow::Continue(state) if entries.len() >= limit => {
                    let _ = state;
                    return Ok((entries, false));
                }
                ControlFlow::Continue(state) => paging = state,
            }
        }
    }

    /// The work of [`super::PendingIndex::list`].
    pub(super) async fn list(
        &self,
        records: &Records,
        query: &PendingQuery,
        now_ms: i64,
    ) -> StoreResult<PendingPage> {
        let mut start: Entry = match &query.page_token {
            Some(token) => decode_token(token).ok_or(StoreError::InvalidPageToken)?.1,
            None => (i64::MIN, String::new(), String::new()),
        };
        // The watermark this replica last saw (its sealer reads every
        // tenant's each step): reading from a watermark that has since
        // moved on only walks a little more, never misses an entry.
        let watermark = match self.tenants.watermark(&query.tenant) {
            Some(watermark) => Some(watermark),
            None => {
                let read = Cursor::read(self.0, &query.tenant)
                    .await?
                    .map(|c| c.watermark);
                if let Some(watermark) = read {
                    self.tenants.saw_watermark(&query.tenant, watermark);
                }
                read
            }
        };
        let fetch = query.page_size.clamp(50, 1000);
        let scan_limit = query.page_size.saturating_add(MAX_SCAN_EXTRA);
        let mut page = PendingPage::default();
        let mut scanned = 0usize;
        // The lowest due instant the bucket reads may still need.
        let mut floor = start.0;
        for _ in 0..MAX_STEPS_PER_CALL {
            let (candidates, done, next_floor) = self
                .candidates(&query.tenant, watermark, &start, floor, now_ms, fetch)
                .await?;
            floor = next_floor;
            let checks = candidates.into_iter().map(|(entry, slots)| {
                let id = RecordKey {
                    tenant: query.tenant.clone(),
                    endpoint: entry.1.clone(),
                    key: entry.2.clone(),
                };
                async move {
                    let record = records.read(&id, false).await;
                    (entry, slots, id, record)
                }
            });
            for (entry, slots, id, record) in join_all(checks).await {
                let due = entry.0;
                start = entry;
                scanned += 1;
                let record = record?.filter(|r| r.is_live(now_ms));
                match classify_entry(due, record.as_ref(), now_ms) {
                    EntryVerdict::Pending => {
                        let record = record.ok_or_else(|| {
                            StoreError::Corrupt("pending entry without record".to_string())
                        })?;
                        let endpoint_ok = query
                            .endpoint
                            .as_ref()
                            .is_none_or(|e| *e == record.id.endpoint);
                        let age_ok = query
                            .created_at_or_before_ms
                            .is_none_or(|limit| record.created_at_ms <= limit);
                        if endpoint_ok && age_ok {
                            page.records.push(record);
                        }
                    }
                    EntryVerdict::Stale => self.cleaner.delete(&id, due, &slots).await,
                    EntryVerdict::Keep => {}
                }
                if page.records.len() >= query.page_size || scanned >= scan_limit {
                    page.next_page_token = Some(encode_token(day_of(start.0), &start));
                    return Ok(page);
                }
            }
            if done {
                return Ok(page);
            }
            floor = floor.max(start.0);
        }
        // Step budget spent: continue from the first bucket not walked. The
        // cursor sorts after every entry due at `floor - 1` (no endpoint
        // starts with U+10FFFF, the largest code point), before any due at
        // `floor`.
        let resume = if floor > start.0 {
            (floor - 1, String::from("\u{10FFFF}"), String::new())
        } else {
            start
        };
        page.next_page_token = Some(encode_token(day_of(resume.0), &resume));
        Ok(page)
    }

    /// One step of the merge: the next entries after `start`, in order,
    /// from the overdue partitions and the buckets from the one holding
    /// `floor` (raised to the watermark). Returns them, whether nothing is
    /// left at all, and the floor of the next step.
    async fn candidates(
        &self,
        tenant: &str,
        watermark: Option<i64>,
        start: &Entry,
        floor: i64,
        now_ms: i64,
        fetch: usize,
    ) -> StoreResult<(Candidates, bool, i64)> {
        let overdue = (0..SHARDS).map(|shard| async move {
            let (entries, exhausted) = self
                .read_slice(
                    &self.statements.overdue_scan,
                    (tenant, shard, start.0, &start.1, &start.2, now_ms),
                    fetch,
                )
                .await?;
            Ok::<_, StoreError>(Source {
                entries,
                exhausted,
                slot: Slot::Overdue,
            })
        });
        // The bucket part: nothing below the watermark, nothing after now.
        let bucket_from = watermark.map(|w| floor.max(start.0).max(w));
        // The buckets of this step: from the one holding `bucket_from`, up
        // to BUCKETS_PER_STEP of them, never past now.
        let range = bucket_from.filter(|from| *from <= now_ms).map(|from| {
            let first = bucket_of(from);
            (first, (first + BUCKETS_PER_STEP - 1).min(bucket_of(now_ms)))
        });
        let bucket_last_due = range.map(|(_, last)| ((last + 1) * BUCKET_MS - 1).min(now_ms));
        let floor_due = watermark.unwrap_or(i64::MIN);
        let buckets = range
            .into_iter()
            .flat_map(|(first, last)| first..=last)
            .flat_map(|b| {
                // Never below the watermark nor this bucket's start.
                let bound = floor_due.max(b * BUCKET_MS);
                let lower: Entry = if start.0 >= bound {
                    start.clone()
                } else {
                    // Exclusive bound just below `bound`: endpoints are never
                    // empty, so (d, "", "") sorts before every entry due at d.
                    (bound, String::new(), String::new())
                };
                let last_due = ((b + 1) * BUCKET_MS - 1).min(now_ms);
                (0..SHARDS).map(move |shard| {
                    let lower = lower.clone();
                    async move {
                        let (entries, exhausted) = self
                            .read_slice(
                                &self.statements.bucket_scan,
                                (tenant, b, shard, lower.0, &lower.1, &lower.2, last_due),
                                fetch,
                            )
                            .await?;
                        Ok::<_, StoreError>(Source {
                            entries,
                            exhausted,
                            slot: Slot::Bucket(b),
                        })
                    }
                })
            });
        let (overdue, buckets) = futures::join!(join_all(overdue), join_all(buckets));
        let mut sources = Vec::with_capacity(overdue.len() + buckets.len());
        for source in overdue.into_iter().chain(buckets) {
            sources.push(source?);
        }
        // Whether these buckets are walked once the candidates are: every
        // slice read to its end, and nothing of them left behind the cut.
        let bucket_sources = sources.iter().filter(|s| s.slot != Slot::Overdue);
        let bucket_read = bucket_sources.clone().all(|s| s.exhausted);
        let bucket_max = bucket_sources
            .filter_map(|s| s.entries.last())
            .max()
            .cloned();
        let last_bucket = bucket_last_due.is_none_or(|last| last >= now_ms);
        let (candidates, complete) =
            merge(sources, fetch, bucket_last_due.filter(|_| !last_bucket));
        let bucket_done = bucket_read
            && bucket_max.is_none_or(|max| candidates.last().is_some_and(|(last, _)| max <= *last));
        let done = complete && last_bucket;
        let next_floor = match bucket_last_due {
            Some(last) if bucket_done && !last_bucket => last + 1,
            _ => floor,
        };
        Ok((candidates, done, next_floor))
    }
}

/// Merges sorted sources into the entries that are certainly next: up to
/// the smallest last entry of any source that has more, and (when
/// `up_to_due` is set, the bucket's last due instant) no further than that
/// bucket, at most `fetch`. An entry in both tables (copied by a sealer not
/// yet finished) comes out once with both slots. `complete` when every
/// entry of every source was taken.
fn merge(sources: Vec<Source>, fetch: usize, up_to_due: Option<i64>) -> (Candidates, bool) {
    let mut cut: Option<Entry> = None;
    let mut all: Vec<(Entry, Slot)> = Vec::new();
    for source in sources {
        if !source.exhausted
            && let Some(last) = source.entries.last()
            && cut.as_ref().is_none_or(|c| last < c)
        {
            cut = Some(last.clone());
        }
        all.extend(source.entries.into_iter().map(|e| (e, source.slot)));
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let total = all.len();
    let mut out: Candidates = Vec::new();
    let mut taken = 0;
    for (entry, slot) in all {
        if cut.as_ref().is_some_and(|c| &entry > c) || up_to_due.is_some_and(|d| entry.0 > d) {
            break;
        }
        let full = out.len() >= fetch;
        match out.last_mut() {
            Some((last, slots)) if *last == entry => slots.push(slot),
            _ if full => break,
            _ => out.push((entry, vec![slot])),
        }
        taken += 1;
    }
    (out, cut.is_none() && taken == total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(due: i64, key: &str) -> Entry {
        (due, "e".to_string(), key.to_string())
    }

    fn source(entries: &[Entry], exhausted: bool, slot: Slot) -> Source {
        Source {
            entries: entries.to_vec(),
            exhausted,
            slot,
        }
    }

    #[test]
    fn merge_stops_where_a_source_may_hide_smaller_entries() {
        let (out, complete) = merge(
            vec![
                source(&[entry(1, "a"), entry(5, "e")], false, Slot::Overdue),
                source(&[entry(2, "b"), entry(9, "z")], true, Slot::Bucket(0)),
            ],
            100,
            None,
        );
        let keys: Vec<&str> = out.iter().map(|(e, _)| e.2.as_str()).collect();
        assert_eq!(keys, ["a", "b", "e"], "9 may follow unseen overdue entries");
        assert!(!complete);
    }

    #[test]
    fn merge_joins_copies_and_respects_the_bucket_end() {
        let (out, complete) = merge(
            vec![
                source(&[entry(3, "k"), entry(40, "later")], true, Slot::Overdue),
                source(&[entry(3, "k")], true, Slot::Bucket(0)),
            ],
            100,
            Some(19),
        );
        assert_eq!(
            out,
            vec![(entry(3, "k"), vec![Slot::Overdue, Slot::Bucket(0)])]
        );
        assert!(!complete, "the overdue entry after the bucket is left");
        let (out, complete) = merge(
            vec![source(&[entry(3, "k"), entry(4, "l")], true, Slot::Overdue)],
            1,
            None,
        );
        assert_eq!(out.len(), 1);
        assert!(!complete, "cut at fetch");
    }
}
