//! The test Cassandra cluster (`scripts/cassandra.sh`: 3 nodes, keyspace
//! RF 3; or two datacenters of 2 nodes, 2 replicas in each), driven from
//! the suite: started, one node killed, paused, resumed
//! or restarted, stopped. The cluster takes ~15 s to start and each node
//! restart ~10 s, which is why the CQL scenarios share one cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Nodes of the test cluster (node I listens on 127.0.0.I:9042 unless
/// placed elsewhere: [`Placement`]).
pub const NODES: usize = 3;

/// The most nodes any layout has (the suite's network makes room for
/// them).
pub const MAX_NODES: usize = 4;

/// How the nodes are laid out, and the keyspace's replication on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// [`NODES`] nodes in one datacenter, RF 3.
    One,
    /// Four nodes: `dc1` (1, 2) and `dc2` (3, 4), two replicas in each.
    TwoDatacenters,
}

impl Layout {
    fn nodes(self) -> usize {
        match self {
            Layout::One => NODES,
            Layout::TwoDatacenters => MAX_NODES,
        }
    }

    fn start_args(self) -> &'static [&'static str] {
        match self {
            Layout::One => &["start", "--nodes", "3"],
            Layout::TwoDatacenters => &["start", "--nodes", "4", "--dcs", "2"],
        }
    }

    fn replication(self) -> &'static str {
        match self {
            Layout::One => "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            Layout::TwoDatacenters => "{'class': 'NetworkTopologyStrategy', 'dc1': 2, 'dc2': 2}",
        }
    }
}

/// The keyspace every CQL scenario shares (each run's keys are its own:
/// `harness::workload`).
const KEYSPACE: &str = "idemd_faults";

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

/// How the cluster's script is run: every call to it carries the same
/// settings, so a node restarted by a scenario comes back as it started.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// `scripts/cassandra.sh`, the one way the suite acts on a node.
    pub script: PathBuf,
    /// The nodes' `commitlog_sync` (`IDEMD_CASSANDRA_COMMITLOG_SYNC`): what
    /// a SIGKILL of every node may lose depends on it.
    pub commitlog_sync: String,
    /// Where the nodes run.
    pub placement: Placement,
}

impl ClusterSpec {
    /// Runs the script with `args`; fails unless it exits 0.
    async fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::new("bash");
        if let Some(dir) = &self.placement.netns_dir {
            command.env("IDEMD_CASSANDRA_NETNS_DIR", dir);
        }
        let status = command
            .arg(&self.script)
            .args(args)
            // Every node is SIGKILLed at once in cql-cluster-restart: with
            // a periodic commit log each node loses its last ~100 ms of
            // writes, acknowledged LWTs included, which no client can
            // survive. Per-write sync (`batch`, the default) is what
            // docs/scylla.md tells Cassandra users to run for that failure
            // (ScyllaDB syncs LWTs before acknowledging whatever the
            // setting); `periodic` is there to measure what it loses.
            .env("IDEMD_CASSANDRA_COMMITLOG_SYNC", &self.commitlog_sync)
            .env(
                "IDEMD_CASSANDRA_ADDRESS_FORMAT",
                &self.placement.address_format,
            )
            .status()
            .await
            .with_context(|| format!("running {}", self.script.display()))?;
        if !status.success() {
            bail!(
                "{} {} failed: {status}",
                self.script.display(),
                args.join(" ")
            );
        }
        Ok(())
    }
}

/// The test cluster, driven through `scripts/cassandra.sh`.
pub struct Cluster {
    /// How the script is run, for every node action after the start.
    spec: ClusterSpec,
    /// `idemd` flags that point at the cluster and the keyspace, for every
    /// replica a scenario starts on it.
    flags: Vec<String>,
}

impl Cluster {
    /// Starts a fresh 3-node cluster as `spec` says and creates the
    /// suite's keyspace with RF 3 (`idemd migrate`, with `bin`).
    pub async fn start(spec: ClusterSpec, bin: &Path) -> anyhow::Result<Self> {
        Self::start_layout(spec, bin, Layout::One).await
    }

    /// [`Cluster::start`] with another layout (the script wipes whatever
    /// cluster ran before).
    pub async fn start_layout(
        spec: ClusterSpec,
        bin: &Path,
        layout: Layout,
    ) -> anyhow::Result<Self> {
        spec.run(layout.start_args()).await?;
        let nodes: Vec<String> = (1..=layout.nodes())
            .map(|i| format!("{}:9042", spec.placement.address(i)))
            .collect();
        let nodes = nodes.join(",");
        let status = tokio::process::Command::new(bin)
            .args(["migrate", "--cql-nodes", &nodes, "--keyspace", KEYSPACE])
            .args(["--replication", layout.replication()])
            .status()
            .await?;
        if !status.success() {
            bail!("idemd migrate failed: {status}");
        }
        Ok(Self {
            spec,
            flags: [
                "--store",
                "cql",
                "--cql-nodes",
                &nodes,
                "--keyspace",
                KEYSPACE,
                "--cql-request-timeout",
                "2s",
            ]
            .map(str::to_string)
            .to_vec(),
        })
    }

    /// `kill`, `pause`, `resume` or `restart` node `i`.
    pub async fn node(&self, action: &str, i: usize) -> anyhow::Result<()> {
        self.spec.run(&[action, &i.to_string()]).await
    }

    /// The `idemd` flags that point a replica at this cluster.
    pub fn flags(&self) -> Vec<String> {
        self.flags.clone()
    }

    /// Stops every node.
    pub async fn stop(&self) -> anyhow::Result<()> {
        self.spec.run(&["stop"]).await
    }
}
