//! The [`PendingIndex`]: the store's entry points into its pending index.
//! It owns the [`Index`] (the parts every pass works on) and hands each
//! call to the pass it belongs to: [`Scan`] (`scan.rs`), [`Sealer`]
//! (`seal.rs`) or [`Cleanup`] (`cleanup.rs`), or to the index itself (what
//! a write adds). Every type's `impl` is in its own file.

use std::sync::Arc;
use std::time::Duration;

use scylla::client::session::Session;

use super::super::records::Records;
use super::super::session::CqlOptions;
use super::cleanup::Cleanup;
use super::entry::Slot;
use super::index::Index;
use super::scan::Scan;
use super::seal::{SealReport, Sealer};
use crate::store::{
    PendingCounts, PendingPage, PendingQuery, Record, RecordKey, RecordState, Store, StoreResult,
};

/// The pending index of one store (see the module docs of [`super`]).
pub(in crate::store::cql) struct PendingIndex {
    /// The parts every pass works on; the passes borrow it per call.
    index: Index,
}

impl PendingIndex {
    /// Prepares the index's statements on `session`.
    pub(in crate::store::cql) async fn open(
        session: Arc<Session>,
        options: &CqlOptions,
    ) -> StoreResult<Self> {
        Ok(Self {
            index: Index::open(session, options).await?,
        })
    }

    /// How many cursor rows this replica asked to create.
    pub(in crate::store::cql) fn cursors_created(&self) -> u64 {
        self.index.cursors_created()
    }

    /// How often the sealer should run: its step.
    pub(in crate::store::cql) fn step(&self) -> Duration {
        self.index.step()
    }

    /// Writes the index entry of `record` (if it is due at some point)
    /// before the conditional write that makes it so; returns where.
    pub(in crate::store::cql) async fn put(
        &self,
        record: &Record,
        now_ms: i64,
    ) -> StoreResult<Option<Slot>> {
        self.index.put(record, now_ms).await
    }

    /// ListPending: see the module docs.
    pub(in crate::store::cql) async fn list(
        &self,
        records: &Records,
        query: &PendingQuery,
        now_ms: i64,
    ) -> StoreResult<PendingPage> {
        Scan(&self.index).list(records, query, now_ms).await
    }

    /// One maintenance pass over every tenant (see the module docs). A
    /// tenant that fails is logged and the pass goes on; the first error is
    /// returned at the end.
    ///
    /// Every tenant's watermark is set from `now_ms`, but never past the
    /// host's wall clock: an engine clock running ahead (a test's manual
    /// clock) is a replica skewed ahead, and sealing from it would seal
    /// buckets other replicas still write.
    ///
    /// Entries are verified against `records`; the gauges' summary is what
    /// [`count_pending`] finds through `store`'s ListPending (this index's
    /// store), the count the engine makes for a backend without one.
    pub(in crate::store::cql) async fn seal_all(
        &self,
        records: &Records,
        store: &dyn Store,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        Sealer(&self.index).seal_all(records, store, now_ms).await
    }

    /// [`PendingIndex::seal_all`] for one tenant, at `now_ms` exactly (no
    /// wall clock cap); nothing when the tenant has no cursor yet.
    pub(in crate::store::cql) async fn seal_one(
        &self,
        records: &Records,
        store: &dyn Store,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<SealReport> {
        Sealer(&self.index)
            .seal_one(records, store, tenant, now_ms)
            .await
    }

    /// The summary the sealer stored for `tenant`; `None` when none was
    /// computed yet (the caller counts itself then). From this replica's
    /// last scan of the cursors when it is at most two steps old (the
    /// summary itself is recomputed every 15 s, so this adds at most one
    /// step of lag); a read of the tenant's cursor otherwise.
    pub(in crate::store::cql) async fn stored_summary(
        &self,
        tenant: &str,
    ) -> StoreResult<Option<PendingCounts>> {
        Sealer(&self.index).stored_summary(tenant).await
    }

    /// Best effort: deletes one entry from `slots`; failures are logged at
    /// debug and left for readers.
    pub(in crate::store::cql) async fn delete(&self, id: &RecordKey, due: i64, slots: &[Slot]) {
        Cleanup(&self.index).delete(id, due, slots).await
    }

    /// After a write that replaced a record in `old_state`, due at
    /// `old_due`, by `new` (or deleted it): drop the entry that no longer
    /// describes the record. An entry at the same due instant may be the
    /// new record's own (same clustering key), so then only the other
    /// table's copy is dropped.
    pub(in crate::store::cql) async fn after_write(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: Option<&Record>,
        now_ms: i64,
    ) {
        Cleanup(&self.index).after_write(id, old, new, now_ms).await
    }

    /// [`PendingIndex::after_write`] off the reply path, for a write that
    /// made the record COMPLETED: the caller's answer does not wait for a
    /// cleanup that only saves readers a verification. Only then, because
    /// a completed record never enters the index again under the entry it
    /// leaves (it can be claimed again only once expired, with a later due
    /// instant), so the late delete can never remove a newer entry with the
    /// same primary key (writes here carry server timestamps: the later
    /// arrival wins). A crash before the delete lands leaves a stale entry,
    /// as any failed cleanup does. At most [`DETACHED_CLEANUPS`] run at
    /// once; past that the caller waits, so an overloaded cluster slows the
    /// replies instead of growing a queue.
    pub(in crate::store::cql) async fn after_completion(
        &self,
        id: &RecordKey,
        old: (RecordState, Option<i64>),
        new: &Record,
        now_ms: i64,
    ) {
        Cleanup(&self.index)
            .after_completion(id, old, new, now_ms)
            .await
    }

    /// Waits (at most `limit`) for the detached cleanups in flight, so a
    /// graceful stop leaves no stale entry behind.
    pub(in crate::store::cql) async fn drain(&self, limit: Duration) {
        Cleanup(&self.index).drain(limit).await
    }
}
