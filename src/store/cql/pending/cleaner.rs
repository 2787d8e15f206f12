//! The [`Cleaner`]: what deletes stale index entries, owned, so that a
//! delete can outlive the request that started it (the cleanups after a
//! completion run off the reply path). Which entries are stale is decided
//! in `cleanup.rs`.

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use tokio::sync::Semaphore;

use super::entry::{Slot, shard_of};
use crate::store::RecordKey;

/// Detached index cleanups in flight at most (see
/// [`PendingIndex::after_completion`]): far above what one replica's
/// completions keep in flight while the cluster answers in milliseconds.
pub(super) const DETACHED_CLEANUPS: usize = 1024;

/// What deletes index entries, owned, so a delete can outlive the request
/// that started it.
#[derive(Clone)]
pub(super) struct Cleaner {
    /// The store's session.
    pub(super) session: Arc<Session>,
    /// `pending_buckets` delete.
    pub(super) bucket_delete: PreparedStatement,
    /// `pending_overdue` delete.
    pub(super) overdue_delete: PreparedStatement,
    /// Permits of the cleanups that run after the reply.
    pub(super) detached: Arc<Semaphore>,
}

impl Cleaner {
    /// A cleaner with every detached permit free.
    pub(super) fn new(
        session: Arc<Session>,
        bucket_delete: PreparedStatement,
        overdue_delete: PreparedStatement,
    ) -> Self {
        Self {
            session,
            bucket_delete,
            overdue_delete,
            detached: Arc::new(Semaphore::new(DETACHED_CLEANUPS)),
        }
    }

    /// Best effort: deletes the entry (`due`, endpoint, key) from each of
    /// `slots`; failures are logged at debug and left for readers.
    pub(super) async fn delete(&self, id: &RecordKey, due: i64, slots: &[Slot]) {
        let shard = shard_of(&id.endpoint, &id.key);
        for slot in slots {
            let result = match slot {
                Slot::Bucket(bucket) => {
                    self.session
                        .execute_unpaged(
                            &self.bucket_delete,
                            (&id.tenant, *bucket, shard, due, &id.endpoint, &id.key),
                        )
                        .await
                }
                Slot::Overdue => {
                    self.session
                        .execute_unpaged(
                            &self.overdue_delete,
                            (&id.tenant, shard, due, &id.endpoint, &id.key),
                        )
                        .await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "pending index cleanup failed; left for lazy removal");
            }
        }
    }
}
