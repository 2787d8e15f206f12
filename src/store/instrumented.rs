//! A [`Store`] decorator that records the latency and failures of every
//! store operation (`idemd_store_operation_duration_seconds`,
//! `idemd_store_errors_total`) and, with tracing on, a child span per
//! operation, so backends stay free of metrics and tracing plumbing except
//! for what only they can see (uncertain writes).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::contract::{
    CasOutcome, Expected, InsertOutcome, PendingCounts, PendingPage, PendingQuery, Store,
    StoreResult,
};
use super::record::{Record, RecordKey};
use crate::metrics as names;

/// Wraps a store and measures it.
pub struct InstrumentedStore {
    /// The measured store.
    inner: Arc<dyn Store>,
}

impl InstrumentedStore {
    /// Measures `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self { inner }
    }

    fn record<T>(&self, operation: &'static str, started: Instant, result: &StoreResult<T>) {
        let backend = self.inner.backend_name();
        metrics::histogram!(names::STORE_DURATION, "backend" => backend, "operation" => operation)
            .record(started.elapsed().as_secs_f64());
        if result.is_err() {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "operation" => operation)
                .increment(1);
        }
    }
}

/// Times the call, counts failures and, when tracing is on, runs it in a
/// child span of the current RPC span.
macro_rules! measured {
    ($self:ident, $operation:literal, $call:expr) => {{
        let started = Instant::now();
        let span = crate::telemetry::store_context($self.inner.backend_name(), $operation);
        let result = match &span {
            Some(context) => {
                opentelemetry::context::FutureExt::with_context($call, context.clone()).await
            }
            None => $call.await,
        };
        if let Some(context) = &span {
            crate::telemetry::end_store(context, &result);
        }
        $self.record($operation, started, &result);
        result
    }};
}

#[async_trait]
impl Store for InstrumentedStore {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn read_before_insert(&self) -> bool {
        self.inner.read_before_insert()
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        measured!(self, "get", self.inner.get(id, now_ms))
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        measured!(self, "insert", self.inner.insert_if_absent(record, now_ms))
    }

    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        measured!(
            self,
            "replace",
            self.inner.replace_if(record, expected, now_ms)
        )
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        measured!(self, "delete", self.inner.delete_if(id, expected, now_ms))
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        measured!(self, "list_pending", self.inner.list_pending(query, now_ms))
    }

    fn maintenance_interval(&self) -> Option<std::time::Duration> {
        self.inner.maintenance_interval()
    }

    async fn maintain(&self, now_ms: i64) -> StoreResult<()> {
        measured!(self, "maintain", self.inner.maintain(now_ms))
    }

    async fn pending_summary(
        &self,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<Option<PendingCounts>> {
        measured!(
            self,
            "pending_summary",
            self.inner.pending_summary(tenant, now_ms)
        )
    }

    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        self.inner.cluster_time_ms().await
    }

    fn has_cluster_clock(&self) -> bool {
        self.inner.has_cluster_clock()
    }

    fn damage(&self) -> Option<String> {
        self.inner.damage()
    }

    async fn backup(
        &self,
        to: &std::path::Path,
        progress: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    ) -> StoreResult<super::contract::BackupSummary> {
        self.inner.backup(to, progress).await
    }

    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        measured!(self, "sweep", self.inner.sweep_expired(now_ms, max_records))
    }

    async fn close(&self) -> StoreResult<()> {
        self.inner.close().await
    }
}
