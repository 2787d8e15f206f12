//! What the clients' probes share: what one timed call does ([`Probe`]),
//! which clients run ([`ClientKind`]), the figures and report they make,
//! and the helpers that build and run a client's command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// The tenant the probes run as (servers run with auth off).
pub(super) const TENANT: &str = "bench";
/// Unmeasured calls before each measured sequence (connection set-up,
/// first store write, caches).
pub(super) const WARMUP_CALLS: usize = 20;

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
    pub(super) fn replay_bytes(self) -> Option<usize> {
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

    pub(super) fn supports(self, probe: Probe) -> bool {
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

/// A key unique to this process and call.
pub(super) fn unique_key(prefix: &str) -> String {
    format!("{prefix}-{}", crate::ids::run_id())
}

/// A command for an external client, on the client core when pinned.
pub(super) fn client_command(program: &Path, pin: bool) -> tokio::process::Command {
    if pin {
        let mut command = tokio::process::Command::new("taskset");
        command.arg("-c").arg("1").arg(program);
        command
    } else {
        tokio::process::Command::new(program)
    }
}

pub(super) async fn output_of(mut command: tokio::process::Command, what: &str) -> Result<Vec<u8>> {
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
