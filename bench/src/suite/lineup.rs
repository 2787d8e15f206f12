//! The line-up: starting one system under test (its server, a client of
//! it, the processes to sample) and stopping them all. Every subcommand
//! measures what this returns, so `run`, `compare` and `soak` start a
//! system the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::options::{Common, SystemKind};
use crate::load::{LoadSpec, Workload};
use crate::servers::{self, Server};
use crate::systems::{Client, Grpc, Lwt, Postgres, Redis};

/// A started system: its server (if the bench started one), a client, and
/// the processes to sample.
pub(super) struct Running {
    /// Which system, for names and per-system settings.
    pub(super) kind: SystemKind,
    /// The server the bench started and stops (none for a `--target` or
    /// the raw driver, whose Cassandra runs outside).
    pub(super) server: Option<Server>,
    /// The client every workload runs over.
    pub(super) client: Arc<Client>,
    /// gRPC address, for extra clients (P5).
    pub(super) grpc: Option<SocketAddr>,
    /// Processes sampled during each window: `(role, pid)`.
    pub(super) sample: Vec<(String, u32)>,
    /// Connections of `client`, for the report.
    pub(super) connections: usize,
}

impl Running {
    /// The load of one measurement of `workload` on this system, as the
    /// shared flags say (closed loop; callers set a rate or a length).
    pub(super) fn spec(&self, common: &Common, workload: Workload) -> LoadSpec {
        LoadSpec {
            workload,
            concurrency: if self.kind.needs_cql() {
                common.cql_concurrency
            } else {
                common.concurrency
            },
            duration: common.duration,
            warmup: common.warmup,
            rate: None,
            conflict_group: common.conflict_group,
            replay_keys: common.replay_keys,
            check_exclusive: self.kind.exclusive(),
            sample: self.sample.clone(),
            progress_every: None,
        }
    }
}

/// Waits until a gRPC server answers a Claim (idemd serves before its store
/// is open and answers UNAVAILABLE until then).
async fn wait_grpc(server: &mut Server, address: SocketAddr, timeout: Duration) -> Result<()> {
    let url = format!("http://{address}");
    let deadline = Instant::now() + timeout;
    let probe = format!("ready-{}", crate::ids::run_id());
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

/// Whether any CQL contact point accepts a TCP connection within 2 s (the
/// CQL systems are skipped, or `--require-cql` fails, when none does).
pub(super) fn cql_reachable(nodes: &[String]) -> bool {
    nodes.iter().any(|node| {
        node.parse::<SocketAddr>().ok().is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        })
    })
}

/// The repository this bench was built in (Cassandra's files live under
/// its `.cache/`).
pub(super) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The server's own process, sampled as `server`.
fn server_sample(server: &Server) -> Vec<(String, u32)> {
    server
        .pid()
        .map(|pid| ("server".to_string(), pid))
        .into_iter()
        .collect()
}

/// Starts `kind` as the flags say: its server (none for the raw driver),
/// a client connected to it, and the processes to sample.
pub(super) async fn start_system(kind: SystemKind, common: &Common) -> Result<Running> {
    let pin = common.pin && kind.pinnable();
    let cassandra = || {
        servers::cassandra_pid(&repo_root())
            .map(|pid| ("store".to_string(), pid))
            .into_iter()
            .collect::<Vec<_>>()
    };
    let grpc_system = |server: Server, address: SocketAddr, client: Grpc, extra: Vec<_>| {
        let mut sample = server_sample(&server);
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
            let sample = server_sample(&server);
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
            let sample = server_sample(&server);
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

/// Stops every server the line-up started (a failure is printed, not
/// returned: the others still stop).
pub(super) async fn stop_all(systems: Vec<Running>) {
    for system in systems {
        if let Some(server) = system.server
            && let Err(error) = server.stop().await
        {
            eprintln!("idemd-bench: stopping {}: {error:#}", system.kind.name());
        }
    }
}
