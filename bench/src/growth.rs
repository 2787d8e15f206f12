//! `idemd-bench growth`: fills one embedded store with fresh pairs at a
//! fixed concurrency, window after window, alternating the gRPC and the
//! HTTP/JSON port, and reports per window what issue 30 asks for: records
//! in the store, pairs/s, p50/p99/p999 as the client saw them, bytes per
//! record, and where the store's writes spent their time (the writer's
//! stage histograms, scraped from `/metrics` before and after the window).
//! At the end: sweep cost over the run, and the time a restart on the
//! filled files takes to serve (integrity check plus log replay).
//!
//! With `--ttl` the same run measures the expiry path: records expire that
//! long after their Claim, so once the first ones are that old they expire
//! as fast as they are created, and each window also reports the sweeps
//! (batches of expired records removed through the store's writer) that
//! ran in it.
//!
//! Every window's figures are compared with the first window of the same
//! port in the same run (the done-when of issue 30: p999 ≤ 3× p50 and
//! pairs/s ≥ 0.85× the first window's).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::load::{self, LoadSpec, Workload};
use crate::servers::{self, Server};
use crate::systems::{Client, Grpc, Http};

/// `idemd-bench growth`.
#[derive(Debug, Args)]
pub struct GrowthArgs {
    /// The idemd binary (default: `idemd` next to this binary).
    #[arg(long)]
    pub idemd_bin: Option<PathBuf>,
    /// Windows per port.
    #[arg(long, default_value_t = 6)]
    pub windows: usize,
    /// Length of each window (one port).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Operations in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// gRPC (HTTP/2) connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Pin idemd to core 0 and this client to core 1.
    #[arg(long)]
    pub pin: bool,
    /// Keep filling with gRPC only (no HTTP/JSON windows).
    #[arg(long)]
    pub grpc_only: bool,
    /// Records expire this long after their Claim (written as `[defaults]
    /// ttl` to a config file for idemd; the lease is the smaller of this
    /// and 60 s): the expiry path. Default: idemd's 24 h, so nothing
    /// expires during a run.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
    /// Extra arguments for `idemd serve` (e.g. a cache size, or
    /// `--sweep-interval 5s` with `--ttl`).
    #[arg(long, allow_hyphen_values = true, value_delimiter = ' ')]
    pub idemd_args: Vec<String>,
    /// Write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Which port a window loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Port {
    Grpc,
    Http,
}

/// One window's figures.
#[derive(Debug, Clone, Serialize)]
struct Row {
    port: Port,
    /// Records in the store after the window (pairs answered so far; up to
    /// `concurrency` pairs in flight at a window's end are not counted).
    records: u64,
    pairs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    errors: u64,
    /// Size of the data directory (redb file and logs).
    bytes: u64,
    /// Peak resident memory of idemd in the window (MiB): shown flat as
    /// the store grows, or not.
    rss_mib: f64,
    bytes_per_record: f64,
    /// The store's side of the window, from its metrics.
    stages: StageReport,
    /// Sweep batches (up to 1,000 expired records each) that ran in the
    /// window, and their total time in the store, ms.
    sweeps: u64,
    sweep_ms: f64,
}

/// The sweep's series of the store-operation histogram.
fn sweep_key() -> (String, String) {
    (
        STORE_OP.to_string(),
        "backend=\"embedded\",operation=\"sweep\"".to_string(),
    )
}

/// Sweep batches and their total ms in `window`.
fn sweeps(window: &Scrape) -> (u64, f64) {
    let key = sweep_key();
    (
        window.counts.get(&key).copied().unwrap_or(0.0) as u64,
        window.sums.get(&key).copied().unwrap_or(0.0) * 1000.0,
    )
}

/// The writer's stage histograms over one window.
#[derive(Debug, Clone, Default, Serialize)]
struct StageReport {
    /// Per stage: (p50, p99, p999) in ms, bucket-interpolated.
    stages: BTreeMap<String, (f64, f64, f64)>,
    /// Store time of a write (queue to answer): p50, p99, p999 in ms.
    write: (f64, f64, f64),
    /// The writes at or above the store's p999 bucket, by the stage that
    /// took most of their time: share in percent.
    worst_by_stage: BTreeMap<String, f64>,
    /// Checkpoints in the window and their p99, ms.
    checkpoints: u64,
    checkpoint_p99_ms: f64,
}

impl StageReport {
    /// The slowest writes' stages, as `fsync 52%, queue 48%`.
    fn worst(&self) -> String {
        self.worst_by_stage
            .iter()
            .map(|(stage, share)| format!("{stage} {share:.0}%"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parsed Prometheus histograms: (name, labels without `le`) → buckets
/// (upper bound, cumulative count), plus `_count`.
#[derive(Debug, Default, Clone)]
struct Scrape {
    buckets: BTreeMap<(String, String), Vec<(f64, f64)>>,
    sums: BTreeMap<(String, String), f64>,
    counts: BTreeMap<(String, String), f64>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut scrape = Scrape::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut le = None;
            let rest: Vec<&str> = labels
                .split(',')
                .filter(|label| {
                    if let Some(bound) = label.strip_prefix("le=\"") {
                        le = Some(bound.trim_end_matches('"').to_string());
                        false
                    } else {
                        !label.is_empty()
                    }
                })
                .collect();
            let labels = rest.join(",");
            if let Some(base) = name.strip_suffix("_bucket") {
                let bound = match le.as_deref() {
                    Some("+Inf") => f64::INFINITY,
                    Some(bound) => bound.parse().unwrap_or(f64::INFINITY),
                    None => continue,
                };
                scrape
                    .buckets
                    .entry((base.to_string(), labels))
                    .or_default()
                    .push((bound, value));
            } else if let Some(base) = name.strip_suffix("_sum") {
                scrape.sums.insert((base.to_string(), labels), value);
            } else if let Some(base) = name.strip_suffix("_count") {
                scrape.counts.insert((base.to_string(), labels), value);
            }
        }
        for buckets in scrape.buckets.values_mut() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        scrape
    }

    /// `self - earlier`, series by series.
    fn since(&self, earlier: &Scrape) -> Scrape {
        let mut diff = self.clone();
        for (key, buckets) in &mut diff.buckets {
            if let Some(before) = earlier.buckets.get(key) {
                for (bucket, old) in buckets.iter_mut().zip(before) {
                    bucket.1 -= old.1;
                }
            }
        }
        for (key, sum) in &mut diff.sums {
            *sum -= earlier.sums.get(key).copied().unwrap_or(0.0);
        }
        for (key, count) in &mut diff.counts {
            *count -= earlier.counts.get(key).copied().unwrap_or(0.0);
        }
        diff
    }

    /// The buckets of `name` summed over every series whose labels contain
    /// `filter`.
    fn merged(&self, name: &str, filter: &str) -> Vec<(f64, f64)> {
        let mut merged: Vec<(f64, f64)> = Vec::new();
        for ((series, labels), buckets) in &self.buckets {
            if series != name || !labels.contains(filter) {
                continue;
            }
            if merged.is_empty() {
                merged = buckets.clone();
            } else {
                for (total, bucket) in merged.iter_mut().zip(buckets) {
                    total.1 += bucket.1;
                }
            }
        }
        merged
    }
}

/// Prometheus' `histogram_quantile`: linear within the bucket, in ms.
fn quantile_ms(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return lower.0 * 1000.0;
            }
            let within = if count > lower.1 {
                (rank - lower.1) / (count - lower.1)
            } else {
                0.0
            };
            return (lower.0 + (bound - lower.0) * within) * 1000.0;
        }
        lower = (bound, count);
    }
    lower.0 * 1000.0
}

const STAGE: &str = "idemd_embedded_write_stage_duration_seconds";
const WRITE: &str = "idemd_embedded_write_duration_seconds";
const CHECKPOINT: &str = "idemd_embedded_checkpoint_duration_seconds";
const STORE_OP: &str = "idemd_store_operation_duration_seconds";
const STAGES: [&str; 6] = [
    "queue",
    "checkpoint_wait",
    "apply",
    "log_write",
    "fsync",
    "commit",
];

fn stage_report(window: &Scrape) -> StageReport {
    let mut report = StageReport::default();
    for stage in STAGES {
        let buckets = window.merged(STAGE, &format!("stage=\"{stage}\""));
        report.stages.insert(
            stage.to_string(),
            (
                quantile_ms(&buckets, 0.5),
                quantile_ms(&buckets, 0.99),
                quantile_ms(&buckets, 0.999),
            ),
        );
    }
    let write = window.merged(WRITE, "");
    report.write = (
        quantile_ms(&write, 0.5),
        quantile_ms(&write, 0.99),
        quantile_ms(&write, 0.999),
    );
    // The writes in the p999's bucket and above, by their slowest stage.
    let p999 = report.write.2 / 1000.0;
    let floor = write
        .iter()
        .rev()
        .map(|(bound, _)| *bound)
        .filter(|bound| *bound < p999)
        .fold(0.0, f64::max);
    let mut worst = BTreeMap::new();
    let mut worst_total = 0.0;
    for stage in STAGES {
        let buckets = window.merged(WRITE, &format!("slowest_stage=\"{stage}\""));
        let total = buckets.last().map_or(0.0, |b| b.1);
        let below = buckets
            .iter()
            .filter(|(bound, _)| *bound <= floor)
            .map(|b| b.1)
            .fold(0.0, f64::max);
        worst.insert(stage.to_string(), total - below);
        worst_total += total - below;
    }
    if worst_total > 0.0 {
        for share in worst.values_mut() {
            *share = *share * 100.0 / worst_total;
        }
        worst.retain(|_, share| *share >= 0.5);
        report.worst_by_stage = worst;
    }
    let checkpoints = window.merged(CHECKPOINT, "");
    report.checkpoints = checkpoints.last().map_or(0.0, |b| b.1) as u64;
    report.checkpoint_p99_ms = quantile_ms(&checkpoints, 0.99);
    report
}

/// GET `/metrics` from idemd's metrics port.
async fn scrape(address: SocketAddr) -> Result<Scrape> {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to the metrics port {address}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: idemd\r\n\r\n")
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    let text = body
        .split_once("\r\n\r\n")
        .map(|(_, text)| text)
        .ok_or_else(|| anyhow!("malformed metrics response"))?;
    Ok(Scrape::parse(text))
}

/// Bytes of every file in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.metadata().ok())
                .filter(|meta| meta.is_file())
                .map(|meta| meta.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The ports of one idemd.
#[derive(Debug, Clone, Copy)]
struct Ports {
    grpc: SocketAddr,
    http: SocketAddr,
    metrics: SocketAddr,
}

async fn start(args: &GrowthArgs, bin: &Path, dir: &Path, ports: Ports) -> Result<Server> {
    let mut serve = vec![
        "--listen".to_string(),
        ports.grpc.to_string(),
        "--http-listen".to_string(),
        ports.http.to_string(),
        "--metrics-listen".to_string(),
        ports.metrics.to_string(),
        // The fill measures the store, not the per-tenant key rate limit.
        "--claim-rate".to_string(),
        "0".to_string(),
    ];
    if let Some(ttl) = args.ttl {
        let config = dir.join("idemd.toml");
        let secs = ttl.as_secs().max(1);
        std::fs::write(
            &config,
            format!(
                "[defaults]\nttl = \"{secs}s\"\nlease = \"{}s\"\n",
                secs.min(60)
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        serve.extend(["--config".to_string(), config.display().to_string()]);
    }
    serve.extend(args.idemd_args.iter().filter(|a| !a.is_empty()).cloned());
    servers::start_idemd_on(
        bin,
        &dir.join("data"),
        &dir.join("idemd.log"),
        &serve,
        args.pin,
    )
    .await
}

/// Runs the growth scenario; false when a window saw errors.
pub async fn run(args: GrowthArgs) -> Result<bool> {
    let bin = crate::embedded::idemd_bin(args.idemd_bin.as_deref())?;
    let dir = servers::scratch_dir("growth")?;
    let ports = Ports {
        grpc: ([127, 0, 0, 1], servers::free_port()?).into(),
        http: ([127, 0, 0, 1], servers::free_port()?).into(),
        metrics: ([127, 0, 0, 1], servers::free_port()?).into(),
    };
    let outcome = fill(&args, &bin, &dir, ports).await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

async fn fill(args: &GrowthArgs, bin: &Path, dir: &Path, ports: Ports) -> Result<bool> {
    let mut server = start(args, bin, dir, ports).await?;
    crate::embedded::wait_ready(&mut server, ports.grpc, Instant::now()).await?;
    let grpc = Arc::new(Client::Grpc(
        Grpc::connect(&format!("http://{}", ports.grpc), args.connections).await?,
    ));
    let http = Arc::new(Client::Http(
        Http::connect(ports.http, args.concurrency).await?,
    ));
    let sample: Vec<(String, u32)> = server
        .pid()
        .map(|pid| ("server".to_string(), pid))
        .into_iter()
        .collect();
    let first_scrape = scrape(ports.metrics).await?;
    let mut rows = Vec::new();
    let mut records = 0u64;
    let mut clean = true;
    let run_started = Instant::now();
    for window in 0..args.windows {
        let mut order = vec![Port::Grpc];
        if !args.grpc_only {
            order.push(Port::Http);
        }
        for port in order {
            let client = match port {
                Port::Grpc => Arc::clone(&grpc),
                Port::Http => Arc::clone(&http),
            };
            let spec = LoadSpec {
                workload: Workload::Fresh,
                concurrency: args.concurrency,
                duration: args.window,
                warmup: if window == 0 {
                    Duration::from_secs(2)
                } else {
                    Duration::ZERO
                },
                rate: None,
                conflict_group: 1,
                replay_keys: 0,
                check_exclusive: true,
                sample: sample.clone(),
                progress_every: None,
            };
            let before = scrape(ports.metrics).await?;
            let result = load::run(Arc::clone(&client), &spec).await?;
            let after = scrape(ports.metrics).await?;
            // Warm-up pairs are in the store too: counted from the rate.
            records +=
                result.ops + (result.throughput() * spec.warmup.as_secs_f64()).round() as u64;
            let bytes = dir_bytes(&dir.join("data"));
            let window_scrape = after.since(&before);
            let (sweeps, sweep_ms) = sweeps(&window_scrape);
            let row = Row {
                port,
                records,
                pairs_per_s: result.throughput(),
                p50_ms: result.percentile_ms(0.5),
                p99_ms: result.percentile_ms(0.99),
                p999_ms: result.percentile_ms(0.999),
                errors: result.errors + result.errors_outside_window,
                bytes,
                rss_mib: result
                    .usage
                    .iter()
                    .find(|(role, _)| role == "server")
                    .map_or(0.0, |(_, usage)| usage.peak_rss_bytes as f64 / 1048576.0),
                bytes_per_record: bytes as f64 / records.max(1) as f64,
                stages: stage_report(&window_scrape),
                sweeps,
                sweep_ms,
            };
            clean &= row.errors == 0 && result.violations == 0;
            if let Some(error) = &result.first_error {
                eprintln!("  first error: {error}");
            }
            eprintln!("{}", row_line(&row));
            rows.push(row);
        }
    }
    let fill_time = run_started.elapsed();
    let last = scrape(ports.metrics).await?;
    let (sweeps, sweep_ms) = sweeps(&last.since(&first_scrape));
    drop((grpc, http));
    server.stop().await?;
    let bytes = dir_bytes(&dir.join("data"));
    let restarting = Instant::now();
    let mut server = start(args, bin, dir, ports).await?;
    let restart = crate::embedded::wait_ready(&mut server, ports.grpc, restarting).await?;
    server.stop().await?;

    let mut out = String::new();
    writeln!(out, "{}", markdown(&rows))?;
    writeln!(
        out,
        "Filled {records} records ({:.1} MiB, {:.0} B/record) in {:.0} s. Sweep batches during the fill: {sweeps}, {:.2} ms each on average. Restart on the filled store to the first answered Claim: {:.0} ms.",
        bytes as f64 / 1048576.0,
        bytes as f64 / records.max(1) as f64,
        fill_time.as_secs_f64(),
        if sweeps > 0 {
            sweep_ms / sweeps as f64
        } else {
            0.0
        },
        restart.as_secs_f64() * 1000.0
    )?;
    println!("{out}");
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "rows": rows,
            "records": records,
            "bytes": bytes,
            "sweeps": sweeps,
            "sweep_ms_total": sweep_ms,
            "restart_ms": restart.as_secs_f64() * 1000.0,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(clean)
}

fn row_line(row: &Row) -> String {
    format!(
        "{:>4} {:>9} records  {:>7.0} pairs/s  p50 {:.2}  p99 {:.2}  p999 {:.2} ms  ({:.1}x)  {:.0} B/rec  RSS {:.1} MiB  store write p50/p99/p999 {:.2}/{:.2}/{:.2} ms  worst 0.1%: {}  checkpoints {} (p99 {:.1} ms)  sweep batches {} ({:.0} ms)",
        match row.port {
            Port::Grpc => "grpc",
            Port::Http => "http",
        },
        row.records,
        row.pairs_per_s,
        row.p50_ms,
        row.p99_ms,
        row.p999_ms,
        row.p999_ms / row.p50_ms.max(1e-9),
        row.bytes_per_record,
        row.rss_mib,
        row.stages.write.0,
        row.stages.write.1,
        row.stages.write.2,
        row.stages.worst(),
        row.stages.checkpoints,
        row.stages.checkpoint_p99_ms,
        row.sweeps,
        row.sweep_ms,
    )
}

/// The rows as a Markdown table, with each port's ratios to its first
/// window.
fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| port | records after | pairs/s | vs first | p50 / p99 / p999 ms | p999/p50 | B/record | RSS MiB | store write p99 / p999 ms | worst 0.1% of store writes by stage | checkpoints (p99 ms) | sweep batches (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut first: BTreeMap<&str, f64> = BTreeMap::new();
    for row in rows {
        let port = match row.port {
            Port::Grpc => "gRPC",
            Port::Http => "HTTP/JSON",
        };
        let base = *first.entry(port).or_insert(row.pairs_per_s);
        let _ = writeln!(
            out,
            "| {port} | {} | {:.0} | {:.2} | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} | {:.1} | {:.1} / {:.1} | {} | {} ({:.0}) | {} ({:.0}) |",
            row.records,
            row.pairs_per_s,
            row.pairs_per_s / base.max(1e-9),
            row.p50_ms,
            row.p99_ms,
            row.p999_ms,
            row.p999_ms / row.p50_ms.max(1e-9),
            row.bytes_per_record,
            row.rss_mib,
            row.stages.write.1,
            row.stages.write.2,
            row.stages.worst(),
            row.stages.checkpoints,
            row.stages.checkpoint_p99_ms,
            row.sweeps,
            row.sweep_ms,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        let text = "# TYPE x histogram\nx_bucket{a=\"1\",le=\"0.001\"} 50\nx_bucket{a=\"1\",le=\"0.01\"} 100\nx_bucket{a=\"1\",le=\"+Inf\"} 100\nx_sum{a=\"1\"} 0.3\nx_count{a=\"1\"} 100\n";
        let scrape = Scrape::parse(text);
        let buckets = scrape.merged("x", "");
        assert_eq!(buckets.len(), 3);
        assert!((quantile_ms(&buckets, 0.5) - 1.0).abs() < 1e-9);
        assert!((quantile_ms(&buckets, 0.75) - 5.5).abs() < 1e-9);
        let diff = scrape.since(&Scrape::parse(
            "x_bucket{a=\"1\",le=\"0.001\"} 50\nx_bucket{a=\"1\",le=\"0.01\"} 50\nx_bucket{a=\"1\",le=\"+Inf\"} 50\n",
        ));
        assert!((quantile_ms(&diff.merged("x", ""), 1.0) - 10.0).abs() < 1e-9);
    }
}
