//! The `go-sdk` client: a loop over the Go SDK's raw `Claim` and its
//! executor (`bench/go`, built against `clients/go`), which times its own
//! calls and prints one JSON object.

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::probe::{Probe, TENANT, Target, WARMUP_CALLS, client_command, output_of, unique_key};
use crate::systems::ENDPOINT;

/// What the Go loop prints (one JSON object).
#[derive(Debug, serde::Deserialize)]
struct GoReport {
    calls: usize,
    p50_ms: f64,
    p99_ms: f64,
}

pub(super) async fn sequence(
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
