//! `cql-clock-skew`: one of two idemd replicas runs with its wall clock
//! moved (libfaketime), under `on_expired_lease = "takeover"`.
//!
//! Leases are judged on each replica's clock. Holders claim through the
//! replica on time with a 4 s lease and work 2.5 s before they complete;
//! meanwhile contenders claim the same keys through the skewed replica
//! every 200 ms. A replica 3 s ahead sees each lease expire 1 s after it
//! was granted and, unchecked, hands the key to a contender while the
//! holder still works: two executions. Then the roles swap (holders on the
//! skewed replica, 3 s behind, whose leases end 3 s early for everyone
//! else; contenders on the replica on time). The checker is the suite's:
//! every `claimed` answer of a key carries one lease token, and every
//! acknowledged Complete replays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::transport::Channel;

use crate::harness::history::{DataLoss, History, response_body};
use crate::harness::report::Report;
use crate::harness::run::Setup;
use crate::harness::workload::{claim_request, finals};
use crate::plumbing::cluster::Cluster;
use crate::plumbing::grpc::{ENDPOINT, channel, request};
use crate::plumbing::server::Server;

/// How far the skewed replica's clock is moved: more than half the lease.
const SKEW: Duration = Duration::from_secs(3);
/// The holders' lease.
const LEASE: Duration = Duration::from_secs(4);
/// How long a holder works before it completes: well inside its lease.
const WORK: Duration = Duration::from_millis(2_500);
/// Holders (and as many contenders) at once.
const WORKERS: usize = 6;
/// How long each direction runs.
const RUN_FOR: Duration = Duration::from_secs(12);

/// Which way the skewed replica's clock is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// [`SKEW`] ahead: holders on the replica on time, contenders on the
    /// skewed one, which sees their leases end early.
    Ahead,
    /// [`SKEW`] behind: holders on the skewed replica, whose leases end
    /// early for everyone else; contenders on the replica on time.
    Behind,
}

impl Direction {
    /// The direction in the scenario's name and keys.
    fn name(self) -> &'static str {
        match self {
            Direction::Ahead => "ahead",
            Direction::Behind => "behind",
        }
    }

    /// `FAKETIME`'s sign.
    fn sign(self) -> &'static str {
        match self {
            Direction::Ahead => "+",
            Direction::Behind => "-",
        }
    }
}

/// Where Debian's `faketime` package puts the library
/// (`scripts/test-deps.sh` installs it).
fn libfaketime() -> anyhow::Result<PathBuf> {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ] {
        let path = Path::new(dir).join("faketime/libfaketime.so.1");
        if path.exists() {
            return Ok(path);
        }
    }
    bail!("libfaketime.so.1 not found: install Debian's faketime package (scripts/test-deps.sh)")
}

/// Runs both directions on `cluster`; one report each. The scenario runs
/// workers of its own (holders and contenders), not `setup`'s load.
pub async fn clock_skew(cluster: &Cluster, setup: &Setup<'_>) -> anyhow::Result<Vec<Report>> {
    let library = libfaketime()?;
    let mut reports = Vec::new();
    for direction in [Direction::Ahead, Direction::Behind] {
        reports.push(one_direction(cluster, setup, &library, direction).await?);
    }
    Ok(reports)
}

/// One direction: the two replicas, the skew checked, the holders and
/// contenders until [`RUN_FOR`] is up, then the checker.
async fn one_direction(
    cluster: &Cluster,
    setup: &Setup<'_>,
    library: &Path,
    direction: Direction,
) -> anyhow::Result<Report> {
    let (bin, log_dir) = (setup.bin, setup.log_dir);
    let ahead = direction == Direction::Ahead;
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("idemd.toml");
    std::fs::write(
        &config,
        format!("[endpoints.\"{ENDPOINT}\"]\non_expired_lease = \"takeover\"\n"),
    )?;
    let mut flags = cluster.flags();
    flags.extend(["--config".to_string(), config.display().to_string()]);
    let sign = direction.sign();
    let mut on_time = Server::new(bin, &dir.path().join("on-time"), log_dir, flags.clone())?;
    let mut skewed = Server::new(bin, &dir.path().join("skewed"), log_dir, flags)?.wrapped(vec![
        "env".into(),
        format!("LD_PRELOAD={}", library.display()),
        format!("FAKETIME={sign}{}s", SKEW.as_secs()),
        // Timers and timeouts keep real time; only the wall clock moves.
        "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
        "FAKETIME_NO_CACHE=1".into(),
    ]);
    on_time.start().await?;
    skewed.start().await?;
    let (holders_at, contenders_at) = if ahead {
        (on_time.address.clone(), skewed.address.clone())
    } else {
        (skewed.address.clone(), on_time.address.clone())
    };
    let history = Arc::new(History::default());
    history.phase("skewed");
    let mut notes = vec![check_the_skew(&skewed.address, direction).await?];
    let deadline = Instant::now() + RUN_FOR;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let history = Arc::clone(&history);
        let holders = IdempotencyClient::new(channel(&holders_at, Duration::from_secs(3))?);
        let contenders = IdempotencyClient::new(channel(&contenders_at, Duration::from_secs(3))?);
        let prefix = format!("skew-{}-{worker}", direction.name());
        workers.spawn(hold_and_contend(
            holders, contenders, history, prefix, deadline,
        ));
    }
    while let Some(result) = workers.join_next().await {
        result??;
    }
    history.phase("check");
    let finals = finals(&on_time.address, &history).await?;
    let verdict = history.verdict(&finals, DataLoss::IsLoss);
    let takeovers = verdict
        .statuses
        .get("skewed")
        .and_then(|codes| codes.get("contender claimed"))
        .copied()
        .unwrap_or(0);
    notes.push(format!(
        "contenders through the replica {} took a live lease over {takeovers} times",
        if ahead { "ahead" } else { "on time" }
    ));
    let _ = on_time.stop().await;
    let _ = skewed.stop().await;
    Ok(Report {
        scenario: format!("cql-clock-skew-{}", direction.name()),
        injected: format!(
            "one of two replicas with its wall clock {sign}{} s (libfaketime), takeover policy, {} s leases held {} ms; holders on the {} replica, contenders on the other",
            SKEW.as_secs(),
            LEASE.as_secs(),
            WORK.as_millis(),
            if ahead { "on-time" } else { "skewed" },
        ),
        verdict,
        recovery_ms: Vec::new(),
        notes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Proves the skew is in effect: the lease the skewed replica grants ends
/// `LEASE ± SKEW` from this process's clock. A replica that refuses to
/// grant (its clock is off, as it should) is retried; a refusal is itself
/// the evidence, reported as such.
async fn check_the_skew(address: &str, direction: Direction) -> anyhow::Result<String> {
    let mut client = IdempotencyClient::new(channel(address, Duration::from_secs(3))?);
    let key = format!("skew-probe-{}", std::process::id());
    let mut claim = claim_request(&key, "probe");
    claim.lease = Some(prost_types::Duration {
        seconds: 60,
        nanos: 0,
    });
    match client.claim(request(claim)).await {
        Ok(answer) => {
            let Some(pb::claim_response::Outcome::Claimed(lease)) = answer.into_inner().outcome
            else {
                bail!("the probe claim on the skewed replica was not granted");
            };
            let ends = lease.lease_expires_at.map_or(0, |t| t.seconds * 1000);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis();
            let skew = ends - i64::try_from(now)? - 60_000;
            let expected = match direction {
                Direction::Ahead => 3_000,
                Direction::Behind => -3_000,
            };
            if (skew - expected).abs() > 1_500 {
                bail!(
                    "the skewed replica's clock is {skew} ms off, not {expected}: libfaketime did not apply"
                );
            }
            Ok(format!(
                "the skewed replica granted a lease on a clock {skew} ms off (unchecked)"
            ))
        }
        Err(status) if status.message().contains("clock") => Ok(format!(
            "the skewed replica refused to grant a lease: {}",
            status.message()
        )),
        Err(status) => Err(status).context("probe claim on the skewed replica"),
    }
}

/// One worker: claims a fresh key through `holders`, then while it works
/// (`WORK`) claims the same key through `contenders` every 200 ms, then
/// completes; until `deadline`.
async fn hold_and_contend(
    mut holders: IdempotencyClient<Channel>,
    mut contenders: IdempotencyClient<Channel>,
    history: Arc<History>,
    prefix: String,
    deadline: Instant,
) -> anyhow::Result<()> {
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let key = format!("{prefix}-{n}");
        let mut claim = claim_request(&key, "holder");
        claim.lease = Some(prost_types::Duration {
            seconds: i64::try_from(LEASE.as_secs())?,
            nanos: 0,
        });
        let token = match holders.claim(request(claim)).await {
            Ok(answer) => match answer.into_inner().outcome {
                Some(pb::claim_response::Outcome::Claimed(lease)) => lease.lease_token,
                other => bail!("a fresh key was not granted: {other:?}"),
            },
            Err(status) => {
                // A skewed holder replica refusing to grant is the fix at
                // work; anything else is a failure of the run.
                history.status(&format!("holder {:?}", status.code()));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        history.claimed(&key, &token);
        let working = Instant::now();
        let mut attempt = 0;
        while working.elapsed() < WORK {
            tokio::time::sleep(Duration::from_millis(200)).await;
            attempt += 1;
            let mut contend = claim_request(&key, &format!("contender-{attempt}"));
            contend.lease = Some(prost_types::Duration {
                seconds: i64::try_from(LEASE.as_secs())?,
                nanos: 0,
            });
            match contenders.claim(request(contend)).await {
                Ok(answer) => match answer.into_inner().outcome {
                    Some(pb::claim_response::Outcome::Claimed(lease)) => {
                        history.status("contender claimed");
                        history.claimed(&key, &lease.lease_token);
                    }
                    Some(pb::claim_response::Outcome::InProgress(_)) => {
                        history.status("contender in_progress");
                    }
                    other => history.status(&format!("contender {other:?}")),
                },
                Err(status) => history.status(&format!("contender {:?}", status.code())),
            }
        }
        let body = response_body(&key, &token);
        let complete = pb::CompleteRequest {
            endpoint: ENDPOINT.to_string(),
            key: key.clone(),
            lease_token: token.clone(),
            response: Some(pb::StoredResponse {
                status: 201,
                headers: Vec::new(),
                body: body.clone(),
                ..Default::default()
            }),
        };
        match holders.complete(request(complete)).await {
            Ok(_) => {
                history.status("holder completed");
                history.acked(&key, &body);
            }
            // Fenced out by a takeover: the double execution the checker
            // reports from the two tokens.
            Err(status) => history.status(&format!("holder complete {:?}", status.code())),
        }
    }
    Ok(())
}
