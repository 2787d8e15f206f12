//! The command line of `run`, `compare` and `soak`: the systems a run can
//! name, the flags every subcommand shares, and each subcommand's own.
//! Defaults are part of the interface (`docs/benchmarks.md` and the
//! Makefile pass flags by these names).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::load::Workload;

/// The systems under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SystemKind {
    /// The no-op gRPC server (canned responses): the gRPC ceiling.
    Noop,
    /// idemd with its embedded (redb) store.
    IdemdEmbedded,
    /// The article's table and statements on Postgres.
    Postgres,
    /// SET NX EX / SET XX on Redis.
    Redis,
    /// idemd's LWT statements straight on the scylla driver.
    RawLwt,
    /// Every statement idemd-cql sends per fresh pair, straight on the
    /// driver: the two LWTs plus the pending index's entry (before the
    /// insert) and its delete (after the update, off the reply path). What
    /// P4 can reach at best with the index idemd keeps.
    RawLwtIndexed,
    /// idemd with the CQL store.
    IdemdCql,
}

impl SystemKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            SystemKind::Noop => "noop",
            SystemKind::IdemdEmbedded => "idemd-embedded",
            SystemKind::Postgres => "postgres",
            SystemKind::Redis => "redis",
            SystemKind::RawLwt => "raw-lwt",
            SystemKind::RawLwtIndexed => "raw-lwt-indexed",
            SystemKind::IdemdCql => "idemd-cql",
        }
    }

    pub(super) fn needs_cql(self) -> bool {
        matches!(
            self,
            SystemKind::RawLwt | SystemKind::RawLwtIndexed | SystemKind::IdemdCql
        )
    }

    /// Whether the system enforces one winner per key.
    pub(super) fn exclusive(self) -> bool {
        self != SystemKind::Noop
    }

    /// Whether the server starts pinned to core 0. The CQL systems start
    /// unpinned and are placed around each of their measurements instead
    /// (`placement`: Cassandra alone on core 1).
    pub(super) fn pinnable(self) -> bool {
        !self.needs_cql()
    }
}

/// Every system, in report order (`compare` without `--systems`).
pub(super) const ALL_SYSTEMS: [SystemKind; 7] = [
    SystemKind::Noop,
    SystemKind::IdemdEmbedded,
    SystemKind::Postgres,
    SystemKind::Redis,
    SystemKind::RawLwt,
    SystemKind::RawLwtIndexed,
    SystemKind::IdemdCql,
];

/// Every workload, in report order (`compare` without `--workloads`).
pub(super) const ALL_WORKLOADS: [Workload; 4] = [
    Workload::Fresh,
    Workload::Replay,
    Workload::Conflict,
    Workload::Mixed,
];

/// Flags shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// gRPC connections (HTTP/2) to idemd and the no-op server.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Connections to Postgres and Redis (a Postgres connection runs one
    /// statement at a time, so this is its parallelism).
    #[arg(long, default_value_t = 16)]
    pub db_connections: usize,
    /// Operations in flight (closed loop), the same for every system.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Measured window of each run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Unmeasured load before each window.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Pin servers to core 0 (taskset) and this client to core 1.
    #[arg(long)]
    pub pin: bool,
    /// The idemd binary (default: `idemd` next to this binary).
    #[arg(long)]
    pub idemd_bin: Option<PathBuf>,
    /// CQL contact points (Cassandra started by scripts/cassandra.sh).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9042")]
    pub cql_nodes: Vec<String>,
    /// Operations in flight for the two CQL systems (raw-lwt, idemd-cql):
    /// one Cassandra node on a shared 2-core machine times out Paxos rounds
    /// well before 64 in flight, which would measure timeouts, not
    /// throughput. Both get the same value, so P4 stays like for like.
    #[arg(long, default_value_t = 16)]
    pub cql_concurrency: usize,
    /// Workers racing for each key in `conflict`.
    #[arg(long, default_value_t = 16)]
    pub conflict_group: usize,
    /// Completed keys prepared for `replay` and `mixed`.
    #[arg(long, default_value_t = 2000)]
    pub replay_keys: usize,
}

impl Common {
    /// The idemd binary: `--idemd-bin`, else `idemd` next to this binary.
    pub(super) fn idemd_bin(&self) -> Result<PathBuf> {
        if let Some(bin) = &self.idemd_bin {
            return Ok(bin.clone());
        }
        let exe = std::env::current_exe()?;
        let bin = exe
            .parent()
            .map(|dir| dir.join("idemd"))
            .context("no directory for the idemd binary")?;
        if !bin.exists() {
            bail!(
                "{} not found: build it (cargo build --release) or pass --idemd-bin",
                bin.display()
            );
        }
        Ok(bin)
    }
}

/// `idemd-bench run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// System to measure.
    #[arg(long, value_enum)]
    pub system: SystemKind,
    /// Workload.
    #[arg(long, value_enum, default_value = "fresh")]
    pub workload: Workload,
    /// Open loop at this many operations per second (closed loop if unset).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Use this already running gRPC server (http://host:port) instead of
    /// starting one (noop and idemd-* only).
    #[arg(long)]
    pub target: Option<String>,
    /// Write the measurement as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `idemd-bench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub common: Common,
    /// Systems, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub systems: Vec<SystemKind>,
    /// Workloads, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Vec<Workload>,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where the .md, .json and .png go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
    /// Requests in flight for the P5 memory run (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub p5_inflight: usize,
    /// Skip the P3 open-loop runs at 50% of max replay load.
    #[arg(long)]
    pub no_open_loop: bool,
    /// Fail instead of skipping the CQL systems when no node answers.
    #[arg(long)]
    pub require_cql: bool,
    /// Skip the one-in-flight phase (bench/src/clients/).
    #[arg(long)]
    pub no_clients: bool,
    /// The ghz binary for the one-in-flight phase (`make bench` installs a
    /// pinned version: bench/scripts/tools.sh).
    #[arg(long)]
    pub ghz: Option<PathBuf>,
    /// The Go SDK loop binary built from bench/go (`make bench` builds it).
    #[arg(long)]
    pub go_sdk_loop: Option<PathBuf>,
    /// Timed calls per one-in-flight sequence.
    #[arg(long, default_value_t = 200)]
    pub client_calls: usize,
    /// How long ghz runs fresh Claims at 64 in flight, per system and run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ghz_duration: Duration,
}

/// `idemd-bench soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    #[command(flatten)]
    pub common: Common,
    /// System to soak.
    #[arg(long, value_enum, default_value = "idemd-embedded")]
    pub system: SystemKind,
    /// Workload.
    #[arg(long, value_enum, default_value = "mixed")]
    pub workload: Workload,
    /// Length of the soak.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub soak: Duration,
    /// Offered load as a fraction of the measured closed-loop maximum.
    #[arg(long, default_value_t = 0.5)]
    pub load_fraction: f64,
    /// A progress point (throughput, errors, RSS) this often.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub sample_every: Duration,
    /// Largest RSS growth tolerated between the first minute and the end, MiB
    /// (or 10%, whichever is larger).
    #[arg(long, default_value_t = 16.0)]
    pub rss_growth_mib: f64,
    /// Write the soak's points and verdict as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}
