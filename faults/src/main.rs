//! `idemd-faults`: the fault-injection suite (issue 14).
//!
//! Runs idemd (a real process, the embedded store in a temp dir) under
//! careful clients while injecting one fault per scenario, heals it, and
//! checks the history with one checker (`harness::history`): no key with two
//! holders, nothing acknowledged lost, no claim lost, replays true, every
//! call answered once healed. `make faults` runs the full profile; the short
//! profile is part of `make test`. Results and what each scenario checks:
//! docs/reliability.md.
//!
//! # Layout
//!
//! Three layers, each using only the ones below it: `scenarios` inject
//! faults, the `harness` runs and judges, the `plumbing` acts on the world.
//!
//! * `scenarios::embedded`: the embedded store's faults (kill -9, SIGSTOP,
//!   a torn log, damaged pages, a full disk).
//! * `scenarios::cql`: Cassandra nodes killed, paused, the quorum lost, the
//!   whole cluster restarted, under two replicas; the previous release and
//!   this one serving together through a rolling update (full profile
//!   only).
//! * `scenarios::skew`: one of two replicas on the cluster with its wall
//!   clock moved (libfaketime), leases taken over.
//! * `scenarios::partition`: links cut between the nodes and the replicas,
//!   on a network of the suite's own.
//! * `harness::run`: one scenario's run: servers up, clients on, heal,
//!   final reads, verdict.
//! * `harness::workload`: the careful client, run by many workers.
//! * `harness::history`: what the clients saw, and the checker.
//! * `harness::judge`: error rates and recovery times scenarios bound.
//! * `harness::report`: the profile, and a scenario's report, printed and
//!   written as JSON.
//! * `plumbing::server`: an idemd process, started, killed, paused,
//!   restarted.
//! * `plumbing::grpc`: the suite's tenant, endpoint and channels.
//! * `plumbing::cluster`: the Cassandra test cluster (`scripts/cassandra.sh`).
//! * `plumbing::namespace`: namespaces held open by an anchor process, and
//!   commands run in them.
//! * `plumbing::disk`: a tmpfs in a mount namespace of its own (the full
//!   disk).
//! * `plumbing::network`: the partitions' network: a namespace per member,
//!   veth links, cuts with nftables.

mod harness;
mod plumbing;
mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;

use harness::report::{Profile, Report};
use harness::run::Setup;
use harness::workload::Load;
use plumbing::cluster::{Cluster, ClusterSpec, Placement};
use scenarios::{cql, cutover, embedded, image, partition, resize, restore, skew};

/// Command line of `idemd-faults`.
#[derive(Debug, Parser)]
#[command(name = "idemd-faults", about = "Fault-injection suite for idemd")]
struct Args {
    /// `short` (seconds, inside `make test`) or `full` (`make faults`).
    #[arg(long, value_enum, default_value_t = Profile::Short)]
    profile: Profile,
    /// The idemd binary under test.
    #[arg(long)]
    idemd_bin: PathBuf,
    /// Only these scenarios (kill9, pause, torn-wal, corrupt-page,
    /// damage-unscrubbed, backup-restore, restore-guard, disk-image, resize-kill, full-disk, cql-node-kill, cql-node-pause, cql-quorum-loss, cutover,
    /// cql-cluster-restart, cql-clock-skew, cql-mixed-fleet, cql-partition-node, cql-partition-dc,
    /// cql-partition-replica, cql-partition-split; of the CQL ones the
    /// short profile runs the clock skew and the partitions).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Writes the reports here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keeps each server's log here (default: a temp dir, removed).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// The previous release's binary (`scripts/previous-release.sh`):
    /// `cql-mixed-fleet` runs it beside `--idemd-bin`; without it that
    /// scenario is skipped, and the run says so.
    #[arg(long)]
    previous_bin: Option<PathBuf>,
    /// The test cluster's script (CQL scenarios).
    #[arg(long, default_value = "scripts/cassandra.sh")]
    cassandra_script: PathBuf,
    /// The test cluster's `commitlog_sync`: `batch` (what docs/scylla.md
    /// tells Cassandra users to run), `periodic` (Cassandra's default;
    /// loses acknowledged writes when every node dies at once) or `group`.
    #[arg(long, default_value = "batch", value_parser = ["batch", "periodic", "group"])]
    cassandra_commitlog_sync: String,
    /// How many times `cql-cluster-restart` runs (each on the same cluster,
    /// with fresh idemd replicas and keys): a loss shows in some runs only,
    /// as the writes in flight at the SIGKILL vary.
    #[arg(long, default_value_t = 3)]
    cluster_restarts: usize,
    /// Set by `idemd-faults` itself when it re-runs the partition
    /// scenarios inside a user and network namespace of their own
    /// (`scenarios::partition::isolated`): run them here, on this
    /// namespace's network.
    #[arg(long, hide = true)]
    in_network_namespace: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (workers, cycles, pauses) = match args.profile {
        Profile::Short => (6, 10, 2),
        Profile::Full => (12, 100, 5),
    };
    let load = Load {
        workers,
        rpc_timeout: Duration::from_millis(500),
        heal_budget: Duration::from_secs(30),
    };
    let temp = tempfile::tempdir()?;
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&log_dir)?;
    // The short profile (`make test`) runs the CQL scenarios whose nemesis
    // no other test injects (a moved clock, cut links); node kills, pauses
    // and restarts, minutes each, only in the full profile.
    let in_short = |name: &str| name == "cql-clock-skew" || name.starts_with("cql-partition");
    let wanted = |name: &str| {
        if args.scenarios.is_empty() {
            !name.starts_with("cql") || args.profile == Profile::Full || in_short(name)
        } else {
            args.scenarios.iter().any(|s| s == name)
        }
    };
    let setup = Setup {
        bin: &args.idemd_bin,
        load,
        log_dir: &log_dir,
    };
    // The CQL scenarios' clients wait longer: a request may take the
    // store's 2 s timeout plus the read that resolves an uncertain write.
    let cql_setup = Setup {
        load: Load {
            rpc_timeout: Duration::from_secs(3),
            ..setup.load.clone()
        },
        ..setup.clone()
    };
    let partitions = partition::Partitions {
        profile: args.profile,
        setup: cql_setup.clone(),
        scenarios: partition::SCENARIOS
            .into_iter()
            .filter(|name| wanted(name))
            .collect(),
        cassandra_script: &args.cassandra_script,
        commitlog_sync: &args.cassandra_commitlog_sync,
    };
    if args.in_network_namespace {
        let reports = partition::inside(&partitions).await?;
        return finish(&args, &reports);
    }
    let mut reports = Vec::new();
    let mut report = |report: Report| {
        report.print();
        reports.push(report);
    };
    if wanted("kill9") {
        report(embedded::kill9(&setup, cycles).await?);
    }
    if wanted("pause") {
        report(embedded::pause(&setup, pauses).await?);
    }
    if wanted("torn-wal") {
        report(embedded::torn_wal(&setup).await?);
    }
    if wanted("corrupt-page") {
        report(embedded::corrupt_page(&setup).await?);
    }
    if wanted("damage-unscrubbed") {
        report(embedded::damage_unscrubbed(&setup).await?);
    }
    if wanted("backup-restore") {
        report(embedded::backup_restore(&setup).await?);
    }
    if wanted("restore-guard") {
        report(restore::restore_guard(&setup).await?);
    }
    if wanted("disk-image") {
        report(image::disk_image(&setup, 10).await?);
    }
    if wanted("resize-kill") {
        report(resize::resize_kill(&setup).await?);
    }
    if wanted("full-disk") {
        let rounds = match args.profile {
            Profile::Short => 1,
            Profile::Full => 3,
        };
        report(embedded::full_disk(&setup, rounds).await?);
    }
    if [
        "cql-node-kill",
        "cql-node-pause",
        "cql-quorum-loss",
        "cql-cluster-restart",
        "cql-clock-skew",
        "cql-mixed-fleet",
        "cutover",
    ]
    .into_iter()
    .any(wanted)
    {
        let spec = ClusterSpec {
            script: args.cassandra_script.clone(),
            commitlog_sync: args.cassandra_commitlog_sync.clone(),
            placement: Placement::loopback(),
        };
        let cluster = Cluster::start(spec, setup.bin).await?;
        // The cluster is stopped whatever a scenario returns: its nodes
        // must not outlive the run (they hold ports and locks of the caller).
        let scenarios = async {
            if wanted("cql-node-kill") {
                report(cql::node_kill(&cluster, &cql_setup).await?);
            }
            if wanted("cql-node-pause") {
                report(cql::node_pause(&cluster, &cql_setup).await?);
            }
            if wanted("cql-clock-skew") {
                for one in skew::clock_skew(&cluster, &setup).await? {
                    report(one);
                }
            }
            if wanted("cql-mixed-fleet") {
                match &args.previous_bin {
                    Some(previous) => {
                        report(cql::mixed_fleet(&cluster, &cql_setup, previous).await?);
                    }
                    None => eprintln!(
                        "cql-mixed-fleet: skipped: no --previous-bin (`make faults` passes \
                         scripts/previous-release.sh's)"
                    ),
                }
            }
            if wanted("cql-quorum-loss") {
                // Three in a row: the recovery must not depend on luck.
                for _ in 0..3 {
                    report(cql::quorum_loss(&cluster, &cql_setup, &[2, 3]).await?);
                }
            }
            if wanted("cql-cluster-restart") {
                for _ in 0..args.cluster_restarts {
                    report(cql::quorum_loss(&cluster, &cql_setup, &[1, 2, 3]).await?);
                }
            }
            // Last: it marks the keyspace as being copied into while it
            // runs, and a replica of a later scenario would be refused.
            if wanted("cutover") {
                report(cutover::cutover(&cluster, &cql_setup).await?);
            }
            anyhow::Ok(())
        }
        .await;
        cluster.stop().await?;
        scenarios?;
    }
    if !partitions.scenarios.is_empty() {
        // Printed by the run in the namespace, as it goes.
        reports.extend(partition::isolated(&partitions).await?);
    }
    finish(&args, &reports)
}

/// Writes the reports (`--json`) and fails if any scenario failed.
fn finish(args: &Args, reports: &[Report]) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&reports)?)?;
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.scenario.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("scenarios failed: {}", failed.join(", "));
    }
    Ok(())
}
