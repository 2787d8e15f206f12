//! `idemd-faults`: the fault-injection suite (issue 14).
//!
//! Runs idemd (a real process, the embedded store in a temp dir) under
//! careful clients while injecting one fault per scenario, heals it, and
//! checks the history with one checker (`history.rs`): no key with two
//! holders, nothing acknowledged lost, no claim lost, replays true, every
//! call answered once healed. `make faults` runs the full profile; the short
//! profile is part of `make test`. Results and what each scenario checks:
//! docs/reliability.md.
//!
//! # Layout
//!
//! * `history`: what the clients saw, and the checker.
//! * `workload`: the careful client, run by many workers.
//! * `server`: the idemd process, started, killed, paused, restarted.
//! * `scenarios`: one function per fault of the embedded store (the full
//!   disk on a tmpfs in a mount namespace of its own).
//! * `cql`: the Cassandra scenarios (3 nodes, two idemd replicas; full
//!   profile only).
//! * `skew`: one of two replicas on the cluster with its wall clock moved
//!   (libfaketime), leases taken over.
//! * `partition`: the cluster and both replicas on a network of the
//!   suite's own (a user and network namespace), links cut with nftables.
//! * `namespace`: namespaces held open by an anchor process (the full
//!   disk's, each replica's in the partitions).

mod cql;
mod history;
mod namespace;
mod partition;
mod scenarios;
mod server;
mod skew;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;

use scenarios::{Profile, Report};
use workload::Load;

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
    /// full-disk, cql-node-kill, cql-node-pause, cql-quorum-loss,
    /// cql-cluster-restart, cql-clock-skew, cql-partition-node,
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
    /// (`partition::isolated`): run them here, on this namespace's network.
    #[arg(long, hide = true)]
    in_network_namespace: bool,
}

fn print(report: &Report) {
    let v = &report.verdict;
    let calls: u64 = v.statuses.values().flat_map(|codes| codes.values()).sum();
    eprintln!(
        "idemd-faults: {:<12} {} in {:.1}s: {} RPCs, {} keys, {} acked, lost {}, double {}, wrong replays {}, undecided {}, unexpected {}, data loss {}",
        report.scenario,
        if report.passed() { "PASS" } else { "FAIL" },
        report.seconds,
        calls,
        v.keys,
        v.acked,
        v.lost.len(),
        v.double.len(),
        v.wrong_replays.len(),
        v.undecided,
        v.unexpected.len(),
        v.data_loss,
    );
    for (phase, codes) in &v.statuses {
        let codes: Vec<String> = codes
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        eprintln!("idemd-faults:   phase {phase:<9} {}", codes.join(", "));
    }
    if !report.recovery_ms.is_empty() {
        let mut sorted = report.recovery_ms.clone();
        sorted.sort_unstable();
        eprintln!(
            "idemd-faults:   recovery: {} faults, median {} ms, max {} ms",
            sorted.len(),
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1]
        );
    }
    for note in &report.notes {
        eprintln!("idemd-faults:   note: {note}");
    }
    for problem in v
        .double
        .iter()
        .chain(&v.lost)
        .chain(&v.wrong_replays)
        .chain(&v.unexpected)
        .take(10)
    {
        eprintln!("idemd-faults:   problem: {problem}");
    }
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
    let bin = &args.idemd_bin;
    let mut reports = Vec::new();
    let partitions: Vec<&'static str> = partition::SCENARIOS
        .into_iter()
        .filter(|name| wanted(name))
        .collect();
    // The CQL scenarios' clients wait longer: a request may take the
    // store's 2 s timeout plus the read that resolves an uncertain write.
    let cql_load = Load {
        rpc_timeout: Duration::from_secs(3),
        ..load.clone()
    };
    if args.in_network_namespace {
        reports = partition::inside(
            &partitions,
            args.profile,
            &args.cassandra_script,
            &args.cassandra_commitlog_sync,
            bin,
            &cql_load,
            &log_dir,
        )
        .await?;
        return finish(&args, &reports);
    }
    if wanted("kill9") {
        reports.push(scenarios::kill9(bin, &load, &log_dir, cycles).await?);
        print(reports.last().expect("pushed"));
    }
    if wanted("pause") {
        reports.push(scenarios::pause(bin, &load, &log_dir, pauses).await?);
        print(reports.last().expect("pushed"));
    }
    if wanted("torn-wal") {
        reports.push(scenarios::torn_wal(bin, &load, &log_dir).await?);
        print(reports.last().expect("pushed"));
    }
    if wanted("corrupt-page") {
        reports.push(scenarios::corrupt_page(bin, &load, &log_dir).await?);
        print(reports.last().expect("pushed"));
    }
    if wanted("full-disk") {
        let rounds = match args.profile {
            Profile::Short => 1,
            Profile::Full => 3,
        };
        reports.push(scenarios::full_disk(bin, &load, &log_dir, rounds).await?);
        print(reports.last().expect("pushed"));
    }
    if [
        "cql-node-kill",
        "cql-node-pause",
        "cql-quorum-loss",
        "cql-cluster-restart",
        "cql-clock-skew",
    ]
    .into_iter()
    .any(wanted)
    {
        let cluster = cql::Cluster::start(
            &args.cassandra_script,
            &args.cassandra_commitlog_sync,
            cql::Placement::loopback(),
            bin,
            "idemd_faults",
        )
        .await?;
        // The cluster is stopped whatever a scenario returns: its nodes
        // must not outlive the run (they hold ports and locks of the caller).
        let scenarios = async {
            if wanted("cql-node-kill") {
                reports.push(cql::node_kill(&cluster, bin, &cql_load, &log_dir).await?);
                print(reports.last().expect("pushed"));
            }
            if wanted("cql-node-pause") {
                reports.push(cql::node_pause(&cluster, bin, &cql_load, &log_dir).await?);
                print(reports.last().expect("pushed"));
            }
            if wanted("cql-clock-skew") {
                for report in skew::clock_skew(&cluster, bin, &log_dir).await? {
                    print(&report);
                    reports.push(report);
                }
            }
            if wanted("cql-quorum-loss") {
                // Three in a row: the recovery must not depend on luck.
                for _ in 0..3 {
                    let report =
                        cql::quorum_loss(&cluster, &[2, 3], bin, &cql_load, &log_dir).await?;
                    print(&report);
                    reports.push(report);
                }
            }
            if wanted("cql-cluster-restart") {
                for _ in 0..args.cluster_restarts {
                    let report =
                        cql::quorum_loss(&cluster, &[1, 2, 3], bin, &cql_load, &log_dir).await?;
                    print(&report);
                    reports.push(report);
                }
            }
            anyhow::Ok(())
        }
        .await;
        cluster.stop().await?;
        scenarios?;
    }
    if !partitions.is_empty() {
        reports.extend(
            partition::isolated(&partition::Isolated {
                profile: match args.profile {
                    Profile::Short => "short",
                    Profile::Full => "full",
                },
                bin,
                scenarios: partitions,
                log_dir: &log_dir,
                cassandra_script: &args.cassandra_script,
                commitlog_sync: &args.cassandra_commitlog_sync,
            })
            .await?,
        );
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
