//! The `ghz` client: the common gRPC load tool (grpc-go), discovering the
//! service by reflection. It cannot chain a Complete to a Claim, so it runs
//! fresh Claims and replays only; it also measures fresh Claims at 64 in
//! flight.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};

use super::probe::{Parallel, Probe, TENANT, Target, Tools, client_command, output_of};
use crate::systems::{ENDPOINT, FINGERPRINT};

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

pub(super) async fn sequence(
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
pub(super) async fn parallel(
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
