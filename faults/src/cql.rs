//! The CQL scenarios: a 3-node Cassandra cluster (`scripts/cassandra.sh`,
//! keyspace RF 3) under two idemd replicas, with faults injected into
//! Cassandra nodes and into one replica. Only in the full profile: the
//! cluster takes ~15 s to start and each node restart ~10 s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::history::Verdict;
use crate::scenarios::{Report, Run};
use crate::server::Server;
use crate::workload::Load;

/// Nodes of the test cluster (node I listens on 127.0.0.I:9042 unless
/// placed elsewhere: [`Placement`]).
pub const NODES: usize = 3;

/// Where the nodes run.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Node I's address: this with `%s` replaced by I
    /// (`IDEMD_CASSANDRA_ADDRESS_FORMAT`).
    pub address_format: String,
    /// Node I runs in the network namespace `<dir>/nodeI`
    /// (`IDEMD_CASSANDRA_NETNS_DIR`); `None`: in this one.
    pub netns_dir: Option<PathBuf>,
}

impl Placement {
    /// Node I on 127.0.0.I, here.
    pub fn loopback() -> Self {
        Self {
            address_format: "127.0.0.%s".into(),
            netns_dir: None,
        }
    }

    /// Node `i`'s address.
    pub fn address(&self, i: usize) -> String {
        self.address_format.replace("%s", &i.to_string())
    }
}

/// The test cluster, driven through `scripts/cassandra.sh`.
pub struct Cluster {
    /// `scripts/cassandra.sh`.
    script: PathBuf,
    /// The nodes' `commitlog_sync` (`IDEMD_CASSANDRA_COMMITLOG_SYNC`).
    commitlog_sync: String,
    /// Where the nodes run.
    placement: Placement,
    /// `idemd` flags that point at the cluster and the keyspace.
    flags: Vec<String>,
}

impl Cluster {
    async fn run(
        script: &Path,
        commitlog_sync: &str,
        placement: &Placement,
        args: &[&str],
    ) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::new("bash");
        if let Some(dir) = &placement.netns_dir {
            command.env("IDEMD_CASSANDRA_NETNS_DIR", dir);
        }
        let status = command
            .arg(script)
            .args(args)
            // Every node is SIGKILLed at once in cql-cluster-restart: with
            // a periodic commit log each node loses its last ~100 ms of
            // writes, acknowledged LWTs included, which no client can
            // survive. Per-write sync (`batch`, the default) is what
            // docs/scylla.md tells Cassandra users to run for that failure
            // (ScyllaDB syncs LWTs before acknowledging whatever the
            // setting); `periodic` is there to measure what it loses.
            .env("IDEMD_CASSANDRA_COMMITLOG_SYNC", commitlog_sync)
            .env("IDEMD_CASSANDRA_ADDRESS_FORMAT", &placement.address_format)
            .status()
            .await
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() {
            bail!("{} {} failed: {status}", script.display(), args.join(" "));
        }
        Ok(())
    }

    /// Starts a fresh 3-node cluster with `commitlog_sync`, placed as
    /// `placement` says, and creates `keyspace` with RF 3.
    pub async fn start(
        script: &Path,
        commitlog_sync: &str,
        placement: Placement,
        bin: &Path,
        keyspace: &str,
    ) -> anyhow::Result<Self> {
        Self::run(
            script,
            commitlog_sync,
            &placement,
            &["start", "--nodes", "3"],
        )
        .await?;
        let nodes: Vec<String> = (1..=NODES)
            .map(|i| format!("{}:9042", placement.address(i)))
            .collect();
        let nodes = nodes.join(",");
        let status = tokio::process::Command::new(bin)
            .args(["migrate", "--cql-nodes", &nodes, "--keyspace", keyspace])
            .args([
                "--replication",
                "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            ])
            .status()
            .await?;
        if !status.success() {
            bail!("idemd migrate failed: {status}");
        }
        Ok(Self {
            script: script.to_path_buf(),
            commitlog_sync: commitlog_sync.to_string(),
            placement,
            flags: [
                "--store",
                "cql",
                "--cql-nodes",
                &nodes,
                "--keyspace",
                keyspace,
                "--cql-request-timeout",
                "2s",
            ]
            .map(str::to_string)
            .to_vec(),
        })
    }

    /// `kill`, `pause`, `resume` or `restart` node `i`.
    pub async fn node(&self, action: &str, i: usize) -> anyhow::Result<()> {
        Self::run(
            &self.script,
            &self.commitlog_sync,
            &self.placement,
            &[action, &i.to_string()],
        )
        .await
    }

    /// The `idemd` flags that point a replica at this cluster.
    pub fn flags(&self) -> Vec<String> {
        self.flags.clone()
    }

    /// Stops every node.
    pub async fn stop(&self) -> anyhow::Result<()> {
        Self::run(
            &self.script,
            &self.commitlog_sync,
            &self.placement,
            &["stop"],
        )
        .await
    }

    /// Two idemd replicas on this cluster.
    async fn run_two(&self, bin: &Path, load: &Load, log_dir: &Path) -> anyhow::Result<Run> {
        let dir = tempfile::tempdir()?;
        let servers = (0..2)
            .map(|i| {
                Server::new(
                    bin,
                    &dir.path().join(format!("replica-{i}")),
                    log_dir,
                    self.flags.clone(),
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Run::start_with(servers, load, dir).await
    }
}

/// Non-OK answers over all answers in `phases`, from the verdict's counts.
pub fn error_rate(verdict: &Verdict, phases: &[&str]) -> f64 {
    let (mut errors, mut all) = (0u64, 0u64);
    for phase in phases {
        for (code, n) in verdict.statuses.get(*phase).into_iter().flatten() {
            all += n;
            if code != "ok" {
                errors += n;
            }
        }
    }
    if all == 0 {
        0.0
    } else {
        errors as f64 / all as f64
    }
}

/// Waits until `ok` (a count of successful calls) grows; the time since
/// `since` that took, at most `limit`.
async fn until_calls_succeed(
    ok: impl Fn() -> u64,
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let mut seen = ok();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = ok();
        if now > seen {
            return Ok(since.elapsed());
        }
        seen = now;
        if since.elapsed() > limit {
            bail!("no call succeeded within {} s", limit.as_secs());
        }
    }
}

/// How long after `since` a call succeeded again (in ms, at most 30 s),
/// or a note that none did: through any of `run`'s replicas, or through
/// `replica` only.
pub async fn recovery(
    run: &Run,
    since: Instant,
    replica: Option<usize>,
) -> (Vec<u64>, Vec<String>) {
    let ok = || match replica {
        Some(replica) => run.history.ok_count_via(replica),
        None => run.history.ok_count(),
    };
    match until_calls_succeed(ok, since, Duration::from_secs(30)).await {
        Ok(took) => (
            vec![u64::try_from(took.as_millis()).unwrap_or(u64::MAX)],
            Vec::new(),
        ),
        Err(error) => (Vec::new(), vec![error.to_string()]),
    }
}

/// One Cassandra node killed under load and restarted from its data, then
/// one idemd replica killed and restarted: errors at most 1% of calls.
pub async fn node_kill(
    cluster: &Cluster,
    bin: &Path,
    load: &Load,
    log_dir: &Path,
) -> anyhow::Result<Report> {
    let mut run = cluster.run_two(bin, load, log_dir).await?;
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
            vec![u64::try_from(restart.as_millis()).unwrap_or(u64::MAX)],
            Vec::new(),
            false,
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
pub async fn node_pause(
    cluster: &Cluster,
    bin: &Path,
    load: &Load,
    log_dir: &Path,
) -> anyhow::Result<Report> {
    let run = cluster.run_two(bin, load, log_dir).await?;
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
            false,
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
    if report.recovery_ms.is_empty() {
        report
            .verdict
            .unexpected
            .push("calls did not succeed within 30 s of the resume".into());
    }
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
    nodes: &[usize],
    bin: &Path,
    load: &Load,
    log_dir: &Path,
) -> anyhow::Result<Report> {
    let run = cluster.run_two(bin, load, log_dir).await?;
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
        .finish(name, injected.into(), recovery_ms, notes, false)
        .await?;
    if report.recovery_ms.is_empty() {
        report
            .verdict
            .unexpected
            .push("calls did not succeed within 30 s of the quorum returning".into());
    }
    Ok(report)
}
