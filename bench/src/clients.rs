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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use serde::Serialize;
use tonic::transport::Channel;

use std::fmt::Write as _;

use crate::report::{Target as Goal, median, ratio_target};
use crate::systems::{ENDPOINT, FINGERPRINT};

/// The tenant the probes run as (servers run with auth off).
const TENANT: &str = "bench";
/// Unmeasured calls before each measured sequence (connection set-up,
/// first store write, caches).
const WARMUP_CALLS: usize = 20;
/// The response stored by `pair` probes.
const PAIR_BODY: &[u8] = br#"{"id":"pay_9F2Kx","status":"succeeded","amount":4200}"#;

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
            let mut rust = connect(&url).await?;
            let replay_keys = prepare_replay_keys(&mut rust, target.system).await?;
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
                            Some(rust_sequence(&mut rust, probe, replay_key, calls).await?)
                        }
                        ClientKind::Ghz => match &tools.ghz {
                            Some(ghz) => Some(
                                ghz_sequence(ghz, tools.pin, target, probe, replay_key, calls)
                                    .await?,
                            ),
                            None => None,
                        },
                        ClientKind::GoSdk => match &tools.go_loop {
                            Some(bin) => Some(
                                go_sequence(bin, tools.pin, target, probe, replay_key, calls)
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
                let parallel = ghz_parallel(ghz, tools, target, run).await?;
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

async fn connect(url: &str) -> Result<IdempotencyClient<Channel>> {
    let channel = Channel::from_shared(url.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(IdempotencyClient::new(channel))
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "x-tenant-id",
        tonic::metadata::MetadataValue::from_static(TENANT),
    );
    request
}

fn claim_message(key: &str) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: ENDPOINT.into(),
        key: key.into(),
        fingerprint: Some(pb::claim_request::Fingerprint::Sha256(FINGERPRINT.to_vec())),
        ..Default::default()
    }
}

fn stored(body: Vec<u8>) -> pb::StoredResponse {
    pb::StoredResponse {
        status: 201,
        headers: vec![pb::Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body,
        body_ref: String::new(),
    }
}

/// A key unique to this process and call.
fn unique_key(prefix: &str) -> String {
    format!("{prefix}-{}", crate::load::run_id())
}

/// The replay key of a body size: the no-op server answers `rb<SIZE>-` keys
/// with a stored body of that size; idemd gets the key completed here.
async fn prepare_replay_keys(
    client: &mut IdempotencyClient<Channel>,
    system: &str,
) -> Result<Vec<(usize, String)>> {
    let mut keys = Vec::new();
    for size in PROBES.iter().filter_map(|p| p.replay_bytes()) {
        let key = unique_key(&format!("rb{size}"));
        let response = client
            .claim(request(claim_message(&key)))
            .await
            .map_err(|s| anyhow!("{system}: claim of replay key: {s}"))?
            .into_inner();
        match response.outcome {
            Some(pb::claim_response::Outcome::Claimed(claimed)) => {
                client
                    .complete(request(pb::CompleteRequest {
                        endpoint: ENDPOINT.into(),
                        key: key.clone(),
                        lease_token: claimed.lease_token,
                        response: Some(stored(vec![b'x'; size])),
                    }))
                    .await
                    .map_err(|s| anyhow!("{system}: complete of replay key: {s}"))?;
            }
            // The no-op server's canned answer for `rb` keys.
            Some(pb::claim_response::Outcome::Replayed(_)) => {}
            other => bail!("{system}: replay key set-up got {other:?}"),
        }
        keys.push((size, key));
    }
    Ok(keys)
}

/// p50 and p99 in ms of a sample.
fn percentiles_ms(mut sample: Vec<Duration>) -> (f64, f64) {
    sample.sort_unstable();
    if sample.is_empty() {
        return (0.0, 0.0);
    }
    let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
    (
        at(0.50).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
    )
}

async fn rust_call(
    client: &mut IdempotencyClient<Channel>,
    probe: Probe,
    replay_key: Option<&str>,
) -> Result<()> {
    use pb::claim_response::Outcome;
    match (probe, replay_key) {
        (Probe::Claim, _) => {
            let response = client
                .claim(request(claim_message(&unique_key("c1"))))
                .await?
                .into_inner();
            if !matches!(response.outcome, Some(Outcome::Claimed(_))) {
                bail!("fresh claim answered {:?}", response.outcome);
            }
        }
        (Probe::Pair, _) => {
            let key = unique_key("p1");
            let response = client
                .claim(request(claim_message(&key)))
                .await?
                .into_inner();
            let Some(Outcome::Claimed(claimed)) = response.outcome else {
                bail!("fresh claim answered {:?}", response.outcome);
            };
            client
                .complete(request(pb::CompleteRequest {
                    endpoint: ENDPOINT.into(),
                    key,
                    lease_token: claimed.lease_token,
                    response: Some(stored(PAIR_BODY.to_vec())),
                }))
                .await?;
        }
        (Probe::Replay1k | Probe::Replay16k, Some(key)) => {
            let response = client
                .claim(request(claim_message(key)))
                .await?
                .into_inner();
            let Some(Outcome::Replayed(replayed)) = response.outcome else {
                bail!("replay answered {:?}", response.outcome);
            };
            let expected = probe.replay_bytes().unwrap_or(0);
            let got = replayed.response.map_or(0, |r| r.body.len());
            if got != expected {
                bail!("replayed body of {got} bytes, expected {expected}");
            }
        }
        (_, None) => bail!("no replay key for {}", probe.name()),
    }
    Ok(())
}

async fn rust_sequence(
    client: &mut IdempotencyClient<Channel>,
    probe: Probe,
    replay_key: Option<&str>,
    calls: usize,
) -> Result<(f64, f64)> {
    for _ in 0..WARMUP_CALLS {
        rust_call(client, probe, replay_key).await?;
    }
    let mut sample = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        rust_call(client, probe, replay_key).await?;
        sample.push(started.elapsed());
    }
    Ok(percentiles_ms(sample))
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

/// The Claim request ghz sends, as proto3 JSON. `{{.UUID}}` is ghz's
/// per-call template value, so every fresh Claim has its own key.
fn ghz_data(key: &str) -> String {
    use base64::Engine as _;
    let digest = base64::engine::general_purpose::STANDARD.encode(FINGERPRINT);
    serde_json::json!({ "endpoint": ENDPOINT, "key": key, "sha256": digest }).to_string()
}

/// What ghz's `--format json` report holds that the bench reads.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GhzReport {
    count: u64,
    rps: f64,
    #[serde(default)]
    latency_distribution: Vec<GhzPercentile>,
    #[serde(default)]
    status_code_distribution: std::collections::HashMap<String, u64>,
    #[serde(default)]
    error_distribution: std::collections::HashMap<String, u64>,
}

#[derive(Debug, serde::Deserialize)]
struct GhzPercentile {
    percentage: u32,
    /// Nanoseconds.
    latency: u64,
}

impl GhzReport {
    fn percentile_ms(&self, percentage: u32) -> Result<f64> {
        self.latency_distribution
            .iter()
            .find(|p| p.percentage == percentage)
            .map(|p| p.latency as f64 / 1e6)
            .ok_or_else(|| anyhow!("ghz report without p{percentage}"))
    }

    fn errors(&self) -> u64 {
        self.status_code_distribution
            .iter()
            .filter(|(code, _)| code.as_str() != "OK")
            .map(|(_, n)| *n)
            .sum()
    }
}

async fn run_ghz(
    ghz: &Path,
    pin: bool,
    target: &Target<'_>,
    data: &str,
    args: &[&str],
) -> Result<GhzReport> {
    let mut command = client_command(ghz, pin);
    command
        .arg("--insecure")
        .arg("--call")
        .arg("idemd.v1.Idempotency/Claim")
        .arg("--data")
        .arg(data)
        .arg("--metadata")
        .arg(format!(r#"{{"x-tenant-id":"{TENANT}"}}"#))
        .arg("--format")
        .arg("json")
        .args(args)
        .arg(target.address.to_string());
    let stdout = output_of(command, "ghz").await?;
    let report: GhzReport = serde_json::from_slice(&stdout)
        .with_context(|| format!("reading ghz's report: {}", String::from_utf8_lossy(&stdout)))?;
    if report.errors() > 0 || !report.error_distribution.is_empty() {
        bail!(
            "ghz against {}: errors {:?}",
            target.system,
            report.error_distribution
        );
    }
    Ok(report)
}

async fn ghz_sequence(
    ghz: &Path,
    pin: bool,
    target: &Target<'_>,
    probe: Probe,
    replay_key: Option<&str>,
    calls: usize,
) -> Result<(f64, f64)> {
    let data = match (probe, replay_key) {
        (Probe::Claim, _) => ghz_data("g1-{{.UUID}}"),
        (Probe::Replay1k | Probe::Replay16k, Some(key)) => ghz_data(key),
        _ => bail!("ghz cannot run {}", probe.name()),
    };
    // ghz has no warm-up: the first calls open the connection and resolve
    // reflection, a handful of calls in a sample of `calls`.
    let total = calls.to_string();
    let report = run_ghz(
        ghz,
        pin,
        target,
        &data,
        &[
            "--concurrency",
            "1",
            "--connections",
            "1",
            "--total",
            &total,
        ],
    )
    .await?;
    if report.count < calls as u64 {
        bail!("ghz made {} of {calls} calls", report.count);
    }
    Ok((report.percentile_ms(50)?, report.percentile_ms(99)?))
}

/// Fresh Claims at 64 in flight over 4 connections for `tools.parallel_for`.
async fn ghz_parallel(
    ghz: &Path,
    tools: &Tools,
    target: &Target<'_>,
    run: usize,
) -> Result<Parallel> {
    let duration = format!("{}ms", tools.parallel_for.as_millis());
    let report = run_ghz(
        ghz,
        tools.pin,
        target,
        &ghz_data("g64-{{.UUID}}"),
        &[
            "--concurrency",
            "64",
            "--connections",
            "4",
            "--duration",
            &duration,
            // ghz's default closes the connections under the calls still in
            // flight when the time is up and counts them as errors.
            "--duration-stop",
            "wait",
        ],
    )
    .await?;
    Ok(Parallel {
        system: target.system.to_string(),
        run,
        throughput: report.rps,
        p50_ms: report.percentile_ms(50)?,
        errors: report.errors(),
    })
}

/// What the Go loop prints (one JSON object).
#[derive(Debug, serde::Deserialize)]
struct GoReport {
    calls: usize,
    p50_ms: f64,
    p99_ms: f64,
}

async fn go_sequence(
    bin: &Path,
    pin: bool,
    target: &Target<'_>,
    probe: Probe,
    replay_key: Option<&str>,
    calls: usize,
) -> Result<(f64, f64)> {
    let mut command = client_command(bin, pin);
    command
        .arg("-addr")
        .arg(target.address.to_string())
        .arg("-tenant")
        .arg(TENANT)
        .arg("-endpoint")
        .arg(ENDPOINT)
        .arg("-calls")
        .arg(calls.to_string())
        .arg("-warmup")
        .arg(WARMUP_CALLS.to_string());
    match (probe, replay_key) {
        (Probe::Claim, _) => command.arg("-probe").arg("claim"),
        (Probe::Pair, _) => command.arg("-probe").arg("pair"),
        // A key of its own, stored through the executor by the loop's first
        // call: the executor's fingerprint (the request itself) is not the
        // fixed digest the other clients' replay keys were stored under.
        (_, Some(_)) => {
            let size = probe.replay_bytes().unwrap_or(0);
            command
                .arg("-probe")
                .arg("replay")
                .arg("-key")
                .arg(unique_key(&format!("rb{size}-go")))
                .arg("-body-bytes")
                .arg(size.to_string())
        }
        (_, None) => bail!("no replay key for {}", probe.name()),
    };
    let stdout = output_of(command, "the Go SDK loop").await?;
    let report: GoReport = serde_json::from_slice(&stdout).with_context(|| {
        format!(
            "reading the Go SDK loop's output: {}",
            String::from_utf8_lossy(&stdout)
        )
    })?;
    if report.calls != calls {
        bail!("the Go SDK loop made {} of {calls} calls", report.calls);
    }
    Ok((report.p50_ms, report.p99_ms))
}

/// Medians over the runs of one (system, client, probe).
pub fn median_of(
    report: &ClientsReport,
    system: &str,
    client: ClientKind,
    probe: Probe,
) -> Option<(f64, f64)> {
    let rows: Vec<&Figure> = report
        .figures
        .iter()
        .filter(|f| f.system == system && f.client == client && f.probe == probe)
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some((
        median(rows.iter().map(|f| f.p50_ms).collect()),
        median(rows.iter().map(|f| f.p99_ms).collect()),
    ))
}

/// Median ghz throughput at 64 in flight of `system`.
pub fn parallel_median(report: &ClientsReport, system: &str) -> Option<f64> {
    let values: Vec<f64> = report
        .parallel
        .iter()
        .filter(|p| p.system == system)
        .map(|p| p.throughput)
        .collect();
    (!values.is_empty()).then(|| median(values))
}

/// The issue's goals for this phase: per client and probe, idemd's p50 at
/// one in flight at most 1.5x the no-op server's; ghz at 64 in flight at
/// least 0.6x the no-op server's fresh Claims/s.
pub fn targets(report: &ClientsReport) -> Vec<Goal> {
    let mut out = Vec::new();
    for client in CLIENTS {
        for probe in PROBES.into_iter().filter(|&p| client.supports(p)) {
            let side = |system: &str| {
                median_of(report, system, client, probe)
                    .map(|(p50, _)| (p50, format!("{system} p50 {p50:.3} ms")))
            };
            let (idemd, noop) = (side("idemd-embedded"), side("noop"));
            if idemd.is_none() && noop.is_none() {
                continue;
            }
            out.push(ratio_target(
                &format!("C1 {}", client.name()),
                &format!("1 in flight, {}, p50 vs no-op", probe.name()),
                idemd,
                noop,
                None,
                Some(1.5),
            ));
        }
    }
    let parallel = |system: &str| {
        parallel_median(report, system).map(|t| (t, format!("{system} {t:.0} claims/s")))
    };
    if !report.parallel.is_empty() {
        out.push(ratio_target(
            "C2 ghz",
            "64 in flight over 4 connections, fresh Claims/s vs no-op",
            parallel("idemd-embedded"),
            parallel("noop"),
            Some(0.6),
            None,
        ));
    }
    out
}

impl ClientsReport {
    /// The one-in-flight section of the markdown page.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "\n## One request in flight, per client (median over the runs)\n\n\
             {} sequential calls per sequence after {WARMUP_CALLS} unmeasured ones (ghz: no \
             warm-up); latencies in ms; ratio = idemd p50 / no-op p50.\n",
            self.calls
        );
        let _ = writeln!(
            md,
            "| client | probe | idemd p50 | idemd p99 | no-op p50 | no-op p99 | ratio p50 |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for client in CLIENTS {
            for probe in PROBES.into_iter().filter(|&p| client.supports(p)) {
                let idemd = median_of(self, "idemd-embedded", client, probe);
                let noop = median_of(self, "noop", client, probe);
                if idemd.is_none() && noop.is_none() {
                    continue;
                }
                let part = |v: Option<(f64, f64)>, p99: bool| {
                    v.map_or(String::new(), |(p50, p99_ms)| {
                        format!("{:.3}", if p99 { p99_ms } else { p50 })
                    })
                };
                let ratio = match (idemd, noop) {
                    (Some((a, _)), Some((b, _))) if b > 0.0 => format!("{:.2}", a / b),
                    _ => String::new(),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    client.name(),
                    probe.name(),
                    part(idemd, false),
                    part(idemd, true),
                    part(noop, false),
                    part(noop, true),
                    ratio
                );
            }
        }
        if !self.parallel.is_empty() {
            let _ = writeln!(
                md,
                "\nghz, fresh Claims at 64 in flight over 4 connections, 10 s: idemd {:.0}/s, \
                 no-op {:.0}/s (medians).",
                parallel_median(self, "idemd-embedded").unwrap_or(0.0),
                parallel_median(self, "noop").unwrap_or(0.0)
            );
        }
        for why in &self.skipped {
            let _ = writeln!(md, "\n- skipped {why}");
        }
        md
    }
}
