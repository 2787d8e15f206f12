//! What a fresh pair costs on the CQL store (issue 27): no read on the
//! reply path of a Claim of a new key or of its holder's Complete, while a
//! Complete with a token the replica did not grant still reads and is
//! refused by the condition. And what a duplicate costs: a read, not
//! another LWT on the key's partition (`engine::existing`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::common::*;
use idemd::proto::v1 as pb;
use idemd::store::cql::CqlStore;
use idemd::store::{
    BackupSummary, CasOutcome, Expected, InsertOutcome, PendingCounts, PendingPage, PendingQuery,
    Record, RecordKey, Store, StoreResult,
};

/// The CQL store, counting the reads and conditional inserts the engine
/// asks for. Every method of [`Store`] is forwarded, defaults included: a
/// default left to the trait would change what the engine does in this
/// test (`has_cluster_clock` once fell back to `false`, so the engine ran
/// without the cluster clock the real store has).
struct CountingReads {
    /// The store under test.
    inner: CqlStore,
    /// Calls of [`Store::get`].
    gets: Arc<AtomicU64>,
    /// Calls of [`Store::insert_if_absent`] (each an LWT).
    inserts: Arc<AtomicU64>,
}

#[async_trait]
impl Store for CountingReads {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn read_before_insert(&self) -> bool {
        self.inner.read_before_insert()
    }
    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(id, now_ms).await
    }
    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        self.inserts.fetch_add(1, Ordering::SeqCst);
        self.inner.insert_if_absent(record, now_ms).await
    }
    async fn import(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        self.inner.import(record, now_ms).await
    }
    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        self.inner.replace_if(record, expected, now_ms).await
    }
    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        self.inner.delete_if(id, expected, now_ms).await
    }
    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        self.inner.list_pending(query, now_ms).await
    }
    fn maintenance_interval(&self) -> Option<Duration> {
        self.inner.maintenance_interval()
    }
    async fn maintain(&self, now_ms: i64) -> StoreResult<()> {
        self.inner.maintain(now_ms).await
    }
    async fn pending_summary(
        &self,
        tenant: &str,
        now_ms: i64,
    ) -> StoreResult<Option<PendingCounts>> {
        self.inner.pending_summary(tenant, now_ms).await
    }
    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        self.inner.cluster_time_ms().await
    }
    fn has_cluster_clock(&self) -> bool {
        self.inner.has_cluster_clock()
    }
    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        self.inner.sweep_expired(now_ms, max_records).await
    }
    async fn backup(
        &self,
        to: &std::path::Path,
        progress: Arc<dyn Fn(u64) + Send + Sync>,
    ) -> StoreResult<BackupSummary> {
        self.inner.backup(to, progress).await
    }
    fn damage(&self) -> Option<String> {
        self.inner.damage()
    }
    async fn close(&self) -> StoreResult<()> {
        self.inner.close().await
    }
}

/// A server on the CQL store whose reads and conditional inserts are
/// counted.
async fn counting_server() -> (TestServer, Arc<AtomicU64>, Arc<AtomicU64>) {
    let options = crate::cql_support::migrated_options().await;
    let (gets, inserts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (counted_gets, counted_inserts) = (gets.clone(), inserts.clone());
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    let factory: StoreFactory = Box::pin(async move {
        let store: Arc<dyn Store> = Arc::new(CountingReads {
            inner: CqlStore::open(&options).await?,
            gets: counted_gets,
            inserts: counted_inserts,
        });
        Ok(store)
    });
    let server = TestServer::start(dir, settings, Some(factory)).await;
    (server, gets, inserts)
}

/// A Complete of `key` by `tenant` with `lease_token`, storing `body`.
fn complete(
    tenant: &str,
    key: &str,
    lease_token: &str,
    body: &str,
) -> tonic::Request<pb::CompleteRequest> {
    as_tenant(
        tenant,
        pb::CompleteRequest {
            endpoint: PAYMENTS.into(),
            key: key.into(),
            lease_token: lease_token.into(),
            response: Some(sample_response(body)),
        },
    )
}

/// Fresh pairs read nothing; a forged lease token is read and refused.
/// Fails if the CQL store asks for a read before its insert
/// (`read_before_insert`) or the engine reads before the holder's update
/// (`engine::granted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_pair_reads_nothing_and_a_forged_token_is_still_refused() {
    let (mut server, gets, _) = counting_server().await;
    let tenant = "round-trips";
    let run = std::process::id();
    for i in 0..20 {
        let key = format!("fresh-{run}-{i}");
        let answer = server
            .client
            .claim(as_tenant(tenant, claim(PAYMENTS, &key, 10)))
            .await
            .expect("claim")
            .into_inner();
        let lease = claimed(&answer);
        server
            .client
            .complete(complete(tenant, &key, &lease.lease_token, "ok"))
            .await
            .expect("complete");
    }
    assert_eq!(
        gets.load(Ordering::SeqCst),
        0,
        "store reads on the reply path of 20 fresh pairs"
    );

    let key = format!("forged-{run}");
    let answer = server
        .client
        .claim(as_tenant(tenant, claim(PAYMENTS, &key, 10)))
        .await
        .expect("claim")
        .into_inner();
    let _held = claimed(&answer);
    let refused = server
        .client
        .complete(complete(tenant, &key, "not-the-granted-token", "forged"))
        .await
        .expect_err("a forged token must be refused");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        gets.load(Ordering::SeqCst) >= 1,
        "a token this replica did not grant is checked against the stored record"
    );
}

/// Duplicates of an in-flight key, polled as clients do (409 + Retry-After)
/// and waiting server-side, cost reads, not LWTs on the key's partition:
/// each LWT bumps the partition's Paxos ballot, and a crowd of them starved
/// the holder's Complete. Fails without `engine::existing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_of_an_in_flight_key_cost_reads_not_lwts() {
    let (mut server, gets, inserts) = counting_server().await;
    let tenant = "round-trips";
    let key = format!("duplicated-{}", std::process::id());
    let answer = server
        .client
        .claim(as_tenant(tenant, claim(PAYMENTS, &key, 10)))
        .await
        .expect("claim")
        .into_inner();
    let lease = claimed(&answer);
    for _ in 0..20 {
        let answer = server
            .client
            .claim(as_tenant(tenant, claim(PAYMENTS, &key, 10)))
            .await
            .expect("duplicate claim")
            .into_inner();
        assert!(
            matches!(
                answer.outcome,
                Some(pb::claim_response::Outcome::InProgress(_))
            ),
            "{answer:?}"
        );
    }
    let mut waiting = claim(PAYMENTS, &key, 10);
    waiting.wait = Some(dur(Duration::from_secs(5)));
    let mut waiter = server.client.clone();
    let waited = tokio::spawn(async move { waiter.claim(as_tenant(tenant, waiting)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server
        .client
        .complete(complete(tenant, &key, &lease.lease_token, "ok"))
        .await
        .expect("the holder's Complete");
    let waited = waited
        .await
        .expect("waiter")
        .expect("waiting claim")
        .into_inner();
    assert!(
        matches!(
            waited.outcome,
            Some(pb::claim_response::Outcome::Replayed(_))
        ),
        "{waited:?}"
    );
    assert_eq!(
        inserts.load(Ordering::SeqCst),
        1,
        "LWT inserts: the holder's only, none for 21 duplicates"
    );
    assert!(
        gets.load(Ordering::SeqCst) >= 21,
        "each duplicate read the key instead"
    );
}
