//! A network of the suite's own, where links between members are cut and
//! healed (the partition scenarios, issue 29).
//!
//! It is built inside the user and network namespace the suite re-runs
//! itself in ([`crate::plumbing::namespace::rerun_in_network_namespace`]),
//! where it is root of an empty network and touches nothing of the host's.
//! That namespace is a router; every Cassandra node and every idemd replica
//! runs in a network namespace of its own, joined to it by a veth pair
//! (subnet 10.77.S.0/24: the router is .1, the member .2 and its default
//! route; nodes 1–3 are S = 1–3, replicas 0 and 1 are S = 11, 12). Each
//! member's packets carry its own address, so a cut between any two is
//! exact. (On one loopback it is not: Cassandra does not bind its outgoing
//! connections, so a node's packets to node J leave with node J's address
//! as their source.)
//!
//! A cut drops every forwarded packet between two sets of addresses, both
//! ways (nftables, table `inet idemd_faults`, hook `forward`): silent, as a
//! real partition is, so connections stay open and requests go unanswered.
//! A heal flushes the rules; open connections carry on.

use std::process::Stdio;

use anyhow::Context;

use crate::plumbing::cluster::{MAX_NODES, Placement};
use crate::plumbing::namespace::{self, Anchor, check};

/// The nftables table the cuts live in.
const TABLE: &str = "idemd_faults";

/// A member of the suite's network: a Cassandra node or an idemd replica,
/// in a network namespace of its own.
pub struct Member {
    /// Holds the namespace: the member's programs join it, the probes run
    /// in it.
    pub anchor: Anchor,
    /// The member's address (its end of the veth pair): what the cuts
    /// name, and where a replica listens.
    pub host: String,
}

/// The suite's network: the router (this namespace) and its members.
pub struct Network {
    /// Nodes 1 to 4 (the one-datacenter layout uses three): the cluster
    /// runs in their namespaces, cuts name them.
    pub nodes: Vec<Member>,
    /// Replica 0 and replica 1: each idemd replica runs in one of these.
    pub replicas: Vec<Member>,
    /// `node1`… links to the nodes' namespaces (`IDEMD_CASSANDRA_NETNS_DIR`),
    /// which `scripts/cassandra.sh` starts each node in.
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
    /// Forwarding on, the cuts' table, and a namespace per node and
    /// replica; run as root of an empty network namespace.
    pub fn new() -> anyhow::Result<Self> {
        namespace::run("ip", &["link", "set", "lo", "up"])?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .context("enabling forwarding in the suite's network namespace")?;
        nft(&format!(
            "add table inet {TABLE}\n\
             add chain inet {TABLE} forward {{ type filter hook forward priority 0; policy accept; }}\n"
        ))?;
        let nodes = (1..=MAX_NODES)
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
    pub fn placement(&self) -> Placement {
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
            anchor
                .run(&["--net"], "ip", args)
                .with_context(|| format!("setting up the network of {name}"))?;
        }
        Ok(Member { anchor, host })
    }

    /// Drops every packet between `a` and `b`, both ways.
    pub fn cut(&self, a: &[&Member], b: &[&Member]) -> anyhow::Result<()> {
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
    pub fn reachable(&self, a: &[&Member], b: &[&Member]) -> anyhow::Result<Vec<(String, bool)>> {
        let mut seen = Vec::new();
        for (from, to) in [(a, b), (b, a)] {
            let Some(node) = to
                .iter()
                .find(|m| self.nodes.iter().any(|n| n.host == m.host))
            else {
                continue;
            };
            for member in from {
                let open = member.anchor.probe(
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
                seen.push((format!("{} → {}:9042", member.host, node.host), open));
            }
        }
        Ok(seen)
    }

    /// Removes every cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        nft(&format!("flush chain inet {TABLE} forward\n"))
    }
}
