//! The partition scenarios (issue 29): the 3-node cluster and two idemd
//! replicas on a network of the suite's own (`plumbing::network`), where
//! links are cut and healed; then two datacenters of two nodes, one replica
//! in each, cut from each other (issue 38).
//!
//! The suite must not touch the host's network, so `idemd-faults` re-runs
//! itself inside a user and network namespace of its own ([`isolated`])
//! and runs the scenarios there ([`inside`]), where it is root of an empty
//! network that it builds: every Cassandra node and every idemd replica in
//! a network namespace of its own, this one the router between them.
//!
//! The careful clients (this process) live in the router and reach each
//! replica at its address; they are never cut off (they stand for a load
//! balancer that sees every replica). A cut is silent, as a real partition
//! is: packets are dropped, connections stay open and requests go
//! unanswered; probes from inside the members' namespaces check that it
//! really cuts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::harness::judge::{error_rate, recovery, require_recovery};
use crate::harness::report::{Profile, Report};
use crate::harness::run::{Run, Setup};
use crate::plumbing::cluster::{Cluster, ClusterSpec, Layout};
use crate::plumbing::namespace::rerun_in_network_namespace;
use crate::plumbing::network::{Member, Network};
use crate::plumbing::server::Server;

/// The partition scenarios, in the order they run.
pub const SCENARIOS: [&str; 4] = [
    "cql-partition-node",
    "cql-partition-replica",
    "cql-partition-split",
    "cql-partition-dc",
];

/// The share of calls through a replica that still reaches a quorum which
/// may fail while the cut is on: as for a paused node (`cql-node-pause`),
/// the driver needs its keepalive (2 s + 2 s) to stop sending to a silent
/// node.
const MAX_ERRORS: f64 = 0.05;
/// Statuses a client may see while part of the cluster is cut off: the
/// store is unreachable (`UNAVAILABLE`, with or without an uncertain
/// outcome), the server's deadline passed (`DEADLINE_EXCEEDED`), or the
/// client's own deadline did (tonic reports that as `CANCELLED`). Anything
/// else is a wrong answer.
const ALLOWED: [&str; 4] = ["ok", "Unavailable", "DeadlineExceeded", "Cancelled"];

/// What one scenario cuts.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Node 3 from everyone (the other nodes and both replicas).
    Node,
    /// Replica 0 from nodes 1 and 2: it still reaches node 3, which
    /// reaches the others.
    Replica,
    /// Node 3 and replica 0 from nodes 1, 2 and replica 1: a minority that
    /// cannot make a quorum, and a majority that can.
    Split,
    /// On the two-datacenter layout, `dc1` (nodes 1, 2, replica 0) from
    /// `dc2` (nodes 3, 4, replica 1). With `quorum` (3 of the 4 replicas of
    /// a key) neither side makes a quorum: every LWT is refused on both
    /// sides until the link returns, the price of linearizability across
    /// datacenters (docs/scylla.md, "Consistency").
    Datacenters,
}

impl Cut {
    /// The scenario's name.
    fn name(self) -> &'static str {
        match self {
            Cut::Node => SCENARIOS[0],
            Cut::Replica => SCENARIOS[1],
            Cut::Split => SCENARIOS[2],
            Cut::Datacenters => SCENARIOS[3],
        }
    }

    /// The cluster it runs on.
    fn layout(self) -> Layout {
        match self {
            Cut::Datacenters => Layout::TwoDatacenters,
            Cut::Node | Cut::Replica | Cut::Split => Layout::One,
        }
    }

    /// Flags of replica `r` beyond the cluster's: on two datacenters each
    /// replica routes to its own.
    fn replica_flags(self, r: usize) -> Vec<String> {
        match self {
            Cut::Datacenters => vec!["--cql-local-dc".into(), format!("dc{}", r + 1)],
            Cut::Node | Cut::Replica | Cut::Split => Vec::new(),
        }
    }

    /// What was injected, in words, for the report.
    fn injected(self, hold: Duration) -> String {
        let what = match self {
            Cut::Node => "Cassandra node 3 cut off from nodes 1, 2 and both idemd replicas",
            Cut::Replica => {
                "idemd replica 0 cut off from Cassandra nodes 1 and 2 (it reaches node 3)"
            }
            Cut::Split => {
                "split: node 3 + replica 0 (no quorum) | nodes 1, 2 + replica 1 (a quorum)"
            }
            Cut::Datacenters => {
                "datacenters cut: dc1 (nodes 1, 2 + replica 0) | dc2 (nodes 3, 4 + replica 1); \
                 RF 2 + 2, consistency quorum: no side has 3 of 4"
            }
        };
        format!(
            "{what} for {} s (packets dropped both ways), then healed",
            hold.as_secs()
        )
    }

    /// The two sides: every packet between a member of one and a member
    /// of the other is dropped.
    fn sides(self, net: &Network) -> (Vec<&Member>, Vec<&Member>) {
        let node = |i: usize| &net.nodes[i - 1];
        let replica = |r: usize| &net.replicas[r];
        match self {
            Cut::Node => (
                vec![node(3)],
                vec![node(1), node(2), replica(0), replica(1)],
            ),
            Cut::Replica => (vec![replica(0)], vec![node(1), node(2)]),
            Cut::Split => (
                vec![node(3), replica(0)],
                vec![node(1), node(2), replica(1)],
            ),
            Cut::Datacenters => (
                vec![node(1), node(2), replica(0)],
                vec![node(3), node(4), replica(1)],
            ),
        }
    }

    /// The replicas that keep a quorum within reach, whose calls must
    /// mostly succeed while the cut is on.
    fn with_quorum(self) -> &'static [usize] {
        match self {
            Cut::Node => &[0, 1],
            Cut::Replica | Cut::Split => &[1],
            Cut::Datacenters => &[],
        }
    }
}

/// What the partition scenarios need from the command line: in the run
/// that re-runs the suite in a namespace of its own, and in the run there.
pub struct Partitions<'a> {
    /// How long each cut holds (and the child run's `--profile`).
    pub profile: Profile,
    /// The binary, the clients' settings (the CQL scenarios'), the logs.
    pub setup: Setup<'a>,
    /// The partition scenarios wanted, by name ([`SCENARIOS`]).
    pub scenarios: Vec<&'static str>,
    /// `scripts/cassandra.sh`, which starts the cluster on the network.
    pub cassandra_script: &'a Path,
    /// The nodes' `commitlog_sync`.
    pub commitlog_sync: &'a str,
}

/// Runs the partition scenarios in a user and network namespace of their
/// own: `idemd-faults` again, with `--in-network-namespace`; its reports
/// come back as JSON (its progress lines go to the same stderr as the
/// others).
pub async fn isolated(partitions: &Partitions<'_>) -> anyhow::Result<Vec<Report>> {
    let dir = tempfile::tempdir()?;
    let json: PathBuf = dir.path().join("partitions.json");
    let args: Vec<OsString> = [
        "--in-network-namespace".into(),
        "--profile".into(),
        partitions.profile.flag().into(),
        "--idemd-bin".into(),
        partitions.setup.bin.into(),
        "--scenarios".into(),
        partitions.scenarios.join(",").into(),
        "--json".into(),
        json.clone().into(),
        "--log-dir".into(),
        partitions.setup.log_dir.into(),
        "--cassandra-script".into(),
        partitions.cassandra_script.into(),
        "--cassandra-commitlog-sync".into(),
        partitions.commitlog_sync.into(),
    ]
    .to_vec();
    let status = rerun_in_network_namespace(
        &args,
        "the partition scenarios need unprivileged user and network namespaces",
    )
    .await?;
    let reports = std::fs::read(&json).with_context(|| {
        format!("the partition scenarios wrote no reports (idemd-faults in its namespace exited with {status})")
    })?;
    Ok(serde_json::from_slice(&reports)?)
}

/// The partition scenarios wanted, run here: the network, the cluster on
/// it, each cut in turn; the cluster is stopped whatever a scenario returns.
pub async fn inside(partitions: &Partitions<'_>) -> anyhow::Result<Vec<Report>> {
    let net = Network::new()?;
    let hold = match partitions.profile {
        Profile::Short => Duration::from_secs(6),
        Profile::Full => Duration::from_secs(10),
    };
    let mut reports = Vec::new();
    for layout in [Layout::One, Layout::TwoDatacenters] {
        let cuts: Vec<Cut> = [Cut::Node, Cut::Replica, Cut::Split, Cut::Datacenters]
            .into_iter()
            .filter(|cut| cut.layout() == layout && partitions.scenarios.contains(&cut.name()))
            .collect();
        if cuts.is_empty() {
            continue;
        }
        let spec = ClusterSpec {
            script: partitions.cassandra_script.to_path_buf(),
            commitlog_sync: partitions.commitlog_sync.to_string(),
            placement: net.placement(),
        };
        let cluster = Cluster::start_layout(spec, partitions.setup.bin, layout).await?;
        let stage = Stage {
            net: &net,
            cluster: &cluster,
            setup: &partitions.setup,
            hold,
        };
        let scenarios = async {
            for cut in cuts {
                let report = partition(&stage, cut).await?;
                report.print();
                reports.push(report);
            }
            anyhow::Ok(())
        }
        .await;
        cluster.stop().await?;
        scenarios?;
    }
    Ok(reports)
}

/// What every cut runs on.
struct Stage<'a> {
    /// The suite's network, where the cut is made.
    net: &'a Network,
    /// The cluster on it, shared by the cuts.
    cluster: &'a Cluster,
    /// The binary, the clients' settings, the logs.
    setup: &'a Setup<'a>,
    /// How long a cut stays on.
    hold: Duration,
}

/// One cut under load: on for `hold`, then healed. Only the allowed
/// statuses while it is on; calls through a replica that keeps a quorum
/// within reach fail at most [`MAX_ERRORS`] of the time; calls through
/// replica 0 succeed again within 30 s of the heal; then the checker.
async fn partition(stage: &Stage<'_>, cut: Cut) -> anyhow::Result<Report> {
    let Stage {
        net,
        cluster,
        setup,
        hold,
    } = *stage;
    let dir = tempfile::tempdir()?;
    let mut common = cluster.flags();
    // The clients reach the replicas from the suite's side of each veth
    // pair: a remote peer to idemd, refused without authentication unless
    // this says it is meant (the suite's namespace has no other peer).
    common.push("--allow-unauthenticated-remote".into());
    let servers = net
        .replicas
        .iter()
        .enumerate()
        .map(|(r, replica)| {
            let mut flags = common.clone();
            flags.extend(cut.replica_flags(r));
            Ok(Server::new(
                setup.bin,
                &dir.path().join(format!("replica-{r}")),
                setup.log_dir,
                flags,
            )?
            .on_host(&replica.host)
            .wrapped(replica.anchor.nsenter(&["--net"])))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let run = Run::start_with(servers, &setup.load, dir).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a, b) = cut.sides(net);
    let mut wrong = Vec::new();
    // The probes block for up to a second each: off the clients' threads.
    let before = tokio::task::block_in_place(|| net.reachable(&a, &b))?;
    run.history.phase("partitioned");
    let since = Instant::now();
    net.cut(&a, &b)?;
    let during = tokio::task::block_in_place(|| net.reachable(&a, &b))?;
    tokio::time::sleep(hold.saturating_sub(since.elapsed())).await;
    net.heal()?;
    let closed = during.iter().filter(|(_, open)| !open).count();
    for ((path, open), (_, open_during)) in before.iter().zip(&during) {
        if !open {
            wrong.push(format!("{path} was closed before the cut"));
        }
        if *open_during {
            wrong.push(format!("{path} stayed open during the cut"));
        }
    }
    let healed = Instant::now();
    run.history.phase("healing");
    let (recovery_ms, notes) = recovery(&run, healed, Some(0)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.history.phase("load");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut report = run
        .finish(cut.name(), cut.injected(hold), recovery_ms, notes)
        .await?;
    judge(&mut report, cut);
    report.notes.push(format!(
        "the cut, probed from inside the members' namespaces: {closed} of {} paths across it closed while on, {} open before",
        during.len(),
        before.iter().filter(|(_, open)| *open).count()
    ));
    report.verdict.unexpected.extend(wrong);
    Ok(report)
}

/// The scenario's own checks, on top of the shared checker's.
fn judge(report: &mut Report, cut: Cut) {
    let verdict = &mut report.verdict;
    let during = verdict
        .by_replica
        .get("partitioned")
        .cloned()
        .unwrap_or_default();
    for (replica, codes) in &during {
        let calls: u64 = codes.values().sum();
        let ok = codes.get("ok").copied().unwrap_or(0);
        let rate = if calls == 0 {
            0.0
        } else {
            (calls - ok) as f64 / calls as f64
        };
        report.notes.push(format!(
            "through replica {replica} while cut: {calls} calls, {ok} ok, {:.2}% failed",
            rate * 100.0
        ));
        for (code, n) in codes {
            if !ALLOWED.contains(&code.as_str()) {
                verdict.unexpected.push(format!(
                    "{n} calls through replica {replica} answered {code} while cut (only {})",
                    ALLOWED.join(", ")
                ));
            }
        }
        if cut.with_quorum().contains(replica) && rate > MAX_ERRORS {
            verdict.unexpected.push(format!(
                "{:.2}% of calls through replica {replica} failed with a quorum in reach (at most {:.0}%)",
                rate * 100.0,
                MAX_ERRORS * 100.0
            ));
        }
    }
    for replica in cut.with_quorum() {
        if !during.contains_key(replica) {
            verdict
                .unexpected
                .push(format!("no call went through replica {replica} while cut"));
        }
    }
    let overall = error_rate(verdict, &["partitioned"]);
    report.notes.push(format!(
        "all calls while cut: {:.2}% failed",
        overall * 100.0
    ));
    require_recovery(
        report,
        "calls through replica 0 did not succeed within 30 s of the heal",
    );
}
