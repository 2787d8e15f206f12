//! The CQL scenarios: the 3-node Cassandra cluster (`plumbing::cluster`)
//! under two idemd replicas, with faults injected into Cassandra nodes and
//! into one replica. Only in the full profile: each node restart takes
//! ~10 s.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;

use crate::harness::judge::{error_rate, recovery, require_recovery};
use crate::harness::report::{Report, millis};
use crate::harness::run::{Run, Setup};
use crate::plumbing::cluster::{Cluster, NODES};
use crate::plumbing::grpc::{channel, request};
use crate::plumbing::server::Server;

/// Two idemd replicas on `cluster`, the clients spread over both.
async fn two_replicas(cluster: &Cluster, setup: &Setup<'_>) -> anyhow::Result<Run> {
    replicas_of(cluster, setup, [setup.bin, setup.bin]).await
}

/// Two idemd replicas of the given binaries on `cluster`, the clients
/// spread over both.
async fn replicas_of(
    cluster: &Cluster,
    setup: &Setup<'_>,
    bins: [&Path; 2],
) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let servers = bins
        .into_iter()
        .enumerate()
        .map(|(i, bin)| {
            Server::new(
                bin,
                &dir.path().join(format!("replica-{i}")),
                setup.log_dir,
                cluster.flags(),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Run::start_with(servers, &setup.load, dir).await
}

/// One Cassandra node killed under load and restarted from its data, then
/// one idemd replica killed and restarted: errors at most 1% of calls.
pub async fn node_kill(cluster: &Cluster, setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = two_replicas(cluster, setup).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("node-down");
    cluster.node("kill", 3).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    run.history.phase("node-back");
    cluster.node("restart", 3).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("replica-down");
    run.servers[1].kill9().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let restart = run.servers[1].start().await?;
    run.history.phase("load");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut report = run
        .finish(
            "cql-node-kill",
            "SIGKILL of Cassandra node 3 for 5 s, restart from its data; then SIGKILL of one of two idemd replicas".into(),
            vec![millis(restart)],
            Vec::new(),
        )
        .await?;
    let rate = error_rate(&report.verdict, &["node-down", "node-back"]);
    report.notes.push(format!(
        "errors while node 3 was down or coming back: {:.2}% of calls",
        rate * 100.0
    ));
    if rate > 0.01 {
        report.verdict.unexpected.push(format!(
            "{:.2}% of calls failed with one node down (at most 1%)",
            rate * 100.0
        ));
    }
    Ok(report)
}

/// Cassandra node 3 stopped with `SIGSTOP` for [`PAUSE`] (four request
/// timeouts: alive to the kernel, so connections stay open and requests
/// sent to it go unanswered, as in a long GC pause or a stalled VM), then
/// resumed: the two other nodes keep a quorum throughout, so no wrong
/// answer, and calls succeed again within 30 s of the resume. The error
/// rate while paused is reported, and bounded by [`PAUSE_MAX_ERRORS`].
pub async fn node_pause(cluster: &Cluster, setup: &Setup<'_>) -> anyhow::Result<Report> {
    let run = two_replicas(cluster, setup).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("paused");
    cluster.node("pause", 3).await?;
    tokio::time::sleep(PAUSE).await;
    cluster.node("resume", 3).await?;
    let resumed = Instant::now();
    run.history.phase("resumed");
    let (recovery_ms, notes) = recovery(&run, resumed, None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("load");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut report = run
        .finish(
            "cql-node-pause",
            format!(
                "SIGSTOP of Cassandra node 3 for {} s (request timeout 2 s), then SIGCONT",
                PAUSE.as_secs()
            ),
            recovery_ms,
            notes,
        )
        .await?;
    let paused = error_rate(&report.verdict, &["paused"]);
    report.notes.push(format!(
        "errors while node 3 was paused: {:.2}% of calls",
        paused * 100.0
    ));
    if paused > PAUSE_MAX_ERRORS {
        report.verdict.unexpected.push(format!(
            "{:.2}% of calls failed with one node of three paused (at most {:.0}%)",
            paused * 100.0,
            PAUSE_MAX_ERRORS * 100.0
        ));
    }
    require_recovery(
        &mut report,
        "calls did not succeed within 30 s of the resume",
    );
    Ok(report)
}

/// How long `cql-node-pause` keeps node 3 stopped.
const PAUSE: Duration = Duration::from_secs(8);

/// The share of calls that may fail while one node of three is paused.
const PAUSE_MAX_ERRORS: f64 = 0.05;

/// `nodes` killed (2 and 3: no quorum; all three: the whole cluster), then
/// restarted from their data: while the quorum is gone only retryable
/// errors, never a wrong answer; calls succeed again within 30 s of the
/// quorum returning.
pub async fn quorum_loss(
    cluster: &Cluster,
    setup: &Setup<'_>,
    nodes: &[usize],
) -> anyhow::Result<Report> {
    let run = two_replicas(cluster, setup).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("no-quorum");
    for node in nodes {
        cluster.node("kill", *node).await?;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The quorum returns with the second node back, before the last one.
    run.history.phase("restarting");
    for node in nodes {
        cluster.node("restart", *node).await?;
    }
    let returned = Instant::now();
    run.history.phase("quorum-back");
    let (recovery_ms, notes) = recovery(&run, returned, None).await;
    run.history.phase("load");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (name, injected) = if nodes.len() == NODES {
        (
            "cql-cluster-restart",
            "SIGKILL of every Cassandra node for 5 s, all restarted from their data",
        )
    } else {
        (
            "cql-quorum-loss",
            "SIGKILL of Cassandra nodes 2 and 3 for 5 s (RF 3: no quorum), both restarted from their data",
        )
    };
    let mut report = run
        .finish(name, injected.into(), recovery_ms, notes)
        .await?;
    require_recovery(
        &mut report,
        "calls did not succeed within 30 s of the quorum returning",
    );
    Ok(report)
}

/// Claims each release leaves stale in `cql-mixed-fleet`.
const STALE_PER_RELEASE: usize = 5;

/// A rolling update under load: replica 0 runs the previous release
/// (`previous`), replica 1 this one, on the keyspace this release migrated,
/// the clients spread over both; each release leaves claims stale (1 s
/// leases nobody completes); then replica 0 is stopped (SIGTERM, as
/// Kubernetes does) and started again with this release's binary on the
/// same address. Checked like every scenario (no key with two holders,
/// nothing acknowledged lost, replays true), and every stale claim,
/// whichever release wrote it, listed by both new replicas within 60 s.
pub async fn mixed_fleet(
    cluster: &Cluster,
    setup: &Setup<'_>,
    previous: &Path,
) -> anyhow::Result<Report> {
    let mut run = replicas_of(cluster, setup, [previous, setup.bin]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stale = leave_stale(&run).await?;
    run.history.phase("mixed");
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.history.phase("upgrading");
    run.servers[0].stop().await?;
    run.servers[0].replace_binary(setup.bin);
    let restart = run.servers[0].start().await?;
    run.history.phase("load");
    let listed_after = stale_listed(&run, &stale).await?;
    let mut report = run
        .finish(
            "cql-mixed-fleet",
            format!(
                "the previous release ({}) and this one serving one keyspace under load, {} \
                 claims left stale by each; then the old replica stopped and replaced by this \
                 release",
                previous.display(),
                STALE_PER_RELEASE
            ),
            vec![millis(restart)],
            Vec::new(),
        )
        .await?;
    match listed_after {
        Ok(after) => report.notes.push(format!(
            "all {} stale claims listed by both new replicas {} ms after the upgrade",
            stale.len(),
            after.as_millis()
        )),
        Err(missing) => report.verdict.unexpected.push(missing),
    }
    Ok(report)
}

/// Claims with a 1 s lease, through each replica, that nobody completes.
async fn leave_stale(run: &Run) -> anyhow::Result<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    for (replica, server) in run.servers.iter().enumerate() {
        let mut client = IdempotencyClient::new(channel(&server.address, Duration::from_secs(3))?);
        for i in 0..STALE_PER_RELEASE {
            let key = format!("stale-{replica}-{i}-{}", std::process::id());
            let mut claim = crate::harness::workload::claim_request(&key, "stale");
            claim.lease = Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            });
            let answer = client.claim(request(claim)).await?.into_inner();
            if !matches!(
                answer.outcome,
                Some(pb::claim_response::Outcome::Claimed(_))
            ) {
                anyhow::bail!("stale claim {key} was not granted: {answer:?}");
            }
            keys.insert(key);
        }
    }
    Ok(keys)
}

/// How long after now both replicas list every key of `stale` (and only
/// stale ones of this run's prefix), or what they list after 60 s.
async fn stale_listed(
    run: &Run,
    stale: &BTreeSet<String>,
) -> anyhow::Result<Result<Duration, String>> {
    let started = Instant::now();
    loop {
        let mut listed = Vec::new();
        for server in &run.servers {
            let mut client =
                IdempotencyClient::new(channel(&server.address, Duration::from_secs(3))?);
            let mut keys = BTreeSet::new();
            let mut page_token = String::new();
            loop {
                let page = match client
                    .list_pending(request(pb::ListPendingRequest {
                        page_token: page_token.clone(),
                        ..Default::default()
                    }))
                    .await
                {
                    Ok(page) => page.into_inner(),
                    Err(_) => break,
                };
                keys.extend(
                    page.records
                        .into_iter()
                        .map(|r| r.key)
                        .filter(|k| k.starts_with("stale-")),
                );
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            listed.push(keys);
        }
        if listed.iter().all(|keys| keys.is_superset(stale)) {
            return Ok(Ok(started.elapsed()));
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Ok(Err(format!(
                "60 s after the upgrade the replicas list {listed:?} of the stale claims {stale:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
