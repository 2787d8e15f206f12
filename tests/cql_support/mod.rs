//! Connection to the test CQL cluster that `make test` starts with
//! `scripts/cassandra.sh` (Apache Cassandra 5.0 from Maven Central jars,
//! standing in for ScyllaDB). The cluster's contact points come from
//! `IDEMD_TEST_CQL_NODES` (default `127.0.0.1:9042`); every test binary
//! migrates one shared keyspace once, and tests keep apart by unique tenants
//! and keys.
#![allow(dead_code)]

use std::time::Duration;

use idemd::store::cql::{CqlOptions, migrate};

/// Keyspace shared by the CQL test binaries.
pub const TEST_KEYSPACE: &str = "idemd_test";

/// Contact points of the test cluster.
pub fn nodes() -> Vec<String> {
    std::env::var("IDEMD_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:9042".to_string())
        .split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// Options for the shared test keyspace.
pub fn options() -> CqlOptions {
    let mut options = CqlOptions::local(TEST_KEYSPACE);
    options.nodes = nodes();
    options.request_timeout = Duration::from_secs(10);
    options
}

static MIGRATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Options for the shared keyspace, migrated (once per test binary).
pub async fn migrated_options() -> CqlOptions {
    let options = options();
    if MIGRATED.get().is_none() {
        // Each test has its own runtime; migrate on a dedicated thread with
        // its own runtime so no test's runtime owns the session.
        let for_thread = options.clone();
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime
                .block_on(migrate::run(
                    &for_thread,
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}",
                    "tests",
                ))
                .expect(
                    "migrations apply to the test cluster (is it running? make test starts it)",
                );
        })
        .await
        .expect("migration thread");
        let _ = MIGRATED.set(());
    }
    options
}

/// Options for a keyspace of the caller's own (`name`), migrated: for tests
/// whose writes must not meet the others' (a cut-over marks its whole
/// keyspace, store::cql::cutover).
#[allow(dead_code)] // not every test binary that includes this module uses it
pub async fn own_keyspace(name: &str) -> CqlOptions {
    let mut options = options();
    options.keyspace = format!("idemd_{name}");
    migrate::run(
        &options,
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        "tests",
    )
    .await
    .expect("migrate a keyspace of the test's own");
    options
}

/// A [`crate::common::Starter`] on the CQL backend (a fresh migrated
/// keyspace per server).
pub async fn start_cql(hook: crate::common::SettingsHook) -> crate::common::TestServer {
    let options = migrated_options().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = crate::common::test_settings(dir.path());
    settings.store = idemd::config::StoreSettings::Cql(options.clone());
    hook(&mut settings);
    let factory: crate::common::StoreFactory = Box::pin(async move {
        let store: std::sync::Arc<dyn idemd::store::Store> =
            std::sync::Arc::new(idemd::store::cql::CqlStore::open(&options).await?);
        Ok(store)
    });
    crate::common::TestServer::start(dir, settings, Some(factory)).await
}

/// The `idemd` flags that serve `keyspace` of the test cluster.
pub fn cql_flags(keyspace: &str) -> Vec<String> {
    vec![
        "--store".into(),
        "cql".into(),
        "--cql-nodes".into(),
        nodes().join(","),
        "--keyspace".into(),
        keyspace.into(),
    ]
}

/// What one contender saw for its key ([`contend`]).
#[derive(Debug)]
pub enum Seen {
    /// It won and stored the response of this id (`sample_response`).
    Won(String),
    /// It was replayed this body.
    Replayed(Vec<u8>),
}

/// Appends `what` to `heard` unless it repeats the last entry.
fn note(heard: &mut Vec<String>, what: String) {
    if heard.last() != Some(&what) {
        heard.push(what);
    }
}

/// How long a contender's lease lasts: a claim whose answer was lost
/// (`UNAVAILABLE` with the outcome unknown, e.g. a Paxos round that timed
/// out and could not be resolved under load) may have been applied, and
/// then nobody holds the key but its lease; it runs out after this.
const CONTENDER_LEASE: Duration = Duration::from_secs(15);

/// Claims `key` of `tenant` until it either wins (then completes with a
/// response naming `me`) or is replayed; waits out holders in progress and
/// retries `UNAVAILABLE`. A key whose lease ran out with nobody completing
/// it (a claim applied although its caller heard `UNAVAILABLE`: the
/// contract's uncertain outcome) is pending, and the caller takes it over
/// by Reconcile, as an operator would: the fenced-out lease belongs to a
/// caller that never ran. The multi-replica tests' careful caller.
pub async fn contend(
    mut client: idemd::proto::v1::idempotency_client::IdempotencyClient<tonic::transport::Channel>,
    tenant: String,
    key: String,
    me: String,
) -> Seen {
    use crate::common::{PAYMENTS, as_tenant, claim, dur, sample_response};
    use idemd::proto::v1 as pb;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    // What this caller heard, for the message if it never settles.
    let mut heard: Vec<String> = Vec::new();
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "{me}: {key} never settled; it heard (oldest first, repeats folded): {heard:?}"
        );
        let mut request = claim(PAYMENTS, &key, 7);
        request.lease = Some(dur(CONTENDER_LEASE));
        let answer = match client.claim(as_tenant(&tenant, request)).await {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                note(&mut heard, format!("UNAVAILABLE: {}", status.message()));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(status) => panic!("{me}: claim {key}: {status}"),
        };
        let won = match &answer.outcome {
            Some(pb::claim_response::Outcome::Claimed(claimed)) => Some(claimed.clone()),
            Some(pb::claim_response::Outcome::Replayed(replayed)) => {
                let body = replayed.response.as_ref().map(|r| r.body.clone());
                return Seen::Replayed(body.unwrap_or_default());
            }
            Some(pb::claim_response::Outcome::InProgress(held)) => {
                note(
                    &mut heard,
                    format!("in progress, lease until {:?}", held.lease_expires_at),
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                None
            }
            Some(pb::claim_response::Outcome::Pending(pending))
                if pending.state == pb::State::InProgress as i32 =>
            {
                note(&mut heard, format!("pending: {}", pending.reason));
                let takeover = pb::ReconcileRequest {
                    endpoint: PAYMENTS.into(),
                    key: key.clone(),
                    verdict: Some(pb::reconcile_request::Verdict::Takeover(pb::Takeover {
                        lease: Some(dur(CONTENDER_LEASE)),
                    })),
                };
                match client.reconcile(as_tenant(&tenant, takeover)).await {
                    Ok(answer) => answer.into_inner().takeover,
                    // Another contender took it over first, or the answer
                    // was lost: claim again.
                    Err(status) => {
                        note(&mut heard, format!("takeover refused: {status}"));
                        None
                    }
                }
            }
            other => panic!("{me}: claim {key}: unexpected {other:?}"),
        };
        if let Some(claimed) = won {
            let id = format!("{key}-{me}");
            let complete = pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.clone(),
                lease_token: claimed.lease_token.clone(),
                response: Some(sample_response(&id)),
            };
            // A Complete answered UNAVAILABLE (the write's outcome unknown:
            // a Paxos round that timed out on a loaded machine) is resolved
            // as idemd's answer says, by the same call again: if the first
            // was applied, the same response again is a success. (CI failed
            // quorum_gives_one_winner_per_key_across_both_datacenters once
            // on such an answer, which this caller used to take as fatal.)
            loop {
                match client.complete(as_tenant(&tenant, complete.clone())).await {
                    Ok(_) => return Seen::Won(id),
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        note(
                            &mut heard,
                            format!("complete UNAVAILABLE: {}", status.message()),
                        );
                        assert!(
                            std::time::Instant::now() < deadline,
                            "{me}: complete {key} never settled; it heard (oldest first, repeats folded): {heard:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(status) => panic!("{me}: complete {key}: {status}"),
                }
            }
        }
    }
}
