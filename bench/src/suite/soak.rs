//! `idemd-bench soak`: the closed-loop maximum, then a long open-loop run
//! at a fraction of it, watching the server's RSS and the errors; fails on
//! either.

use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;

use super::lineup::{Running, start_system, stop_all};
use super::options::SoakArgs;
use crate::load::{self, ProgressPoint, Workload};

/// The soak's verdict and its evidence, as printed and written to JSON.
#[derive(Debug, Serialize)]
struct SoakReport {
    /// System soaked.
    system: String,
    /// Workload soaked.
    workload: Workload,
    /// Closed-loop maximum measured first, operations/s.
    max_throughput: f64,
    /// Offered rate of the soak (`--load-fraction` of the maximum).
    rate: f64,
    /// Length of the soak window, s.
    duration_s: f64,
    /// Failed operations, in and out of the window.
    errors: u64,
    /// Exactly-one-winner violations.
    violations: u64,
    /// Server RSS at the first point after one minute (warm caches), MiB.
    rss_baseline_mib: f64,
    /// Server RSS at the last point, MiB.
    rss_end_mib: f64,
    /// Highest server RSS of any point, MiB.
    rss_peak_mib: f64,
    /// 99th percentile latency over the soak, ms.
    p99_ms: f64,
    /// Every progress point.
    points: Vec<ProgressPoint>,
    /// No errors, no violations, RSS growth within bounds.
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
        &system.spec(common, args.workload),
    )
    .await?
    .throughput();
    let rate = (max * args.load_fraction).max(1.0);
    eprintln!("idemd-bench: soaking at {rate:.0}/s for {:?}", args.soak);
    let mut spec = system.spec(common, args.workload);
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
