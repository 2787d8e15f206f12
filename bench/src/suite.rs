//! The subcommands: `run` (one system, one workload), `compare` (every
//! system, every workload, repeated, with the targets and the files) and
//! `soak` (a long open-loop run watching RSS and errors).
//!
//! `compare` starts every server once and keeps them all up, then runs the
//! repetitions round-robin (run 1 of every system and workload, then run 2,
//! ...), so slow drift on a shared machine spreads over all systems instead
//! of biasing whichever ran last.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::load::{self, LoadSpec, ProgressPoint, Workload};
use crate::report::{self, Environment, Measurement, Report};
use crate::servers::{self, Server};
use crate::systems::{Client, Grpc, Lwt, Postgres, Redis};

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
    fn name(self) -> &'static str {
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

    fn needs_cql(self) -> bool {
        matches!(
            self,
            SystemKind::RawLwt | SystemKind::RawLwtIndexed | SystemKind::IdemdCql
        )
    }

    /// Whether the system enforces one winner per key.
    fn exclusive(self) -> bool {
        self != SystemKind::Noop
    }

    /// Whether the CPU pinning applies: the CQL systems share the machine
    /// with a Cassandra JVM that needs both cores, so neither the raw driver
    /// nor idemd-cql is pinned (the comparison between them stays fair).
    fn pinnable(self) -> bool {
        !self.needs_cql()
    }
}

const ALL_SYSTEMS: [SystemKind; 7] = [
    SystemKind::Noop,
    SystemKind::IdemdEmbedded,
    SystemKind::Postgres,
    SystemKind::Redis,
    SystemKind::RawLwt,
    SystemKind::RawLwtIndexed,
    SystemKind::IdemdCql,
];

const ALL_WORKLOADS: [Workload; 4] = [
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
    fn idemd_bin(&self) -> Result<PathBuf> {
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

    fn spec(&self, workload: Workload, system: &Running) -> LoadSpec {
        LoadSpec {
            workload,
            concurrency: if system.kind.needs_cql() {
                self.cql_concurrency
            } else {
                self.concurrency
            },
            duration: self.duration,
            warmup: self.warmup,
            rate: None,
            conflict_group: self.conflict_group,
            replay_keys: self.replay_keys,
            check_exclusive: system.kind.exclusive(),
            sample: system.sample.clone(),
            progress_every: None,
        }
    }
}

/// A started system: its server (if the bench started one), a client, and
/// the processes to sample.
struct Running {
    kind: SystemKind,
    server: Option<Server>,
    client: Arc<Client>,
    /// gRPC address, for extra clients (P5).
    grpc: Option<SocketAddr>,
    sample: Vec<(String, u32)>,
    connections: usize,
}

/// Waits until a gRPC server answers a Claim (idemd serves before its store
/// is open and answers UNAVAILABLE until then).
async fn wait_grpc(server: &mut Server, address: SocketAddr, timeout: Duration) -> Result<()> {
    let url = format!("http://{address}");
    let deadline = Instant::now() + timeout;
    let probe = format!("ready-{}", load::run_id());
    loop {
        server.check_alive()?;
        let last = match Grpc::connect(&url, 1).await {
            Ok(client) => match Client::Grpc(client).claim(&probe, 0).await {
                Ok(_) => return Ok(()),
                Err(error) => format!("{error:#}"),
            },
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() > deadline {
            bail!("{} not ready after {timeout:?}: {last}", server.name);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cql_reachable(nodes: &[String]) -> bool {
    nodes.iter().any(|node| {
        node.parse::<SocketAddr>().ok().is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        })
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

async fn start_system(kind: SystemKind, common: &Common) -> Result<Running> {
    let pin = common.pin && kind.pinnable();
    let cassandra = || {
        servers::cassandra_pid(&repo_root())
            .map(|pid| ("store".to_string(), pid))
            .into_iter()
            .collect::<Vec<_>>()
    };
    let grpc_system = |server: Server, address: SocketAddr, client: Grpc, extra: Vec<_>| {
        let mut sample: Vec<(String, u32)> = server
            .pid()
            .map(|pid| ("server".to_string(), pid))
            .into_iter()
            .collect();
        sample.extend(extra);
        Running {
            kind,
            server: Some(server),
            client: Arc::new(Client::Grpc(client)),
            grpc: Some(address),
            sample,
            connections: common.connections,
        }
    };
    match kind {
        SystemKind::Noop | SystemKind::IdemdEmbedded | SystemKind::IdemdCql => {
            let (mut server, address) = match kind {
                SystemKind::Noop => servers::start_noop(pin).await?,
                SystemKind::IdemdEmbedded => {
                    servers::start_idemd(&common.idemd_bin()?, &[], pin).await?
                }
                _ => {
                    let bin = common.idemd_bin()?;
                    servers::migrate_cql(&bin, &common.cql_nodes).await?;
                    let args = vec![
                        "--store".to_string(),
                        "cql".to_string(),
                        "--cql-nodes".to_string(),
                        common.cql_nodes.join(","),
                    ];
                    servers::start_idemd(&bin, &args, pin).await?
                }
            };
            wait_grpc(&mut server, address, Duration::from_secs(90)).await?;
            let client = Grpc::connect(&format!("http://{address}"), common.connections).await?;
            let extra = if kind == SystemKind::IdemdCql {
                cassandra()
            } else {
                Vec::new()
            };
            Ok(grpc_system(server, address, client, extra))
        }
        SystemKind::Postgres => {
            let (server, conninfo) = servers::start_postgres(pin).await?;
            Postgres::reset_schema(&conninfo).await?;
            let client = Postgres::connect(&conninfo, common.db_connections).await?;
            let sample = server
                .pid()
                .map(|pid| ("server".to_string(), pid))
                .into_iter()
                .collect();
            Ok(Running {
                kind,
                server: Some(server),
                client: Arc::new(Client::Postgres(client)),
                grpc: None,
                sample,
                connections: common.db_connections,
            })
        }
        SystemKind::Redis => {
            let (server, url) = servers::start_redis(pin).await?;
            let client = Redis::connect(&url, common.db_connections).await?;
            let sample = server
                .pid()
                .map(|pid| ("server".to_string(), pid))
                .into_iter()
                .collect();
            Ok(Running {
                kind,
                server: Some(server),
                client: Arc::new(Client::Redis(client)),
                grpc: None,
                sample,
                connections: common.db_connections,
            })
        }
        SystemKind::RawLwt | SystemKind::RawLwtIndexed => {
            // The table is idemd's: migrate (idempotent) so it exists.
            servers::migrate_cql(&common.idemd_bin()?, &common.cql_nodes).await?;
            let indexed = kind == SystemKind::RawLwtIndexed;
            let client = Lwt::connect(&common.cql_nodes, "idemd", indexed).await?;
            Ok(Running {
                kind,
                server: None,
                client: Arc::new(Client::Lwt(Box::new(client))),
                grpc: None,
                sample: cassandra(),
                connections: 1,
            })
        }
    }
}

async fn stop_all(systems: Vec<Running>) {
    for system in systems {
        if let Some(server) = system.server
            && let Err(error) = server.stop().await
        {
            eprintln!("idemd-bench: stopping {}: {error:#}", system.kind.name());
        }
    }
}

// ---------------------------------------------------------------------------
// run
// ---------------------------------------------------------------------------

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

/// Runs one measurement; false when it saw errors or violations.
pub async fn run(args: RunArgs) -> Result<bool> {
    let system = match &args.target {
        Some(url) => {
            if !matches!(
                args.system,
                SystemKind::Noop | SystemKind::IdemdEmbedded | SystemKind::IdemdCql
            ) {
                bail!("--target only applies to gRPC systems");
            }
            Running {
                kind: args.system,
                server: None,
                client: Arc::new(Client::Grpc(
                    Grpc::connect(url, args.common.connections).await?,
                )),
                grpc: None,
                sample: Vec::new(),
                connections: args.common.connections,
            }
        }
        None => start_system(args.system, &args.common).await?,
    };
    let mut spec = args.common.spec(args.workload, &system);
    spec.rate = args.rate;
    let concurrency = spec.concurrency;
    let result = load::run(Arc::clone(&system.client), &spec).await;
    let connections = system.connections;
    stop_all(vec![system]).await;
    let result = result?;
    let measurement = Measurement::new(
        args.system.name(),
        args.workload,
        0,
        args.rate,
        concurrency,
        connections,
        &result,
    );
    println!("{}", measurement.line());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&measurement)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(measurement.errors + measurement.errors_outside_window == 0 && measurement.violations == 0)
}

// ---------------------------------------------------------------------------
// compare
// ---------------------------------------------------------------------------

/// CPU (in cores) under which the suite's servers count as idle: an idle
/// Cassandra JVM still uses a few percent of a core for gossip and timers.
const SETTLED_CORES: f64 = 0.15;
/// Longest wait for the servers to go idle before a measurement; past it
/// the measurement runs anyway (and says it waited).
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

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
    /// Skip the one-in-flight phase (clients.rs).
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

/// Runs the comparison; false when any run saw errors or violations.
pub async fn compare(args: CompareArgs) -> Result<bool> {
    let common = &args.common;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let started_at = report::timestamp();
    let systems: Vec<SystemKind> = if args.systems.is_empty() {
        ALL_SYSTEMS.to_vec()
    } else {
        args.systems.clone()
    };
    let workloads: Vec<Workload> = if args.workloads.is_empty() {
        ALL_WORKLOADS.to_vec()
    } else {
        args.workloads.clone()
    };
    let mut skipped = Vec::new();
    let cql_up = cql_reachable(&common.cql_nodes);
    if !cql_up && systems.iter().any(|s| s.needs_cql()) {
        if args.require_cql {
            bail!(
                "no CQL node answers at {} (start one: scripts/cassandra.sh start)",
                common.cql_nodes.join(",")
            );
        }
        for s in systems.iter().filter(|s| s.needs_cql()) {
            skipped.push((
                s.name().to_string(),
                format!("no CQL node at {}", common.cql_nodes.join(",")),
            ));
        }
    }
    let mut running = Vec::new();
    for kind in systems.iter().copied() {
        if kind.needs_cql() && !cql_up {
            continue;
        }
        eprintln!("idemd-bench: starting {}", kind.name());
        match start_system(kind, common).await {
            Ok(system) => running.push(system),
            Err(error) => {
                stop_all(running).await;
                return Err(error.context(format!("starting {}", kind.name())));
            }
        }
    }
    let outcome = measure_all(&args, &running, &workloads).await;
    let clients = match &outcome {
        Ok(_) if !args.no_clients => measure_clients(&args, &running).await,
        _ => Ok(None),
    };
    stop_all(running).await;
    let (measurements, rss_1000) = outcome?;
    let clients = clients?;

    let summaries = report::summarize(&measurements);
    let mut targets = report::targets(&summaries, rss_1000);
    if let Some(clients) = &clients {
        targets.extend(crate::clients::targets(clients));
    }
    let settings = vec![
        (
            "load".to_string(),
            format!(
                "closed loop, {} operations in flight for every system except the CQL pair ({} in flight for raw-lwt, raw-lwt-indexed and idemd-cql alike: one Cassandra node times Paxos rounds out beyond that); {} gRPC connections (idemd, no-op), {} connections (Postgres, Redis), one driver session (raw LWT)",
                common.concurrency,
                common.cql_concurrency,
                common.connections,
                common.db_connections
            ),
        ),
        (
            "runs".to_string(),
            format!(
                "{} runs per system and workload, round-robin; {:?} measured after {:?} warm-up",
                args.runs, common.duration, common.warmup
            ),
        ),
        (
            "placement".to_string(),
            if common.pin {
                "servers pinned to core 0 (taskset), the bench client to core 1; the CQL systems (Cassandra, idemd-cql) unpinned".to_string()
            } else {
                "unpinned".to_string()
            },
        ),
        (
            "durability".to_string(),
            format!(
                "idemd-embedded fsyncs every acknowledged write (group commit); Postgres synchronous_commit=on, fsync=on; Redis appendonly yes, appendfsync everysec (not durable per operation); Cassandra commitlog_sync {} (scripts/cassandra.sh; raw-lwt and idemd-cql on the same node)",
                // What scripts/cassandra.sh wrote into the node's yaml.
                std::env::var("IDEMD_CASSANDRA_COMMITLOG_SYNC").unwrap_or_else(|_| "batch".into())
            ),
        ),
        (
            "workloads".to_string(),
            format!(
                "fresh = Claim + Complete on a unique key; replay = Claim of one of {} completed keys; conflict = {} consecutive claims race for each key, the winner completes (no-op not run: it enforces nothing); mixed = 90% fresh, 8% replay, 2% duplicate of a key claimed in flight",
                common.replay_keys, common.conflict_group
            ),
        ),
    ];
    let report = Report {
        started_at: started_at.clone(),
        command,
        environment: environment(common).await,
        settings,
        measurements,
        summaries,
        targets,
        skipped,
        clients,
    };
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let base = args.out_dir.join(&started_at);
    let png = base.with_extension("png");
    let chart_name = format!("{started_at}.png");
    let chart = match crate::chart::draw(
        &png,
        &report.summaries,
        &format!("idemd benchmark {started_at}"),
    ) {
        Ok(()) => Some(chart_name.as_str()),
        Err(error) => {
            eprintln!("idemd-bench: no chart: {error:#}");
            None
        }
    };
    let markdown = report.markdown(chart);
    std::fs::write(base.with_extension("md"), &markdown)?;
    std::fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{markdown}");
    eprintln!("idemd-bench: wrote {}.{{md,json,png}}", base.display());
    // A baseline's own errors (Cassandra timing out Paxos rounds under
    // load) are reported in the tables but do not fail the run; a violation
    // anywhere, or an error from idemd or the no-op server, does.
    let clean = report.measurements.iter().all(|m| {
        let ours = m.system.starts_with("idemd") || m.system == "noop";
        m.violations == 0 && (!ours || m.errors + m.errors_outside_window == 0)
    });
    if !clean {
        eprintln!(
            "idemd-bench: FAILED: idemd or the no-op server saw errors, or a key had two winners"
        );
    }
    Ok(clean)
}

/// The one-in-flight phase (clients.rs) against the no-op server and
/// idemd-embedded, when both run; the servers settle first.
async fn measure_clients(
    args: &CompareArgs,
    running: &[Running],
) -> Result<Option<crate::clients::ClientsReport>> {
    let address = |kind: SystemKind| running.iter().find(|s| s.kind == kind)?.grpc;
    let (Some(noop), Some(idemd)) = (
        address(SystemKind::Noop),
        address(SystemKind::IdemdEmbedded),
    ) else {
        eprintln!("idemd-bench: one-in-flight phase skipped: it needs noop and idemd-embedded");
        return Ok(None);
    };
    let mut pids: Vec<u32> = running
        .iter()
        .flat_map(|system| system.sample.iter().map(|(_, pid)| *pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    servers::settle(&pids, SETTLED_CORES, SETTLE_LIMIT).await;
    let targets = [
        crate::clients::Target {
            system: "noop",
            address: noop,
        },
        crate::clients::Target {
            system: "idemd-embedded",
            address: idemd,
        },
    ];
    let tools = crate::clients::Tools {
        ghz: args.ghz.clone(),
        go_loop: args.go_sdk_loop.clone(),
        pin: args.common.pin,
        parallel_for: args.ghz_duration,
    };
    crate::clients::measure(&targets, &tools, args.runs, args.client_calls)
        .await
        .map(Some)
}

/// The closed-loop matrix, then the P3 open-loop runs and the P5 run.
async fn measure_all(
    args: &CompareArgs,
    running: &[Running],
    workloads: &[Workload],
) -> Result<(Vec<Measurement>, Option<f64>)> {
    let common = &args.common;
    let mut measurements = Vec::new();
    // Every server and store process of the suite: all stay up throughout.
    let mut pids: Vec<u32> = running
        .iter()
        .flat_map(|system| system.sample.iter().map(|(_, pid)| *pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let settle = |before: String| {
        let pids = pids.clone();
        async move {
            let waited = servers::settle(&pids, SETTLED_CORES, SETTLE_LIMIT).await;
            if waited > Duration::from_secs(2) {
                eprintln!(
                    "idemd-bench: waited {waited:.1?} for the servers to go idle before {before}"
                );
            }
        }
    };
    for run in 1..=args.runs.max(1) {
        for &workload in workloads {
            for system in running {
                if workload == Workload::Conflict && !system.kind.exclusive() {
                    continue;
                }
                settle(format!("{} {}", system.kind.name(), workload.name())).await;
                let spec = common.spec(workload, system);
                let result = load::run(Arc::clone(&system.client), &spec).await?;
                let m = Measurement::new(
                    system.kind.name(),
                    workload,
                    run,
                    None,
                    spec.concurrency,
                    system.connections,
                    &result,
                );
                eprintln!("{}", m.line());
                measurements.push(m);
            }
        }
    }

    // P3: replay p99 at 50% of idemd's max replay load, idemd and no-op at
    // the same offered rate.
    let find = |kind: SystemKind| running.iter().find(|s| s.kind == kind);
    if !args.no_open_loop
        && workloads.contains(&Workload::Replay)
        && let (Some(idemd), Some(noop)) = (find(SystemKind::IdemdEmbedded), find(SystemKind::Noop))
    {
        let max = report::median(
            measurements
                .iter()
                .filter(|m| m.system == "idemd-embedded" && m.workload == Workload::Replay)
                .map(|m| m.throughput)
                .collect(),
        );
        let rate = (max * 0.5).max(1.0);
        for run in 1..=args.runs.max(1) {
            for system in [idemd, noop] {
                settle(format!("{} open-loop replay", system.kind.name())).await;
                let mut spec = common.spec(Workload::Replay, system);
                spec.rate = Some(rate);
                let result = load::run(Arc::clone(&system.client), &spec).await?;
                let m = Measurement::new(
                    system.kind.name(),
                    Workload::Replay,
                    run,
                    Some(rate),
                    spec.concurrency,
                    system.connections,
                    &result,
                );
                eprintln!("{} (open loop at {rate:.0}/s)", m.line());
                measurements.push(m);
            }
        }
    }

    // P5: idemd-embedded RSS with 1,000 requests in flight. h2 servers
    // allow a limited number of concurrent streams per connection, so the
    // load is spread over enough connections for every request to be in
    // flight at the server, not queued in the client.
    let mut rss_1000 = None;
    if args.p5_inflight > 0
        && let Some(idemd) = find(SystemKind::IdemdEmbedded)
        && let Some(address) = idemd.grpc
    {
        let connections = args.p5_inflight.div_ceil(100).max(1);
        let client = Arc::new(Client::Grpc(
            Grpc::connect(&format!("http://{address}"), connections).await?,
        ));
        let mut spec = common.spec(Workload::Fresh, idemd);
        spec.concurrency = args.p5_inflight;
        let result = load::run(client, &spec).await?;
        let mut m = Measurement::new(
            "idemd-embedded",
            Workload::Fresh,
            1,
            None,
            args.p5_inflight,
            connections,
            &result,
        );
        m.mode = format!("closed loop, {} in flight", args.p5_inflight);
        eprintln!("{} ({} in flight)", m.line(), args.p5_inflight);
        rss_1000 = m.server_rss_mib;
        measurements.push(m);
    }
    Ok((measurements, rss_1000))
}

/// Output of a command's first line, or "?".
async fn version_of(program: &Path, arg: &str) -> String {
    match tokio::process::Command::new(program)
        .arg(arg)
        .output()
        .await
    {
        Ok(output) => {
            let text = if output.stdout.is_empty() {
                output.stderr
            } else {
                output.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("?")
                .trim()
                .to_string()
        }
        Err(_) => "?".to_string(),
    }
}

async fn environment(common: &Common) -> Environment {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| "?".to_string());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    let mut versions = Vec::new();
    if let Ok(bin) = common.idemd_bin() {
        versions.push(("idemd".to_string(), version_of(&bin, "--version").await));
    }
    versions.push((
        "rustc".to_string(),
        version_of(Path::new("rustc"), "--version").await,
    ));
    versions.push(("tonic".to_string(), "0.14".to_string()));
    if let Some(bindir) = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|entries| entries.flatten().map(|e| e.path()).max())
    {
        versions.push((
            "postgres".to_string(),
            version_of(&bindir.join("bin/postgres"), "--version").await,
        ));
    }
    versions.push((
        "redis".to_string(),
        version_of(Path::new("redis-server"), "--version").await,
    ));
    let cassandra = std::fs::read_to_string(repo_root().join(".cache/cassandra/nodes/cluster.env"))
        .ok()
        .and_then(|env| {
            env.lines()
                .find_map(|l| l.strip_prefix("VERSION=").map(str::to_string))
        });
    if let Some(version) = cassandra {
        versions.push(("cassandra".to_string(), version));
    }
    Environment {
        cores,
        cpu_model,
        memory_gib,
        kernel,
        versions,
    }
}

// ---------------------------------------------------------------------------
// soak
// ---------------------------------------------------------------------------

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

#[derive(Debug, Serialize)]
struct SoakReport {
    system: String,
    workload: Workload,
    max_throughput: f64,
    rate: f64,
    duration_s: f64,
    errors: u64,
    violations: u64,
    rss_baseline_mib: f64,
    rss_end_mib: f64,
    rss_peak_mib: f64,
    p99_ms: f64,
    points: Vec<ProgressPoint>,
    passed: bool,
}

/// Measures the maximum, then runs open loop at a fraction of it for the
/// soak's length; false on errors, violations or RSS growth.
pub async fn soak(args: SoakArgs) -> Result<bool> {
    let system = start_system(args.system, &args.common).await?;
    let outcome = soak_on(&args, &system).await;
    stop_all(vec![system]).await;
    let report = outcome?;
    println!(
        "soak {} {}: {:.0}/s offered ({:.0}% of max {:.0}), {:.0} s, errors {}, violations {}, RSS {:.1} MiB after the first minute -> {:.1} MiB at the end (peak {:.1}), p99 {:.3} ms: {}",
        report.system,
        report.workload.name(),
        report.rate,
        args.load_fraction * 100.0,
        report.max_throughput,
        report.duration_s,
        report.errors,
        report.violations,
        report.rss_baseline_mib,
        report.rss_end_mib,
        report.rss_peak_mib,
        report.p99_ms,
        if report.passed { "PASSED" } else { "FAILED" }
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report.passed)
}

async fn soak_on(args: &SoakArgs, system: &Running) -> Result<SoakReport> {
    let common = &args.common;
    eprintln!(
        "idemd-bench: measuring the maximum of {} {} ({:?})",
        system.kind.name(),
        args.workload.name(),
        common.duration
    );
    let max = load::run(
        Arc::clone(&system.client),
        &common.spec(args.workload, system),
    )
    .await?
    .throughput();
    let rate = (max * args.load_fraction).max(1.0);
    eprintln!("idemd-bench: soaking at {rate:.0}/s for {:?}", args.soak);
    let mut spec = common.spec(args.workload, system);
    spec.rate = Some(rate);
    spec.duration = args.soak;
    spec.progress_every = Some(args.sample_every);
    let result = load::run(Arc::clone(&system.client), &spec).await?;
    let points = result.progress.clone();
    // Baseline: the first point at or after one minute (warm caches and
    // allocator arenas), or the first point of a shorter soak.
    let baseline = points
        .iter()
        .find(|p| p.at_s >= 60.0)
        .or(points.first())
        .map(|p| p.server_rss_mib)
        .unwrap_or(0.0);
    let end = points.last().map(|p| p.server_rss_mib).unwrap_or(0.0);
    let peak = points.iter().map(|p| p.server_rss_mib).fold(0.0, f64::max);
    let allowed = args.rss_growth_mib.max(baseline * 0.10);
    let errors = result.errors + result.errors_outside_window;
    let passed = errors == 0 && result.violations == 0 && end - baseline <= allowed;
    Ok(SoakReport {
        system: system.kind.name().to_string(),
        workload: args.workload,
        max_throughput: max,
        rate,
        duration_s: result.elapsed.as_secs_f64(),
        errors,
        violations: result.violations,
        rss_baseline_mib: baseline,
        rss_end_mib: end,
        rss_peak_mib: peak,
        p99_ms: result.percentile_ms(0.99),
        points,
        passed,
    })
}
