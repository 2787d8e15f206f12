//! One request in flight, through the clients users run.
//!
//! Why this phase exists: the closed-loop matrix drives many requests in
//! flight from this crate's own tonic client, and that once hid a transport
//! defect that idemd and the no-op server shared (TCP_NODELAY missing on
//! accepted sockets: ~44 ms per call at one in flight through ghz, grpc-go,
//! grpcio and every SDK, issue 12). A service calls idemd before each side
//! effect, usually one call at a time, so the figure users feel is the
//! sequential latency through their own gRPC library. Each probe is timed
//! against idemd-embedded and the no-op server in the same run, per client:
//!
//! * `rust`: a tonic client of this crate, one connection, sequential calls.
//! * `ghz`: the common gRPC load tool (grpc-go), discovering the service by
//!   reflection, `--concurrency 1 --connections 1`; it cannot chain a
//!   Complete to a Claim, so it has no `pair` figure.
//! * `go-sdk`: a loop over the Go SDK's raw `Claim` and its executor
//!   (`bench/go`, built against `clients/go`).
//!
//! Probes: a fresh `claim` (unique key, sha256 fingerprint), a `pair`
//! (Claim + Complete of a unique key; the executor's ExecuteOnce for the Go
//! SDK), and replays of a completed key whose stored body is 1 KiB or
//! 16 KiB. ghz also measures fresh Claims at 64 in flight over 4
//! connections (throughput, 10 s by default).

//!
//! One module per client (`rust`, `ghz`, `go`), each timing one sequence of
//! a probe; `summary` turns the figures into medians, targets and the
//! report's section.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

mod ghz;
mod go;
mod rust;
mod summary;

pub use summary::targets;

/// The tenant the probes run as (servers run with auth off).
const TENANT: &str = "bench";
/// Unmeasured calls before each measured sequence (connection set-up,
/// first store write, caches).
const WARMUP_CALLS: usize = 20;

/// What one timed call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probe {
    /// A Claim of a unique key.
    Claim,
    /// Claim + Complete of a unique key.
    Pair,
    /// A Claim of a key completed with a 1 KiB body.
    Replay1k,
    /// A Claim of a key completed with a 16 KiB body.
    Replay16k,
}

/// Every probe, in report order.
pub const PROBES: [Probe; 4] = [Probe::Claim, Probe::Pair, Probe::Replay1k, Probe::Replay16k];

impl Probe {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Probe::Claim => "fresh Claim",
            Probe::Pair => "Claim+Complete pair",
            Probe::Replay1k => "replay, 1 KiB body",
            Probe::Replay16k => "replay, 16 KiB body",
        }
    }

    /// Stored body size of a replay probe.
    fn replay_bytes(self) -> Option<usize> {
        match self {
            Probe::Replay1k => Some(1024),
            Probe::Replay16k => Some(16 * 1024),
            Probe::Claim | Probe::Pair => None,
        }
    }
}

/// The clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientKind {
    /// This crate's tonic client.
    Rust,
    /// ghz.
    Ghz,
    /// The Go SDK.
    GoSdk,
}

/// Every client, in report order.
pub const CLIENTS: [ClientKind; 3] = [ClientKind::Rust, ClientKind::Ghz, ClientKind::GoSdk];

impl ClientKind {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Rust => "rust",
            ClientKind::Ghz => "ghz",
            ClientKind::GoSdk => "go-sdk",
        }
    }

    fn supports(self, probe: Probe) -> bool {
        !(self == ClientKind::Ghz && probe == Probe::Pair)
    }
}

/// The external clients and how to place them.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The ghz binary (`None`: ghz figures are skipped and say so).
    pub ghz: Option<PathBuf>,
    /// The Go SDK loop binary built from `bench/go`.
    pub go_loop: Option<PathBuf>,
    /// Run external clients on core 1 (`taskset`), like this process.
    pub pin: bool,
    /// How long ghz runs at 64 in flight.
    pub parallel_for: Duration,
}

/// One measured sequence.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// `noop` or `idemd-embedded`.
    pub system: String,
    /// The client.
    pub client: ClientKind,
    /// The probe.
    pub probe: Probe,
    /// Repetition (1-based).
    pub run: usize,
    /// Calls timed.
    pub calls: usize,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
}

/// ghz at 64 requests in flight, fresh Claims.
#[derive(Debug, Clone, Serialize)]
pub struct Parallel {
    /// `noop` or `idemd-embedded`.
    pub system: String,
    /// Repetition (1-based).
    pub run: usize,
    /// Claims per second.
    pub throughput: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// Calls that did not answer OK.
    pub errors: u64,
}

/// Everything the phase measured.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ClientsReport {
    /// Calls per sequence.
    pub calls: usize,
    /// Every sequence, every run.
    pub figures: Vec<Figure>,
    /// ghz at 64 in flight, every run.
    pub parallel: Vec<Parallel>,
    /// Clients not measured and why.
    pub skipped: Vec<String>,
}

/// A system the phase measures.
pub struct Target<'a> {
    /// `noop` or `idemd-embedded`.
    pub system: &'a str,
    /// Its gRPC address.
    pub address: std::net::SocketAddr,
}

/// Runs every probe through every client against every target, `runs`
/// times round-robin.
pub async fn measure(
    targets: &[Target<'_>],
    tools: &Tools,
    runs: usize,
    calls: usize,
) -> Result<ClientsReport> {
    let mut report = ClientsReport {
        calls,
        ..ClientsReport::default()
    };
    if tools.ghz.is_none() {
        report
            .skipped
            .push("ghz: not given (--ghz; `make bench` installs it)".into());
    }
    if tools.go_loop.is_none() {
        report
            .skipped
            .push("go-sdk: not given (--go-sdk-loop; `make bench` builds it)".into());
    }
    for run in 1..=runs.max(1) {
        for target in targets {
            let url = format!("http://{}", target.address);
            let mut rust = rust::connect(&url).await?;
            let replay_keys = rust::prepare_replay_keys(&mut rust, target.system).await?;
            for probe in PROBES {
                let replay_key = probe
                    .replay_bytes()
                    .and_then(|size| replay_keys.iter().find(|(s, _)| *s == size))
                    .map(|(_, key)| key.as_str());
                for client in CLIENTS {
                    if !client.supports(probe) {
                        continue;
                    }
                    let sample = match client {
                        ClientKind::Rust => {
                            Some(rust::sequence(&mut rust, probe, replay_key, calls).await?)
                        }
                        ClientKind::Ghz => match &tools.ghz {
                            Some(ghz) => Some(
                                ghz::sequence(ghz, tools.pin, target, probe, replay_key, calls)
                                    .await?,
                            ),
                            None => None,
                        },
                        ClientKind::GoSdk => match &tools.go_loop {
                            Some(bin) => Some(
                                go::sequence(bin, tools.pin, target, probe, replay_key, calls)
                                    .await?,
                            ),
                            None => None,
                        },
                    };
                    if let Some((p50_ms, p99_ms)) = sample {
                        let figure = Figure {
                            system: target.system.to_string(),
                            client,
                            probe,
                            run,
                            calls,
                            p50_ms,
                            p99_ms,
                        };
                        eprintln!(
                            "idemd-bench: 1 in flight run {run} {:<15} {:<7} {:<22} p50 {:.3} ms p99 {:.3} ms",
                            figure.system,
                            client.name(),
                            probe.name(),
                            p50_ms,
                            p99_ms
                        );
                        report.figures.push(figure);
                    }
                }
            }
            if let Some(ghz) = &tools.ghz {
                let parallel = ghz::parallel(ghz, tools, target, run).await?;
                eprintln!(
                    "idemd-bench: ghz 64 in flight run {run} {:<15} {:.0} claims/s p50 {:.3} ms errors {}",
                    parallel.system, parallel.throughput, parallel.p50_ms, parallel.errors
                );
                report.parallel.push(parallel);
            }
        }
    }
    Ok(report)
}

/// A key unique to this process and call.
fn unique_key(prefix: &str) -> String {
    format!("{prefix}-{}", crate::ids::run_id())
}

/// A command for an external client, on the client core when pinned.
fn client_command(program: &Path, pin: bool) -> tokio::process::Command {
    if pin {
        let mut command = tokio::process::Command::new("taskset");
        command.arg("-c").arg("1").arg(program);
        command
    } else {
        tokio::process::Command::new(program)
    }
}

async fn output_of(mut command: tokio::process::Command, what: &str) -> Result<Vec<u8>> {
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
}
