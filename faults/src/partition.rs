//! The partition scenarios (issue 29): the 3-node cluster and two idemd
//! replicas on a network of the suite's own, where links are cut and
//! healed.
//!
//! The suite must not touch the host's network, so `idemd-faults` re-runs
//! itself inside a user and network namespace of its own (`unshare --user
//! --map-root-user --net`, unprivileged; [`isolated`]) and is root of an
//! empty network there ([`inside`]). That namespace is a router; every
//! Cassandra node and every idemd replica runs in a network namespace of
//! its own, joined to it by a veth pair (subnet 10.77.S.0/24: the router
//! is .1, the member .2 and its default route; nodes 1–3 are S = 1–3,
//! replicas 0 and 1 are S = 11, 12). Each member's packets carry its own
//! address, so a cut between any two is exact. (On one loopback it is
//! not: Cassandra does not bind its outgoing connections, so a node's
//! packets to node J leave with node J's address as their source.)
//!
//! The careful clients (this process) live in the router and reach each
//! replica at its address; they are never cut off (they stand for a load
//! balancer that sees every replica).
//!
//! A cut drops every forwarded packet between two sets of addresses, both
//! ways (nftables, table `inet idemd_faults`, hook `forward`): silent, as a
//! real partition is, so connections stay open and requests go unanswered.
//! A heal flushes the rules; open connections carry on.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cql::{Cluster, NODES, Placement, error_rate, recovery};
use crate::namespace::{self, Anchor, check};
use crate::scenarios::{Profile, Report, Run};
use crate::server::Server;
use crate::workload::Load;

/// The partition scenarios, in the order they run.
pub const SCENARIOS: [&str; 3] = [
    "cql-partition-node",
    "cql-partition-replica",
    "cql-partition-split",
];

/// The nftables table the cuts live in.
const TABLE: &str = "idemd_faults";
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
}

impl Cut {
    fn name(self) -> &'static str {
        match self {
            Cut::Node => SCENARIOS[0],
            Cut::Replica => SCENARIOS[1],
            Cut::Split => SCENARIOS[2],
        }
    }

    fn injected(self, hold: Duration) -> String {
        let what = match self {
            Cut::Node => "Cassandra node 3 cut off from nodes 1, 2 and both idemd replicas",
            Cut::Replica => {
                "idemd replica 0 cut off from Cassandra nodes 1 and 2 (it reaches node 3)"
            }
            Cut::Split => {
                "split: node 3 + replica 0 (no quorum) | nodes 1, 2 + replica 1 (a quorum)"
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
        }
    }

    /// The replicas that keep a quorum within reach, whose calls must
    /// mostly succeed while the cut is on.
    fn with_quorum(self) -> &'static [usize] {
        match self {
            Cut::Node => &[0, 1],
            Cut::Replica | Cut::Split => &[1],
        }
    }
}

/// A member of the suite's network: a Cassandra node or an idemd replica,
/// in a network namespace of its own.
struct Member {
    /// Holds the namespace.
    anchor: Anchor,
    /// The member's address (its end of the veth pair).
    host: String,
}

/// The suite's network, built inside the namespace [`isolated`] made.
struct Network {
    /// Nodes 1, 2, 3.
    nodes: Vec<Member>,
    /// Replica 0 and replica 1.
    replicas: Vec<Member>,
    /// `node1`… links to the nodes' namespaces (`IDEMD_CASSANDRA_NETNS_DIR`).
    netns_dir: tempfile::TempDir,
}

/// Applies `script` with `nft -f -`.
fn nft(script: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("nft (Debian's nftables; scripts/test-deps.sh installs it)")?;
    child
        .stdin
        .take()
        .context("nft's stdin")?
        .write_all(script.as_bytes())?;
    check(&child.wait_with_output()?, &format!("nft: {script}"))
}

impl Network {
    fn new() -> anyhow::Result<Self> {
        namespace::run("ip", &["link", "set", "lo", "up"])?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .context("enabling forwarding in the suite's network namespace")?;
        nft(&format!(
            "add table inet {TABLE}\n\
             add chain inet {TABLE} forward {{ type filter hook forward priority 0; policy accept; }}\n"
        ))?;
        let nodes = (1..=NODES)
            .map(|i| Self::member(&format!("n{i}"), i))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let replicas = (0..2)
            .map(|r| Self::member(&format!("r{r}"), 11 + r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let netns_dir = tempfile::tempdir()?;
        for (i, node) in nodes.iter().enumerate() {
            std::os::unix::fs::symlink(
                format!("/proc/{}/ns/net", node.anchor.pid()),
                netns_dir.path().join(format!("node{}", i + 1)),
            )?;
        }
        Ok(Self {
            nodes,
            replicas,
            netns_dir,
        })
    }

    /// Where the cluster's nodes run: node I in its namespace, on its
    /// address.
    fn placement(&self) -> Placement {
        Placement {
            address_format: "10.77.%s.2".into(),
            netns_dir: Some(self.netns_dir.path().to_path_buf()),
        }
    }

    /// A namespace of its own for member `name` on subnet 10.77.`subnet`,
    /// joined to this one by a veth pair.
    fn member(name: &str, subnet: usize) -> anyhow::Result<Member> {
        let anchor = Anchor::new(
            &["--net"],
            "true",
            &[],
            "a network namespace for a member of the partition scenarios",
        )?;
        let (router, host) = (format!("10.77.{subnet}.1"), format!("10.77.{subnet}.2"));
        let link = format!("idemd-{name}");
        let pid = anchor.pid().to_string();
        namespace::run(
            "ip",
            &[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &pid,
            ],
        )?;
        namespace::run(
            "ip",
            &["addr", "add", &format!("{router}/24"), "dev", &link],
        )?;
        namespace::run("ip", &["link", "set", &link, "up"])?;
        let inner: [&[&str]; 4] = [
            &["link", "set", "lo", "up"],
            &["addr", "add", &format!("{host}/24"), "dev", "eth0"],
            &["link", "set", "eth0", "up"],
            &["route", "add", "default", "via", &router],
        ];
        for args in inner {
            check(
                &anchor.run(&["--net"], "ip", args)?,
                &format!("ip {} ({name})", args.join(" ")),
            )?;
        }
        Ok(Member { anchor, host })
    }

    /// Drops every packet between `a` and `b`, both ways.
    fn cut(&self, a: &[&Member], b: &[&Member]) -> anyhow::Result<()> {
        let hosts = |side: &[&Member]| {
            side.iter()
                .map(|m| m.host.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (a, b) = (hosts(a), hosts(b));
        let mut script = String::new();
        for (from, to) in [(&a, &b), (&b, &a)] {
            script.push_str(&format!(
                "add rule inet {TABLE} forward ip saddr {{ {from} }} ip daddr {{ {to} }} drop\n"
            ));
        }
        nft(&script)
    }

    /// Whether each member of either side can open a TCP connection to
    /// the CQL port of the first node on the other side (a second's try):
    /// what a cut must change, checked from inside the members'
    /// namespaces, so a cut that drops nothing fails the scenario instead
    /// of passing it unharmed.
    fn reachable(&self, a: &[&Member], b: &[&Member]) -> anyhow::Result<Vec<(String, bool)>> {
        let mut seen = Vec::new();
        for (from, to) in [(a, b), (b, a)] {
            let Some(node) = to
                .iter()
                .find(|m| self.nodes.iter().any(|n| n.host == m.host))
            else {
                continue;
            };
            for member in from {
                let output = member.anchor.run(
                    &["--net"],
                    "timeout",
                    &[
                        "1",
                        "bash",
                        "-c",
                        "exec 3<>\"/dev/tcp/$1/9042\"",
                        "probe",
                        &node.host,
                    ],
                )?;
                seen.push((
                    format!("{} → {}:9042", member.host, node.host),
                    output.status.success(),
                ));
            }
        }
        Ok(seen)
    }

    /// Removes every cut.
    fn heal(&self) -> anyhow::Result<()> {
        nft(&format!("flush chain inet {TABLE} forward\n"))
    }
}

/// What the child run needs from the parent's command line.
pub struct Isolated<'a> {
    /// `short` or `full`.
    pub profile: &'static str,
    /// The idemd binary.
    pub bin: &'a Path,
    /// The partition scenarios wanted.
    pub scenarios: Vec<&'static str>,
    /// Where server logs go.
    pub log_dir: &'a Path,
    /// `scripts/cassandra.sh`.
    pub cassandra_script: &'a Path,
    /// The nodes' `commitlog_sync`.
    pub commitlog_sync: &'a str,
}

/// Runs the partition scenarios in a user and network namespace of their
/// own: `idemd-faults` again, under `unshare`, with `--in-network-namespace`;
/// its reports come back as JSON (its progress lines go to the same
/// stderr as the others).
pub async fn isolated(run: &Isolated<'_>) -> anyhow::Result<Vec<Report>> {
    let exe = std::env::current_exe().context("the path of idemd-faults")?;
    let dir = tempfile::tempdir()?;
    let json: PathBuf = dir.path().join("partitions.json");
    let status = tokio::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--"])
        .arg(exe)
        .args(["--in-network-namespace", "--profile", run.profile])
        .arg("--idemd-bin")
        .arg(run.bin)
        .arg("--scenarios")
        .arg(run.scenarios.join(","))
        .arg("--json")
        .arg(&json)
        .arg("--log-dir")
        .arg(run.log_dir)
        .arg("--cassandra-script")
        .arg(run.cassandra_script)
        .args(["--cassandra-commitlog-sync", run.commitlog_sync])
        .stdin(Stdio::null())
        .status()
        .await
        .context("unshare (util-linux): the partition scenarios need unprivileged user and network namespaces")?;
    let reports = std::fs::read(&json).with_context(|| {
        format!("the partition scenarios wrote no reports (idemd-faults in its namespace exited with {status})")
    })?;
    Ok(serde_json::from_slice(&reports)?)
}

/// The partition scenarios `wanted`, run here: the network, the cluster on
/// it, each cut in turn; the cluster is stopped whatever a scenario returns.
pub async fn inside(
    wanted: &[&str],
    profile: Profile,
    cassandra_script: &Path,
    commitlog_sync: &str,
    bin: &Path,
    load: &Load,
    log_dir: &Path,
) -> anyhow::Result<Vec<Report>> {
    let net = Network::new()?;
    let cluster = Cluster::start(
        cassandra_script,
        commitlog_sync,
        net.placement(),
        bin,
        "idemd_faults",
    )
    .await?;
    let hold = match profile {
        Profile::Short => Duration::from_secs(6),
        Profile::Full => Duration::from_secs(10),
    };
    let mut reports = Vec::new();
    let scenarios = async {
        for cut in [Cut::Node, Cut::Replica, Cut::Split] {
            if wanted.contains(&cut.name()) {
                let report = partition(&net, &cluster, cut, hold, bin, load, log_dir).await?;
                crate::print(&report);
                reports.push(report);
            }
        }
        anyhow::Ok(())
    }
    .await;
    cluster.stop().await?;
    scenarios?;
    Ok(reports)
}

/// One cut under load: on for `hold`, then healed. Only the allowed
/// statuses while it is on; calls through a replica that keeps a quorum
/// within reach fail at most [`MAX_ERRORS`] of the time; calls through
/// replica 0 succeed again within 30 s of the heal; then the checker.
async fn partition(
    net: &Network,
    cluster: &Cluster,
    cut: Cut,
    hold: Duration,
    bin: &Path,
    load: &Load,
    log_dir: &Path,
) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let mut flags = cluster.flags();
    // The clients reach the replicas from the suite's side of each veth
    // pair: a remote peer to idemd, refused without authentication unless
    // this says it is meant (the suite's namespace has no other peer).
    flags.push("--allow-unauthenticated-remote".into());
    let servers = net
        .replicas
        .iter()
        .enumerate()
        .map(|(r, replica)| {
            Ok(Server::new(
                bin,
                &dir.path().join(format!("replica-{r}")),
                log_dir,
                flags.clone(),
            )?
            .on_host(&replica.host)
            .wrapped(replica.anchor.nsenter(&["--net"])))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let run = Run::start_with(servers, load, dir).await?;
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
        .finish(cut.name(), cut.injected(hold), recovery_ms, notes, false)
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
    if report.recovery_ms.is_empty() {
        verdict
            .unexpected
            .push("calls through replica 0 did not succeed within 30 s of the heal".into());
    }
}
