//! Deleting the entries a record write made stale: which ones (the old due
//! instant, in whichever table it may be), and what the [`super::cleaner::Cleaner`]
//! deletes, on the reply path or after it.
//!
//! Every delete is best effort: a failed one leaves an entry that readers
//! verify against `records` and drop, so a cleanup never fails a request.
//! Cleanups after a completion run off the reply path, at most
//! [`DETACHED_CLEANUPS`] at once, and [`PendingIndex::drain`] waits for
//! them at a graceful stop.

use std::sync::Arc;
use std::time::Duration;

use super::cleaner::DETACHED_CLEANUPS;
use super::entry::{Slot, bucket_of};
use super::index::Index;
use crate::store::{Record, RecordKey, RecordState};

/// The pending index seen by the removal of entries whose record moved on: a view of its [`Index`] for one
/// pass, so that each pass is a type with its `impl` here while
/// [`super::PendingIndex`] keeps the store's entry points in one place.
pub(super) struct Cleanup<'a>(pub(super) &'a Index);

impl std::ops::Deref for Cleanup<'_> {
    type Target = Index;

    fn deref(&self) -> &Index {
        self.0
    }
}

impl Cleanup<'_> {
    /// The work of [`super::PendingIndex::delete`].
    pub(super) async fn delete(&self, id: &RecordKey, due: i64, slots: &[Slot]) {
        self.cleaner.delete(id, due, slots).await;
    }

    /// The work of [`super::PendingIndex::after_write`].
    pub(super) async fn after_write(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: Option<&Record>,
        now_ms: i64,
    ) {
        if let Some((due, slots)) = self.stale_after_write(old, new, now_ms) {
            self.delete(id, due, &slots).await;
        }
    }

    /// The work of [`super::PendingIndex::after_completion`].
    pub(super) async fn after_completion(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: &Record,
        now_ms: i64,
    ) {
        debug_assert_eq!(new.state, RecordState::Completed);
        let Some((due, slots)) = self.stale_after_write(old, Some(new), now_ms) else {
            return;
        };
        let Ok(permit) = Arc::clone(&self.cleaner.detached).try_acquire_owned() else {
            self.delete(id, due, &slots).await;
            return;
        };
        let cleaner = self.cleaner.clone();
        let id = id.clone();
        tokio::spawn(async move {
            cleaner.delete(&id, due, &slots).await;
            drop(permit);
        });
    }

    /// The work of [`super::PendingIndex::drain`].
    pub(super) async fn drain(&self, limit: Duration) {
        let all = u32::try_from(DETACHED_CLEANUPS).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(limit, self.cleaner.detached.acquire_many(all)).await;
        if drained.is_err() {
            tracing::debug!("pending index cleanups still in flight at close; readers drop them");
        }
    }

    /// The entries made stale by a write (see [`PendingIndex::after_write`]):
    /// the old due instant and its slots.
    fn stale_after_write(
        &self,
        (old_state, old_due): (RecordState, Option<i64>),
        new: Option<&Record>,
        now_ms: i64,
    ) -> Option<(i64, Vec<Slot>)> {
        let old_due = old_due?;
        match new.filter(|new| new.pending_since_ms() == Some(old_due)) {
            None => Some((old_due, self.slots_of(old_state, old_due, now_ms))),
            Some(new)
                if old_state == RecordState::InProgress && new.state != RecordState::InProgress =>
            {
                Some((old_due, vec![Slot::Bucket(bucket_of(old_due))]))
            }
            // Same table, same row: the new entry is the old one.
            Some(_) => None,
        }
    }

    /// Where the entry of a record in `state`, due at `due`, may be. An
    /// IN_PROGRESS entry due long enough ago may have been moved to
    /// `pending_overdue` by the sealer, so it is looked for there too.
    fn slots_of(&self, state: RecordState, due: i64, now_ms: i64) -> Vec<Slot> {
        let mut slots = Vec::with_capacity(2);
        if state == RecordState::InProgress {
            slots.push(Slot::Bucket(bucket_of(due)));
            if due <= now_ms - self.timing.grace_ms / 2 {
                slots.push(Slot::Overdue);
            }
        } else {
            slots.push(Slot::Overdue);
        }
        slots
    }
}
